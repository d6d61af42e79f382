import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

cpp_source = r"""
#include <torch/extension.h>
#include <vector>

torch::Tensor bmm_add_relu_forward(torch::Tensor a, torch::Tensor b, torch::Tensor bias) {
    TORCH_CHECK(a.scalar_type() == torch::kFloat32 && a.dim() == 3 && b.dim() == 3, "a, b must be 3-D float32 tensors");
    auto ac = a.contiguous();
    auto bc = b.contiguous();
    auto biasc = bias.contiguous();
    const int64_t B = ac.size(0);
    const int64_t M = ac.size(1);
    const int64_t K = ac.size(2);
    const int64_t N = bc.size(2);
    TORCH_CHECK(bc.size(0) == B && bc.size(1) == K && biasc.numel() == N, "shape mismatch");
    const float* ap = ac.data_ptr<float>();
    const float* bp = bc.data_ptr<float>();
    const float* hp = biasc.data_ptr<float>();
    auto out = torch::empty({B, M, N}, ac.options());
    float* op = out.data_ptr<float>();
    std::vector<double> acc((size_t)N);
    for (int64_t z = 0; z < B; ++z) {
        const float* az = ap + z * M * K;
        const float* bz = bp + z * K * N;
        float* oz = op + z * M * N;
        for (int64_t i = 0; i < M; ++i) {
            for (int64_t j = 0; j < N; ++j) acc[j] = 0.0;
            for (int64_t kk = 0; kk < K; ++kk) {
                const double av = (double)az[i * K + kk];
                const float* br = bz + kk * N;
                for (int64_t j = 0; j < N; ++j) acc[j] += av * (double)br[j];
            }
            for (int64_t j = 0; j < N; ++j) {
                const double v = acc[j] + (double)hp[j];
                oz[i * N + j] = (float)(v > 0.0 ? v : 0.0);
            }
        }
    }
    return out;
}
"""

bmm_add_relu_ext = load_inline(
    name="kevin_l2_bmm_add_relu_cpu",
    cpp_sources=cpp_source,
    functions=["bmm_add_relu_forward"],
    verbose=False,
)


class ModelNew(nn.Module):
    def __init__(self, n):
        super().__init__()
        self.bias = nn.Parameter(torch.randn(n) * 0.5)

    def forward(self, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        return bmm_add_relu_ext.bmm_add_relu_forward(a, b, self.bias)
