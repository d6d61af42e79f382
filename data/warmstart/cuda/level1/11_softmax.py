import torch.nn as nn
from torch.utils.cpp_extension import load_inline

src = r"""
#define P(t) t.data_ptr<float>()
__global__ void k(float* x, float* y, int D) {
    float *a = x + blockIdx.x * D, *b = y + blockIdx.x * D, m = a[0], s = 0;
    for (int j = 0; j < D; j++) m = fmaxf(m, a[j]);
    for (int j = 0; j < D; j++) s += b[j] = expf(a[j] - m);
    for (int j = 0; j < D; j++) b[j] /= s;
}
torch::Tensor run(torch::Tensor x) {
    auto y = torch::empty_like(x);
    k<<<x.size(0), 1>>>(P(x), P(y), x.size(1));
    return y;
}
"""
ext = load_inline(name="wsc_softmax", cpp_sources="torch::Tensor run(torch::Tensor);", cuda_sources=src, functions=["run"])


class ModelNew(nn.Module):
    def forward(self, x):
        return ext.run(x)
