import torch.nn as nn
from torch.utils.cpp_extension import load_inline

src = """
#define P(t) t.data_ptr<float>()
__global__ void k(float* X, float* W, float* B, float* Y, int K, int N, float s) {
    for (int i = blockIdx.x, j = threadIdx.x; j < N; j += 64) {
        float v = B[j];
        for (int t = 0; t < K; t++) v += X[i * K + t] * W[j * K + t];
        Y[i * N + j] = 0.5f * v * (1 + erff(v * 0.70710678f)) * s;
    }
}
torch::Tensor run(torch::Tensor x, torch::Tensor w, torch::Tensor b, double s) {
    int M = x.size(0), K = x.size(1), N = w.size(0);
    auto y = torch::empty({M, N}, x.options());
    k<<<M, 64>>>(P(x), P(w), P(b), P(y), K, N, s);
    return y;
}
"""
ext = load_inline(name="wsc2_gelu_scale", cpp_sources="torch::Tensor run(torch::Tensor, torch::Tensor, torch::Tensor, double);", cuda_sources=src, functions=["run"])


class ModelNew(nn.Module):
    def __init__(self, in_features, out_features, scale):
        super().__init__()
        self.linear = nn.Linear(in_features, out_features)
        self.scale = scale

    def forward(self, x):
        return ext.run(x, self.linear.weight, self.linear.bias, self.scale)
