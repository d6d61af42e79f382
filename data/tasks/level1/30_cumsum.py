import torch
import torch.nn as nn


class Model(nn.Module):
    """Inclusive prefix sum (cumulative sum) along dimension 1 of a 2D tensor."""

    def __init__(self):
        super().__init__()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.cumsum(x, dim=1)


batch_size = 32768
length = 4096


def get_inputs():
    # Non-negative inputs: with zero-mean inputs the running sums pass close to zero, where
    # float32 rounding inside the reference's own GPU scan already exceeds the 1e-4 tolerance.
    return [torch.rand(batch_size, length)]


def get_init_inputs():
    return []


KEVIN_PROFILES = {"cpu": {"batch_size": 64, "length": 4096}}
