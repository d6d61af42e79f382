"""DeepSpeed ZeRO-3 for the GRPO update: parameters, gradients and AdamW state partitioned over processes.

Launch as for plain data parallelism, with the repository's accelerate config (it starts one process per
GPU and tells each one, through the environment, to use ZeRO stage 3)::

    accelerate launch --config_file configs/accelerate_zero3.yaml --num_processes N your_train_script.py

``GRPOTrainer`` then hands its model and AdamW to ``deepspeed.initialize`` (``train.zero_stage`` = 3, or
left unset under that launch). What changes against the replicated update (``kevin/distributed.py``):
- every forward and backward gathers the parameters a layer needs from all processes, so every process
  must make the SAME number of passes: a process with fewer micro-batches than the others makes zero-loss
  passes (``kevin.distributed.max_over_processes``) instead of waiting in a collective that never comes;
- DeepSpeed reduces the gradients into each process's partition and clips the global norm itself
  (``gradient_clipping`` = ``train.max_grad_norm``), and skips the step when that norm is not finite;
- the weights stay float32 masters (DeepSpeed's own bf16/fp16 modes are off) and the trainer's bf16
  autocast does the compute, as without ZeRO, so both paths train the same numbers;
- a checkpoint holds DeepSpeed's partitioned model and optimiser files (resume with the same number of
  processes) plus the consolidated weights in ``model/``, loadable by ``from_pretrained`` or a vLLM server;
- ``HFPolicy`` generates from the partitioned model in lockstep (the same passes on every process, for the
  same reason as the idle passes); each pass gathers the weights, so a server that loads ``model/`` is the
  fast way to generate.

What it does not do: LoRA (the frozen base would be partitioned for nothing; adapters are small enough to
replicate).
"""

from __future__ import annotations

import logging
import math
import os
from typing import Any

import torch

log = logging.getLogger(__name__)

ZERO_STAGES = (0, 3)
CHECKPOINT_TAG = "zero"
"""DeepSpeed's tag (sub-directory) inside a checkpoint's ``deepspeed/`` folder."""


def stage_from_launcher(environ: dict[str, str] | None = None) -> int:
    """The ZeRO stage that ``accelerate launch`` asked for (0 when it was not a DeepSpeed launch)."""
    env = os.environ if environ is None else environ
    if env.get("ACCELERATE_USE_DEEPSPEED", "").lower() != "true":
        return 0
    stage = int(env.get("ACCELERATE_DEEPSPEED_ZERO_STAGE", "0") or 0)
    if stage not in ZERO_STAGES:
        raise ValueError(f"the accelerate config asks for ZeRO stage {stage}; the trainer supports {ZERO_STAGES} "
                         "(configs/accelerate_zero3.yaml is stage 3)")
    return stage


def deepspeed_config(*, max_grad_norm: float, options: dict[str, Any] | None = None,
                     environ: dict[str, str] | None = None) -> dict[str, Any]:
    """DeepSpeed's config for the trainer's ZeRO-3 engine.

    Micro-batch 1 and accumulation 1 are placeholders: the trainer accumulates its own micro-batches
    (with the step's totals in the loss) and marks the accumulation boundary itself. Offload devices come
    from the accelerate config when it sets them. ``options`` (``TrainConfig.zero_options``) are laid over
    the ``zero_optimization`` section.
    """
    env = os.environ if environ is None else environ
    clip = env.get("ACCELERATE_GRADIENT_CLIPPING")
    if clip not in (None, "", "none") and abs(float(clip) - max_grad_norm) > 1e-12:
        log.warning("the accelerate config clips at %s but train.max_grad_norm is %s: using train.max_grad_norm",
                    clip, max_grad_norm)
    zero: dict[str, Any] = {"stage": 3, "stage3_gather_16bit_weights_on_model_save": True}
    for key, var in (("offload_optimizer", "ACCELERATE_DEEPSPEED_OFFLOAD_OPTIMIZER_DEVICE"),
                     ("offload_param", "ACCELERATE_DEEPSPEED_OFFLOAD_PARAM_DEVICE")):
        device = env.get(var, "none").lower()
        if device not in ("", "none"):
            zero[key] = {"device": device}
    zero.update(options or {})
    return {"train_micro_batch_size_per_gpu": 1, "gradient_accumulation_steps": 1,
            "gradient_clipping": max_grad_norm, "zero_optimization": zero,
            "bf16": {"enabled": False}, "fp16": {"enabled": False}, "steps_per_print": 2**31 - 1,
            "wall_clock_breakdown": False}


def initialize(model: torch.nn.Module, optimizer: torch.optim.Optimizer, config: dict[str, Any]) -> Any:
    """Partition ``model`` and ``optimizer`` over the processes; returns the DeepSpeed engine.

    The process group must exist (``distributed.init_from_env()``); DeepSpeed joins it.
    """
    # DeepSpeed picks its accelerator when first imported; on a machine without CUDA it must be told.
    os.environ.setdefault("DS_ACCELERATOR", "cuda" if torch.cuda.is_available() else "cpu")
    try:
        import deepspeed
    except ImportError as exc:
        raise ImportError("train.zero_stage 3 needs DeepSpeed: pip install 'kevin[deepspeed]'") from exc
    import torch.distributed as dist

    if not dist.is_initialized():
        deepspeed.init_distributed(dist_backend="nccl" if torch.cuda.is_available() else "gloo")
    engine, _, _, _ = deepspeed.initialize(model=model, optimizer=optimizer, config=config)
    return engine


def clipped_norm(norm: float, max_norm: float) -> float:
    """The global gradient norm after clipping to ``max_norm`` (as DeepSpeed and torch clip: scale by
    max_norm / (norm + 1e-6) when that is below 1)."""
    if not math.isfinite(norm):
        return 0.0
    return norm * min(1.0, max_norm / (norm + 1e-6))
