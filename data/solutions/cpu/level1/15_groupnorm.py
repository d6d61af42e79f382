import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

cpp_source = r"""
#include <torch/extension.h>
#include <cmath>

// GroupNorm on a (N, C, ...) tensor: statistics over each group of C/G channels and all spatial
// positions, then per-channel affine weight and bias.
torch::Tensor groupnorm_forward(torch::Tensor x, torch::Tensor weight, torch::Tensor bias,
                                int64_t groups, double eps) {
    TORCH_CHECK(x.scalar_type() == torch::kFloat32, "groupnorm_forward expects float32");
    TORCH_CHECK(x.dim() >= 2, "groupnorm_forward expects at least 2 dimensions");
    auto xc = x.contiguous();
    auto wc = weight.contiguous();
    auto bc = bias.contiguous();
    const int64_t N = xc.size(0), C = xc.size(1);
    TORCH_CHECK(groups > 0 && C % groups == 0, "channels must be divisible by groups");
    const int64_t S = (N * C) > 0 ? xc.numel() / (N * C) : 0;
    const int64_t cpg = C / groups;
    const int64_t gsize = cpg * S;
    auto y = torch::empty_like(xc);
    const float* in = xc.data_ptr<float>();
    const float* w = wc.data_ptr<float>();
    const float* b = bc.data_ptr<float>();
    float* out = y.data_ptr<float>();
    for (int64_t n = 0; n < N; ++n) {
        for (int64_t g = 0; g < groups; ++g) {
            const int64_t off = (n * C + g * cpg) * S;
            const float* src = in + off;
            float* dst = out + off;
            double s = 0.0;
            for (int64_t i = 0; i < gsize; ++i) s += (double)src[i];
            const double mean = s / (double)gsize;
            double sq = 0.0;
            for (int64_t i = 0; i < gsize; ++i) { const double d = (double)src[i] - mean; sq += d * d; }
            const double rstd = 1.0 / std::sqrt(sq / (double)gsize + eps);
            for (int64_t k = 0; k < cpg; ++k) {
                const int64_t c = g * cpg + k;
                const double scale = rstd * (double)w[c];
                const double shift = (double)b[c] - mean * scale;
                const float* p = src + k * S;
                float* q = dst + k * S;
                for (int64_t i = 0; i < S; ++i) q[i] = (float)((double)p[i] * scale + shift);
            }
        }
    }
    return y;
}
"""

ext = load_inline(
    name="kevin_l1_groupnorm_cpu",
    cpp_sources=cpp_source,
    functions=["groupnorm_forward"],
    verbose=False,
)


class ModelNew(nn.Module):
    def __init__(self, num_groups: int, num_channels: int):
        super().__init__()
        self.gn = nn.GroupNorm(num_groups, num_channels)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return ext.groupnorm_forward(x, self.gn.weight, self.gn.bias, self.gn.num_groups, self.gn.eps)
