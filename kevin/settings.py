"""The one base of every config dataclass: dict round trips that refuse unknown keys.

A misspelt key in params.yaml (or `dvc exp run -S`) must be an error, never silently ignored.
"""

from __future__ import annotations

import dataclasses
import math
import numbers
from typing import Any, ClassVar, Mapping, TypeVar

T = TypeVar("T", bound="Settings")

__all__ = ["Settings", "finite_number", "positive_int", "seconds"]


def positive_int(value: Any) -> bool:
    """An int >= 1 (a bool is not: YAML's `yes` must not pass as 1)."""
    return isinstance(value, int) and not isinstance(value, bool) and value >= 1


def finite_number(value: Any) -> bool:
    """A real number, neither a bool nor NaN nor infinite."""
    return isinstance(value, numbers.Real) and not isinstance(value, bool) and math.isfinite(value)


def seconds(value: Any) -> bool:
    """A finite number of seconds >= 0."""
    return finite_number(value) and value >= 0


class Settings:
    """Mixin for ``@dataclass`` configs; ``section`` names them in error messages."""

    section: ClassVar[str] = "settings"

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)  # type: ignore[call-overload]

    @classmethod
    def from_dict(cls: type[T], data: Mapping[str, Any]) -> T:
        known = {f.name for f in dataclasses.fields(cls)}  # type: ignore[arg-type]
        unknown = sorted(set(data) - known)
        if unknown:
            raise ValueError(f"unknown {cls.section} settings: {unknown}; known: {sorted(known)}")
        return cls(**dict(data))
