import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

src = r"""
#include <torch/extension.h>
torch::Tensor run(torch::Tensor x) {
    auto y = torch::empty_like(x);
    float *a = x.data_ptr<float>(), *b = y.data_ptr<float>();
    for (int i = 0; i < x.numel(); i++) b[i] = a[i] > 20 ? a[i] : std::log1p(std::exp(a[i]));
    return y;
}
"""
ext = load_inline(name="ws_softplus", cpp_sources=src, functions=["run"])


class ModelNew(nn.Module):
    def forward(self, x):
        return ext.run(x)
