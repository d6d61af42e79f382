import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

cpp_source = r"""
#include <torch/extension.h>

// Direct 2D convolution (groups = 1, dilation = 1) with zero padding and bias.
// x: (N, C, H, W), w: (OC, C, KH, KW), b: (OC). Accumulates in double.
torch::Tensor conv2d_forward(torch::Tensor x, torch::Tensor w, torch::Tensor b, int64_t stride, int64_t padding) {
    TORCH_CHECK(x.scalar_type() == torch::kFloat32, "float32 expected");
    TORCH_CHECK(x.dim() == 4 && w.dim() == 4 && x.size(1) == w.size(1), "shape mismatch");
    auto xc = x.contiguous();
    auto wc = w.contiguous();
    auto bc = b.contiguous();
    const int64_t N = xc.size(0), C = xc.size(1), H = xc.size(2), W = xc.size(3);
    const int64_t OC = wc.size(0), KH = wc.size(2), KW = wc.size(3);
    const int64_t OH = (H + 2 * padding - KH) / stride + 1;
    const int64_t OW = (W + 2 * padding - KW) / stride + 1;
    auto y = torch::empty({N, OC, OH, OW}, xc.options());
    const float* px = xc.data_ptr<float>();
    const float* pw = wc.data_ptr<float>();
    const float* pb = bc.data_ptr<float>();
    float* py = y.data_ptr<float>();
    for (int64_t n = 0; n < N; ++n) {
        for (int64_t oc = 0; oc < OC; ++oc) {
            for (int64_t oh = 0; oh < OH; ++oh) {
                for (int64_t ow = 0; ow < OW; ++ow) {
                    double acc = pb[oc];
                    for (int64_t c = 0; c < C; ++c) {
                        const float* xp = px + (n * C + c) * H * W;
                        const float* wp = pw + (oc * C + c) * KH * KW;
                        for (int64_t kh = 0; kh < KH; ++kh) {
                            const int64_t ih = oh * stride - padding + kh;
                            if (ih < 0 || ih >= H) continue;
                            for (int64_t kw = 0; kw < KW; ++kw) {
                                const int64_t iw = ow * stride - padding + kw;
                                if (iw < 0 || iw >= W) continue;
                                acc += (double)xp[ih * W + iw] * (double)wp[kh * KW + kw];
                            }
                        }
                    }
                    py[((n * OC + oc) * OH + oh) * OW + ow] = (float)acc;
                }
            }
        }
    }
    return y;
}
"""

conv2d_ext = load_inline(
    name="kevin_l1_conv2d_cpu",
    cpp_sources=cpp_source,
    functions=["conv2d_forward"],
    verbose=False,
)


class ModelNew(nn.Module):
    def __init__(self, in_channels: int, out_channels: int, kernel_size: int, stride: int, padding: int):
        super().__init__()
        self.conv = nn.Conv2d(in_channels, out_channels, kernel_size, stride=stride, padding=padding, bias=True)
        self.stride = stride
        self.padding = padding

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return conv2d_ext.conv2d_forward(x, self.conv.weight, self.conv.bias, self.stride, self.padding)
