import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

cuda_source = r"""
#include <torch/extension.h>
#include <cuda_runtime.h>

// LogSoftmax along dim 1 of a (rows, cols) tensor, one block per row. First sweep: each thread keeps an
// online (running max, rescaled sum of exp) pair over its strided elements; pairs are merged with
// warp shuffles and then across warps in shared memory. A second sweep writes the result.
#define THREADS 512

__device__ __forceinline__ void merge_pair(float& m, float& s, float m2, float s2) {
    const float mx = fmaxf(m, m2);
    if (mx == -INFINITY) { m = mx; s = 0.0f; return; }
    s = s * expf(m - mx) + s2 * expf(m2 - mx);
    m = mx;
}

__global__ void log_softmax_kernel(const float* __restrict__ in, float* __restrict__ out,
                               int64_t rows, int64_t cols) {
    __shared__ float shm[THREADS / 32];
    __shared__ float shs[THREADS / 32];
    __shared__ float fin[2];
    const int tid = threadIdx.x, lane = tid & 31, wid = tid >> 5;
    for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
        const float* row = in + r * cols;
        float* out_row = out + r * cols;
        float m = -INFINITY, s = 0.0f;
        for (int64_t j = tid; j < cols; j += THREADS) {
            const float v = row[j];
            if (v > m) { s = s * expf(m - v) + 1.0f; m = v; }
            else { s += expf(v - m); }
        }
        for (int off = 16; off > 0; off >>= 1) {
            const float m2 = __shfl_down_sync(0xffffffffu, m, off);
            const float s2 = __shfl_down_sync(0xffffffffu, s, off);
            merge_pair(m, s, m2, s2);
        }
        if (lane == 0) { shm[wid] = m; shs[wid] = s; }
        __syncthreads();
        if (wid == 0) {
            m = lane < THREADS / 32 ? shm[lane] : -INFINITY;
            s = lane < THREADS / 32 ? shs[lane] : 0.0f;
            for (int off = 16; off > 0; off >>= 1) {
                const float m2 = __shfl_down_sync(0xffffffffu, m, off);
                const float s2 = __shfl_down_sync(0xffffffffu, s, off);
                merge_pair(m, s, m2, s2);
            }
            if (lane == 0) { fin[0] = m; fin[1] = s; }
        }
        __syncthreads();
        const float M = fin[0];
        const float S = fin[1];
        const float shift = M + logf(S);
        for (int64_t j = tid; j < cols; j += THREADS) {
            out_row[j] = row[j] - shift;
        }
        __syncthreads();  // fin/shm are reused by the next row
    }
}

torch::Tensor log_softmax_forward(torch::Tensor x) {
    TORCH_CHECK(x.is_cuda() && x.scalar_type() == torch::kFloat32, "log_softmax_forward expects a float32 CUDA tensor");
    TORCH_CHECK(x.dim() == 2, "log_softmax_forward expects a 2D tensor");
    auto xc = x.contiguous();
    auto y = torch::empty_like(xc);
    const int64_t rows = xc.size(0), cols = xc.size(1);
    if (rows == 0 || cols == 0) return y;
    const int blocks = (int)std::min<int64_t>(rows, 1 << 20);
    log_softmax_kernel<<<blocks, THREADS>>>(xc.data_ptr<float>(), y.data_ptr<float>(), rows, cols);
    return y;
}
"""

cpp_source = "torch::Tensor log_softmax_forward(torch::Tensor x);"

ext = load_inline(
    name="kevin_l1_log_softmax_cuda",
    cpp_sources=cpp_source,
    cuda_sources=cuda_source,
    functions=["log_softmax_forward"],
    verbose=False,
)


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return ext.log_softmax_forward(x)
