import torch.nn as nn
from torch.utils.cpp_extension import load_inline

src = r"""
#define P(t) t.data_ptr<float>()
__global__ void k(float* a, float* b, int D) {
    double s = 0;
    for (int j = blockIdx.x * D; j < blockIdx.x * D + D; j++) b[j] = s += a[j];
}
torch::Tensor run(torch::Tensor x) {
    auto y = torch::empty_like(x);
    k<<<x.size(0), 1>>>(P(x), P(y), x.size(1));
    return y;
}
"""
ext = load_inline(name="wsc_cumsum", cpp_sources="torch::Tensor run(torch::Tensor);", cuda_sources=src, functions=["run"])


class ModelNew(nn.Module):
    def forward(self, x):
        return ext.run(x)
