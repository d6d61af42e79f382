import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

cpp_source = r"""
#include <torch/extension.h>
#include <vector>

// Sum over dimension `dim`, keeping it with size 1. The tensor is viewed as (outer, R, inner).
torch::Tensor sum_dim_forward(torch::Tensor x, int64_t dim) {
    TORCH_CHECK(x.scalar_type() == torch::kFloat32, "sum_dim_forward expects float32");
    auto xc = x.contiguous();
    const int64_t nd = xc.dim();
    if (dim < 0) dim += nd;
    TORCH_CHECK(dim >= 0 && dim < nd, "dim out of range");
    int64_t outer = 1, inner = 1;
    for (int64_t d = 0; d < dim; ++d) outer *= xc.size(d);
    for (int64_t d = dim + 1; d < nd; ++d) inner *= xc.size(d);
    const int64_t R = xc.size(dim);
    std::vector<int64_t> out_shape(xc.sizes().begin(), xc.sizes().end());
    out_shape[dim] = 1;
    auto y = torch::empty(out_shape, xc.options());
    const float* in = xc.data_ptr<float>();
    float* out = y.data_ptr<float>();
    std::vector<double> acc((size_t)inner);
    for (int64_t o = 0; o < outer; ++o) {
        for (int64_t j = 0; j < inner; ++j) acc[j] = 0.0;
        const float* base = in + o * R * inner;
        for (int64_t r = 0; r < R; ++r) {
            const float* row = base + r * inner;
            for (int64_t j = 0; j < inner; ++j) acc[j] += (double)row[j];
        }
        for (int64_t j = 0; j < inner; ++j) out[o * inner + j] = (float)acc[j];
    }
    return y;
}
"""

ext = load_inline(
    name="kevin_l1_sum_dim_cpu",
    cpp_sources=cpp_source,
    functions=["sum_dim_forward"],
    verbose=False,
)


class ModelNew(nn.Module):
    def __init__(self, dim: int):
        super().__init__()
        self.dim = dim

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return ext.sum_dim_forward(x, self.dim)
