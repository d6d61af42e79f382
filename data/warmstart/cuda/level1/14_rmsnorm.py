import torch.nn as nn
from torch.utils.cpp_extension import load_inline

src = r"""
#define P(t) t.data_ptr<float>()
__global__ void k(float* x, float* y, int C, int N, float e, int n) {
    int i = blockIdx.x * 256 + threadIdx.x;
    if (i >= n) return;
    float* a = x + i / N / C * C * N + i % N;
    double s = 0;
    for (int c = 0; c < C; c++) s += a[c * N] * a[c * N];
    y[i] = x[i] / sqrtf(s / C + e);
}
torch::Tensor run(torch::Tensor x, double e) {
    auto y = torch::empty_like(x);
    int n = x.numel();
    k<<<n / 256 + 1, 256>>>(P(x), P(y), x.size(1), x.size(2) * x.size(3), e, n);
    return y;
}
"""
ext = load_inline(name="wsc_rmsnorm", cpp_sources="torch::Tensor run(torch::Tensor, double);", cuda_sources=src, functions=["run"])


class ModelNew(nn.Module):
    def __init__(self, num_features, eps=1e-5):
        super().__init__()
        self.eps = eps

    def forward(self, x):
        return ext.run(x, self.eps)
