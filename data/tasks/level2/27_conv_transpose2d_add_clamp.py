import torch
import torch.nn as nn


class Model(nn.Module):
    """Upsampling ConvTranspose2d, add a learned per-channel bias, then clamp to [clamp_min, clamp_max]."""

    def __init__(self, in_channels, out_channels, kernel_size, stride, padding, clamp_min, clamp_max):
        super().__init__()
        self.conv_transpose = nn.ConvTranspose2d(in_channels, out_channels, kernel_size, stride=stride, padding=padding)
        self.bias = nn.Parameter(torch.randn(out_channels, 1, 1) * 0.1)
        self.clamp_min = clamp_min
        self.clamp_max = clamp_max

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.conv_transpose(x)
        x = x + self.bias
        return torch.clamp(x, min=self.clamp_min, max=self.clamp_max)


batch_size = 32
in_channels = 64
out_channels = 32
height = 64
width = 64
kernel_size = 4
stride = 2
padding = 1
clamp_min = -0.5
clamp_max = 0.5


def get_inputs():
    return [torch.randn(batch_size, in_channels, height, width)]


def get_init_inputs():
    return [in_channels, out_channels, kernel_size, stride, padding, clamp_min, clamp_max]


KEVIN_PROFILES = {"cpu": {"batch_size": 2, "in_channels": 8, "out_channels": 8, "height": 12, "width": 12}}
