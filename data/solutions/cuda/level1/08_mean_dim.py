import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

cuda_source = r"""
#include <torch/extension.h>
#include <cuda_runtime.h>
#include <vector>

// Mean over the last dimension: one warp per row; lanes read consecutive elements (coalesced),
// accumulate in double and combine with warp shuffles.
#define WARPS_PER_BLOCK 8

__global__ void mean_last_kernel(const float* __restrict__ in, float* __restrict__ out,
                                 int64_t rows, int64_t L) {
    const int lane = threadIdx.x & 31;
    const int64_t warp = (int64_t)blockIdx.x * WARPS_PER_BLOCK + (threadIdx.x >> 5);
    const int64_t nwarps = (int64_t)gridDim.x * WARPS_PER_BLOCK;
    for (int64_t r = warp; r < rows; r += nwarps) {
        const float* row = in + r * L;
        double acc = 0.0;
        for (int64_t j = lane; j < L; j += 32) acc += (double)row[j];
        for (int off = 16; off > 0; off >>= 1) acc += __shfl_down_sync(0xffffffffu, acc, off);
        if (lane == 0) out[r] = (float)(acc / (double)L);
    }
}

torch::Tensor mean_last_forward(torch::Tensor x) {
    TORCH_CHECK(x.is_cuda() && x.scalar_type() == torch::kFloat32, "mean_last_forward expects a float32 CUDA tensor");
    TORCH_CHECK(x.dim() >= 1, "mean_last_forward expects at least 1 dimension");
    auto xc = x.contiguous();
    const int64_t L = xc.size(xc.dim() - 1);
    std::vector<int64_t> out_shape(xc.sizes().begin(), xc.sizes().end() - 1);
    auto y = torch::empty(out_shape, xc.options());
    const int64_t rows = y.numel();
    if (rows == 0) return y;
    const int threads = WARPS_PER_BLOCK * 32;
    const int blocks = (int)std::min<int64_t>((rows + WARPS_PER_BLOCK - 1) / WARPS_PER_BLOCK, 1 << 20);
    mean_last_kernel<<<blocks, threads>>>(xc.data_ptr<float>(), y.data_ptr<float>(), rows, L);
    return y;
}
"""

cpp_source = "torch::Tensor mean_last_forward(torch::Tensor x);"

ext = load_inline(
    name="kevin_l1_mean_dim_cuda",
    cpp_sources=cpp_source,
    cuda_sources=cuda_source,
    functions=["mean_last_forward"],
    verbose=False,
)


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return ext.mean_last_forward(x)
