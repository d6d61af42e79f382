import torch
import torch.nn as nn
import torch.nn.functional as F


class Model(nn.Module):
    """Linear layer, multiplication by an inverse temperature, then softmax over the features."""

    def __init__(self, in_features, out_features, scale):
        super().__init__()
        self.linear = nn.Linear(in_features, out_features)
        self.scale = scale

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.softmax(self.linear(x) * self.scale, dim=1)


batch_size = 4096
in_features = 2048
out_features = 2048
scale = 4.0


def get_inputs():
    return [torch.randn(batch_size, in_features)]


def get_init_inputs():
    return [in_features, out_features, scale]


KEVIN_PROFILES = {"cpu": {"batch_size": 32, "in_features": 128, "out_features": 200}}
