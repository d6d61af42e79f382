import torch
import torch.nn as nn
import torch.nn.functional as F


class Model(nn.Module):
    """Linear layer, then logsumexp over each contiguous group of features: output (batch, num_groups)."""

    def __init__(self, in_features, out_features, num_groups):
        super().__init__()
        self.linear = nn.Linear(in_features, out_features)
        self.num_groups = num_groups

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.linear(x)
        return torch.logsumexp(y.reshape(y.shape[0], self.num_groups, -1), dim=2)


batch_size = 4096
in_features = 2048
out_features = 4096
num_groups = 64


def get_inputs():
    return [torch.randn(batch_size, in_features)]


def get_init_inputs():
    return [in_features, out_features, num_groups]


KEVIN_PROFILES = {"cpu": {"batch_size": 32, "in_features": 128, "out_features": 256, "num_groups": 16}}
