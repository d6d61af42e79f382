import torch
import torch.nn as nn
import torch.nn.functional as F


class Model(nn.Module):
    """Linear layer, hardtanh with an asymmetric range, then the mean over features (keepdim)."""

    def __init__(self, in_features, out_features, min_val, max_val):
        super().__init__()
        self.linear = nn.Linear(in_features, out_features)
        self.min_val = min_val
        self.max_val = max_val

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = F.hardtanh(self.linear(x), min_val=self.min_val, max_val=self.max_val)
        return y.mean(dim=1, keepdim=True)


batch_size = 4096
in_features = 2048
out_features = 4096
min_val = -0.25
max_val = 0.75


def get_inputs():
    return [torch.randn(batch_size, in_features)]


def get_init_inputs():
    return [in_features, out_features, min_val, max_val]


KEVIN_PROFILES = {"cpu": {"batch_size": 64, "in_features": 96, "out_features": 256}}
