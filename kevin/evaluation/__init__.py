"""Kernel evaluation: static rules, sandboxed compile/run, the judge, correctness, timing, batch evaluator.

Names are imported on first use (PEP 562), so the worker processes that import
``kevin.evaluation.harness`` or ``kevin.evaluation.judge`` do not load the evaluator itself.
"""

from __future__ import annotations

from typing import Any

_EXPORTS = {
    "EvalConfig": "kevin.evaluation.config",
    "Evaluator": "kevin.evaluation.evaluator",
    "feedback_line": "kevin.records.verdicts",
    "Candidate": "kevin.records.evaluation",
    "EvalResult": "kevin.records.evaluation",
    "Fault": "kevin.records.evaluation",
    "PhaseTimes": "kevin.records.evaluation",
    "Status": "kevin.records.evaluation",
    "kernel_score": "kevin.records.evaluation",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    if name in _EXPORTS:
        import importlib

        return getattr(importlib.import_module(_EXPORTS[name]), name)
    raise AttributeError(f"module 'kevin.evaluation' has no attribute {name!r}")
