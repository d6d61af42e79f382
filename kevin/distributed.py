"""Several processes (one per GPU, or several on CPU for tests): the group, and the few collectives the
data-parallel GRPO update and the in-process policy need.

It sits at the bottom of the package (it imports nothing of kevin), because both the policy layer (``HFPolicy``
keeps ZeRO-3 processes in lockstep) and the training layer use it.

Launch with ``torchrun --nproc_per_node N script.py`` or ``accelerate launch --num_processes N`` (both set
WORLD_SIZE, RANK, LOCAL_RANK, MASTER_ADDR/PORT) and call ``init_from_env()`` before building the trainer.

How the update is split, so that N processes give the gradient one process would:
- every process holds the full list of samples (the batch is small: token ids and advantages), so the
  step totals that Dr-GRPO divides by (sequences, tokens) are the whole batch's, without a collective;
- process r backpropagates only samples ``r, r + N, ...`` of the step's trainable samples;
- the gradients are summed across processes (one all-reduce per parameter) before clipping, so the
  clipped norm, the AdamW step and thus the weights are the same on every process.
This replicates the model on every GPU (plain data parallelism). To partition parameters, gradients and
optimiser state instead, the trainer runs a DeepSpeed ZeRO-3 engine on the same shares
(``kevin/training/zero.py``, ``configs/accelerate_zero3.yaml``).
"""

from __future__ import annotations

import os
from typing import Sequence

import torch


def world() -> tuple[int, int]:
    """(rank, world size) of this process; (0, 1) when no process group is initialised."""
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return 0, 1


def init_from_env(backend: str | None = None) -> tuple[int, int]:
    """Join the process group that ``torchrun`` / ``accelerate launch`` describe in the environment.

    Without WORLD_SIZE (or with 1) nothing is done. On CUDA each process takes GPU ``LOCAL_RANK``.
    Returns (rank, world size).
    """
    import torch.distributed as dist

    size = int(os.environ.get("WORLD_SIZE", "1"))
    if size <= 1 or dist.is_initialized():
        return world()
    cuda = torch.cuda.is_available()
    if cuda:
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
    dist.init_process_group(backend or ("nccl" if cuda else "gloo"))
    return world()


def shard(indices: Sequence[int], rank: int, size: int) -> list[int]:
    """This process's share of a step's sample indices (strided: every process gets a mix of tasks)."""
    return list(indices)[rank::size]


def sum_gradients(params: Sequence[torch.nn.Parameter]) -> None:
    """Sum ``.grad`` over all processes, in place (a parameter without a gradient counts as zeros)."""
    import torch.distributed as dist

    for p in params:
        if p.grad is None:
            p.grad = torch.zeros_like(p)
        dist.all_reduce(p.grad, op=dist.ReduceOp.SUM)


def _collective_device() -> torch.device:
    """Where a small tensor for a collective must live: NCCL reduces only CUDA tensors."""
    import torch.distributed as dist

    return torch.device("cuda", torch.cuda.current_device()) if dist.get_backend() == "nccl" else torch.device("cpu")


def sum_floats(values: dict[str, float], keys: Sequence[str]) -> dict[str, float]:
    """``values[k]`` summed over all processes for each of ``keys`` (missing keys count as 0)."""
    import torch.distributed as dist

    t = torch.tensor([float(values.get(k, 0.0)) for k in keys], dtype=torch.float64, device=_collective_device())
    dist.all_reduce(t, op=dist.ReduceOp.SUM)
    return dict(zip(keys, t.tolist()))


def max_over_processes(mine: int) -> int:
    """The largest of every process's ``mine`` (``mine`` itself without a process group): how many passes
    each must make so that none waits in a collective the others never enter."""
    import torch.distributed as dist

    if not dist.is_available() or not dist.is_initialized() or dist.get_world_size() == 1:
        return mine
    value = torch.tensor([mine], dtype=torch.int64, device=_collective_device())
    dist.all_reduce(value, op=dist.ReduceOp.MAX)
    return int(value.item())


def barrier() -> None:
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        dist.barrier()


__all__ = ["barrier", "init_from_env", "shard", "sum_floats", "sum_gradients", "world"]
