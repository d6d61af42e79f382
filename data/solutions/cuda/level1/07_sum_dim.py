import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

cuda_source = r"""
#include <torch/extension.h>
#include <cuda_runtime.h>
#include <vector>

// The input is viewed as (outer, R, inner); the sum runs over R. A block of (TX x TY) threads
// covers TX consecutive inner positions (coalesced loads); its TY rows of threads split R, each
// accumulating in double, and a shared-memory tree combines the TY partial sums.
#define TX 32
#define TY 16

__global__ void sum_mid_kernel(const float* __restrict__ in, float* __restrict__ out,
                               int64_t outer, int64_t R, int64_t inner) {
    __shared__ double sh[TY][TX + 1];
    const int tx = threadIdx.x, ty = threadIdx.y;
    const int64_t j = (int64_t)blockIdx.x * TX + tx;
    for (int64_t o = blockIdx.y; o < outer; o += gridDim.y) {
        double acc = 0.0;
        if (j < inner) {
            const float* p = in + o * R * inner + j;
            for (int64_t r = ty; r < R; r += TY) acc += (double)p[r * inner];
        }
        sh[ty][tx] = acc;
        __syncthreads();
        for (int s = TY / 2; s > 0; s >>= 1) {
            if (ty < s) sh[ty][tx] += sh[ty + s][tx];
            __syncthreads();
        }
        if (ty == 0 && j < inner) out[o * inner + j] = (float)sh[0][tx];
        __syncthreads();
    }
}

torch::Tensor sum_dim_forward(torch::Tensor x, int64_t dim) {
    TORCH_CHECK(x.is_cuda() && x.scalar_type() == torch::kFloat32, "sum_dim_forward expects a float32 CUDA tensor");
    auto xc = x.contiguous();
    const int64_t nd = xc.dim();
    if (dim < 0) dim += nd;
    TORCH_CHECK(dim >= 0 && dim < nd, "dim out of range");
    int64_t outer = 1, inner = 1;
    for (int64_t d = 0; d < dim; ++d) outer *= xc.size(d);
    for (int64_t d = dim + 1; d < nd; ++d) inner *= xc.size(d);
    const int64_t R = xc.size(dim);
    std::vector<int64_t> out_shape(xc.sizes().begin(), xc.sizes().end());
    out_shape[dim] = 1;
    auto y = torch::empty(out_shape, xc.options());
    if (outer == 0 || inner == 0) return y;
    dim3 block(TX, TY);
    dim3 grid((unsigned)((inner + TX - 1) / TX), (unsigned)std::min<int64_t>(outer, 65535));
    sum_mid_kernel<<<grid, block>>>(xc.data_ptr<float>(), y.data_ptr<float>(), outer, R, inner);
    return y;
}
"""

cpp_source = "torch::Tensor sum_dim_forward(torch::Tensor x, int64_t dim);"

ext = load_inline(
    name="kevin_l1_sum_dim_cuda",
    cpp_sources=cpp_source,
    cuda_sources=cuda_source,
    functions=["sum_dim_forward"],
    verbose=False,
)


class ModelNew(nn.Module):
    def __init__(self, dim: int):
        super().__init__()
        self.dim = dim

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return ext.sum_dim_forward(x, self.dim)
