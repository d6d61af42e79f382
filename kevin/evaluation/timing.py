"""Timing protocol, shared by candidates and the PyTorch eager baseline so speedups compare like with like.

Per timed call: refresh the inputs' contents in place (so an output cached by input pointer or shape
is stale), flush the last-level cache, synchronise the whole device, time the call, synchronise the
whole device again (work the candidate pushed to side streams is counted), stop the clock.
CUDA uses events; the cpu backend uses the monotonic clock. The reported figure is the median.

``mark`` (optional) tells the evaluator when each call begins and ends: ``mark("b", i)`` just before the
clock starts (it returns once the evaluator has stamped it with its own clock) and ``mark("e", i)``
just after the clock stops. The evaluator compares the times reported here with its own stamps
(verdict.py), so a process that reports times shorter than the calls took is caught from outside.
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
    spot_outputs: dict[int, list[torch.Tensor]] = field(default_factory=dict)


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
    spot_trials: Sequence[int] = (),
    snapshot: Callable[[Any], list[torch.Tensor]] | None = None,
    mark: Callable[[str, int], None] | None = None,
) -> TimingResult:
    """Time ``fn(*inputs)``; before call i the inputs are overwritten with ``sources[i % len(sources)]``.

    ``spot_trials``: indices of timed calls whose outputs are snapshotted (outside the timed region)
    for a later correctness spot-check against the reference on ``sources[i % len(sources)]``.
    """
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
    spots: dict[int, list[torch.Tensor]] = {}
    wanted = set(spot_trials)
    use_events = device.type == "cuda"
    start_event = _CudaEvent(enable_timing=True) if use_events else None
    end_event = _CudaEvent(enable_timing=True) if use_events else None
    for i in range(trials):
        refresh(i)
        if flush is not None:
            flush.fill_(float(i))
        _sync(device)
        if mark is not None:
            mark("b", i)
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
        if mark is not None:
            mark("e", i)
        if i in wanted and snapshot is not None:
            spots[i] = snapshot(out)
        del out
    return TimingResult(
        median_ms=statistics.median(samples),
        mean_ms=statistics.fmean(samples),
        std_ms=statistics.pstdev(samples) if len(samples) > 1 else 0.0,
        min_ms=min(samples),
        trials=trials,
        samples_ms=samples,
        spot_outputs=spots,
    )
