import torch
import torch.nn as nn


class Model(nn.Module):
    """Same-padded Conv1d, ReLU, then sum over the length dimension -> (batch, out_channels)."""

    def __init__(self, in_channels, out_channels, kernel_size):
        super().__init__()
        self.conv = nn.Conv1d(in_channels, out_channels, kernel_size, padding=kernel_size // 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.conv(x)
        x = torch.relu(x)
        return x.sum(dim=2)


batch_size = 64
in_channels = 64
out_channels = 128
length = 2048
kernel_size = 5


def get_inputs():
    return [torch.randn(batch_size, in_channels, length)]


def get_init_inputs():
    return [in_channels, out_channels, kernel_size]


KEVIN_PROFILES = {"cpu": {"batch_size": 2, "in_channels": 8, "out_channels": 16, "length": 256}}
