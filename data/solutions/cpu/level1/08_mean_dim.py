import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

cpp_source = r"""
#include <torch/extension.h>
#include <vector>

// Mean over the last dimension (dropped from the output shape).
torch::Tensor mean_last_forward(torch::Tensor x) {
    TORCH_CHECK(x.scalar_type() == torch::kFloat32, "mean_last_forward expects float32");
    TORCH_CHECK(x.dim() >= 1, "mean_last_forward expects at least 1 dimension");
    auto xc = x.contiguous();
    const int64_t nd = xc.dim();
    const int64_t L = xc.size(nd - 1);
    std::vector<int64_t> out_shape(xc.sizes().begin(), xc.sizes().end() - 1);
    auto y = torch::empty(out_shape, xc.options());
    const int64_t rows = y.numel();
    const float* in = xc.data_ptr<float>();
    float* out = y.data_ptr<float>();
    for (int64_t r = 0; r < rows; ++r) {
        const float* row = in + r * L;
        double s = 0.0;
        for (int64_t j = 0; j < L; ++j) s += (double)row[j];
        out[r] = (float)(s / (double)L);
    }
    return y;
}
"""

ext = load_inline(
    name="kevin_l1_mean_dim_cpu",
    cpp_sources=cpp_source,
    functions=["mean_last_forward"],
    verbose=False,
)


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return ext.mean_last_forward(x)
