import torch
import torch.nn as nn


class Model(nn.Module):
    """Matrix-vector product: y (M, 1) = A (M, K) @ x (K, 1)."""

    def __init__(self):
        super().__init__()

    def forward(self, A: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        return torch.matmul(A, x)


M = 12288
K = 16384


def get_inputs():
    A = torch.randn(M, K)
    # The vector is scaled by K ** -0.5 so each output has unit variance and float32 rounding
    # over the length-K dot product stays far below the 1e-4 tolerance.
    x = torch.randn(K, 1) * (K ** -0.5)
    return [A, x]


def get_init_inputs():
    return []


KEVIN_PROFILES = {"cpu": {"M": 1024, "K": 2048}}
