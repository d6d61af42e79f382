import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

src = """
#define P(t) t.data_ptr<float>()
__global__ void k(float* A, float* B, float* E, float* C, int M, int K, int N) {
    for (int i = blockIdx.x, j = threadIdx.x; j < N; j += 64) {
        float v = E[j], *b = B + i / M * K * N;
        for (int t = 0; t < K; t++) v += A[i * K + t] * b[t * N + j];
        C[i * N + j] = fmaxf(v, 0.f);
    }
}
torch::Tensor run(torch::Tensor a, torch::Tensor b, torch::Tensor e) {
    int L = a.size(0), M = a.size(1), K = a.size(2), N = b.size(2);
    auto c = torch::empty({L, M, N}, a.options());
    k<<<L * M, 64>>>(P(a), P(b), P(e), P(c), M, K, N);
    return c;
}
"""
ext = load_inline(name="wsc2_bmm_add_relu", cpp_sources="torch::Tensor run(torch::Tensor, torch::Tensor, torch::Tensor);", cuda_sources=src, functions=["run"])


class ModelNew(nn.Module):
    def __init__(self, n):
        super().__init__()
        self.bias = nn.Parameter(torch.randn(n) * 0.5)

    def forward(self, a, b):
        return ext.run(a, b, self.bias)
