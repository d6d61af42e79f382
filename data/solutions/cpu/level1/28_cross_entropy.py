import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

cpp_source = r"""
#include <torch/extension.h>
#include <cmath>
#include <limits>

// Mean cross-entropy: for each row r with target t != ignore_index,
// loss_r = log(sum_j exp(x[r][j])) - x[r][t], computed stably with the row max, in double;
// the result is the mean over the rows that are not ignored.
torch::Tensor cross_entropy_forward(torch::Tensor logits, torch::Tensor targets, int64_t ignore_index) {
    TORCH_CHECK(logits.scalar_type() == torch::kFloat32 && logits.dim() == 2, "float32 (batch, classes) expected");
    TORCH_CHECK(targets.scalar_type() == torch::kInt64 && targets.dim() == 1 && targets.size(0) == logits.size(0),
                "int64 (batch,) targets expected");
    auto x = logits.contiguous();
    auto t = targets.contiguous();
    const int64_t B = x.size(0), C = x.size(1);
    const float* px = x.data_ptr<float>();
    const int64_t* pt = t.data_ptr<int64_t>();
    double total = 0.0;
    int64_t count = 0;
    for (int64_t r = 0; r < B; ++r) {
        const int64_t tgt = pt[r];
        if (tgt == ignore_index) continue;
        TORCH_CHECK(tgt >= 0 && tgt < C, "target out of range");
        const float* row = px + r * C;
        double m = -std::numeric_limits<double>::infinity();
        for (int64_t j = 0; j < C; ++j) m = row[j] > m ? (double)row[j] : m;
        double s = 0.0;
        for (int64_t j = 0; j < C; ++j) s += std::exp((double)row[j] - m);
        total += m + std::log(s) - (double)row[tgt];
        ++count;
    }
    auto out = torch::empty({}, x.options());
    out.data_ptr<float>()[0] = (float)(total / (double)count);
    return out;
}
"""

ce_ext = load_inline(
    name="kevin_l1_cross_entropy_cpu",
    cpp_sources=cpp_source,
    functions=["cross_entropy_forward"],
    verbose=False,
)


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        return ce_ext.cross_entropy_forward(logits, targets, -100)
