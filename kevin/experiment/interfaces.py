"""The capabilities a run's live objects are asked for beyond their own protocols, and closing them.

A training or evaluation run holds an evaluator (``kevin.evaluation.cluster.BatchEvaluator``), a policy
(``kevin.policy.protocol.Policy``) and, for a served model, a weight sync: each has ``close``. Only the local
``Evaluator`` can say whether it takes several batches at once (``concurrent_batches``; a cluster always queues
them), so that one capability is an explicit protocol checked with ``isinstance`` rather than an attribute probe.
"""

from __future__ import annotations

import logging
from typing import Protocol, runtime_checkable

log = logging.getLogger(__name__)

__all__ = ["Closeable", "ConcurrentBatches", "close_all", "takes_concurrent_batches"]


class Closeable(Protocol):
    def close(self) -> None: ...


@runtime_checkable
class ConcurrentBatches(Protocol):
    """An evaluator that says whether evaluations of different batches may run at once (on a CPU machine the timed
    runs would share the cores, so it takes one batch at a time)."""

    @property
    def concurrent_batches(self) -> bool: ...


def takes_concurrent_batches(evaluator: object) -> bool:
    """Whether ``evaluator`` judges several batches at once; one that does not say takes one at a time."""
    return isinstance(evaluator, ConcurrentBatches) and bool(evaluator.concurrent_batches)


def close_all(*things: Closeable | None) -> None:
    """Close each of ``things`` (None: not built), every one even when an earlier close fails."""
    for thing in things:
        if thing is None:
            continue
        try:
            thing.close()
        except Exception:  # one failing close must not keep the others open
            log.exception("closing %s failed", type(thing).__name__)
