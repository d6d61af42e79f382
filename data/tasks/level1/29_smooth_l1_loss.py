import torch
import torch.nn as nn
import torch.nn.functional as F


class Model(nn.Module):
    """Smooth L1 (Huber-style) loss with beta = 1.0, averaged over all elements:
    0.5 * d^2 / beta where |d| < beta, else |d| - 0.5 * beta, with d = prediction - target."""

    def __init__(self):
        super().__init__()

    def forward(self, predictions: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        return F.smooth_l1_loss(predictions, targets, reduction="mean", beta=1.0)


batch_size = 8192
dim = 16384


def get_inputs():
    return [torch.randn(batch_size, dim), torch.randn(batch_size, dim)]


def get_init_inputs():
    return []


KEVIN_PROFILES = {"cpu": {"batch_size": 64, "dim": 4096}}
