"""Level-2 task 26 (Conv3d + LeakyReLU + MaxPool3d(2)): CPU solution, single-threaded C++ loops with double accumulation."""
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

torch::Tensor conv3d_leakyrelu_maxpool_forward(torch::Tensor x, torch::Tensor weight, torch::Tensor bias, double negative_slope, int64_t stride, int64_t padding, int64_t dilation) {
    check_input(x, "x");
    check_input(weight, "weight");
    check_input(bias, "bias");
    TORCH_CHECK(x.dim() == 5 && weight.dim() == 5, "expected a 5-D input and a 5-D weight");
    TORCH_CHECK(weight.size(1) == x.size(1), "weight and input channel counts differ");
    TORCH_CHECK(stride > 0 && padding >= 0 && dilation > 0, "bad convolution hyper-parameters");
    auto xc = x.contiguous();
    auto wc = weight.contiguous();
    auto bc = bias.contiguous();
    const int64_t N = xc.size(0), C = xc.size(1), D = xc.size(2), H = xc.size(3), W = xc.size(4);
    const int64_t K = wc.size(0), T = wc.size(2), R = wc.size(3), S = wc.size(4);
    TORCH_CHECK(bc.numel() == K, "conv bias size mismatch");
    const int64_t OD = (D + 2 * padding - dilation * (T - 1) - 1) / stride + 1;
    const int64_t OH = (H + 2 * padding - dilation * (R - 1) - 1) / stride + 1;
    const int64_t OW = (W + 2 * padding - dilation * (S - 1) - 1) / stride + 1;
    TORCH_CHECK(OD > 0 && OH > 0 && OW > 0, "convolution output would be empty");
    const float* xp = xc.data_ptr<float>();
    const float* wp = wc.data_ptr<float>();
    const float* bp = bc.data_ptr<float>();
    const float slope = (float)negative_slope;
    std::vector<float> act((size_t)(N * K * OD * OH * OW));
    for (int64_t n = 0; n < N; ++n)
    for (int64_t k = 0; k < K; ++k)
    for (int64_t od = 0; od < OD; ++od)
    for (int64_t oh = 0; oh < OH; ++oh)
    for (int64_t ow = 0; ow < OW; ++ow) {
        double acc = (double)bp[k];
        for (int64_t c = 0; c < C; ++c) {
            const float* xcp = xp + (n * C + c) * D * H * W;
            const float* wcp = wp + (k * C + c) * T * R * S;
            for (int64_t t = 0; t < T; ++t) {
                const int64_t id = od * stride - padding + t * dilation;
                if (id < 0 || id >= D) continue;
                for (int64_t r = 0; r < R; ++r) {
                    const int64_t ih = oh * stride - padding + r * dilation;
                    if (ih < 0 || ih >= H) continue;
                    for (int64_t s = 0; s < S; ++s) {
                        const int64_t iw = ow * stride - padding + s * dilation;
                        if (iw < 0 || iw >= W) continue;
                        acc += (double)xcp[(id * H + ih) * W + iw] * (double)wcp[(t * R + r) * S + s];
                    }
                }
            }
        }
        const float v = (float)acc;
        act[(size_t)((((n * K + k) * OD + od) * OH + oh) * OW + ow)] = v > 0.0f ? v : v * slope;
    }
    const int64_t PD = OD / 2, PH = OH / 2, PW = OW / 2;
    auto y = torch::empty({N, K, PD, PH, PW}, xc.options());
    float* yp = y.data_ptr<float>();
    for (int64_t nk = 0; nk < N * K; ++nk)
    for (int64_t a = 0; a < PD; ++a)
    for (int64_t bb = 0; bb < PH; ++bb)
    for (int64_t cc = 0; cc < PW; ++cc) {
        float m = act[(size_t)(((nk * OD + 2 * a) * OH + 2 * bb) * OW + 2 * cc)];
        for (int64_t i = 0; i < 2; ++i)
            for (int64_t j = 0; j < 2; ++j)
                for (int64_t l = 0; l < 2; ++l)
                    m = std::max(m, act[(size_t)(((nk * OD + 2 * a + i) * OH + 2 * bb + j) * OW + 2 * cc + l)]);
        yp[((nk * PD + a) * PH + bb) * PW + cc] = m;
    }
    return y;
}
"""

_ext = load_inline(
    name="kevin_l2_conv3d_leakyrelu_maxpool_cpu",
    cpp_sources=cpp_source,
    functions=["conv3d_leakyrelu_maxpool_forward"],
    verbose=False,
)


class ModelNew(nn.Module):
    def __init__(self, in_channels, out_channels, kernel_size, negative_slope):
        super().__init__()
        self.conv = nn.Conv3d(in_channels, out_channels, kernel_size)
        self.negative_slope = negative_slope
        self.pool = nn.MaxPool3d(2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return _ext.conv3d_leakyrelu_maxpool_forward(
            x, self.conv.weight, self.conv.bias, float(self.negative_slope), 1, 0, 1
        )
