"""Level-2 task 27 (ConvTranspose2d + per-channel bias + clamp): CPU solution, single-threaded C++ loops with double accumulation."""
import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

cpp_source = r"""
#include <torch/extension.h>
#include <algorithm>
#include <cmath>
#include <vector>

static void check_input(const torch::Tensor& t, const char* name) {
    TORCH_CHECK(!t.is_cuda(), name, " must be a CPU tensor");
    TORCH_CHECK(t.scalar_type() == torch::kFloat32, name, " must be float32");
}

torch::Tensor conv_transpose2d_add_clamp_forward(torch::Tensor x, torch::Tensor weight, torch::Tensor bias, torch::Tensor bias2, double clamp_min, double clamp_max, int64_t stride, int64_t padding, int64_t output_padding, int64_t dilation) {
    check_input(x, "x");
    check_input(weight, "weight");
    check_input(bias, "bias");
    check_input(bias2, "bias2");
    TORCH_CHECK(x.dim() == 4 && weight.dim() == 4, "expected a 4-D input and a 4-D weight");
    TORCH_CHECK(weight.size(0) == x.size(1), "weight and input channel counts differ");
    TORCH_CHECK(stride > 0 && padding >= 0 && output_padding >= 0 && dilation > 0, "bad hyper-parameters");
    auto xc = x.contiguous();
    auto wc = weight.contiguous();
    auto bc = bias.contiguous();
    auto b2c = bias2.contiguous();
    const int64_t N = xc.size(0), C = xc.size(1), H = xc.size(2), W = xc.size(3);
    const int64_t K = wc.size(1), R = wc.size(2), S = wc.size(3);
    TORCH_CHECK(bc.numel() == K && b2c.numel() == K, "bias size mismatch");
    const int64_t OH = (H - 1) * stride - 2 * padding + dilation * (R - 1) + output_padding + 1;
    const int64_t OW = (W - 1) * stride - 2 * padding + dilation * (S - 1) + output_padding + 1;
    TORCH_CHECK(OH > 0 && OW > 0, "output would be empty");
    const float* xp = xc.data_ptr<float>();
    const float* wp = wc.data_ptr<float>();
    const float* bp = bc.data_ptr<float>();
    const float* b2 = b2c.data_ptr<float>();
    const float lo = (float)clamp_min, hi = (float)clamp_max;
    auto y = torch::empty({N, K, OH, OW}, xc.options());
    float* yp = y.data_ptr<float>();
    // gather form: y[n][k][oh][ow] = b[k] + sum x[n][c][ih][iw] * w[c][k][r][s]
    // over the taps with oh = ih * stride - padding + r * dilation (same for the width)
    for (int64_t n = 0; n < N; ++n)
    for (int64_t k = 0; k < K; ++k)
    for (int64_t oh = 0; oh < OH; ++oh)
    for (int64_t ow = 0; ow < OW; ++ow) {
        double acc = (double)bp[k];
        for (int64_t c = 0; c < C; ++c) {
            const float* xcp = xp + (n * C + c) * H * W;
            const float* wcp = wp + (c * K + k) * R * S;
            for (int64_t r = 0; r < R; ++r) {
                const int64_t th = oh + padding - r * dilation;
                if (th < 0 || th % stride != 0) continue;
                const int64_t ih = th / stride;
                if (ih >= H) continue;
                for (int64_t s = 0; s < S; ++s) {
                    const int64_t tw = ow + padding - s * dilation;
                    if (tw < 0 || tw % stride != 0) continue;
                    const int64_t iw = tw / stride;
                    if (iw >= W) continue;
                    acc += (double)xcp[ih * W + iw] * (double)wcp[r * S + s];
                }
            }
        }
        const float v = (float)acc + b2[k];
        yp[((n * K + k) * OH + oh) * OW + ow] = std::min(std::max(v, lo), hi);
    }
    return y;
}
"""

_ext = load_inline(
    name="kevin_l2_conv_transpose2d_add_clamp_cpu",
    cpp_sources=cpp_source,
    functions=["conv_transpose2d_add_clamp_forward"],
    verbose=False,
)


class ModelNew(nn.Module):
    def __init__(self, in_channels, out_channels, kernel_size, stride, padding, clamp_min, clamp_max):
        super().__init__()
        self.conv_transpose = nn.ConvTranspose2d(in_channels, out_channels, kernel_size, stride=stride, padding=padding)
        self.bias = nn.Parameter(torch.empty(out_channels, 1, 1))
        self.clamp_min = clamp_min
        self.clamp_max = clamp_max
        self.stride = stride
        self.padding = padding

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return _ext.conv_transpose2d_add_clamp_forward(
            x, self.conv_transpose.weight, self.conv_transpose.bias, self.bias,
            float(self.clamp_min), float(self.clamp_max), self.stride, self.padding, 0, 1
        )
