import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

src = r"""
#include <torch/extension.h>
torch::Tensor run(torch::Tensor x) {
    auto y = torch::empty_like(x);
    float *a = x.data_ptr<float>(), *b = y.data_ptr<float>();
    for (int i = 0; i < x.numel(); i++) b[i] = 0.5f * a[i] * (1 + std::erf(a[i] * 0.70710678f));
    return y;
}
"""
ext = load_inline(name="ws_gelu", cpp_sources=src, functions=["run"])


class ModelNew(nn.Module):
    def forward(self, x):
        return ext.run(x)
