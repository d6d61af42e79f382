import torch
import torch.nn as nn
import torch.nn.functional as F


class Model(nn.Module):
    """Square matmul with a learned weight, plus a scaled residual of the input: x @ W + x * scale."""

    def __init__(self, dim, scale):
        super().__init__()
        self.weight = nn.Parameter(torch.randn(dim, dim) * dim ** -0.5)
        self.scale = scale

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.matmul(x, self.weight) + x * self.scale


batch_size = 2048
dim = 4096
scale = 0.5


def get_inputs():
    return [torch.randn(batch_size, dim)]


def get_init_inputs():
    return [dim, scale]


KEVIN_PROFILES = {"cpu": {"batch_size": 32, "dim": 192}}
