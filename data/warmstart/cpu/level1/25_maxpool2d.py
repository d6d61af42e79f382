import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

src = r"""
#include <torch/extension.h>
torch::Tensor run(torch::Tensor x, int k, int64_t s) {
    int P = x.size(0) * x.size(1), H = x.size(2), W = x.size(3);
    int OH = (H - k) / s + 1, OW = (W - k) / s + 1;
    auto y = torch::empty({x.size(0), x.size(1), OH, OW}, x.options());
    float *a = x.data_ptr<float>(), *b = y.data_ptr<float>();
    for (int p = 0; p < P; p++)
        for (int i = 0; i < OH; i++)
            for (int j = 0; j < OW; j++) {
                float m = -INFINITY;
                for (int u = 0; u < k; u++)
                    for (int v = 0; v < k; v++) m = std::max(m, a[(p * H + i * s + u) * W + j * s + v]);
                b[(p * OH + i) * OW + j] = m;
            }
    return y;
}
"""
ext = load_inline(name="ws_maxpool2d", cpp_sources=src, functions=["run"])


class ModelNew(nn.Module):
    def __init__(self, kernel_size, stride):
        super().__init__()
        self.k = kernel_size
        self.s = stride

    def forward(self, x):
        return ext.run(x, self.k, self.s)
