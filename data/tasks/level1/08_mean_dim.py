import torch
import torch.nn as nn


class Model(nn.Module):
    """Takes the mean of a 3D tensor over its last dimension (the dimension is dropped)."""

    def __init__(self):
        super().__init__()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.mean(x, dim=-1)


batch_size = 64
dim1 = 4096
dim2 = 512


def get_inputs():
    return [torch.randn(batch_size, dim1, dim2)]


def get_init_inputs():
    return []


KEVIN_PROFILES = {"cpu": {"batch_size": 8, "dim1": 128, "dim2": 256}}
