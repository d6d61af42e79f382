import torch
import torch.nn as nn
import torch.nn.functional as F


class Model(nn.Module):
    """Same-padded 5x5 Conv2d followed by Mish applied twice."""

    def __init__(self, in_channels, out_channels, kernel_size):
        super().__init__()
        self.conv = nn.Conv2d(in_channels, out_channels, kernel_size, padding=kernel_size // 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.conv(x)
        x = F.mish(x)
        return F.mish(x)


batch_size = 32
in_channels = 32
out_channels = 64
height = 96
width = 96
kernel_size = 5


def get_inputs():
    return [torch.randn(batch_size, in_channels, height, width)]


def get_init_inputs():
    return [in_channels, out_channels, kernel_size]


KEVIN_PROFILES = {"cpu": {"batch_size": 2, "in_channels": 3, "out_channels": 8, "height": 16, "width": 16}}
