import torch
import torch.nn as nn
import torch.nn.functional as F


class Model(nn.Module):
    """Linear layer, GroupNorm over groups of features (learned affine), then Swish."""

    def __init__(self, in_features, out_features, num_groups):
        super().__init__()
        self.linear = nn.Linear(in_features, out_features)
        self.norm = nn.GroupNorm(num_groups, out_features)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.norm(self.linear(x))
        return y * torch.sigmoid(y)


batch_size = 2048
in_features = 4096
out_features = 4096
num_groups = 32


def get_inputs():
    return [torch.randn(batch_size, in_features)]


def get_init_inputs():
    return [in_features, out_features, num_groups]


KEVIN_PROFILES = {"cpu": {"batch_size": 32, "in_features": 128, "out_features": 256, "num_groups": 16}}
