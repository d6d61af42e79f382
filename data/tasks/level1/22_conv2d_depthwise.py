import torch
import torch.nn as nn


class Model(nn.Module):
    """Depthwise 2D convolution: every channel is filtered by its own 3x3 kernel
    (groups = channels), stride 1, padding 1, with a bias."""

    def __init__(self, channels: int, kernel_size: int, stride: int, padding: int):
        super().__init__()
        self.conv = nn.Conv2d(channels, channels, kernel_size, stride=stride, padding=padding,
                              groups=channels, bias=True)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.conv(x)


batch_size = 16
channels = 128
height = 256
width = 256
kernel_size = 3
stride = 1
padding = 1


def get_inputs():
    return [torch.randn(batch_size, channels, height, width)]


def get_init_inputs():
    return [channels, kernel_size, stride, padding]


KEVIN_PROFILES = {"cpu": {"batch_size": 2, "channels": 8, "height": 32, "width": 32}}
