import torch
import torch.nn as nn


class Model(nn.Module):
    """Residual block: same-padded Conv2d, learned per-channel scale, add the block input, ReLU."""

    def __init__(self, channels, kernel_size):
        super().__init__()
        self.conv = nn.Conv2d(channels, channels, kernel_size, padding=kernel_size // 2)
        self.scale = nn.Parameter(torch.randn(channels, 1, 1) * 0.5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.conv(x)
        y = y * self.scale
        y = y + x
        return torch.relu(y)


batch_size = 32
channels = 64
height = 64
width = 64
kernel_size = 3


def get_inputs():
    return [torch.randn(batch_size, channels, height, width)]


def get_init_inputs():
    return [channels, kernel_size]


KEVIN_PROFILES = {"cpu": {"batch_size": 2, "channels": 8, "height": 16, "width": 16}}
