import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

cpp_source = r"""
#include <torch/extension.h>

// Inclusive prefix sum along dim 1 of a 2D tensor, with a double running total per row.
torch::Tensor cumsum_forward(torch::Tensor x) {
    TORCH_CHECK(x.scalar_type() == torch::kFloat32 && x.dim() == 2, "float32 2D tensor expected");
    auto xc = x.contiguous();
    const int64_t R = xc.size(0), L = xc.size(1);
    auto y = torch::empty_like(xc);
    const float* px = xc.data_ptr<float>();
    float* py = y.data_ptr<float>();
    for (int64_t r = 0; r < R; ++r) {
        double run = 0.0;
        for (int64_t j = 0; j < L; ++j) {
            run += (double)px[r * L + j];
            py[r * L + j] = (float)run;
        }
    }
    return y;
}
"""

cumsum_ext = load_inline(
    name="kevin_l1_cumsum_cpu",
    cpp_sources=cpp_source,
    functions=["cumsum_forward"],
    verbose=False,
)


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return cumsum_ext.cumsum_forward(x)
