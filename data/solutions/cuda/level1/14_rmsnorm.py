import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

cuda_source = r"""
#include <torch/extension.h>
#include <cuda_runtime.h>

// RMS normalization over dim 1 of a (B, C, S...) tensor. One thread per (b, s) position: it walks
// the C channels (stride S, so neighbouring threads read neighbouring addresses), sums squares,
// then rescales the same C values.
__global__ void rmsnorm_kernel(const float* __restrict__ in, float* __restrict__ out,
                               int64_t B, int64_t C, int64_t S, float eps) {
    const int64_t total = B * S;
    const int64_t stride = (int64_t)gridDim.x * blockDim.x;
    for (int64_t idx = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; idx < total; idx += stride) {
        const int64_t b = idx / S;
        const int64_t s = idx - b * S;
        const int64_t base = b * C * S + s;
        float acc = 0.0f;
        for (int64_t c = 0; c < C; ++c) {
            const float v = in[base + c * S];
            acc = fmaf(v, v, acc);
        }
        const float inv = 1.0f / sqrtf(acc / (float)C + eps);
        for (int64_t c = 0; c < C; ++c) out[base + c * S] = in[base + c * S] * inv;
    }
}

torch::Tensor rmsnorm_forward(torch::Tensor x, double eps) {
    TORCH_CHECK(x.is_cuda() && x.scalar_type() == torch::kFloat32, "rmsnorm_forward expects a float32 CUDA tensor");
    TORCH_CHECK(x.dim() >= 2, "rmsnorm_forward expects at least 2 dimensions");
    auto xc = x.contiguous();
    auto y = torch::empty_like(xc);
    const int64_t B = xc.size(0), C = xc.size(1);
    if (xc.numel() == 0) return y;
    const int64_t S = xc.numel() / (B * C);
    const int threads = 256;
    const int blocks = (int)std::min<int64_t>((B * S + threads - 1) / threads, 1 << 20);
    rmsnorm_kernel<<<blocks, threads>>>(xc.data_ptr<float>(), y.data_ptr<float>(), B, C, S, (float)eps);
    return y;
}
"""

cpp_source = "torch::Tensor rmsnorm_forward(torch::Tensor x, double eps);"

ext = load_inline(
    name="kevin_l1_rmsnorm_cuda",
    cpp_sources=cpp_source,
    cuda_sources=cuda_source,
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
