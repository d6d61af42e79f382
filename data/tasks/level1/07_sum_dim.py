import torch
import torch.nn as nn


class Model(nn.Module):
    """Sums a 3D tensor over dimension `dim` (1 here), keeping that dimension with size 1."""

    def __init__(self, dim: int):
        super().__init__()
        self.dim = dim

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.sum(x, dim=self.dim, keepdim=True)


batch_size = 64
dim1 = 4096
dim2 = 512
reduce_dim = 1


def get_inputs():
    return [torch.randn(batch_size, dim1, dim2)]


def get_init_inputs():
    return [reduce_dim]


KEVIN_PROFILES = {"cpu": {"batch_size": 8, "dim1": 256, "dim2": 128}}
