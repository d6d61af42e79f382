import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

src = r"""
#include <torch/extension.h>
torch::Tensor run(torch::Tensor x, torch::Tensor w, torch::Tensor b, torch::Tensor e) {
    int M = x.size(0), K = x.size(1), N = w.size(0);
    auto y = torch::empty({M, N}, x.options());
    float *X = x.data_ptr<float>(), *W = w.data_ptr<float>(), *B = b.data_ptr<float>(), *Y = y.data_ptr<float>();
    for (int i = 0; i < M; i++) {
        for (int j = 0; j < N; j++) {
            float v = B[j];
            for (int k = 0; k < K; k++) v += X[i * K + k] * W[j * K + k];
            Y[i * N + j] = std::max(v, 0.f) + e.data_ptr<float>()[j];
        }
    }
    return y;
}
"""
ext = load_inline(name="ws_linear_relu_add_bias", cpp_sources=src, functions=["run"])


class ModelNew(nn.Module):
    def __init__(self, in_features, out_features):
        super().__init__()
        self.linear = nn.Linear(in_features, out_features)
        self.bias = nn.Parameter(torch.randn(out_features) * 0.1)

    def forward(self, x):
        return ext.run(x, self.linear.weight, self.linear.bias, self.bias)
