import torch
import torch.nn as nn


class Model(nn.Module):
    """RMS normalization over the feature dimension (dim 1) of a (batch, features, h, w) tensor:
    x / sqrt(mean(x^2 over dim 1) + eps). No learned weights."""

    def __init__(self, num_features: int, eps: float = 1e-5):
        super().__init__()
        self.num_features = num_features
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        rms = torch.sqrt(torch.mean(x * x, dim=1, keepdim=True) + self.eps)
        return x / rms


batch_size = 16
features = 64
height = 256
width = 256
eps = 1e-5


def get_inputs():
    return [torch.randn(batch_size, features, height, width)]


def get_init_inputs():
    return [features, eps]


KEVIN_PROFILES = {"cpu": {"batch_size": 2, "features": 16, "height": 32, "width": 32}}
