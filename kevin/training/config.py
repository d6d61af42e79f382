"""Training settings: one dataclass (the ``train`` section of params.yaml), every field documented and validated.

The loss itself (clip range, aggregation, KL coefficient) is ``LossConfig``, nested here as ``loss``.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from typing import Any

from kevin.training.loss import LossConfig
from kevin.settings import Settings, finite_number, positive_int

LR_SCHEDULES = ("constant", "linear", "cosine")
DTYPES = ("auto", "bf16", "fp32")


@dataclass
class TrainConfig(Settings):
    """The GRPO update: optimiser, schedule, batching, precision, LoRA, checkpoints."""

    section = "train"

    lr: float = 2e-6
    """AdamW learning rate (the paper's single-turn run: 2e-6, constant after warmup)."""

    warmup_ratio: float = 0.03
    """Share of all optimiser steps (``total_steps`` x ``grad_steps``) spent warming the lr up linearly from 0."""

    lr_schedule: str = "constant"
    """After warmup: `constant` (the paper), `linear` decay to 0, or `cosine` decay to 0."""

    total_steps: int = 40
    """Training steps (rollout batches) the run will make (the paper's final run: 40). Only sets the
    length of warmup and decay; a run may stop earlier."""

    weight_decay: float = 0.0
    """AdamW decoupled weight decay (0: the paper states none)."""

    adam_betas: tuple[float, float] = (0.9, 0.999)
    """AdamW (beta1, beta2)."""

    adam_eps: float = 1e-8
    """AdamW epsilon: below this gradient scale a parameter's update shrinks with its gradient; above it the update
    is about ``lr`` x sign(gradient) whatever the gradient's size. A LoRA adapter's GRPO gradients can sit far below
    1e-8's reach (the H200 runs: ~6e-6 a coordinate), so at 1e-8 every parameter moves by ~lr a step, the noise's as
    far as the signal's; the sixth H200 run uses 1e-5 (docs/learning.md)."""

    max_grad_norm: float = 0.05
    """Clip the global gradient norm to this before each optimiser step (the paper: 0.05, which delayed
    collapse from step ~35 to ~100). The reported ``grad_norm`` is the norm before clipping."""

    grad_steps: int = 2
    """Optimiser steps per rollout batch (the paper: 2). The first is on-policy (old log-probs = the current
    ones, detached); later ones are off-policy, their importance ratios taken against the log-probs that the
    first step computed (the policy that generated the batch)."""

    split_batch: bool = False
    """False: every optimiser step uses the whole batch (TRL's ``num_iterations``). True: the batch is cut
    into ``grad_steps`` disjoint mini-batches, one per optimiser step (OpenRLHF / PPO mini-batches); the
    later mini-batches' old log-probs then come from a no-grad pass before the first step."""

    micro_batch_size: int = 4
    """Sequences per forward/backward pass. Gradients of the micro-batches of one optimiser step are
    accumulated with the step's totals passed to the loss, so the result does not depend on this value;
    only peak memory does."""

    temperature: float = 0.9
    """Logits are divided by this before the log-softmax, so the trained log-probs are those of the policy
    that sampled (set it to the sampling temperature; the paper: 0.9)."""

    skip_zero_advantage: bool = True
    """Leave out of the forward/backward passes samples whose advantage is exactly 0 (e.g. every sample of a
    task whose kernels all scored 0). With ``loss.beta`` = 0 they contribute nothing to the loss or its
    gradient (the loss is normalised by the totals of ALL samples, so it is unchanged); only metrics such as
    entropy are then taken over the other samples. Ignored when beta > 0."""

    loss: LossConfig = field(default_factory=LossConfig)
    """The GRPO objective: clip-higher, aggregation (Dr-GRPO), max completion length, KL coefficient."""

    max_response_tokens: int | None = None
    """Longest completion the update accepts: the run's largest response length limit (with a length schedule,
    its highest value; the root config derives it). None: ``loss.max_completion_length``. The loss still divides
    by ``loss.max_completion_length`` (the Dr-GRPO constant), also for longer completions."""

    lora: bool = False
    """Train LoRA adapters (peft) instead of every weight. The base weights stay frozen; checkpoints hold
    the adapter only; with beta > 0 the reference model is the base model with adapters disabled."""

    lora_r: int = 16
    """LoRA rank."""

    lora_alpha: int = 32
    """LoRA scaling numerator (the update is scaled by alpha / r)."""

    lora_dropout: float = 0.0
    """Dropout on the LoRA input. Keep 0: dropout makes the recomputed log-probs noisy, and the importance
    ratios with them."""

    lora_target_modules: list[str] | str = "all-linear"
    """Modules that get adapters: a list of module names (e.g. ["q_proj", "v_proj"]) or peft's `all-linear`
    (every linear layer except the output head)."""

    dtype: str = "auto"
    """Compute precision: `bf16` runs forward/backward under bfloat16 autocast, `fp32` in float32, `auto`
    picks bf16 on CUDA and fp32 on CPU. Weights and optimiser state stay float32 either way: a 2e-6 update
    is far below bfloat16's resolution (8 bits of mantissa, ~0.4% relative) and would round to nothing."""

    gradient_checkpointing: bool = False
    """Recompute activations in the backward pass (less memory, ~30% more compute) for long responses."""

    seed: int = 0
    """Seeds python, numpy and torch when the trainer is built (LoRA initialisation, anything sampled later)."""

    keep_checkpoints: int = 3
    """How many of the newest checkpoints ``save_checkpoint`` keeps; older ones are deleted."""

    device: str = "auto"
    """Where the model trains: `auto` (CUDA if available, else CPU), `cpu`, `cuda`, `cuda:1`, ..."""

    zero_stage: int | None = None
    """DeepSpeed ZeRO stage of the update: 3 partitions parameters, gradients and AdamW state over the
    processes of a launch (``kevin/training/zero.py``); 0 replicates them (plain data parallelism, or one
    process). None: what the launcher asked for (3 under ``accelerate launch --config_file
    configs/accelerate_zero3.yaml``), else 0. Not with ``lora``."""

    zero_options: dict[str, Any] = field(default_factory=dict)
    """Under ZeRO-3, DeepSpeed ``zero_optimization`` settings laid over ours, e.g.
    ``stage3_param_persistence_threshold`` (parameters this small stay whole on every process),
    ``stage3_max_live_parameters``, ``stage3_max_reuse_distance``, ``stage3_prefetch_bucket_size``.
    ``stage`` and the offload devices are not set here (``zero_stage``, the accelerate config)."""

    def __post_init__(self) -> None:
        if isinstance(self.loss, dict):
            self.loss = LossConfig.from_dict(self.loss)
        if not isinstance(self.loss, LossConfig):
            raise ValueError(f"train.loss must be a LossConfig or a dict of its settings, got {type(self.loss).__name__}")
        limit = self.max_response_tokens
        if limit is not None and (not positive_int(limit) or limit < self.loss.max_completion_length):
            raise ValueError(f"train.max_response_tokens must be a number of tokens >= loss.max_completion_length "
                             f"({self.loss.max_completion_length}; the limit can only be raised), or null, got {limit!r}")
        self._check_optimiser()
        self._check_model_settings()
        self._check_placement()

    def _check_optimiser(self) -> None:
        """The learning rate, its schedule, AdamW and the gradient clip."""
        if not finite_number(self.lr) or self.lr <= 0:
            raise ValueError(f"train.lr must be a positive number such as 2.0e-6, got {self.lr!r}")
        if not finite_number(self.warmup_ratio) or not 0 <= self.warmup_ratio < 1:
            raise ValueError(f"train.warmup_ratio must be in [0, 1) (the paper: 0.03), got {self.warmup_ratio!r}")
        if self.lr_schedule not in LR_SCHEDULES:
            raise ValueError(f"train.lr_schedule must be one of {LR_SCHEDULES}, got {self.lr_schedule!r}")
        for name in ("total_steps", "grad_steps", "micro_batch_size", "lora_r", "lora_alpha", "keep_checkpoints"):
            if not positive_int(getattr(self, name)):
                raise ValueError(f"train.{name} must be a positive integer, got {getattr(self, name)!r}")
        if not finite_number(self.weight_decay) or self.weight_decay < 0:
            raise ValueError(f"train.weight_decay must be >= 0, got {self.weight_decay!r}")
        self.adam_betas = tuple(self.adam_betas)  # YAML/JSON give a list
        if len(self.adam_betas) != 2 or not all(finite_number(b) and 0 <= b < 1 for b in self.adam_betas):
            raise ValueError(f"train.adam_betas must be two numbers in [0, 1), e.g. [0.9, 0.999], got {self.adam_betas!r}")
        if not finite_number(self.adam_eps) or self.adam_eps <= 0:
            raise ValueError(f"train.adam_eps must be a positive number such as 1.0e-8, got {self.adam_eps!r}")
        if not finite_number(self.max_grad_norm) or self.max_grad_norm <= 0:
            raise ValueError(f"train.max_grad_norm must be a positive number (the paper: 0.05), got {self.max_grad_norm!r}")

    def _check_model_settings(self) -> None:
        """The temperature, the LoRA adapter, the dtype, the switches and the seed."""
        if not finite_number(self.temperature) or self.temperature <= 0:
            raise ValueError(f"train.temperature must be > 0 and equal to the sampling temperature (greedy "
                             f"decoding is not a policy to train), got {self.temperature!r}")
        if not finite_number(self.lora_dropout) or not 0 <= self.lora_dropout < 1:
            raise ValueError(f"train.lora_dropout must be in [0, 1), got {self.lora_dropout!r}")
        targets = self.lora_target_modules
        if isinstance(targets, (list, tuple)):
            self.lora_target_modules = targets = list(targets)
            ok = bool(targets) and all(isinstance(m, str) and m for m in targets)
        else:
            ok = isinstance(targets, str) and bool(targets)
        if not ok:
            raise ValueError(f"train.lora_target_modules must be module names or 'all-linear', got {targets!r}")
        if self.dtype not in DTYPES:
            raise ValueError(f"train.dtype must be one of {DTYPES}, got {self.dtype!r}")
        for name in ("split_batch", "skip_zero_advantage", "lora", "gradient_checkpointing"):
            if not isinstance(getattr(self, name), bool):
                raise ValueError(f"train.{name} must be true or false, got {getattr(self, name)!r}")
        if isinstance(self.seed, bool) or not isinstance(self.seed, int) or self.seed < 0:
            raise ValueError(f"train.seed must be a non-negative integer, got {self.seed!r}")

    def _check_placement(self) -> None:
        """Where the model lives: DeepSpeed ZeRO (with what it may not be combined) and the device."""
        if self.zero_stage is not None and (isinstance(self.zero_stage, bool) or self.zero_stage not in (0, 3)):
            raise ValueError(f"train.zero_stage must be 0, 3 or null (from the launcher), got {self.zero_stage!r}")
        if not isinstance(self.zero_options, dict) or not all(isinstance(k, str) for k in self.zero_options):
            raise ValueError(f"train.zero_options must be a mapping of DeepSpeed zero_optimization settings, "
                             f"got {self.zero_options!r}")
        owned = sorted(set(self.zero_options) & {"stage", "offload_optimizer", "offload_param"})
        if owned:
            raise ValueError(f"train.zero_options cannot set {owned}: the stage is train.zero_stage and the offload "
                             "devices come from the accelerate config")
        if self.lora and self.zero_stage == 3:
            raise ValueError("train.lora with train.zero_stage 3 is not supported: LoRA's frozen base gains nothing "
                             "from partitioning and its adapters are small; use zero_stage 0 (replicated)")
        if not isinstance(self.device, str) or not (self.device in ("auto", "cpu", "cuda") or self.device.startswith("cuda:")):
            raise ValueError(f"train.device must be auto, cpu, cuda or cuda:N, got {self.device!r}")

    @property
    def response_limit(self) -> int:
        """The longest completion the update accepts."""
        return self.max_response_tokens or self.loss.max_completion_length

    @property
    def total_optimizer_steps(self) -> int:
        return self.total_steps * self.grad_steps

    @property
    def warmup_steps(self) -> int:
        return int(math.ceil(self.warmup_ratio * self.total_optimizer_steps))

    def to_dict(self) -> dict[str, Any]:
        data = dataclasses.asdict(self)
        data["adam_betas"] = list(self.adam_betas)
        return data


