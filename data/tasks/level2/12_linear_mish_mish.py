import torch
import torch.nn as nn
import torch.nn.functional as F


class Model(nn.Module):
    """Linear layer followed by the Mish activation applied twice."""

    def __init__(self, in_features, out_features):
        super().__init__()
        self.linear = nn.Linear(in_features, out_features)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = F.mish(self.linear(x))
        return F.mish(y)


batch_size = 2048
in_features = 4096
out_features = 2048


def get_inputs():
    return [torch.randn(batch_size, in_features)]


def get_init_inputs():
    return [in_features, out_features]


KEVIN_PROFILES = {"cpu": {"batch_size": 32, "in_features": 192, "out_features": 128}}
