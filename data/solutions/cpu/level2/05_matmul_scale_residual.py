import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

cpp_source = r"""
#include <torch/extension.h>
#include <vector>

torch::Tensor matmul_scale_residual_forward(torch::Tensor x, torch::Tensor weight, double scale) {
    TORCH_CHECK(x.scalar_type() == torch::kFloat32 && x.dim() == 2, "x must be a 2-D float32 tensor");
    auto xc = x.contiguous();
    auto wc = weight.contiguous();
    const int64_t M = xc.size(0);
    const int64_t D = xc.size(1);
    TORCH_CHECK(wc.size(0) == D && wc.size(1) == D, "weight must be [dim][dim]");
    const float* xp = xc.data_ptr<float>();
    const float* wp = wc.data_ptr<float>();
    auto out = torch::empty({M, D}, xc.options());
    float* op = out.data_ptr<float>();
    const double s = (double)(float)scale;
    std::vector<double> acc((size_t)D);
    for (int64_t m = 0; m < M; ++m) {
        for (int64_t n = 0; n < D; ++n) acc[n] = 0.0;
        // row m of x times W, walking W row by row (k outer) so the inner loop is contiguous
        for (int64_t k = 0; k < D; ++k) {
            const double xv = (double)xp[m * D + k];
            const float* wr = wp + k * D;
            for (int64_t n = 0; n < D; ++n) acc[n] += xv * (double)wr[n];
        }
        for (int64_t n = 0; n < D; ++n) op[m * D + n] = (float)(acc[n] + (double)xp[m * D + n] * s);
    }
    return out;
}
"""

matmul_scale_residual_ext = load_inline(
    name="kevin_l2_matmul_scale_residual_cpu",
    cpp_sources=cpp_source,
    functions=["matmul_scale_residual_forward"],
    verbose=False,
)


class ModelNew(nn.Module):
    def __init__(self, dim, scale):
        super().__init__()
        self.weight = nn.Parameter(torch.randn(dim, dim) * dim ** -0.5)
        self.scale = scale

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return matmul_scale_residual_ext.matmul_scale_residual_forward(x, self.weight, self.scale)
