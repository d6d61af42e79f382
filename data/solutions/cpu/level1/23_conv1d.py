import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

cpp_source = r"""
#include <torch/extension.h>

// 1D convolution with bias, x: (N, C, L), w: (OC, C, K), b: (OC). Double accumulation.
torch::Tensor conv1d_forward(torch::Tensor x, torch::Tensor w, torch::Tensor b, int64_t stride, int64_t padding) {
    TORCH_CHECK(x.scalar_type() == torch::kFloat32, "float32 expected");
    TORCH_CHECK(x.dim() == 3 && w.dim() == 3 && x.size(1) == w.size(1), "shape mismatch");
    auto xc = x.contiguous();
    auto wc = w.contiguous();
    auto bc = b.contiguous();
    const int64_t N = xc.size(0), C = xc.size(1), L = xc.size(2);
    const int64_t OC = wc.size(0), KS = wc.size(2);
    const int64_t OL = (L + 2 * padding - KS) / stride + 1;
    auto y = torch::empty({N, OC, OL}, xc.options());
    const float* px = xc.data_ptr<float>();
    const float* pw = wc.data_ptr<float>();
    const float* pb = bc.data_ptr<float>();
    float* py = y.data_ptr<float>();
    for (int64_t n = 0; n < N; ++n) {
        for (int64_t oc = 0; oc < OC; ++oc) {
            float* yp = py + (n * OC + oc) * OL;
            for (int64_t o = 0; o < OL; ++o) {
                double acc = pb[oc];
                for (int64_t c = 0; c < C; ++c) {
                    const float* xp = px + (n * C + c) * L;
                    const float* wp = pw + (oc * C + c) * KS;
                    for (int64_t k = 0; k < KS; ++k) {
                        const int64_t i = o * stride - padding + k;
                        if (i < 0 || i >= L) continue;
                        acc += (double)xp[i] * (double)wp[k];
                    }
                }
                yp[o] = (float)acc;
            }
        }
    }
    return y;
}
"""

conv1d_ext = load_inline(
    name="kevin_l1_conv1d_cpu",
    cpp_sources=cpp_source,
    functions=["conv1d_forward"],
    verbose=False,
)


class ModelNew(nn.Module):
    def __init__(self, in_channels: int, out_channels: int, kernel_size: int):
        super().__init__()
        self.conv = nn.Conv1d(in_channels, out_channels, kernel_size, stride=1, padding=0, bias=True)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return conv1d_ext.conv1d_forward(x, self.conv.weight, self.conv.bias, 1, 0)
