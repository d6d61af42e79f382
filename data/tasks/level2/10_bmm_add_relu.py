import torch
import torch.nn as nn
import torch.nn.functional as F


class Model(nn.Module):
    """Batched matmul, plus a learned bias over the last dimension, then ReLU."""

    def __init__(self, n):
        super().__init__()
        self.bias = nn.Parameter(torch.randn(n) * 0.5)

    def forward(self, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        return torch.relu(torch.bmm(a, b) + self.bias)


batch = 16
m = 1024
k = 1024
n = 2048


def get_inputs():
    return [torch.randn(batch, m, k), torch.randn(batch, k, n) * k ** -0.5]


def get_init_inputs():
    return [n]


KEVIN_PROFILES = {"cpu": {"batch": 4, "m": 32, "k": 64, "n": 48}}
