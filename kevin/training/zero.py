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
- a checkpoint holds DeepSpeed's partitioned model and optimiser files plus the consolidated weights in
  ``model/``, loadable by ``from_pretrained`` or a vLLM server; it resumes on the number of processes that wrote
  it directly, and on any other number through DeepSpeed's universal checkpoint (``universal_checkpoint``: the
  partitions converted once into one file per parameter and state, which each process then slices);
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
from pathlib import Path
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


UNIVERSAL_DIR = "deepspeed_universal"
"""A checkpoint's DeepSpeed partitions converted to a universal checkpoint (made on the first resume that needs it)."""


def universal_checkpoint(checkpoint: Path) -> Path:
    """``checkpoint/deepspeed_universal``: the checkpoint's ZeRO-3 partitions, written by any number of
    processes, as DeepSpeed's universal checkpoint (per parameter: fp32 weights and both AdamW moments, whole),
    which a ZeRO-3 engine of any process count can load. Rank 0 converts once (written beside, renamed into
    place: a kill leaves no half conversion); every process must call it, and all get the path."""
    from kevin.distributed import barrier, world

    target = checkpoint / UNIVERSAL_DIR
    if world()[0] == 0 and not target.is_dir():
        import argparse
        import contextlib
        import io
        import shutil

        from deepspeed.checkpoint import ds_to_universal

        tmp = checkpoint / f".{UNIVERSAL_DIR}.tmp"
        shutil.rmtree(tmp, ignore_errors=True)
        args = argparse.Namespace(input_folder=str(checkpoint / "deepspeed" / CHECKPOINT_TAG),
                                  output_folder=str(tmp / CHECKPOINT_TAG), num_extract_workers=1, num_merge_workers=1,
                                  keep_temp_folder=False, strict=True, inject_missing_state=False)
        with contextlib.redirect_stdout(io.StringIO()):  # the converter prints every stage and a progress bar
            ds_to_universal.main(args)
        os.rename(tmp, target)
        log.info("%s: ZeRO-3 partitions converted to a universal checkpoint", checkpoint)
    barrier()
    return target


def load_universal(engine: Any, checkpoint: Path) -> None:
    """Load ``checkpoint``'s partitions (weights and AdamW state) into ``engine`` whatever process count wrote them."""
    folder = universal_checkpoint(checkpoint)
    # The engine was built for a plain checkpoint; DeepSpeed reads this flag when it loads, so set it for this load.
    engine._config.load_universal_checkpoint = True
    try:
        loaded, _ = engine.load_checkpoint(str(folder), tag=CHECKPOINT_TAG, load_optimizer_states=True,
                                           load_lr_scheduler_states=False)
    finally:
        engine._config.load_universal_checkpoint = False
    if loaded is None:
        raise ValueError(f"{checkpoint}: DeepSpeed could not load the universal checkpoint in {folder}")
