import torch
import torch.nn as nn
import torch.nn.functional as F


class Model(nn.Module):
    """Linear layer, Swish (x * sigmoid(x)), then division by a constant."""

    def __init__(self, in_features, out_features, divisor):
        super().__init__()
        self.linear = nn.Linear(in_features, out_features)
        self.divisor = divisor

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.linear(x)
        y = y * torch.sigmoid(y)
        return y / self.divisor


batch_size = 8192
in_features = 2048
out_features = 2048
divisor = 2.5


def get_inputs():
    return [torch.randn(batch_size, in_features)]


def get_init_inputs():
    return [in_features, out_features, divisor]


KEVIN_PROFILES = {"cpu": {"batch_size": 64, "in_features": 128, "out_features": 128}}
