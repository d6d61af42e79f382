import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

src = r"""
#include <torch/extension.h>
torch::Tensor run(torch::Tensor x, double s) {
    auto y = torch::empty_like(x);
    float *a = x.data_ptr<float>(), *b = y.data_ptr<float>();
    for (int i = 0; i < x.numel(); i++) b[i] = a[i] > 0 ? a[i] : a[i] * (float)s;
    return y;
}
"""
ext = load_inline(name="ws_leaky_relu", cpp_sources=src, functions=["run"])


class ModelNew(nn.Module):
    def __init__(self, negative_slope=0.01):
        super().__init__()
        self.negative_slope = negative_slope

    def forward(self, x):
        return ext.run(x, self.negative_slope)
