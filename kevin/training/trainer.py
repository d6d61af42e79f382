"""The GRPO update on per-turn TrainingSamples, and checkpoints that make a killed run resumable.

One call of ``GRPOTrainer.update(samples)`` = ``grad_steps`` optimiser steps on one rollout batch:
  1. recompute each completion's token log-probs under the current policy (``sequence_logprobs``:
     prompt + completion in one forward pass, logits / temperature);
  2. loss = ``kevin.training.loss.policy_loss`` (clip-higher, Dr-GRPO aggregation, optional k3 KL);
     the first optimiser step is on-policy (old log-probs = the current ones, detached, so every ratio
     is exactly 1 and the gradient is the plain policy gradient); later steps are off-policy, with
     ratios against the log-probs the first step saw (= the policy that generated the batch);
  3. micro-batches of ``micro_batch_size`` sequences are backpropagated one by one with the step's
     totals passed to the loss, so their gradients add up to the full batch's gradient;
  4. clip the global grad norm (0.05), AdamW step, lr schedule step.
The loss maths lives in ``loss.py``; this file only moves tensors, models and optimiser state.

Why old log-probs are recomputed instead of taken from the rollout: a server backend (vLLM) may give
none, or give them from different kernels / precision; mixing those into the ratio biases it. The
rollout's log-probs are still compared with the recomputed ones (metric ``rollout_logprob_diff``).

Several processes (``torchrun`` / ``accelerate launch``, after ``distributed.init_from_env()``): plain
data parallelism, see ``kevin/training/distributed.py``: each process backpropagates its strided share
of the step's samples against the whole batch's totals and the gradients are summed across processes
before clipping, so every process takes the step one process would have taken. With ``zero_stage`` 3
the same shares are trained by a DeepSpeed ZeRO-3 engine instead, which partitions the parameters,
gradients and AdamW state over the processes (``kevin/training/zero.py``).
"""

from __future__ import annotations

import copy
import json
import logging
import math
import os
import random
import shutil
import tempfile
import time
from contextlib import nullcontext
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any, Sequence

import torch

from kevin.rollout.records import TrainingSample
from kevin.training import zero
from kevin.training.config import TrainConfig
from kevin.training.distributed import barrier, max_over_processes, shard, sum_floats, sum_gradients, world
from kevin.training.loss import policy_loss

log = logging.getLogger(__name__)

__all__ = [
    "GRPOTrainer",
    "SequenceLogprobs",
    "latest_checkpoint",
    "list_checkpoints",
    "lr_factor",
    "pad_prompt_completion",
    "sequence_logprobs",
    "token_logprobs",
]

CHECKPOINT_FORMAT = 1
STATE_FILE = "trainer_state.json"


# ------------------------------------------------------------------------------ log-probs (pure)


def pad_prompt_completion(prompt_ids: Sequence[Sequence[int]], completion_ids: Sequence[Sequence[int]], pad_id: int,
                          device: torch.device | str = "cpu") -> tuple[torch.Tensor, ...]:
    """Pack prompt + completion pairs into one batch: prompts LEFT-padded to P, completions RIGHT-padded to T.

    Every completion then occupies the last T columns, so the logits that predict it are the last T + 1
    positions (``logits_to_keep``) whatever the prompt lengths.
    Returns input_ids [B, P+T], attention_mask [B, P+T], position_ids [B, P+T] (real tokens numbered from
    0, as in a single-sequence pass), completion_mask [B, T] (bool, True = real completion token).
    """
    if len(prompt_ids) != len(completion_ids):
        raise ValueError(f"{len(prompt_ids)} prompts but {len(completion_ids)} completions")
    width_p = max((len(p) for p in prompt_ids), default=0)
    width_c = max((len(c) for c in completion_ids), default=0)
    b = len(prompt_ids)
    ids = torch.full((b, width_p + width_c), pad_id, dtype=torch.long)
    mask = torch.zeros((b, width_p + width_c), dtype=torch.long)
    for i, (p, c) in enumerate(zip(prompt_ids, completion_ids)):
        if not len(p):
            raise ValueError(f"sample {i} has an empty prompt; the first completion token needs a context")
        ids[i, width_p - len(p):width_p] = torch.as_tensor(list(p), dtype=torch.long)
        ids[i, width_p:width_p + len(c)] = torch.as_tensor(list(c), dtype=torch.long)
        mask[i, width_p - len(p):width_p + len(c)] = 1
    positions = (mask.cumsum(-1) - 1).clamp(min=0)
    completion_mask = mask[:, width_p:].bool()
    return ids.to(device), mask.to(device), positions.to(device), completion_mask.to(device)


def token_logprobs(logits: torch.Tensor, tokens: torch.Tensor, temperature: float = 1.0, *,
                   with_entropy: bool = False) -> tuple[torch.Tensor, torch.Tensor | None]:
    """log softmax(logits / temperature) at ``tokens``: logits [B, T, V], tokens [B, T] -> [B, T] float32.

    Also the entropy [B, T] of each position's distribution (no gradient) when asked. One sequence at a
    time, so only one [T, V] float32 copy of bf16 logits exists outside autograd's saved tensors.
    """
    logps, entropies = [], []
    for row_logits, row_tokens in zip(logits, tokens):  # [T, V], [T]
        lp = torch.log_softmax(row_logits.float() / temperature, dim=-1)  # [T, V]
        logps.append(lp.gather(-1, row_tokens.unsqueeze(-1)).squeeze(-1))  # [T]
        if with_entropy:
            with torch.no_grad():
                entropies.append(-(lp.exp() * lp).sum(-1))  # [T]
    return torch.stack(logps), (torch.stack(entropies) if with_entropy else None)


@dataclass
class SequenceLogprobs:
    """Per-token results of ``sequence_logprobs`` for B completions padded to T tokens."""

    logprobs: torch.Tensor
    """[B, T] float32 log-prob of each completion token (0 at padding), differentiable."""
    mask: torch.Tensor
    """[B, T] bool, True at real completion tokens."""
    entropy: torch.Tensor | None = None
    """[B, T] float32 entropy of the policy at each completion position (0 at padding, no gradient)."""


def sequence_logprobs(model: Any, prompt_ids: Sequence[Sequence[int]], completion_ids: Sequence[Sequence[int]], *,
                      temperature: float = 1.0, pad_token_id: int = 0, with_entropy: bool = False) -> SequenceLogprobs:
    """Token log-probs [B, T] of each completion given its prompt under ``model``, with the padding mask.

    log p(c_t | prompt, c_<t) = log softmax(z_t / temperature)[c_t], z the model's logits: the same quantity
    ``HFPolicy`` records while sampling. Run it under ``torch.no_grad()`` for old/reference log-probs.
    """
    device = next(model.parameters()).device
    ids, attn, positions, cmask = pad_prompt_completion(prompt_ids, completion_ids, pad_token_id, device)
    width_c = cmask.shape[1]
    if width_c == 0:  # nothing to score (every completion empty): no forward pass needed
        zeros = torch.zeros(cmask.shape, dtype=torch.float32, device=device)
        return SequenceLogprobs(zeros, cmask, zeros.clone() if with_entropy else None)
    kwargs = dict(input_ids=ids, attention_mask=attn, position_ids=positions, use_cache=False)
    try:
        logits = model(**kwargs, logits_to_keep=width_c + 1).logits[:, :-1]  # [B, T, V]
    except TypeError as exc:  # a model without logits_to_keep: take the last T+1 positions ourselves
        if "logits_to_keep" not in str(exc):
            raise
        logits = model(**kwargs).logits[:, -width_c - 1:-1]
    logp, entropy = token_logprobs(logits, ids[:, -width_c:], temperature, with_entropy=with_entropy)
    zero = torch.zeros((), dtype=logp.dtype, device=device)
    logp = torch.where(cmask, logp, zero)
    if entropy is not None:
        entropy = torch.where(cmask, entropy, zero)
    return SequenceLogprobs(logp, cmask, entropy)


# ------------------------------------------------------------------------------ schedule, RNG, devices


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


def seed_everything(seed: int) -> None:
    random.seed(seed)
    try:
        import numpy as np

        np.random.seed(seed)
    except ImportError:  # numpy is a dependency, but the trainer does not need it
        pass
    torch.manual_seed(seed)  # also seeds every CUDA device


def rng_state() -> dict[str, Any]:
    state: dict[str, Any] = {"python": random.getstate(), "torch": torch.get_rng_state()}
    try:
        import numpy as np

        state["numpy"] = np.random.get_state()
    except ImportError:
        pass
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict[str, Any]) -> None:
    random.setstate(state["python"])
    torch.set_rng_state(state["torch"])
    if "numpy" in state:
        import numpy as np

        np.random.set_state(state["numpy"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def _resolve_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name.startswith("cuda") and not torch.cuda.is_available():
        raise ValueError(f"train.device is {name!r} but no CUDA device is visible; use auto or cpu")
    return torch.device(name)


# ------------------------------------------------------------------------------ checkpoints on disk


def list_checkpoints(directory: str | Path) -> list[tuple[int, Path]]:
    """Finished checkpoints under ``directory`` as (step, path), oldest first (temp dirs are ignored)."""
    directory = Path(directory)
    if not directory.is_dir():
        return []
    found = []
    for path in directory.iterdir():
        if path.is_dir() and path.name.startswith("step_") and (path / STATE_FILE).is_file():
            try:
                found.append((int(path.name[len("step_"):]), path))
            except ValueError:
                continue
    return sorted(found)


def latest_checkpoint(directory: str | Path) -> Path | None:
    found = list_checkpoints(directory)
    return found[-1][1] if found else None


def _load_safetensors_dir(path: Path) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    files = sorted(path.glob("*.safetensors"))
    if not files:
        raise FileNotFoundError(f"{path}: no .safetensors weights")
    state: dict[str, torch.Tensor] = {}
    for f in files:
        state.update(load_file(str(f)))
    return state


# ------------------------------------------------------------------------------ the trainer


@dataclass
class _StepTotals:
    """Sums over the micro-batches of one optimiser step (for token-weighted metric means)."""

    loss: float = 0.0
    pg_loss: float = 0.0
    tokens: float = 0.0  # completion tokens that went through the loss
    processed: float = 0.0  # prompt + completion tokens that went through forward/backward
    entropy: float = 0.0
    weighted: dict[str, float] | None = None
    rollout_diff: float = 0.0
    rollout_tokens: float = 0.0

    WEIGHTED = ("clip_fraction", "clip_fraction_high", "clip_fraction_low", "ratio_mean", "approx_kl", "kl_ref")

    def add_weighted(self, metrics: dict[str, float], weight: float) -> None:
        self.weighted = self.weighted or {}
        for key in self.WEIGHTED:
            if key in metrics:
                self.weighted[key] = self.weighted.get(key, 0.0) + metrics[key] * weight


class GRPOTrainer:
    """GRPO updates of a transformers causal LM (full fine-tuning or LoRA) on per-turn TrainingSamples.

    ``model`` is moved to ``config.device``; with ``config.lora`` it is wrapped by peft (``trainer.model``
    is then the PeftModel; generate with it, e.g. ``HFPolicy(trainer.model, tokenizer)``).
    ``ref_model``: the frozen reference for the KL penalty, only used when ``config.loss.beta > 0``
    (default: a copy of the initial model, or the adapter-free base model under LoRA).
    """

    def __init__(self, model: Any, config: TrainConfig | None = None, *, tokenizer: Any = None,
                 ref_model: Any = None, pad_token_id: int | None = None):
        self.config = cfg = config or TrainConfig()
        self.rank, self.world_size = world()
        seed_everything(cfg.seed)  # the same seed on every process: the same initial weights everywhere
        self.device = _resolve_device(cfg.device)
        self.tokenizer = tokenizer
        self.pad_token_id = self._pad_id(model, tokenizer, pad_token_id)
        use_bf16 = cfg.dtype == "bf16" or (cfg.dtype == "auto" and self.device.type == "cuda")
        self.autocast_dtype = torch.bfloat16 if use_bf16 else None
        model.to(self.device)
        if not cfg.lora and next(model.parameters()).dtype != torch.float32:
            # Full fine-tuning keeps float32 master weights (see TrainConfig.dtype); bf16 is for compute only.
            log.info("casting the model to float32 master weights for full fine-tuning")
            model.float()
        if cfg.gradient_checkpointing:
            # Non-reentrant checkpointing works with frozen inputs (LoRA) without enable_input_require_grads.
            kwargs = {"use_reentrant": False}
            if hasattr(model, "activation_checkpointing_enable"):  # the name from transformers 5.2x on
                model.activation_checkpointing_enable(activation_checkpointing_kwargs=kwargs)
            else:
                model.gradient_checkpointing_enable(gradient_checkpointing_kwargs=kwargs)
        if cfg.lora:
            model = self._wrap_lora(model, cfg)
        self.model = model
        self.ref_model = None
        if cfg.loss.needs_reference and not cfg.lora:
            self.ref_model = ref_model if ref_model is not None else copy.deepcopy(model)
            self.ref_model.to(self.device).eval().requires_grad_(False)
        self.params = [p for p in self.model.parameters() if p.requires_grad]
        if not self.params:
            raise ValueError("the model has no trainable parameters")
        fused = self.device.type == "cuda"  # one kernel for all parameters on GPU
        self.optimizer = torch.optim.AdamW(self.params, lr=cfg.lr, betas=cfg.adam_betas, eps=cfg.adam_eps,
                                           weight_decay=cfg.weight_decay, fused=fused)
        self.zero_stage = zero.stage_from_launcher() if cfg.zero_stage is None else cfg.zero_stage
        if self.zero_stage and cfg.lora:
            raise ValueError("train.lora cannot train under ZeRO-3 (the launcher asked for it): set train.zero_stage: 0")
        self.engine = None
        """The DeepSpeed engine under ZeRO-3 (it owns the partitioned weights and optimiser state), else None."""
        if self.zero_stage:
            self.engine = zero.initialize(self.model, self.optimizer,
                                          zero.deepspeed_config(max_grad_norm=cfg.max_grad_norm,
                                                                options=cfg.zero_options))
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(self.optimizer, partial(
            lr_factor, warmup=cfg.warmup_steps, total=cfg.total_optimizer_steps, schedule=cfg.lr_schedule))
        self.optimizer_steps = 0
        self.passes = 0
        """Forward/backward passes of the last accumulation (the most any process made, under ZeRO-3)."""
        self.resumed_extra: dict[str, Any] = {}
        """``extra`` of the checkpoint that ``resume`` loaded (e.g. the policy's sampler state)."""

    @staticmethod
    def _pad_id(model: Any, tokenizer: Any, pad_token_id: int | None) -> int:
        # Any valid id works: padded positions are masked out; it only has to index the embedding table.
        for candidate in (pad_token_id, getattr(tokenizer, "pad_token_id", None),
                          getattr(tokenizer, "eos_token_id", None), getattr(model.config, "pad_token_id", None)):
            if candidate is not None:
                return int(candidate)
        return 0

    @staticmethod
    def _wrap_lora(model: Any, cfg: TrainConfig) -> Any:
        try:
            from peft import LoraConfig, get_peft_model
        except ImportError as exc:
            raise ImportError("train.lora needs peft: pip install 'kevin[train]' (or pip install peft)") from exc
        lora = LoraConfig(r=cfg.lora_r, lora_alpha=cfg.lora_alpha, lora_dropout=cfg.lora_dropout,
                          target_modules=cfg.lora_target_modules, task_type="CAUSAL_LM")
        return get_peft_model(model, lora)

    # -- forward passes

    def _autocast(self):
        return torch.autocast(self.device.type, dtype=self.autocast_dtype) if self.autocast_dtype else nullcontext()

    def _logprobs(self, model: Any, samples: Sequence[TrainingSample], *, with_entropy: bool) -> SequenceLogprobs:
        if model is self.model and self.engine is not None:
            model = self.engine  # its forward gathers the partitioned parameters
        with self._autocast():
            return sequence_logprobs(model, [s.prompt_token_ids for s in samples],
                                     [s.completion_token_ids for s in samples], temperature=self.config.temperature,
                                     pad_token_id=self.pad_token_id, with_entropy=with_entropy)

    @torch.no_grad()
    def _reference_logprobs(self, samples: Sequence[TrainingSample]) -> torch.Tensor:
        if self.config.lora:
            with self.model.disable_adapter():
                return self._logprobs(self.model, samples, with_entropy=False).logprobs
        return self._logprobs(self.ref_model, samples, with_entropy=False).logprobs

    @torch.no_grad()
    def _old_logprobs(self, samples: Sequence[TrainingSample], indices: Sequence[int]) -> dict[int, torch.Tensor]:
        """Log-probs under the current policy, no gradient, per sample index -> [len(completion)]."""
        out: dict[int, torch.Tensor] = {}
        for chunk in self._micro_batches(samples, indices):
            lp = self._logprobs(self.model, [samples[i] for i in chunk], with_entropy=False).logprobs
            for row, i in enumerate(chunk):
                out[i] = lp[row, :len(samples[i].completion_token_ids)].clone()
        return out

    def _micro_batches(self, samples: Sequence[TrainingSample], indices: Sequence[int]) -> list[list[int]]:
        # Similar lengths together: less padding per micro-batch, same result.
        ordered = sorted(indices, key=lambda i: len(samples[i].prompt_token_ids) + len(samples[i].completion_token_ids))
        size = self.config.micro_batch_size
        return [ordered[k:k + size] for k in range(0, len(ordered), size)]

    # -- gradients

    def _check_samples(self, samples: Sequence[TrainingSample]) -> None:
        if not samples:
            raise ValueError("update needs at least one TrainingSample")
        limit = self.config.loss.max_completion_length
        for i, s in enumerate(samples):
            if not s.prompt_token_ids:
                raise ValueError(f"sample {i} ({s.task_id} traj {s.trajectory} turn {s.turn}) has no prompt token ids")
            if len(s.completion_token_ids) > limit:
                raise ValueError(f"sample {i} has {len(s.completion_token_ids)} completion tokens, more than "
                                 f"loss.max_completion_length={limit}; set it to the generation's max new tokens")
            if not math.isfinite(s.advantage):
                raise ValueError(f"sample {i} has a non-finite advantage {s.advantage}")

    def accumulate_gradients(self, samples: Sequence[TrainingSample], indices: Sequence[int] | None = None,
                             old_logprobs: dict[int, torch.Tensor] | None = None) -> dict[str, float]:
        """Backpropagate the GRPO loss of ``samples[indices]`` into ``.grad``, micro-batch by micro-batch.

        ``old_logprobs`` maps a sample index to its old log-probs [len(completion)]; a sample missing from
        it is on-policy (old = current, detached) and its current log-probs are stored into the dict, for
        the off-policy steps that follow. Gradients ADD to existing ``.grad`` (zero them before).
        Returns the step's loss metrics (loss = the full batch's loss, the sum over micro-batches).
        """
        cfg = self.config
        indices = list(range(len(samples))) if indices is None else list(indices)
        old_logprobs = {} if old_logprobs is None else old_logprobs
        # Totals of the WHOLE step, zero-advantage samples included: dr_grpo divides by them, so leaving those
        # samples out of the passes below does not change the loss.
        num_sequences = float(len(indices))
        num_tokens = float(sum(len(samples[i].completion_token_ids) for i in indices))
        # An empty completion has no token to score: it adds nothing to the loss, only to the totals.
        active = [i for i in indices if samples[i].completion_token_ids]
        if cfg.skip_zero_advantage and not cfg.loss.needs_reference:
            active = [i for i in active if samples[i].advantage != 0.0]
        totals = _StepTotals()
        mine = shard(active, self.rank, self.world_size)  # all of them in a single process
        on_policy = all(i not in old_logprobs for i in mine)
        self.model.train()
        chunks = self._micro_batches(samples, mine)
        passes = max_over_processes(len(chunks)) if self.engine is not None else len(chunks)
        for k, chunk in enumerate(chunks):
            if self.engine is not None:
                self.engine.set_gradient_accumulation_boundary(k == passes - 1)
            batch = [samples[i] for i in chunk]
            cur = self._logprobs(self.model, batch, with_entropy=True)
            logp, mask = cur.logprobs, cur.mask  # [b, T] float32, [b, T] bool
            width = logp.shape[1]
            old = torch.zeros_like(logp)
            for row, i in enumerate(chunk):
                n = len(samples[i].completion_token_ids)
                if i not in old_logprobs:
                    old_logprobs[i] = logp[row, :n].detach().clone()
                    self._compare_rollout(samples[i], old_logprobs[i], totals)
                old[row, :n] = old_logprobs[i].to(old.device)
            adv = torch.tensor([s.advantage for s in batch], dtype=torch.float32, device=logp.device)  # [b]
            ref = self._reference_logprobs(batch)[:, :width] if cfg.loss.needs_reference else None
            loss, metrics = policy_loss(logp, old, adv, mask, cfg.loss, logp_ref=ref,
                                        num_sequences=num_sequences, num_tokens=num_tokens)
            self._backward(loss)
            tokens = float(mask.sum())
            totals.loss += loss.item()
            totals.pg_loss += metrics["pg_loss"]
            totals.tokens += tokens
            totals.processed += tokens + sum(len(s.prompt_token_ids) for s in batch)
            totals.entropy += float(cur.entropy.sum())
            totals.add_weighted(metrics, tokens)
        for k in range(len(chunks), passes):
            self._idle_pass(samples[0], boundary=k == passes - 1)
        self.passes = passes
        if self.world_size > 1:
            totals = self._sum_totals(totals)
        out = {"loss": totals.loss, "pg_loss": totals.pg_loss, "sequences": num_sequences, "tokens": num_tokens,
               "trained_sequences": float(len(active)), "on_policy": float(on_policy),
               "entropy": totals.entropy / totals.tokens if totals.tokens else 0.0,
               "processed_tokens": totals.processed}
        for key, value in (totals.weighted or {}).items():
            out[key] = value / totals.tokens if totals.tokens else 0.0
        if totals.rollout_tokens:
            out["rollout_logprob_diff"] = totals.rollout_diff / totals.rollout_tokens
        return out

    def _backward(self, loss: torch.Tensor) -> None:
        if self.engine is not None:
            # DeepSpeed AVERAGES the processes' gradients; the loss is already divided by the whole step's
            # totals, so the sum is the step's gradient: scale by the world size to undo the average.
            self.engine.backward(loss * self.world_size)  # reduces into this process's gradient partition
        else:
            loss.backward()

    def _idle_pass(self, probe: TrainingSample, *, boundary: bool) -> None:
        """A forward/backward that adds nothing to the gradient, for a ZeRO-3 process that has run out of
        micro-batches before the others: their passes gather parameters from it too."""
        self.engine.set_gradient_accumulation_boundary(boundary)
        lp = self._logprobs(self.model, [probe], with_entropy=False).logprobs
        self._backward(lp.sum() * 0.0)

    @staticmethod
    def _sum_totals(totals: _StepTotals) -> _StepTotals:
        """The step's sums over every process (each saw only its share of the samples)."""
        plain = ("loss", "pg_loss", "tokens", "processed", "entropy", "rollout_diff", "rollout_tokens")
        weighted = totals.weighted or {}
        values = {k: getattr(totals, k) for k in plain}
        values.update({f"w:{k}": v for k, v in weighted.items()})
        values.update({f"has:{k}": 1.0 for k in weighted})
        keys = list(plain) + [f"{p}:{k}" for k in _StepTotals.WEIGHTED for p in ("w", "has")]
        summed = sum_floats(values, keys)
        out = _StepTotals(**{k: summed[k] for k in plain})
        present = [k for k in _StepTotals.WEIGHTED if summed[f"has:{k}"] > 0]
        out.weighted = {k: summed[f"w:{k}"] for k in present} or None
        return out

    @staticmethod
    def _compare_rollout(sample: TrainingSample, current: torch.Tensor, totals: _StepTotals) -> None:
        """Accumulate |rollout log-prob - recomputed log-prob| (generation/training mismatch), where stored."""
        stored = sample.old_logprobs
        if stored is None or len(stored) != current.shape[0] or not len(stored):
            return
        diff = (torch.tensor(stored, dtype=torch.float32, device=current.device) - current.float()).abs()
        totals.rollout_diff += float(diff.sum())
        totals.rollout_tokens += float(len(stored))

    # -- the update

    def _plan(self, n: int) -> list[list[int]]:
        """Sample indices of each optimiser step of one batch."""
        k = self.config.grad_steps
        if not self.config.split_batch:
            return [list(range(n))] * k
        if n < k:
            raise ValueError(f"train.split_batch cuts the batch into grad_steps={k} mini-batches but it has only {n} samples")
        # Strided, so every mini-batch holds samples of every task (samples arrive grouped by task).
        return [list(range(j, n, k)) for j in range(k)]

    def update(self, samples: Sequence[TrainingSample]) -> list[dict[str, float]]:
        """``grad_steps`` optimiser steps on one rollout batch; one metrics dict per optimiser step.

        Metrics: loss, pg_loss, kl_ref (beta > 0), grad_norm (before clipping), grad_norm_clipped (after),
        clip_fraction(_high/_low), ratio_mean, approx_kl, entropy (mean token entropy of the policy over
        completion tokens), lr, sequences, tokens, trained_sequences, on_policy, tokens_per_s (prompt +
        completion tokens through forward and backward per second), rollout_logprob_diff (where the rollout
        stored log-probs), skipped (1 when a non-finite gradient norm skipped the optimiser step).
        """
        samples = list(samples)
        self._check_samples(samples)
        plan = self._plan(len(samples))
        old: dict[int, torch.Tensor] = {}
        if self.config.split_batch and len(plan) > 1:
            # Later mini-batches need the log-probs of the policy BEFORE the first step changes it.
            later = [i for step in plan[1:] for i in step
                     if samples[i].advantage != 0.0 or not self.config.skip_zero_advantage]
            old.update(self._old_logprobs(samples, later))
        return [self._optimizer_step(samples, indices, old) for indices in plan]

    def _optimizer_step(self, samples: list[TrainingSample], indices: list[int],
                        old: dict[int, torch.Tensor]) -> dict[str, float]:
        start = time.perf_counter()
        lr = self.optimizer.param_groups[0]["lr"]
        if self.engine is not None:
            return self._zero_optimizer_step(samples, indices, old, start, lr)
        self.optimizer.zero_grad(set_to_none=True)
        metrics = self.accumulate_gradients(samples, indices, old)
        if self.world_size > 1:
            sum_gradients(self.params)  # before clipping: every process clips and steps on the same sum
        grad_norm = float(torch.nn.utils.clip_grad_norm_(self.params, self.config.max_grad_norm))
        skipped = not math.isfinite(grad_norm)
        if skipped:
            # One NaN/inf gradient would poison every AdamW moment for good: drop this step instead.
            log.warning("non-finite gradient norm (%s): optimiser step %d skipped", grad_norm, self.optimizer_steps)
            self.optimizer.zero_grad(set_to_none=True)
            clipped = 0.0
        else:
            clipped = _grad_norm(self.params)
            self.optimizer.step()
        self.scheduler.step()  # the schedule follows steps taken or skipped, so a resume lands on the same lr
        self.optimizer.zero_grad(set_to_none=True)
        self.optimizer_steps += 1
        return self._step_metrics(metrics, start, lr, grad_norm, clipped, skipped)

    def _zero_optimizer_step(self, samples: list[TrainingSample], indices: list[int],
                             old: dict[int, torch.Tensor], start: float, lr: float) -> dict[str, float]:
        """The ZeRO-3 step: DeepSpeed clips the summed gradient partitions and steps (or skips a non-finite norm)."""
        metrics = self.accumulate_gradients(samples, indices, old)
        if self.passes:
            self.engine.step()
            grad_norm = float(self.engine.get_global_grad_norm() or 0.0)
        else:  # no process had a sample to train: no gradient, no step (as AdamW skips params without .grad)
            grad_norm = 0.0
        skipped = not math.isfinite(grad_norm)
        if skipped:
            log.warning("non-finite gradient norm (%s): optimiser step %d skipped", grad_norm, self.optimizer_steps)
        self.scheduler.step()
        self.optimizer_steps += 1
        return self._step_metrics(metrics, start, lr, grad_norm, zero.clipped_norm(grad_norm, self.config.max_grad_norm),
                                  skipped)

    def _step_metrics(self, metrics: dict[str, float], start: float, lr: float, grad_norm: float, clipped: float,
                      skipped: bool) -> dict[str, float]:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        seconds = time.perf_counter() - start
        processed = metrics.pop("processed_tokens")
        metrics.update(grad_norm=grad_norm, grad_norm_clipped=clipped, lr=lr, skipped=float(skipped),
                       tokens_per_s=processed / seconds if seconds > 0 else 0.0, optimizer_step=float(self.optimizer_steps))
        return metrics

    # -- checkpoints

    def save_checkpoint(self, directory: str | Path, step: int, *, extra: dict[str, Any] | None = None) -> Path:
        """Save everything a resume needs after finishing training step ``step``: ``directory/step_NNNNNN``.

        Holds the model (full weights, or the LoRA adapter only) in safetensors loadable by
        ``from_pretrained`` / a vLLM server, the tokenizer when the trainer has one, optimiser and lr
        scheduler state, python/numpy/torch/CUDA RNG states, the resolved config (JSON) and ``extra``
        (anything torch.save can write, e.g. the policy's sampler state). Written into a temp directory and
        renamed, so a kill leaves either no checkpoint or a complete one; then all but the newest
        ``keep_checkpoints`` are deleted.
        """
        if isinstance(step, bool) or not isinstance(step, int) or step < 0:
            raise ValueError(f"step must be a non-negative integer, got {step!r}")
        directory = Path(directory)
        final = directory / f"step_{step:06d}"
        if self.engine is not None:
            return self._save_zero_checkpoint(directory, final, step, extra)
        if self.rank != 0:  # the weights are the same on every process: the first one writes them
            barrier()
            return final
        directory.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=f".{final.name}.", suffix=".tmp", dir=directory))
        try:
            self.model.save_pretrained(str(tmp / "model"))
            self._finish_checkpoint(tmp, final, step, extra, optimizer=self.optimizer.state_dict())
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
        barrier()  # the others wait for a complete checkpoint before anyone reads it
        return final

    def _finish_checkpoint(self, tmp: Path, final: Path, step: int, extra: dict[str, Any] | None, *,
                           optimizer: dict[str, Any] | None) -> None:
        """Rank 0: write the tokenizer, scheduler/optimiser, RNG and state files into ``tmp``, rename it to
        ``final``, drop old checkpoints. ``optimizer`` None: its state is in DeepSpeed's files."""
        if self.tokenizer is not None:
            self.tokenizer.save_pretrained(str(tmp / "model"))
        torch.save({"optimizer": optimizer, "scheduler": self.scheduler.state_dict()}, tmp / "optimizer.pt")
        torch.save({"rng": rng_state(), "extra": extra or {}}, tmp / "state.pt")
        state = {"format": CHECKPOINT_FORMAT, "step": step, "optimizer_steps": self.optimizer_steps,
                 "lora": self.config.lora, "zero_stage": self.zero_stage, "world_size": self.world_size,
                 "config": self.config.to_dict(), "saved_at": time.time()}
        # The state file goes last: list_checkpoints only counts directories that have it.
        (tmp / STATE_FILE).write_text(json.dumps(state, indent=1) + "\n", encoding="utf-8")
        if final.exists():  # the same step saved again (e.g. a re-run): replace it
            stale = final.parent / f".{final.name}.old-{os.getpid()}"
            os.rename(final, stale)
            shutil.rmtree(stale, ignore_errors=True)
        os.rename(tmp, final)
        for _, old in list_checkpoints(final.parent)[:-self.config.keep_checkpoints]:
            shutil.rmtree(old, ignore_errors=True)

    def _save_zero_checkpoint(self, directory: Path, final: Path, step: int, extra: dict[str, Any] | None) -> Path:
        """Every process writes its partitions (DeepSpeed's files, under ``deepspeed/``); rank 0 gathers the
        full weights into ``model/`` and writes the rest. All processes must call it."""
        # One temp path every process knows without a message: named after the step, cleared by rank 0 first.
        tmp = directory / f".{final.name}.zero.tmp"
        if self.rank == 0:
            directory.mkdir(parents=True, exist_ok=True)
            shutil.rmtree(tmp, ignore_errors=True)
            tmp.mkdir()
        barrier()
        failed = None
        try:
            self.engine.save_checkpoint(str(tmp / "deepspeed"), tag=zero.CHECKPOINT_TAG, save_latest=False)
            weights = self.engine._zero3_consolidated_16bit_state_dict()  # collective; the full dict on rank 0
            if self.rank == 0:
                self.model.save_pretrained(str(tmp / "model"), state_dict=weights)
                self._finish_checkpoint(tmp, final, step, extra, optimizer=None)
        except BaseException as exc:  # noqa: BLE001  (re-raised below, after the others are released)
            failed = exc
        barrier()
        if failed is not None:
            if self.rank == 0:
                shutil.rmtree(tmp, ignore_errors=True)
            raise failed
        return final

    def load_checkpoint(self, path: str | Path) -> dict[str, Any]:
        """Restore model/adapter weights, optimiser, scheduler and RNG from ``path``; returns
        {"step", "optimizer_steps", "config", "extra"} (the trainer's own config is not replaced)."""
        path = Path(path)
        state = json.loads((path / STATE_FILE).read_text(encoding="utf-8"))
        if state.get("format") != CHECKPOINT_FORMAT:
            raise ValueError(f"{path}: checkpoint format {state.get('format')!r}, this code reads {CHECKPOINT_FORMAT}")
        if bool(state["lora"]) != self.config.lora:
            raise ValueError(f"{path}: a {'LoRA' if state['lora'] else 'full fine-tuning'} checkpoint cannot resume "
                             f"a {'LoRA' if self.config.lora else 'full fine-tuning'} trainer; match train.lora")
        saved_stage = int(state.get("zero_stage", 0))
        if saved_stage != self.zero_stage:
            raise ValueError(f"{path}: saved with ZeRO stage {saved_stage}, this trainer runs stage {self.zero_stage}; "
                             "resume with the same train.zero_stage (its model/ folder holds the full weights "
                             "for a fresh start)")
        if self.engine is not None:
            saved_world = int(state.get("world_size", 1))
            if saved_world != self.world_size:
                raise ValueError(f"{path}: ZeRO-3 partitions of {saved_world} processes cannot resume on "
                                 f"{self.world_size}; launch as many processes as the run that saved it")
            loaded, _ = self.engine.load_checkpoint(str(path / "deepspeed"), tag=zero.CHECKPOINT_TAG,
                                                    load_optimizer_states=True, load_lr_scheduler_states=False)
            if loaded is None:
                raise ValueError(f"{path}: DeepSpeed found no checkpoint under deepspeed/{zero.CHECKPOINT_TAG}")
        else:
            self._load_weights(path / "model")
        opt = torch.load(path / "optimizer.pt", map_location=self.device, weights_only=True)
        if self.engine is None:
            self.optimizer.load_state_dict(opt["optimizer"])
        self.scheduler.load_state_dict(opt["scheduler"])
        # Our own file (RNG states are python/numpy objects, which weights_only refuses).
        rest = torch.load(path / "state.pt", map_location="cpu", weights_only=False)
        set_rng_state(rest["rng"])
        self.optimizer_steps = int(state["optimizer_steps"])
        return {"step": int(state["step"]), "optimizer_steps": self.optimizer_steps, "config": state["config"],
                "extra": rest.get("extra", {})}

    def _load_weights(self, model_dir: Path) -> None:
        weights = _load_safetensors_dir(model_dir)
        if self.config.lora:
            from peft import set_peft_model_state_dict

            result = set_peft_model_state_dict(self.model, weights)
            if getattr(result, "unexpected_keys", None):
                raise ValueError(f"{model_dir}: adapter weights that this model does not have: {result.unexpected_keys[:5]}")
            return
        missing, unexpected = self.model.load_state_dict(weights, strict=False)
        if unexpected:
            raise ValueError(f"{model_dir}: weights that this model does not have: {unexpected[:5]}")
        # save_pretrained writes a tied weight (e.g. lm_head = embed_tokens) once; anything else missing is an error.
        params = dict(self.model.named_parameters(remove_duplicate=False))
        loaded_ptrs = {params[k].data_ptr() for k in weights if k in params}
        untied = [k for k in missing if k not in params or params[k].data_ptr() not in loaded_ptrs]
        if untied:
            raise ValueError(f"{model_dir}: the checkpoint lacks weights {untied[:5]}")

    def resume(self, directory: str | Path) -> int:
        """Load the newest checkpoint under ``directory`` and return the next step to run (0 if none).

        A checkpoint named step N was saved after step N finished, so the run continues at N + 1 and
        replays no finished step.
        """
        path = latest_checkpoint(directory)
        if path is None:
            return 0
        state = self.load_checkpoint(path)
        self.resumed_extra = state["extra"]
        log.info("resumed from %s: next step %d", path, state["step"] + 1)
        return state["step"] + 1


def _grad_norm(params: Sequence[torch.Tensor]) -> float:
    grads = [p.grad for p in params if p.grad is not None]
    if not grads:
        return 0.0
    return float(torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(g.float()) for g in grads])))
