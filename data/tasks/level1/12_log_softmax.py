import torch
import torch.nn as nn


class Model(nn.Module):
    """LogSoftmax over dimension 1 of a (batch, dim) tensor."""

    def __init__(self):
        super().__init__()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.log_softmax(x, dim=1)


batch_size = 4096
dim = 32768


def get_inputs():
    return [torch.randn(batch_size, dim)]


def get_init_inputs():
    return []


KEVIN_PROFILES = {"cpu": {"batch_size": 64, "dim": 2048}}
