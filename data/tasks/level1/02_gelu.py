import torch
import torch.nn as nn
import torch.nn.functional as F


class Model(nn.Module):
    """Applies the exact (erf-based) GELU activation elementwise."""

    def __init__(self):
        super().__init__()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.gelu(x)


batch_size = 8192
dim = 16384


def get_inputs():
    return [torch.randn(batch_size, dim)]


def get_init_inputs():
    return []


KEVIN_PROFILES = {"cpu": {"batch_size": 64, "dim": 4096}}
