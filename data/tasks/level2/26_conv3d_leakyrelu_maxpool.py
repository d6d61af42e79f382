import torch
import torch.nn as nn
import torch.nn.functional as F


class Model(nn.Module):
    """Conv3d (no padding), LeakyReLU, then 2x2x2 max pooling with stride 2."""

    def __init__(self, in_channels, out_channels, kernel_size, negative_slope):
        super().__init__()
        self.conv = nn.Conv3d(in_channels, out_channels, kernel_size)
        self.negative_slope = negative_slope
        self.pool = nn.MaxPool3d(2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.conv(x)
        x = F.leaky_relu(x, self.negative_slope)
        return self.pool(x)


batch_size = 16
in_channels = 16
out_channels = 32
depth = 32
height = 32
width = 32
kernel_size = 3
negative_slope = 0.1


def get_inputs():
    return [torch.randn(batch_size, in_channels, depth, height, width)]


def get_init_inputs():
    return [in_channels, out_channels, kernel_size, negative_slope]


KEVIN_PROFILES = {
    "cpu": {"batch_size": 2, "in_channels": 3, "out_channels": 8, "depth": 8, "height": 8, "width": 8}
}
