import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

cpp_source = r"""
#include <torch/extension.h>
#include <cmath>

// Mean smooth-L1 loss: z = |p - t|; z < beta ? 0.5 * z * z / beta : z - 0.5 * beta.
// The elementwise term is formed in float (as PyTorch does) and summed in double.
torch::Tensor smooth_l1_forward(torch::Tensor pred, torch::Tensor target, double beta) {
    TORCH_CHECK(pred.scalar_type() == torch::kFloat32 && target.scalar_type() == torch::kFloat32, "float32 expected");
    TORCH_CHECK(pred.sizes() == target.sizes(), "shape mismatch");
    TORCH_CHECK(beta > 0.0, "beta must be positive");
    auto p = pred.contiguous();
    auto t = target.contiguous();
    const int64_t n = p.numel();
    const float* pp = p.data_ptr<float>();
    const float* pt = t.data_ptr<float>();
    const float b = (float)beta;
    double acc = 0.0;
    for (int64_t i = 0; i < n; ++i) {
        const float z = std::fabs(pp[i] - pt[i]);
        const float v = z < b ? 0.5f * z * z / b : z - 0.5f * b;
        acc += (double)v;
    }
    auto out = torch::empty({}, p.options());
    out.data_ptr<float>()[0] = (float)(acc / (double)n);
    return out;
}
"""

smooth_l1_ext = load_inline(
    name="kevin_l1_smooth_l1_loss_cpu",
    cpp_sources=cpp_source,
    functions=["smooth_l1_forward"],
    verbose=False,
)


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, predictions: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        return smooth_l1_ext.smooth_l1_forward(predictions, targets, 1.0)
