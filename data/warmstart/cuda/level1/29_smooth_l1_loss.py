import torch.nn as nn
from torch.utils.cpp_extension import load_inline

src = r"""
#define P(t) t.data_ptr<float>()
__global__ void k(float* a, float* b, float* y, int n) {
    int i = (blockIdx.x * 256 + threadIdx.x) * 1024;
    if (i >= n) return;
    double s = 0;
    for (int j = i; j < min(i + 1024, n); j++) {
        float d = fabsf(a[j] - b[j]);
        s += d < 1 ? 0.5f * d * d : d - 0.5f;
    }
    atomicAdd(y, (float)(s / n));
}
torch::Tensor run(torch::Tensor p, torch::Tensor t) {
    auto y = torch::zeros({}, p.options());
    int n = p.numel();
    k<<<n / 262144 + 1, 256>>>(P(p), P(t), P(y), n);
    return y;
}
"""
ext = load_inline(name="wsc_smooth_l1_loss", cpp_sources="torch::Tensor run(torch::Tensor, torch::Tensor);", cuda_sources=src, functions=["run"])


class ModelNew(nn.Module):
    def forward(self, predictions, targets):
        return ext.run(predictions, targets)
