import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

cpp_source = r"""
#include <torch/extension.h>

// mean((p - t)^2) over all elements, summed in double; returns a 0-dim float32 tensor.
torch::Tensor mse_forward(torch::Tensor pred, torch::Tensor target) {
    TORCH_CHECK(pred.scalar_type() == torch::kFloat32 && target.scalar_type() == torch::kFloat32, "float32 expected");
    TORCH_CHECK(pred.sizes() == target.sizes(), "shape mismatch");
    auto p = pred.contiguous();
    auto t = target.contiguous();
    const int64_t n = p.numel();
    const float* pp = p.data_ptr<float>();
    const float* pt = t.data_ptr<float>();
    double acc = 0.0;
    for (int64_t i = 0; i < n; ++i) {
        const double d = (double)pp[i] - (double)pt[i];
        acc += d * d;
    }
    auto out = torch::empty({}, p.options());
    out.data_ptr<float>()[0] = (float)(acc / (double)n);
    return out;
}
"""

mse_ext = load_inline(
    name="kevin_l1_mse_loss_cpu",
    cpp_sources=cpp_source,
    functions=["mse_forward"],
    verbose=False,
)


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, predictions: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        return mse_ext.mse_forward(predictions, targets)
