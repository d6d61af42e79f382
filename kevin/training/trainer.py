"""The GRPO update on per-turn TrainingSamples.

One call of ``GRPOTrainer.update(samples)`` = ``grad_steps`` optimiser steps on one rollout batch:
  1. recompute each completion's token log-probs under the current policy (``sequence_logprobs``:
     prompt + completion in one forward pass, logits / temperature, the output layer run over chunks
     of tokens so no micro-batch's whole [B, T, V] logits exist);
  2. loss = ``kevin.training.loss.policy_loss`` (clip-higher, Dr-GRPO aggregation, optional k3 KL);
     the first optimiser step is on-policy (old log-probs = the current ones, detached, so every ratio
     is exactly 1 and the gradient is the plain policy gradient); later steps are off-policy, with
     ratios against the log-probs the first step saw (= the policy that generated the batch);
  3. micro-batches of ``micro_batch_size`` sequences are backpropagated one by one with the step's
     totals passed to the loss, so their gradients add up to the full batch's gradient;
  4. clip the global grad norm (0.05), AdamW step, lr schedule step.
The loss maths lives in ``loss.py``, log-probs in ``logprobs.py``, model preparation (device, precision,
LoRA, reference model, optimiser, schedule) in ``prepare.py`` and checkpoints in ``checkpoint.py``; this
file only moves tensors through the update. It never seeds the RNG: the entry point does (``rng.py``).

Why old log-probs are recomputed instead of taken from the rollout: a server backend (vLLM) may give
none, or give them from different kernels / precision; mixing those into the ratio biases it. The
rollout's log-probs are still compared with the recomputed ones (metric ``rollout_logprob_diff``).

Several processes (``torchrun`` / ``accelerate launch``, after ``kevin.distributed.init_from_env()``): plain
data parallelism, see ``kevin/distributed.py``: each process backpropagates its strided share
of the step's samples against the whole batch's totals and the gradients are summed across processes
before clipping, so every process takes the step one process would have taken. With ``zero_stage`` 3
the same shares are trained by a DeepSpeed ZeRO-3 engine instead, which partitions the parameters,
gradients and AdamW state over the processes (``kevin/training/zero.py``).
"""

from __future__ import annotations

import logging
import math
import time
from contextlib import nullcontext
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

import torch

from kevin.distributed import max_over_processes, shard, sum_floats, sum_gradients, world
from kevin.records.rollout import TrainingSample
from kevin.training import checkpoint, zero
from kevin.training.checkpoint import latest_checkpoint, list_checkpoints
from kevin.training.config import TrainConfig
from kevin.training.logprobs import (
    LOGIT_CHUNK_TOKENS,
    SequenceLogprobs,
    pad_prompt_completion,
    sequence_logprobs,
    token_logprobs,
)
from kevin.training.loss import policy_loss
from kevin.training.prepare import (
    autocast_dtype,
    choose_pad_token_id,
    lr_factor,
    make_optimizer,
    make_scheduler,
    prepare_model,
    reference_model,
    resolve_device,
)

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
        # No seeding here: the entry point seeds (``kevin.training.rng.seed_everything``) before it builds the
        # model, so every process starts from the same weights and LoRA factors (see rng.py).
        self.config = cfg = config or TrainConfig()
        self.rank, self.world_size = world()
        self.device = resolve_device(cfg.device)
        self.tokenizer = tokenizer
        self.pad_token_id = choose_pad_token_id(model, tokenizer, pad_token_id)
        self.autocast_dtype = autocast_dtype(cfg, self.device)
        self.model = prepare_model(model, cfg, self.device)
        self.ref_model = reference_model(self.model, cfg, self.device, ref_model)
        self.params = [p for p in self.model.parameters() if p.requires_grad]
        if not self.params:
            raise ValueError("the model has no trainable parameters")
        self.optimizer = make_optimizer(self.params, cfg, self.device)
        self.zero_stage = zero.stage_from_launcher() if cfg.zero_stage is None else cfg.zero_stage
        if self.zero_stage and cfg.lora:
            raise ValueError("train.lora cannot train under ZeRO-3 (the launcher asked for it): set train.zero_stage: 0")
        self.engine = None
        """The DeepSpeed engine under ZeRO-3 (it owns the partitioned weights and optimiser state), else None."""
        if self.zero_stage:
            self.engine = zero.initialize(self.model, self.optimizer,
                                          zero.deepspeed_config(max_grad_norm=cfg.max_grad_norm,
                                                                options=cfg.zero_options))
        self.scheduler = make_scheduler(self.optimizer, cfg)
        self.optimizer_steps = 0
        self.passes = 0
        """Forward/backward passes of the last accumulation (the most any process made, under ZeRO-3)."""
        self.resumed_extra: dict[str, Any] = {}
        """``extra`` of the checkpoint that ``resume`` loaded (e.g. the policy's sampler state)."""

    # -- forward passes

    def _autocast(self):
        return torch.autocast(self.device.type, dtype=self.autocast_dtype) if self.autocast_dtype else nullcontext()

    def _logprobs(self, model: Any, samples: Sequence[TrainingSample], *, with_entropy: bool) -> SequenceLogprobs:
        chunk = LOGIT_CHUNK_TOKENS  # the output layer a chunk of tokens at a time: no [B, T, V] logits
        if model is self.model and self.engine is not None:
            model = self.engine  # its forward gathers the partitioned parameters
            chunk = 0  # one pass through the engine's forward (its hooks gather and release every layer)
        with self._autocast():
            return sequence_logprobs(model, [s.prompt_token_ids for s in samples],
                                     [s.completion_token_ids for s in samples], temperature=self.config.temperature,
                                     pad_token_id=self.pad_token_id, with_entropy=with_entropy, chunk_tokens=chunk)

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
        limit = self.config.response_limit
        for i, s in enumerate(samples):
            if not s.prompt_token_ids:
                raise ValueError(f"sample {i} ({s.task_id} traj {s.trajectory} turn {s.turn}) has no prompt token ids")
            if len(s.completion_token_ids) > limit:
                raise ValueError(f"sample {i} has {len(s.completion_token_ids)} completion tokens, more than the "
                                 f"{limit} this trainer accepts (train.max_response_tokens, else "
                                 "loss.max_completion_length); set max_response_tokens, which sets both")
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
            old = self._chunk_old_logprobs(samples, chunk, logp, old_logprobs, totals)
            adv = torch.tensor([s.advantage for s in batch], dtype=torch.float32, device=logp.device)  # [b]
            ref = self._reference_logprobs(batch)[:, :width] if cfg.loss.needs_reference else None
            loss, metrics = policy_loss(logp, old, adv, mask, cfg.loss, logp_ref=ref, num_sequences=num_sequences,
                                        num_tokens=num_tokens, max_width=cfg.response_limit)
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
        return _step_metrics(totals, num_sequences, num_tokens, trained=len(active), on_policy=on_policy)

    def _chunk_old_logprobs(self, samples: Sequence[TrainingSample], chunk: Sequence[int], logp: torch.Tensor,
                            old_logprobs: dict[int, torch.Tensor], totals: _StepTotals) -> torch.Tensor:
        """The behaviour policy's log-probs of a micro-batch, [b, T] like ``logp``: the stored ones, or for a sample
        seen for the first time this step its current ones (on-policy), stored for the later optimiser steps and
        compared with what the rollout recorded."""
        old = torch.zeros_like(logp)
        for row, i in enumerate(chunk):
            n = len(samples[i].completion_token_ids)
            if i not in old_logprobs:
                old_logprobs[i] = logp[row, :n].detach().clone()
                self._compare_rollout(samples[i], old_logprobs[i], totals)
            old[row, :n] = old_logprobs[i].to(old.device)
        return old

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

    # -- checkpoints (kevin/training/checkpoint.py)

    def save_checkpoint(self, directory: str | Path, step: int, *, extra: dict[str, Any] | None = None) -> Path:
        """Save everything a resume needs after training step ``step``: ``directory/step_NNNNNN``
        (see ``checkpoint.save_checkpoint``)."""
        return checkpoint.save_checkpoint(self, directory, step, extra=extra)

    def load_checkpoint(self, path: str | Path) -> dict[str, Any]:
        """Restore weights, optimiser, scheduler and RNG from ``path`` (see ``checkpoint.load_checkpoint``)."""
        return checkpoint.load_checkpoint(self, path)

    def resume(self, directory: str | Path) -> int:
        """Load the newest checkpoint under ``directory``; the next step to run (0 if none)."""
        return checkpoint.resume(self, directory)


def _grad_norm(params: Sequence[torch.Tensor]) -> float:
    grads = [p.grad for p in params if p.grad is not None]
    if not grads:
        return 0.0
    return float(torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(g.float()) for g in grads])))


def _step_metrics(totals: _StepTotals, num_sequences: float, num_tokens: float, *, trained: int,
                  on_policy: bool) -> dict[str, float]:
    """The loss metrics ``accumulate_gradients`` returns: sums over the step, token-weighted means per token."""
    out = {"loss": totals.loss, "pg_loss": totals.pg_loss, "sequences": num_sequences, "tokens": num_tokens,
           "trained_sequences": float(trained), "on_policy": float(on_policy),
           "entropy": totals.entropy / totals.tokens if totals.tokens else 0.0,
           "processed_tokens": totals.processed}
    for key, value in (totals.weighted or {}).items():
        out[key] = value / totals.tokens if totals.tokens else 0.0
    if totals.rollout_tokens:
        out["rollout_logprob_diff"] = totals.rollout_diff / totals.rollout_tokens
    return out
