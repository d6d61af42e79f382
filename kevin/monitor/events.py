"""Alerts: one typed record per threshold crossing, and how much it matters.

Plain frozen dataclasses (with a JSON round trip for checkpoints) so that flows (Prefect events, ``kevin.alerts``)
and tracking (MLflow artifacts) consume them without knowing the monitor.
"""

from __future__ import annotations

import dataclasses
import enum
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any


class Severity(str, enum.Enum):
    """How much an alert matters: info (a fact about the setup), warning (look at it), critical (stop)."""

    INFO = "info"
    WARNING = "warning"
    CRITICAL = "critical"


@dataclass(frozen=True)
class Alert:
    """One threshold crossing at one step: a plain event for notifications (Prefect) and tracking (MLflow)."""

    metric: str
    value: float
    threshold: float
    step: int
    severity: Severity
    should_stop: bool
    message: str
    bound: str = "max"
    """"max": the value went above the threshold; "min": it went below."""
    consecutive: int = 1
    """Steps in a row (since min_steps) this metric has crossed this bound, this one included; notifiers can
    send only consecutive == 1 to avoid one message per step."""

    def to_dict(self) -> dict[str, Any]:
        data = dataclasses.asdict(self)
        data["severity"] = self.severity.value
        return data

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> "Alert":
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(data) - known)
        if unknown:
            raise ValueError(f"unknown alert fields: {unknown}; known: {sorted(known)}")
        data = dict(data)
        data["severity"] = Severity(data["severity"])
        return cls(**data)
