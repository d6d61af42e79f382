import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

cpp_source = r"""
#include <torch/extension.h>
#include <cmath>

// LayerNorm over the trailing weight.numel() elements of each row, with affine weight and bias.
torch::Tensor layernorm_forward(torch::Tensor x, torch::Tensor weight, torch::Tensor bias, double eps) {
    TORCH_CHECK(x.scalar_type() == torch::kFloat32, "layernorm_forward expects float32");
    auto xc = x.contiguous();
    auto wc = weight.contiguous();
    auto bc = bias.contiguous();
    const int64_t N = wc.numel();
    TORCH_CHECK(N > 0 && xc.numel() % N == 0, "normalized size does not divide the input");
    const int64_t rows = xc.numel() / N;
    auto y = torch::empty_like(xc);
    const float* in = xc.data_ptr<float>();
    const float* w = wc.data_ptr<float>();
    const float* b = bc.data_ptr<float>();
    float* out = y.data_ptr<float>();
    for (int64_t r = 0; r < rows; ++r) {
        const float* row = in + r * N;
        float* dst = out + r * N;
        double s = 0.0;
        for (int64_t j = 0; j < N; ++j) s += (double)row[j];
        const double mean = s / (double)N;
        double sq = 0.0;
        for (int64_t j = 0; j < N; ++j) { const double d = (double)row[j] - mean; sq += d * d; }
        const double rstd = 1.0 / std::sqrt(sq / (double)N + eps);
        for (int64_t j = 0; j < N; ++j)
            dst[j] = (float)(((double)row[j] - mean) * rstd * (double)w[j] + (double)b[j]);
    }
    return y;
}
"""

ext = load_inline(
    name="kevin_l1_layernorm_cpu",
    cpp_sources=cpp_source,
    functions=["layernorm_forward"],
    verbose=False,
)


class ModelNew(nn.Module):
    def __init__(self, normalized_shape: tuple):
        super().__init__()
        self.ln = nn.LayerNorm(normalized_shape)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return ext.layernorm_forward(x, self.ln.weight, self.ln.bias, self.ln.eps)
