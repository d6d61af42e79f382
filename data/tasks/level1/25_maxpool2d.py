import torch
import torch.nn as nn


class Model(nn.Module):
    """2D max pooling with a 2x2 window and stride 2 (halves height and width)."""

    def __init__(self, kernel_size: int, stride: int):
        super().__init__()
        self.pool = nn.MaxPool2d(kernel_size=kernel_size, stride=stride)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.pool(x)


batch_size = 32
channels = 64
height = 256
width = 256
kernel_size = 2
stride = 2


def get_inputs():
    return [torch.randn(batch_size, channels, height, width)]


def get_init_inputs():
    return [kernel_size, stride]


KEVIN_PROFILES = {"cpu": {"batch_size": 2, "channels": 8, "height": 64, "width": 64}}
