import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

src = r"""
#include <torch/extension.h>
torch::Tensor run(torch::Tensor x) {
    int B = x.size(0), D = x.size(1);
    auto y = torch::empty_like(x);
    float *a = x.data_ptr<float>(), *b = y.data_ptr<float>();
    for (int i = 0; i < B; i++) {
        double s = 0;
        for (int j = 0; j < D; j++) b[i * D + j] = s += a[i * D + j];
    }
    return y;
}
"""
ext = load_inline(name="ws_cumsum", cpp_sources=src, functions=["run"])


class ModelNew(nn.Module):
    def forward(self, x):
        return ext.run(x)
