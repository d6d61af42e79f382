import torch
import torch.nn as nn


class Model(nn.Module):
    """Rectangular matrix product: C (M, N) = A (M, K) @ B (K, N)."""

    def __init__(self):
        super().__init__()

    def forward(self, A: torch.Tensor, B: torch.Tensor) -> torch.Tensor:
        return torch.matmul(A, B)


M = 2048
K = 4096
N = 1024


def get_inputs():
    # Scaling by K ** -0.25 gives outputs of unit variance, so float32 rounding over the
    # length-K reduction stays well inside the 1e-4 tolerance.
    scale = K ** -0.25
    A = torch.randn(M, K) * scale
    B = torch.randn(K, N) * scale
    return [A, B]


def get_init_inputs():
    return []


KEVIN_PROFILES = {"cpu": {"M": 160, "K": 256, "N": 192}}
