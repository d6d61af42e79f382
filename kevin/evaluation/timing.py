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
    use_events = device.type == "cuda"
    start_event = _CudaEvent(enable_timing=True) if use_events else None
    end_event = _CudaEvent(enable_timing=True) if use_events else None
    for i in range(trials):
        refresh(i)
        if flush is not None:
            flush.fill_(float(i))
        _sync(device)
        if use_events:
            start_event.record()
            out = fn(*inputs)
            _cuda_synchronize(device)
            end_event.record()
            end_event.synchronize()
            samples.append(start_event.elapsed_time(end_event))
        else:
            t0 = _perf_counter_ns()
            out = fn(*inputs)
            samples.append((_perf_counter_ns() - t0) / 1e6)
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
    use_events = device.type == "cuda"
    start_event = _CudaEvent(enable_timing=True) if use_events else None
    end_event = _CudaEvent(enable_timing=True) if use_events else None
    for i in range(trials):
        begin(i)
        channel.stage_in()
        if use_events:
            start_event.record()
            out = fn(*channel.inputs)
            _cuda_synchronize(device)
            end_event.record()
            end_event.synchronize()
            samples.append(start_event.elapsed_time(end_event))
        else:
            t0 = _perf_counter_ns()
            out = fn(*channel.inputs)
            samples.append((_perf_counter_ns() - t0) / 1e6)
        problem = check(out) if check is not None else ""
        outputs = list(out) if isinstance(out, (tuple, list)) else [out]
        problem = problem or channel.put(outputs)
        if problem:
            raise ValueError(problem)
        del out, outputs
        end(i)
    return samples
