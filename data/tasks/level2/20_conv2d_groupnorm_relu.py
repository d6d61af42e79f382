import torch
import torch.nn as nn


class Model(nn.Module):
    """Same-padded Conv2d, GroupNorm (affine, eps 1e-5), then ReLU."""

    def __init__(self, in_channels, out_channels, kernel_size, num_groups):
        super().__init__()
        self.conv = nn.Conv2d(in_channels, out_channels, kernel_size, padding=kernel_size // 2)
        self.norm = nn.GroupNorm(num_groups, out_channels)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.conv(x)
        x = self.norm(x)
        return torch.relu(x)


batch_size = 32
in_channels = 32
out_channels = 64
height = 96
width = 96
kernel_size = 3
num_groups = 8


def get_inputs():
    return [torch.randn(batch_size, in_channels, height, width)]


def get_init_inputs():
    return [in_channels, out_channels, kernel_size, num_groups]


KEVIN_PROFILES = {
    "cpu": {"batch_size": 2, "in_channels": 4, "out_channels": 16, "height": 16, "width": 16, "num_groups": 4}
}
