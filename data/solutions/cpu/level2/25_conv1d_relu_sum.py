"""Level-2 task 25 (Conv1d (same padding) + ReLU + sum over length): CPU solution, single-threaded C++ loops with double accumulation."""
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

// out[n][k][oh][ow] = b[k] + sum_{c,r,s} x[n][c][ih][iw] * w[k][c][r][s], accumulated in double.
static void conv2d_direct(const float* x, const float* w, const float* b, double* out,
                          int64_t N, int64_t C, int64_t H, int64_t W, int64_t K, int64_t R, int64_t S,
                          int64_t OH, int64_t OW, int64_t sh, int64_t sw, int64_t ph, int64_t pw,
                          int64_t dh, int64_t dw) {
    for (int64_t n = 0; n < N; ++n) {
        for (int64_t k = 0; k < K; ++k) {
            const float* wk = w + k * C * R * S;
            double* ok = out + (n * K + k) * OH * OW;
            for (int64_t oh = 0; oh < OH; ++oh) {
                for (int64_t ow = 0; ow < OW; ++ow) {
                    double acc = b != nullptr ? (double)b[k] : 0.0;
                    for (int64_t c = 0; c < C; ++c) {
                        const float* xc = x + (n * C + c) * H * W;
                        const float* wc = wk + c * R * S;
                        for (int64_t r = 0; r < R; ++r) {
                            const int64_t ih = oh * sh - ph + r * dh;
                            if (ih < 0 || ih >= H) continue;
                            for (int64_t s = 0; s < S; ++s) {
                                const int64_t iw = ow * sw - pw + s * dw;
                                if (iw < 0 || iw >= W) continue;
                                acc += (double)xc[ih * W + iw] * (double)wc[r * S + s];
                            }
                        }
                    }
                    ok[oh * OW + ow] = acc;
                }
            }
        }
    }
}

torch::Tensor conv1d_relu_sum_forward(torch::Tensor x, torch::Tensor weight, torch::Tensor bias, int64_t stride, int64_t padding, int64_t dilation) {
    check_input(x, "x");
    check_input(weight, "weight");
    check_input(bias, "bias");
    TORCH_CHECK(x.dim() == 3 && weight.dim() == 3, "expected a 3-D input and a 3-D weight");
    TORCH_CHECK(weight.size(1) == x.size(1), "weight and input channel counts differ");
    TORCH_CHECK(stride > 0 && padding >= 0 && dilation > 0, "bad convolution hyper-parameters");
    auto xc = x.contiguous();
    auto wc = weight.contiguous();
    auto bc = bias.contiguous();
    const int64_t N = xc.size(0), C = xc.size(1), L = xc.size(2);
    const int64_t K = wc.size(0), S = wc.size(2);
    TORCH_CHECK(bc.numel() == K, "conv bias size mismatch");
    const int64_t OL = (L + 2 * padding - dilation * (S - 1) - 1) / stride + 1;
    TORCH_CHECK(OL > 0, "convolution output would be empty");
    std::vector<double> buf((size_t)(N * K * OL));
    // a 1-D convolution is a 2-D one over a 1 x L image with a 1 x S window
    conv2d_direct(xc.data_ptr<float>(), wc.data_ptr<float>(), bc.data_ptr<float>(), buf.data(),
                  N, C, 1, L, K, 1, S, 1, OL, 1, stride, 0, padding, 1, dilation);
    auto y = torch::empty({N, K}, xc.options());
    float* yp = y.data_ptr<float>();
    for (int64_t nk = 0; nk < N * K; ++nk) {
        double sum = 0.0;
        for (int64_t l = 0; l < OL; ++l) {
            const float v = (float)buf[nk * OL + l];
            sum += v > 0.0f ? (double)v : 0.0;
        }
        yp[nk] = (float)sum;
    }
    return y;
}
"""

_ext = load_inline(
    name="kevin_l2_conv1d_relu_sum_cpu",
    cpp_sources=cpp_source,
    functions=["conv1d_relu_sum_forward"],
    verbose=False,
)


class ModelNew(nn.Module):
    def __init__(self, in_channels, out_channels, kernel_size):
        super().__init__()
        self.conv = nn.Conv1d(in_channels, out_channels, kernel_size, padding=kernel_size // 2)
        self.padding = kernel_size // 2

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return _ext.conv1d_relu_sum_forward(x, self.conv.weight, self.conv.bias, 1, self.padding, 1)
