import torch
import torch.nn as nn


class Model(nn.Module):
    """Transposed 2D convolution (learned 2x upsampling): kernel 4, stride 2, padding 1, with a
    bias; an (H, W) input becomes a (2H, 2W) output."""

    def __init__(self, in_channels: int, out_channels: int, kernel_size: int, stride: int, padding: int):
        super().__init__()
        self.deconv = nn.ConvTranspose2d(in_channels, out_channels, kernel_size, stride=stride,
                                         padding=padding, bias=True)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.deconv(x)


batch_size = 16
in_channels = 64
out_channels = 32
height = 64
width = 64
kernel_size = 4
stride = 2
padding = 1


def get_inputs():
    return [torch.randn(batch_size, in_channels, height, width)]


def get_init_inputs():
    return [in_channels, out_channels, kernel_size, stride, padding]


KEVIN_PROFILES = {"cpu": {"batch_size": 2, "in_channels": 8, "out_channels": 8, "height": 16, "width": 16}}
