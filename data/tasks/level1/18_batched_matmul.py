import torch
import torch.nn as nn


class Model(nn.Module):
    """Batched matrix product: for every b, C[b] = A[b] @ B[b] (torch.bmm)."""

    def __init__(self):
        super().__init__()

    def forward(self, A: torch.Tensor, B: torch.Tensor) -> torch.Tensor:
        return torch.bmm(A, B)


batch = 64
M = 512
K = 512
N = 512


def get_inputs():
    # Scaled by K ** -0.25 so outputs have unit variance (keeps float32 rounding of the
    # length-K reductions well inside the 1e-4 tolerance).
    scale = K ** -0.25
    A = torch.randn(batch, M, K) * scale
    B = torch.randn(batch, K, N) * scale
    return [A, B]


def get_init_inputs():
    return []


KEVIN_PROFILES = {"cpu": {"batch": 4, "M": 96, "K": 128, "N": 80}}
