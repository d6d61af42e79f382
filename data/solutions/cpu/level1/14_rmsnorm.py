import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

cpp_source = r"""
#include <torch/extension.h>
#include <cmath>
#include <vector>

// RMS normalization over dim 1 of a (B, C, ...) tensor: x / sqrt(mean over C of x^2 + eps).
torch::Tensor rmsnorm_forward(torch::Tensor x, double eps) {
    TORCH_CHECK(x.scalar_type() == torch::kFloat32, "rmsnorm_forward expects float32");
    TORCH_CHECK(x.dim() >= 2, "rmsnorm_forward expects at least 2 dimensions");
    auto xc = x.contiguous();
    auto y = torch::empty_like(xc);
    const int64_t B = xc.size(0), C = xc.size(1);
    const int64_t S = (B * C) > 0 ? xc.numel() / (B * C) : 0;
    const float* in = xc.data_ptr<float>();
    float* out = y.data_ptr<float>();
    std::vector<double> acc((size_t)S);
    for (int64_t b = 0; b < B; ++b) {
        const float* base = in + b * C * S;
        float* dst = out + b * C * S;
        for (int64_t s = 0; s < S; ++s) acc[s] = 0.0;
        for (int64_t c = 0; c < C; ++c) {
            const float* plane = base + c * S;
            for (int64_t s = 0; s < S; ++s) acc[s] += (double)plane[s] * (double)plane[s];
        }
        for (int64_t s = 0; s < S; ++s) acc[s] = 1.0 / std::sqrt(acc[s] / (double)C + eps);
        for (int64_t c = 0; c < C; ++c) {
            const float* plane = base + c * S;
            float* oplane = dst + c * S;
            for (int64_t s = 0; s < S; ++s) oplane[s] = (float)((double)plane[s] * acc[s]);
        }
    }
    return y;
}
"""

ext = load_inline(
    name="kevin_l1_rmsnorm_cpu",
    cpp_sources=cpp_source,
    functions=["rmsnorm_forward"],
    verbose=False,
)


class ModelNew(nn.Module):
    def __init__(self, num_features: int, eps: float = 1e-5):
        super().__init__()
        self.num_features = num_features
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return ext.rmsnorm_forward(x, self.eps)
