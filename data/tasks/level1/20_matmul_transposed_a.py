import torch
import torch.nn as nn


class Model(nn.Module):
    """Matrix product with the first operand stored transposed: C (M, N) = A.T @ B,
    where A has shape (K, M) and B has shape (K, N)."""

    def __init__(self):
        super().__init__()

    def forward(self, A: torch.Tensor, B: torch.Tensor) -> torch.Tensor:
        return torch.matmul(A.T, B)


M = 2048
K = 4096
N = 2048


def get_inputs():
    # Scaled by K ** -0.25 so outputs have unit variance (keeps float32 rounding of the
    # length-K reduction well inside the 1e-4 tolerance).
    scale = K ** -0.25
    A = torch.randn(K, M) * scale
    B = torch.randn(K, N) * scale
    return [A, B]


def get_init_inputs():
    return []


KEVIN_PROFILES = {"cpu": {"M": 192, "K": 256, "N": 128}}
