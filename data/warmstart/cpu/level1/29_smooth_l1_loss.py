import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

src = r"""
#include <torch/extension.h>
torch::Tensor run(torch::Tensor p, torch::Tensor t) {
    auto y = torch::empty({}, p.options());
    float *a = p.data_ptr<float>(), *b = t.data_ptr<float>();
    double s = 0;
    for (int i = 0; i < p.numel(); i++) {
        float d = std::fabs(a[i] - b[i]);
        s += d < 1 ? 0.5f * d * d : d - 0.5f;
    }
    y.data_ptr<float>()[0] = s / p.numel();
    return y;
}
"""
ext = load_inline(name="ws_smooth_l1_loss", cpp_sources=src, functions=["run"])


class ModelNew(nn.Module):
    def forward(self, predictions, targets):
        return ext.run(predictions, targets)
