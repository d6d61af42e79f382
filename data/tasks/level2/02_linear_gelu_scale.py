import torch
import torch.nn as nn
import torch.nn.functional as F


class Model(nn.Module):
    """Linear layer, exact (erf) GELU, then multiplication by a constant factor."""

    def __init__(self, in_features, out_features, scale):
        super().__init__()
        self.linear = nn.Linear(in_features, out_features)
        self.scale = scale

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.gelu(self.linear(x)) * self.scale


batch_size = 4096
in_features = 2048
out_features = 4096
scale = 1.7


def get_inputs():
    return [torch.randn(batch_size, in_features)]


def get_init_inputs():
    return [in_features, out_features, scale]


KEVIN_PROFILES = {"cpu": {"batch_size": 48, "in_features": 96, "out_features": 160}}
