"""Kernel evaluation: static rules, sandboxed compile/run, the judge, correctness, timing, batch evaluator.

Names are imported on first use (PEP 562), so the worker processes that import
``kevin.evaluation.harness`` or ``kevin.evaluation.judge`` do not load the evaluator itself.
"""

from __future__ import annotations

from typing import Any

_EXPORTS = {
    "EvalConfig": "kevin.evaluation.config",
    "Evaluator": "kevin.evaluation.evaluator",
    "feedback_line": "kevin.evaluation.feedback",
    "Candidate": "kevin.evaluation.records",
    "EvalResult": "kevin.evaluation.records",
    "PhaseTimes": "kevin.evaluation.records",
    "Status": "kevin.evaluation.records",
    "kernel_score": "kevin.evaluation.records",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    if name in _EXPORTS:
        import importlib

        return getattr(importlib.import_module(_EXPORTS[name]), name)
    raise AttributeError(f"module 'kevin.evaluation' has no attribute {name!r}")
