import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

src = r"""
#include <torch/extension.h>
torch::Tensor run(torch::Tensor x, int k, int64_t s, int pd) {
    int P = x.size(0) * x.size(1), H = x.size(2), W = x.size(3);
    int OH = (H + 2 * pd - k) / s + 1, OW = (W + 2 * pd - k) / s + 1;
    auto y = torch::empty({x.size(0), x.size(1), OH, OW}, x.options());
    float *a = x.data_ptr<float>(), *b = y.data_ptr<float>();
    for (int p = 0; p < P; p++)
        for (int i = 0; i < OH; i++)
            for (int j = 0; j < OW; j++) {
                float t = 0;
                for (int h = i * s - pd; h < i * s - pd + k; h++)
                    for (int w = j * s - pd; w < j * s - pd + k; w++)
                        if (h >= 0 && h < H && w >= 0 && w < W) t += a[(p * H + h) * W + w];
                b[(p * OH + i) * OW + j] = t / (k * k);
            }
    return y;
}
"""
ext = load_inline(name="ws_avgpool2d", cpp_sources=src, functions=["run"])


class ModelNew(nn.Module):
    def __init__(self, kernel_size, stride, padding):
        super().__init__()
        self.args = (kernel_size, stride, padding)

    def forward(self, x):
        return ext.run(x, *self.args)
