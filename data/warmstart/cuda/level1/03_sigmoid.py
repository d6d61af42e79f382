import torch.nn as nn
from torch.utils.cpp_extension import load_inline

src = r"""
#define P(t) t.data_ptr<float>()
__global__ void k(float* a, float* b, int n) {
    int i = blockIdx.x * 256 + threadIdx.x;
    if (i < n) b[i] = 1 / (1 + expf(-a[i]));
}
torch::Tensor run(torch::Tensor x) {
    auto y = torch::empty_like(x);
    int n = x.numel();
    k<<<n / 256 + 1, 256>>>(P(x), P(y), n);
    return y;
}
"""
ext = load_inline(name="wsc_sigmoid", cpp_sources="torch::Tensor run(torch::Tensor);", cuda_sources=src, functions=["run"])


class ModelNew(nn.Module):
    def forward(self, x):
        return ext.run(x)
