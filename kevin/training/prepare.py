"""Preparing a model for the GRPO update: device, master-weight precision, activation checkpointing, LoRA,
the frozen reference model, and the optimiser with its learning-rate schedule.

Each piece is a function of the model and ``TrainConfig``, so the trainer's constructor only wires them
together (and a script can prepare a model the same way without building a trainer).
"""

from __future__ import annotations

import copy
import logging
import math
from functools import partial
from typing import Any

import torch

from kevin.training.config import TrainConfig

log = logging.getLogger(__name__)

__all__ = ["autocast_dtype", "choose_pad_token_id", "lr_factor", "make_optimizer", "make_scheduler", "prepare_model",
           "reference_model", "resolve_device"]


def resolve_device(name: str) -> torch.device:
    """``train.device`` as a torch device (`auto`: CUDA when visible, else the CPU)."""
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name.startswith("cuda") and not torch.cuda.is_available():
        raise ValueError(f"train.device is {name!r} but no CUDA device is visible; use auto or cpu")
    return torch.device(name)


def autocast_dtype(config: TrainConfig, device: torch.device) -> torch.dtype | None:
    """The compute dtype under autocast (bfloat16), or None to compute in float32."""
    use_bf16 = config.dtype == "bf16" or (config.dtype == "auto" and device.type == "cuda")
    return torch.bfloat16 if use_bf16 else None


def choose_pad_token_id(model: Any, tokenizer: Any = None, explicit: int | None = None) -> int:
    """A token id to pad batches with: the explicit one, the tokenizer's pad or eos, the model's pad, else 0.
    Any valid id works: padded positions are masked out; it only has to index the embedding table."""
    for candidate in (explicit, getattr(tokenizer, "choose_pad_token_id", None), getattr(tokenizer, "eos_token_id", None),
                      getattr(model.config, "choose_pad_token_id", None)):
        if candidate is not None:
            return int(candidate)
    return 0


def _wrap_lora(model: Any, config: TrainConfig) -> Any:
    try:
        from peft import LoraConfig, get_peft_model
    except ImportError as exc:
        raise ImportError("train.lora needs peft: pip install 'kevin[train]' (or pip install peft)") from exc
    lora = LoraConfig(r=config.lora_r, lora_alpha=config.lora_alpha, lora_dropout=config.lora_dropout,
                      target_modules=config.lora_target_modules, task_type="CAUSAL_LM")
    return get_peft_model(model, lora)


def prepare_model(model: Any, config: TrainConfig, device: torch.device) -> Any:
    """Move ``model`` to ``device`` and make it trainable as ``config`` says; returns the model to train (the
    peft wrapper under LoRA, whose adapter initialisation draws from torch's global RNG)."""
    model.to(device)
    if not config.lora and next(model.parameters()).dtype != torch.float32:
        # Full fine-tuning keeps float32 master weights (see TrainConfig.dtype); bf16 is for compute only.
        log.info("casting the model to float32 master weights for full fine-tuning")
        model.float()
    if config.gradient_checkpointing:
        # Non-reentrant checkpointing works with frozen inputs (LoRA) without enable_input_require_grads.
        kwargs = {"use_reentrant": False}
        if hasattr(model, "activation_checkpointing_enable"):  # the name from transformers 5.2x on
            model.activation_checkpointing_enable(activation_checkpointing_kwargs=kwargs)
        else:
            model.gradient_checkpointing_enable(gradient_checkpointing_kwargs=kwargs)
    return _wrap_lora(model, config) if config.lora else model


def reference_model(model: Any, config: TrainConfig, device: torch.device, given: Any = None) -> Any | None:
    """The frozen reference for the KL penalty: None when beta is 0 or under LoRA (the base model with its
    adapters disabled is the reference there); else ``given`` or a copy of the initial ``model``."""
    if not config.loss.needs_reference or config.lora:
        return None
    ref = given if given is not None else copy.deepcopy(model)
    return ref.to(device).eval().requires_grad_(False)


def make_optimizer(params: list[torch.nn.Parameter], config: TrainConfig, device: torch.device) -> torch.optim.AdamW:
    fused = device.type == "cuda"  # one kernel for all parameters on GPU
    return torch.optim.AdamW(params, lr=config.lr, betas=config.adam_betas, eps=config.adam_eps,
                             weight_decay=config.weight_decay, fused=fused)


def lr_factor(step: int, *, warmup: int, total: int, schedule: str) -> float:
    """Multiplier of the base lr for optimiser step ``step`` (0-based): linear warmup, then the schedule."""
    if step < warmup:
        return (step + 1) / warmup  # the first step already moves, with lr / warmup
    if schedule == "constant":
        return 1.0
    progress = min(1.0, (step - warmup) / max(1, total - warmup))
    if schedule == "linear":
        return 1.0 - progress
    return 0.5 * (1.0 + math.cos(math.pi * progress))  # cosine


def make_scheduler(optimizer: torch.optim.Optimizer, config: TrainConfig) -> torch.optim.lr_scheduler.LambdaLR:
    """Linear warmup over ``warmup_ratio`` of all optimiser steps, then ``lr_schedule``."""
    return torch.optim.lr_scheduler.LambdaLR(optimizer, partial(
        lr_factor, warmup=config.warmup_steps, total=config.total_optimizer_steps, schedule=config.lr_schedule))
