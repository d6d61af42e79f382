import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

cuda_source = r"""
#include <torch/extension.h>
#include <cuda_runtime.h>

// 2D average pooling with zero padding, floor mode and count_include_pad = true: the divisor is
// the window clipped to the padded input, the sum runs over the part inside the real input.
__global__ void avgpool2d_kernel(const float* __restrict__ x, float* __restrict__ y, int64_t total,
                                 int H, int W, int OH, int OW, int kernel, int stride, int pad) {
    const int64_t step = (int64_t)gridDim.x * blockDim.x;
    for (int64_t idx = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; idx < total; idx += step) {
        const int ow = (int)(idx % OW);
        const int oh = (int)((idx / OW) % OH);
        const int64_t plane = idx / ((int64_t)OW * OH);
        const int hs = oh * stride - pad;
        const int ws = ow * stride - pad;
        const int he = min(hs + kernel, H + pad);
        const int we = min(ws + kernel, W + pad);
        const int count = (he - hs) * (we - ws);
        const int h0 = max(hs, 0), h1 = min(he, H);
        const int w0 = max(ws, 0), w1 = min(we, W);
        const float* xp = x + plane * H * W;
        float acc = 0.0f;
        for (int ih = h0; ih < h1; ++ih)
            for (int iw = w0; iw < w1; ++iw) acc += __ldg(xp + (int64_t)ih * W + iw);
        y[idx] = acc / (float)count;
    }
}

torch::Tensor avgpool2d_forward(torch::Tensor x, int64_t kernel, int64_t stride, int64_t padding) {
    TORCH_CHECK(x.is_cuda() && x.scalar_type() == torch::kFloat32 && x.dim() == 4, "float32 NCHW CUDA tensor expected");
    TORCH_CHECK(kernel >= 1 && stride >= 1 && padding >= 0, "bad kernel/stride/padding");
    auto xc = x.contiguous();
    const int64_t N = xc.size(0), C = xc.size(1), H = xc.size(2), W = xc.size(3);
    const int64_t OH = (H + 2 * padding - kernel) / stride + 1;
    const int64_t OW = (W + 2 * padding - kernel) / stride + 1;
    TORCH_CHECK(OH > 0 && OW > 0, "output would be empty");
    auto y = torch::empty({N, C, OH, OW}, xc.options());
    const int64_t total = y.numel();
    if (total == 0) return y;
    const int threads = 256;
    const int blocks = (int)std::min<int64_t>((total + threads - 1) / threads, (int64_t)1 << 20);
    avgpool2d_kernel<<<blocks, threads>>>(xc.data_ptr<float>(), y.data_ptr<float>(), total, (int)H, (int)W,
                                          (int)OH, (int)OW, (int)kernel, (int)stride, (int)padding);
    return y;
}
"""

cpp_source = "torch::Tensor avgpool2d_forward(torch::Tensor x, int64_t kernel, int64_t stride, int64_t padding);"

avgpool_ext = load_inline(
    name="kevin_l1_avgpool2d_cuda",
    cpp_sources=cpp_source,
    cuda_sources=cuda_source,
    functions=["avgpool2d_forward"],
    verbose=False,
)


class ModelNew(nn.Module):
    def __init__(self, kernel_size: int, stride: int, padding: int):
        super().__init__()
        self.kernel_size = kernel_size
        self.stride = stride
        self.padding = padding

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return avgpool_ext.avgpool2d_forward(x, self.kernel_size, self.stride, self.padding)
