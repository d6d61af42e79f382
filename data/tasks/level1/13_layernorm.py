import torch
import torch.nn as nn


class Model(nn.Module):
    """nn.LayerNorm over the last two dimensions (dim1, dim2) of a 4D tensor, with an elementwise
    affine weight and bias (eps 1e-5). The affine parameters are set to seeded random values so
    that they matter."""

    def __init__(self, normalized_shape: tuple):
        super().__init__()
        self.ln = nn.LayerNorm(normalized_shape)
        with torch.no_grad():
            self.ln.weight.copy_(1.0 + 0.5 * torch.randn(normalized_shape))
            self.ln.bias.copy_(0.5 * torch.randn(normalized_shape))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.ln(x)


batch_size = 16
features = 64
dim1 = 256
dim2 = 256


def get_inputs():
    return [torch.randn(batch_size, features, dim1, dim2)]


def get_init_inputs():
    return [(dim1, dim2)]


KEVIN_PROFILES = {"cpu": {"batch_size": 4, "features": 8, "dim1": 32, "dim2": 32}}
