"""Generation throughput: our ``HFPolicy`` against transformers' own ``generate`` on the same prompts and batch.

The library part of ``benchmarks/bench_generate.py``: each backend is a callable ``run(prompt_ids) ->
response lengths``, timed by ``measure`` (a warm-up call, then timed calls, with the device synchronised
around each and the peak GPU memory of the timed calls). Nothing here builds models or prompts.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

__all__ = ["Measurement", "hf_generate_runner", "measure", "policy_runner", "response_lengths"]


def response_lengths(generated: torch.Tensor, eos_ids: Sequence[int]) -> list[int]:
    """Tokens per row of generated ids [B, N] up to and including the first end-of-response token."""
    ended = torch.isin(generated, torch.tensor(list(eos_ids), device=generated.device))  # [B, N]
    first = torch.where(ended.any(-1), ended.int().argmax(-1) + 1, torch.full_like(ended[:, 0], generated.shape[1],
                                                                                  dtype=torch.long))
    return first.tolist()


def hf_generate_runner(model: Any, *, pad_id: int, eos_ids: Sequence[int], max_new_tokens: int, temperature: float,
                       top_p: float = 1.0, seed: int = 0, cache_implementation: str = "static"
                       ) -> Callable[[Sequence[Sequence[int]]], list[int]]:
    """transformers' ``model.generate`` with our sampling settings: multinomial sampling at ``temperature``
    and ``top_p``, no top-k (transformers' default top_k=50 would change the distribution), left padding,
    the given cache (``static``: on CUDA, transformers compiles the decode step itself)."""
    from kevin.policy.hf import left_pad

    device = next(model.parameters()).device

    def run(prompt_ids: Sequence[Sequence[int]]) -> list[int]:
        ids, mask = left_pad(prompt_ids, pad_id, device)
        torch.manual_seed(seed)
        with torch.no_grad():
            out = model.generate(input_ids=ids, attention_mask=mask, do_sample=True, temperature=temperature,
                                 top_p=top_p, top_k=0, max_new_tokens=max_new_tokens, min_new_tokens=0,
                                 cache_implementation=cache_implementation, pad_token_id=pad_id,
                                 eos_token_id=list(eos_ids))
        return response_lengths(out[:, ids.shape[1]:], eos_ids)

    return run


def policy_runner(policy: Any) -> Callable[[Sequence[Sequence[int]]], list[int]]:
    """An ``HFPolicy`` as a runner (its outputs' token counts)."""

    def run(prompt_ids: Sequence[Sequence[int]]) -> list[int]:
        return [len(o.token_ids) for o in policy.generate_ids(prompt_ids)]

    return run


@dataclass
class Measurement:
    """One backend on one batch: a warm-up call, then ``len(seconds)`` timed calls."""

    name: str
    batch: int
    first_call_s: float
    """The warm-up call (compilation, graph capture, allocator growth land here)."""
    seconds: list[float] = field(default_factory=list)
    tokens: list[int] = field(default_factory=list)
    """Generated tokens of each timed call (end-of-response tokens included, padding not)."""
    peak_gb: float = 0.0
    """Peak GPU memory allocated during the timed calls (0 on the CPU)."""

    @property
    def tokens_per_s(self) -> float:
        return sum(self.tokens) / sum(self.seconds) if self.seconds and sum(self.seconds) > 0 else 0.0

    @property
    def ms_per_step(self) -> float:
        """Wall time per decoding step (per token of the longest response), in ms."""
        steps = sum(self.tokens) / self.batch if self.batch else 0
        return 1000 * sum(self.seconds) / steps if steps else 0.0

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "batch": self.batch, "first_call_s": self.first_call_s, "seconds": self.seconds,
                "tokens": self.tokens, "tokens_per_s": self.tokens_per_s, "ms_per_step": self.ms_per_step,
                "peak_gb": self.peak_gb}


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def measure(name: str, run: Callable[[Sequence[Sequence[int]]], list[int]], prompt_ids: Sequence[Sequence[int]],
            device: torch.device | str, repeats: int = 2) -> Measurement:
    """Time ``run`` on ``prompt_ids``: one warm-up call, then ``repeats`` timed calls."""
    device = torch.device(device)
    _sync(device)
    start = time.perf_counter()
    run(prompt_ids)
    _sync(device)
    m = Measurement(name, len(prompt_ids), time.perf_counter() - start)
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    for _ in range(repeats):
        _sync(device)
        start = time.perf_counter()
        lengths = run(prompt_ids)
        _sync(device)
        m.seconds.append(time.perf_counter() - start)
        m.tokens.append(int(sum(lengths)))
    if device.type == "cuda":
        m.peak_gb = torch.cuda.max_memory_allocated(device) / 2**30
    return m
