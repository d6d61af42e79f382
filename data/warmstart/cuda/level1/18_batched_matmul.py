import torch.nn as nn
from torch.utils.cpp_extension import load_inline

src = r"""
#define P(t) t.data_ptr<float>()
__global__ void k(float* a, float* b, float* c, int M, int K, int N, int n) {
    int i = blockIdx.x * 256 + threadIdx.x;
    if (i >= n) return;
    double s = 0;
    for (int t = 0; t < K; t++) s += a[i / N * K + t] * b[(i / N / M * K + t) * N + i % N];
    c[i] = s;
}
torch::Tensor run(torch::Tensor A, torch::Tensor B) {
    int M = A.size(1), K = A.size(2), N = B.size(2), n = A.size(0) * M * N;
    auto C = torch::empty({A.size(0), M, N}, A.options());
    k<<<n / 256 + 1, 256>>>(P(A), P(B), P(C), M, K, N, n);
    return C;
}
"""
ext = load_inline(name="wsc_batched_matmul", cpp_sources="torch::Tensor run(torch::Tensor, torch::Tensor);", cuda_sources=src, functions=["run"])


class ModelNew(nn.Module):
    def forward(self, A, B):
        return ext.run(A, B)
