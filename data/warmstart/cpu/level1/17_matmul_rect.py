import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

src = r"""
#include <torch/extension.h>
torch::Tensor run(torch::Tensor A, torch::Tensor B) {
    int M = A.size(0), K = A.size(1), N = B.size(1);
    auto C = torch::empty({M, N}, A.options());
    float *a = A.data_ptr<float>(), *b = B.data_ptr<float>(), *c = C.data_ptr<float>();
    for (int i = 0; i < M; i++)
        for (int j = 0; j < N; j++) {
            float s = 0;
            for (int k = 0; k < K; k++) s += a[i * K + k] * b[k * N + j];
            c[i * N + j] = s;
        }
    return C;
}
"""
ext = load_inline(name="ws_matmul_rect", cpp_sources=src, functions=["run"])


class ModelNew(nn.Module):
    def forward(self, A, B):
        return ext.run(A, B)
