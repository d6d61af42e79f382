"""One device shared by the policy's generation and the evaluator's timings, in a training run with waves.

With waves (``experiment.rollout_waves`` > 1) one wave's kernels are judged while the next wave generates. Compiles
use the host and overlap generation freely, which is what waves are for. Timings must not: work of another process on
the same GPU is time-sliced with the timed kernels and lengthens them. On an H200, PyTorch baselines timed while the
other wave generated came out 2.3-2.8 ms slow (a softplus kernel at about 0.6x of PyTorch's speed scored 5.76x), and
honest kernels judged in those steps were scored from the evaluator's clock up to 3x slower than they reported.
So:

- a step's baselines are timed when its tasks are drawn, before any wave generates (``time_baselines_first``);
- the policy holds the device while it generates (``generation_hold``): no candidate run and no baseline timing
  starts on it meanwhile, and generation waits for the run in progress.

Neither applies with one wave (generation and evaluation never overlap), to a policy served by another process
(``policy.backend: openai``: its device is not known here), or to an evaluator without the hooks (the cluster's
workers time on their own machines).
"""

from __future__ import annotations

from contextlib import AbstractContextManager, nullcontext
from typing import Any, Sequence

__all__ = ["device_name", "generation_hold", "time_baselines_first"]


def time_baselines_first(evaluator: Any, tasks: Sequence[Any], waves: int,
                         span: AbstractContextManager | None = None) -> bool:
    """Time the uncached baselines of ``tasks`` now, while nothing generates, inside ``span`` (the run's record of
    the phase, entered only when there is work); False when not needed (one wave) or the evaluator has no
    ``prefetch_baselines``."""
    prefetch = getattr(evaluator, "prefetch_baselines", None)
    if waves == 1 or prefetch is None:
        return False
    with span or nullcontext():
        prefetch(list(tasks))
    return True


def device_name(device: Any) -> str:
    """A torch device (or its name) as the evaluator names its devices: ``cuda:N`` (N the current device when unset)
    or ``cpu``."""
    if isinstance(device, str):
        kind, _, number = device.partition(":")
        index = int(number) if number else None
    else:
        kind, index = device.type, device.index
    if kind != "cuda":
        return kind
    if index is None:
        import torch

        index = torch.cuda.current_device()
    return f"cuda:{index}"


def generation_hold(evaluator: Any, policy_device: Any, waves: int, policy_backend: str) -> AbstractContextManager:
    """What the policy holds while it generates: the evaluator's hold on the device it generates on, when the
    evaluator times kernels there and waves overlap the two; otherwise nothing."""
    hold = getattr(evaluator, "hold_device", None)
    if waves == 1 or hold is None or policy_backend == "openai" or policy_device is None:
        return nullcontext()
    name = device_name(policy_device)
    return hold(name) if name in evaluator.devices() else nullcontext()
