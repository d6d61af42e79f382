import torch.nn as nn
from torch.utils.cpp_extension import load_inline

src = r"""
#define P(t) t.data_ptr<float>()
__global__ void k(float* a, float* b, float s, int n) {
    int i = blockIdx.x * 256 + threadIdx.x;
    if (i < n) b[i] = a[i] > 0 ? a[i] : a[i] * s;
}
torch::Tensor run(torch::Tensor x, double s) {
    auto y = torch::empty_like(x);
    int n = x.numel();
    k<<<n / 256 + 1, 256>>>(P(x), P(y), s, n);
    return y;
}
"""
ext = load_inline(name="wsc_leaky_relu", cpp_sources="torch::Tensor run(torch::Tensor, double);", cuda_sources=src, functions=["run"])


class ModelNew(nn.Module):
    def __init__(self, negative_slope=0.01):
        super().__init__()
        self.negative_slope = negative_slope

    def forward(self, x):
        return ext.run(x, self.negative_slope)
