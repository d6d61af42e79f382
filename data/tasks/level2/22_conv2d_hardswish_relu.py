import torch
import torch.nn as nn
import torch.nn.functional as F


class Model(nn.Module):
    """Dilated Conv2d (no padding), HardSwish, then ReLU."""

    def __init__(self, in_channels, out_channels, kernel_size, dilation):
        super().__init__()
        self.conv = nn.Conv2d(in_channels, out_channels, kernel_size, dilation=dilation)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.conv(x)
        x = F.hardswish(x)
        return torch.relu(x)


batch_size = 64
in_channels = 8
out_channels = 64
height = 128
width = 128
kernel_size = 3
dilation = 2


def get_inputs():
    return [torch.randn(batch_size, in_channels, height, width)]


def get_init_inputs():
    return [in_channels, out_channels, kernel_size, dilation]


KEVIN_PROFILES = {"cpu": {"batch_size": 2, "in_channels": 3, "out_channels": 8, "height": 20, "width": 20}}
