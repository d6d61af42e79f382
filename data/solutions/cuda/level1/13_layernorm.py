import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

cuda_source = r"""
#include <torch/extension.h>
#include <cuda_runtime.h>

// LayerNorm over the trailing N = weight.numel() elements of each row, one block per row.
// Two-sweep statistics (mean, then mean of squared deviations) with double accumulators and a
// block tree reduction (warp shuffles, then across warps in shared memory); a third sweep applies
// the normalization and the affine weight and bias.
#define THREADS 512

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

__global__ void layernorm_kernel(const float* __restrict__ in, const float* __restrict__ w,
                                 const float* __restrict__ b, float* __restrict__ out,
                                 int64_t rows, int64_t N, float eps) {
    __shared__ double sh[THREADS / 32 + 1];
    for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
        const float* row = in + r * N;
        float* dst = out + r * N;
        double acc = 0.0;
        for (int64_t j = threadIdx.x; j < N; j += THREADS) acc += (double)row[j];
        const double mean_d = block_sum(acc, sh) / (double)N;
        const float mean = (float)mean_d;
        acc = 0.0;
        for (int64_t j = threadIdx.x; j < N; j += THREADS) {
            const double d = (double)row[j] - mean_d;
            acc += d * d;
        }
        const double var = block_sum(acc, sh) / (double)N;
        const float rstd = (float)(1.0 / sqrt(var + (double)eps));
        for (int64_t j = threadIdx.x; j < N; j += THREADS)
            dst[j] = (row[j] - mean) * rstd * w[j] + b[j];
    }
}

torch::Tensor layernorm_forward(torch::Tensor x, torch::Tensor weight, torch::Tensor bias, double eps) {
    TORCH_CHECK(x.is_cuda() && x.scalar_type() == torch::kFloat32, "layernorm_forward expects a float32 CUDA tensor");
    TORCH_CHECK(weight.is_cuda() && bias.is_cuda(), "weight and bias must be CUDA tensors");
    auto xc = x.contiguous();
    auto wc = weight.contiguous();
    auto bc = bias.contiguous();
    const int64_t N = wc.numel();
    TORCH_CHECK(N > 0 && xc.numel() % N == 0, "normalized size does not divide the input");
    TORCH_CHECK(bc.numel() == N, "bias size mismatch");
    const int64_t rows = xc.numel() / N;
    auto y = torch::empty_like(xc);
    if (rows == 0) return y;
    const int blocks = (int)std::min<int64_t>(rows, 1 << 20);
    layernorm_kernel<<<blocks, THREADS>>>(xc.data_ptr<float>(), wc.data_ptr<float>(), bc.data_ptr<float>(),
                                          y.data_ptr<float>(), rows, N, (float)eps);
    return y;
}
"""

cpp_source = "torch::Tensor layernorm_forward(torch::Tensor x, torch::Tensor weight, torch::Tensor bias, double eps);"

ext = load_inline(
    name="kevin_l1_layernorm_cuda",
    cpp_sources=cpp_source,
    cuda_sources=cuda_source,
    functions=["layernorm_forward"],
    verbose=False,
)


class ModelNew(nn.Module):
    def __init__(self, normalized_shape: tuple):
        super().__init__()
        self.ln = nn.LayerNorm(normalized_shape)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return ext.layernorm_forward(x, self.ln.weight, self.ln.bias, self.ln.eps)
