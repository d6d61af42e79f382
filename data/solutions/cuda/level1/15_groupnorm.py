import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

cuda_source = r"""
#include <torch/extension.h>
#include <cuda_runtime.h>

// GroupNorm on a (N, C, S...) tensor, one block per (n, group): the group's C/G channels are one
// contiguous run of (C/G)*S floats. Two-sweep statistics with double accumulators and a block tree
// reduction, then each channel's affine weight and bias are applied.
#define THREADS 1024

__device__ __forceinline__ double warp_sum(double v) {
    for (int off = 16; off > 0; off >>= 1) v += __shfl_down_sync(0xffffffffu, v, off);
    return v;
}

// Sum of v over the block, returned to every thread. sh needs THREADS / 32 + 1 slots.
__device__ double block_sum(double v, double* sh) {
    const int lane = threadIdx.x & 31, wid = threadIdx.x >> 5;
    v = warp_sum(v);
    if (lane == 0) sh[wid] = v;
    __syncthreads();
    if (wid == 0) {
        double t = lane < THREADS / 32 ? sh[lane] : 0.0;
        t = warp_sum(t);
        if (lane == 0) sh[THREADS / 32] = t;
    }
    __syncthreads();
    const double total = sh[THREADS / 32];
    __syncthreads();
    return total;
}

__global__ void groupnorm_kernel(const float* __restrict__ in, const float* __restrict__ w,
                                 const float* __restrict__ b, float* __restrict__ out,
                                 int64_t N, int64_t C, int64_t S, int64_t groups, float eps) {
    __shared__ double sh[THREADS / 32 + 1];
    const int64_t cpg = C / groups;
    const int64_t gsize = cpg * S;
    const int64_t total_groups = N * groups;
    for (int64_t ng = blockIdx.x; ng < total_groups; ng += gridDim.x) {
        const int64_t g = ng % groups;
        const float* src = in + ng * gsize;   // (n * C + g * cpg) * S == ng * gsize
        float* dst = out + ng * gsize;
        double acc = 0.0;
        for (int64_t i = threadIdx.x; i < gsize; i += THREADS) acc += (double)src[i];
        const double mean_d = block_sum(acc, sh) / (double)gsize;
        acc = 0.0;
        for (int64_t i = threadIdx.x; i < gsize; i += THREADS) {
            const double d = (double)src[i] - mean_d;
            acc += d * d;
        }
        const double var = block_sum(acc, sh) / (double)gsize;
        const double rstd = 1.0 / sqrt(var + (double)eps);
        for (int64_t k = 0; k < cpg; ++k) {
            const int64_t c = g * cpg + k;
            const float scale = (float)(rstd * (double)w[c]);
            const float shift = (float)((double)b[c] - mean_d * rstd * (double)w[c]);
            const float* p = src + k * S;
            float* q = dst + k * S;
            for (int64_t i = threadIdx.x; i < S; i += THREADS) q[i] = fmaf(p[i], scale, shift);
        }
    }
}

torch::Tensor groupnorm_forward(torch::Tensor x, torch::Tensor weight, torch::Tensor bias,
                                int64_t groups, double eps) {
    TORCH_CHECK(x.is_cuda() && x.scalar_type() == torch::kFloat32, "groupnorm_forward expects a float32 CUDA tensor");
    TORCH_CHECK(weight.is_cuda() && bias.is_cuda(), "weight and bias must be CUDA tensors");
    TORCH_CHECK(x.dim() >= 2, "groupnorm_forward expects at least 2 dimensions");
    auto xc = x.contiguous();
    auto wc = weight.contiguous();
    auto bc = bias.contiguous();
    const int64_t N = xc.size(0), C = xc.size(1);
    TORCH_CHECK(groups > 0 && C % groups == 0, "channels must be divisible by groups");
    TORCH_CHECK(wc.numel() == C && bc.numel() == C, "weight/bias size mismatch");
    auto y = torch::empty_like(xc);
    if (xc.numel() == 0) return y;
    const int64_t S = xc.numel() / (N * C);
    const int blocks = (int)std::min<int64_t>(N * groups, 1 << 20);
    groupnorm_kernel<<<blocks, THREADS>>>(xc.data_ptr<float>(), wc.data_ptr<float>(), bc.data_ptr<float>(),
                                          y.data_ptr<float>(), N, C, S, groups, (float)eps);
    return y;
}
"""

cpp_source = ("torch::Tensor groupnorm_forward(torch::Tensor x, torch::Tensor weight, torch::Tensor bias, "
              "int64_t groups, double eps);")

ext = load_inline(
    name="kevin_l1_groupnorm_cuda",
    cpp_sources=cpp_source,
    cuda_sources=cuda_source,
    functions=["groupnorm_forward"],
    verbose=False,
)


class ModelNew(nn.Module):
    def __init__(self, num_groups: int, num_channels: int):
        super().__init__()
        self.gn = nn.GroupNorm(num_groups, num_channels)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return ext.groupnorm_forward(x, self.gn.weight, self.gn.bias, self.gn.num_groups, self.gn.eps)
