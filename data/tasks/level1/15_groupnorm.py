import torch
import torch.nn as nn


class Model(nn.Module):
    """nn.GroupNorm on a 4D (batch, channels, h, w) tensor with per-channel affine weight and bias
    (eps 1e-5). The affine parameters are set to seeded random values so that they matter."""

    def __init__(self, num_groups: int, num_channels: int):
        super().__init__()
        self.gn = nn.GroupNorm(num_groups, num_channels)
        with torch.no_grad():
            self.gn.weight.copy_(1.0 + 0.5 * torch.randn(num_channels))
            self.gn.bias.copy_(0.5 * torch.randn(num_channels))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.gn(x)


batch_size = 16
channels = 64
num_groups = 8
height = 256
width = 256


def get_inputs():
    return [torch.randn(batch_size, channels, height, width)]


def get_init_inputs():
    return [num_groups, channels]


KEVIN_PROFILES = {"cpu": {"batch_size": 2, "channels": 16, "num_groups": 4, "height": 32, "width": 32}}
