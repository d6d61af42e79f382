import torch
import torch.nn as nn


class Model(nn.Module):
    """Strided Conv2d, multiply by a constant, tanh, then multiply by a learned per-channel gain."""

    def __init__(self, in_channels, out_channels, kernel_size, stride, scale):
        super().__init__()
        self.conv = nn.Conv2d(in_channels, out_channels, kernel_size, stride=stride, padding=kernel_size // 2)
        self.scale = scale
        self.gain = nn.Parameter(torch.rand(out_channels, 1, 1) + 0.5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.conv(x)
        x = torch.tanh(x * self.scale)
        return x * self.gain


batch_size = 64
in_channels = 32
out_channels = 64
height = 128
width = 128
kernel_size = 3
stride = 2
scale = 1.5


def get_inputs():
    return [torch.randn(batch_size, in_channels, height, width)]


def get_init_inputs():
    return [in_channels, out_channels, kernel_size, stride, scale]


KEVIN_PROFILES = {"cpu": {"batch_size": 2, "in_channels": 4, "out_channels": 8, "height": 24, "width": 24}}
