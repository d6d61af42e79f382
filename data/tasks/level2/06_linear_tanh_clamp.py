import torch
import torch.nn as nn
import torch.nn.functional as F


class Model(nn.Module):
    """Linear layer, tanh, then clamping into [clamp_min, clamp_max]."""

    def __init__(self, in_features, out_features, clamp_min, clamp_max):
        super().__init__()
        self.linear = nn.Linear(in_features, out_features)
        self.clamp_min = clamp_min
        self.clamp_max = clamp_max

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.clamp(torch.tanh(self.linear(x)), min=self.clamp_min, max=self.clamp_max)


batch_size = 1024
in_features = 8192
out_features = 4096
clamp_min = -0.4
clamp_max = 0.6


def get_inputs():
    return [torch.randn(batch_size, in_features)]


def get_init_inputs():
    return [in_features, out_features, clamp_min, clamp_max]


KEVIN_PROFILES = {"cpu": {"batch_size": 40, "in_features": 256, "out_features": 96}}
