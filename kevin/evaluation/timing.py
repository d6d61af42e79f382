"""Timing protocol, shared by candidates and the PyTorch eager baseline so speedups compare like with like.

Per timed call: fresh input values, the last-level cache flushed, the whole device synchronised, the call
timed, the whole device synchronised again (work the candidate pushed to side streams is counted), the
clock stopped. CUDA uses events; the cpu backend uses the monotonic clock. The reported figure is the median.

- ``time_callable`` (the judge's baselines): the inputs are refreshed in place from a few sources and the
  cache is flushed by this process.
- ``channel_calls`` (a candidate's timed calls, in its own process): the judge writes every call's inputs into
  the channel from a fresh secret seed and flushes the cache before it answers the call's begin mark, and
  copies the outputs out when the end mark arrives (channel.py). Here the call runs between the two marks,
  its outputs are put into the channel, and the times this process measured are reported; the evaluator
  accepts them only where its own stamps agree (verdict.py).
"""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

import torch

# Bound when the harness imports this module, before any candidate code exists, so patching
# time.perf_counter_ns or torch.cuda.synchronize later cannot change what the harness measures.
_perf_counter_ns = time.perf_counter_ns
_cuda_synchronize = torch.cuda.synchronize
_CudaEvent = torch.cuda.Event


@dataclass
class TimingResult:
    median_ms: float
    mean_ms: float
    std_ms: float
    min_ms: float
    trials: int
    samples_ms: list[float] = field(default_factory=list)


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        _cuda_synchronize(device)


class _CallTimer:
    """One call's time: CUDA events around the call and a device synchronisation (work left running counts) on
    cuda, the monotonic clock on cpu."""

    def __init__(self, device: torch.device):
        self.device = device
        cuda = device.type == "cuda"
        self.start = _CudaEvent(enable_timing=True) if cuda else None
        self.end = _CudaEvent(enable_timing=True) if cuda else None

    def call(self, fn: Callable[..., Any], args: Sequence[Any]) -> tuple[Any, float]:
        """(``fn(*args)``, its time in ms)."""
        if self.start is not None:
            self.start.record()
            out = fn(*args)
            _cuda_synchronize(self.device)
            self.end.record()
            self.end.synchronize()
            return out, self.start.elapsed_time(self.end)
        t0 = _perf_counter_ns()
        out = fn(*args)
        return out, (_perf_counter_ns() - t0) / 1e6


def time_callable(
    fn: Callable[..., Any],
    inputs: list[Any],
    sources: Sequence[list[Any]],
    device: torch.device,
    warmup: int,
    trials: int,
    flush_bytes: int,
) -> TimingResult:
    """Time ``fn(*inputs)``; before call i the inputs are overwritten with ``sources[i % len(sources)]``."""
    flush = torch.empty(max(flush_bytes // 4, 1), dtype=torch.float32, device=device) if flush_bytes else None

    def refresh(i: int) -> None:
        for dst, src in zip(inputs, sources[i % len(sources)]):
            if isinstance(dst, torch.Tensor):
                dst.copy_(src)

    for i in range(warmup):
        refresh(i)
        fn(*inputs)
    _sync(device)

    samples: list[float] = []
    timer = _CallTimer(device)
    for i in range(trials):
        refresh(i)
        if flush is not None:
            flush.fill_(float(i))
        _sync(device)
        out, ms = timer.call(fn, inputs)
        samples.append(ms)
        del out
    return TimingResult(
        median_ms=statistics.median(samples),
        mean_ms=statistics.fmean(samples),
        std_ms=statistics.pstdev(samples) if len(samples) > 1 else 0.0,
        min_ms=min(samples),
        trials=trials,
        samples_ms=samples,
    )


def channel_calls(fn: Callable[..., Any], channel: Any, device: torch.device, warmup: int, trials: int,
                  begin: Callable[[int], None], end: Callable[[int], None],
                  check: Callable[[Any], str] | None = None) -> list[float]:
    """Time ``trials`` calls of ``fn`` on the channel's inputs (a ``channel.HarnessChannel``); the samples in ms.

    ``begin(i)`` returns once the judge has written call i's inputs (the evaluator answered the begin mark);
    ``end(i)`` sends the end mark, after the outputs are in the channel. ``check(out)`` says why an output cannot
    be handed over ('' if it can); a problem raises ``ValueError``. The warm-up calls run on whatever the channel
    holds (the last trial's inputs): nothing about them is checked or timed.
    """
    for _ in range(warmup):
        fn(*channel.inputs)
    _sync(device)
    samples: list[float] = []
    timer = _CallTimer(device)
    for i in range(trials):
        begin(i)
        channel.stage_in()
        out, ms = timer.call(fn, channel.inputs)
        samples.append(ms)
        problem = check(out) if check is not None else ""
        outputs = list(out) if isinstance(out, (tuple, list)) else [out]
        problem = problem or channel.put(outputs)
        if problem:
            raise ValueError(problem)
        del out, outputs
        end(i)
    return samples
