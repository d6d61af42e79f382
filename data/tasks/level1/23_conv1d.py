import torch
import torch.nn as nn


class Model(nn.Module):
    """1D convolution over sequences: kernel 5, stride 1, no padding, with a bias
    (output length = length - 4)."""

    def __init__(self, in_channels: int, out_channels: int, kernel_size: int):
        super().__init__()
        self.conv = nn.Conv1d(in_channels, out_channels, kernel_size, stride=1, padding=0, bias=True)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.conv(x)


batch_size = 16
in_channels = 64
out_channels = 128
length = 8192
kernel_size = 5


def get_inputs():
    return [torch.randn(batch_size, in_channels, length)]


def get_init_inputs():
    return [in_channels, out_channels, kernel_size]


KEVIN_PROFILES = {"cpu": {"batch_size": 2, "in_channels": 8, "out_channels": 16, "length": 512}}
