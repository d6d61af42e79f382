"""The one base of every config dataclass: dict round trips that refuse unknown keys.

A misspelt key in params.yaml (or `dvc exp run -S`) must be an error, never silently ignored.
"""

from __future__ import annotations

import dataclasses
from typing import Any, ClassVar, Mapping, TypeVar

T = TypeVar("T", bound="Settings")


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
