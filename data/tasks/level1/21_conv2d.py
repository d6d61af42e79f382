import torch
import torch.nn as nn


class Model(nn.Module):
    """2D convolution with a 3x3 kernel, stride 1, padding 1 and a bias (same spatial size out)."""

    def __init__(self, in_channels: int, out_channels: int, kernel_size: int, stride: int, padding: int):
        super().__init__()
        self.conv = nn.Conv2d(in_channels, out_channels, kernel_size, stride=stride, padding=padding, bias=True)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.conv(x)


batch_size = 16
in_channels = 64
out_channels = 64
height = 128
width = 128
kernel_size = 3
stride = 1
padding = 1


def get_inputs():
    return [torch.randn(batch_size, in_channels, height, width)]


def get_init_inputs():
    return [in_channels, out_channels, kernel_size, stride, padding]


KEVIN_PROFILES = {"cpu": {"batch_size": 2, "in_channels": 8, "out_channels": 16, "height": 24, "width": 24}}
