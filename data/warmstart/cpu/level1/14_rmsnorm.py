import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

src = r"""
#include <torch/extension.h>
torch::Tensor run(torch::Tensor x, double eps) {
    int B = x.size(0), C = x.size(1), N = x.size(2) * x.size(3);
    auto y = torch::empty_like(x);
    float *a = x.data_ptr<float>(), *b = y.data_ptr<float>();
    for (int i = 0; i < B; i++)
        for (int k = 0; k < N; k++) {
            float s = 0;
            for (int c = 0; c < C; c++) s += a[(i * C + c) * N + k] * a[(i * C + c) * N + k];
            float r = 1.0f / std::sqrt(s / C + (float)eps);
            for (int c = 0; c < C; c++) b[(i * C + c) * N + k] = a[(i * C + c) * N + k] * r;
        }
    return y;
}
"""
ext = load_inline(name="ws_rmsnorm", cpp_sources=src, functions=["run"])


class ModelNew(nn.Module):
    def __init__(self, num_features, eps=1e-5):
        super().__init__()
        self.eps = eps

    def forward(self, x):
        return ext.run(x, self.eps)
