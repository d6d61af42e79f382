import torch
import torch.nn as nn


class Model(nn.Module):
    """Product of two square matrices: C = A @ B with A, B of shape (N, N)."""

    def __init__(self):
        super().__init__()

    def forward(self, A: torch.Tensor, B: torch.Tensor) -> torch.Tensor:
        return torch.matmul(A, B)


N = 4096


def get_inputs():
    # Entries are scaled by N ** -0.25 so every output element has unit variance; this keeps
    # float32 rounding of the length-N dot products far below the 1e-4 comparison tolerance.
    scale = N ** -0.25
    A = torch.randn(N, N) * scale
    B = torch.randn(N, N) * scale
    return [A, B]


def get_init_inputs():
    return []


KEVIN_PROFILES = {"cpu": {"N": 256}}
