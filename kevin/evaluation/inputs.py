"""Inputs for correctness and timing: fresh seeds, two input distributions, poisoned memory.

``make_inputs`` runs in the judge (every call's inputs, from its own secret seeds) and in the harness (the
models' initial weights come from the public seed); ``poison_free_cuda_memory`` runs in the harness.
"""

from __future__ import annotations

from typing import Any, Callable, Sequence

import torch

DISTRIBUTIONS = ("base", "scaled")
POISON_BYTE = 0xFF  # every float dtype reads 0xFF.. as NaN; integers read -1


def seeded(seed: int, fn: Callable[[], Any]) -> Any:
    """Call ``fn`` with every RNG the task might use seeded to ``seed``."""
    torch.manual_seed(seed)
    return fn()


def _reshape_distribution(tensor: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
    """The task's own values pushed to another distribution without leaving the op's domain.

    Values in [0, 1] (probabilities, torch.rand) stay in [0, 1] as x ** u; anything else is
    multiplied elementwise by u; u ~ U(0.5, 1.5). Signs and zeros are kept, so positive-only inputs
    (logs, square roots) stay valid, while shortcuts that assume torch.randn/torch.rand statistics fail.
    """
    u = torch.rand(tensor.shape, generator=generator, dtype=torch.float32, device=tensor.device).to(tensor.dtype) + 0.5
    if tensor.numel() and float(tensor.min()) >= 0.0 and float(tensor.max()) <= 1.0:
        return tensor.pow(u)
    return tensor * u


def make_inputs(task_module: Any, seed: int, distribution: str, device: torch.device) -> list[Any]:
    """``get_inputs()`` under ``seed``, reshaped to ``distribution``, on ``device``.

    ``get_inputs`` runs with ``device`` as the default device, so its ``torch.randn`` & co. fill the
    tensors where they are used: on cuda, drawing a few hundred MB of inputs on one CPU core and
    copying them over took seconds per trial. (Values then come from that device's generator,
    seeded by the same ``seed``.)
    """
    if distribution not in DISTRIBUTIONS:
        raise ValueError(f"unknown input distribution {distribution!r}")
    with torch.device(device):
        raw = seeded(seed, task_module.get_inputs)
    generator = torch.Generator(device=device).manual_seed(seed ^ 0x5EED)
    out: list[Any] = []
    for item in raw:
        if isinstance(item, torch.Tensor):
            item = item.detach().to(device)
            if distribution == "scaled" and item.is_floating_point():
                item = _reshape_distribution(item, generator)
            item = item.contiguous()
        out.append(item)
    return out


def clone_all(values: Sequence[Any]) -> list[Any]:
    """Independent copies: the candidate and the reference never share an input buffer."""
    return [v.clone() if isinstance(v, torch.Tensor) else v for v in values]


def poison_free_cuda_memory(device: torch.device) -> int:
    """Overwrite every free block in PyTorch's CUDA cache with NaN bytes; return bytes poisoned.

    An uninitialised ``torch.empty`` in the candidate is served from these blocks, so it reads NaN
    instead of whatever an earlier computation (e.g. a reference output) left there.
    """
    held = []
    poisoned = 0
    for segment in torch.cuda.memory_snapshot():
        if segment.get("device", device.index or 0) != (device.index or 0):
            continue
        for block in segment["blocks"]:
            if block["state"] == "inactive" and block["size"] > 0:
                held.append(torch.empty(block["size"], dtype=torch.uint8, device=device))
    for tensor in held:
        tensor.fill_(POISON_BYTE)
        poisoned += tensor.numel()
    torch.cuda.synchronize(device)
    del held
    return poisoned
