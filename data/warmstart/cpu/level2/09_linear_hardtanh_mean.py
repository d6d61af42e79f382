import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

src = r"""
#include <torch/extension.h>
torch::Tensor run(torch::Tensor x, torch::Tensor w, torch::Tensor b, double lo, double hi) {
    int M = x.size(0), K = x.size(1), N = w.size(0);
    auto y = torch::empty({M, 1}, x.options());
    float *X = x.data_ptr<float>(), *W = w.data_ptr<float>(), *B = b.data_ptr<float>(), *Y = y.data_ptr<float>();
    for (int i = 0; i < M; i++) {
        float s = 0;
        for (int j = 0; j < N; j++) {
            float v = B[j];
            for (int k = 0; k < K; k++) v += X[i * K + k] * W[j * K + k];
            s += std::min(std::max(v, (float)lo), (float)hi);
        }
        Y[i] = s / N;
    }
    return y;
}
"""
ext = load_inline(name="ws_linear_hardtanh_mean", cpp_sources=src, functions=["run"])


class ModelNew(nn.Module):
    def __init__(self, in_features, out_features, min_val, max_val):
        super().__init__()
        self.linear = nn.Linear(in_features, out_features)
        self.lo = min_val
        self.hi = max_val

    def forward(self, x):
        return ext.run(x, self.linear.weight, self.linear.bias, self.lo, self.hi)
