"""What every benchmark script does with its markdown result."""

from __future__ import annotations

from pathlib import Path


def print_and_save(text: str, out: str) -> None:
    """Print the report; with ``out`` (a path) also write it there, creating its folder."""
    print(text)
    if out:
        Path(out).parent.mkdir(parents=True, exist_ok=True)
        Path(out).write_text(text)
