"""What every benchmark script does with its markdown result."""

from __future__ import annotations

import atexit
import re
import shutil
import tempfile
from pathlib import Path


def scratch_dir(prefix: str) -> str:
    """A fresh temporary folder, removed when the benchmark's process exits: an evaluator's cache in it holds about a
    gigabyte of precompiled headers, and folders left behind by benchmarks once filled the disk CI shares."""
    path = tempfile.mkdtemp(prefix=prefix)
    atexit.register(shutil.rmtree, path, ignore_errors=True)
    return path


def print_and_save(text: str, out: str) -> None:
    """Print the report; with ``out`` (a path) also write it there, creating its folder."""
    print(text)
    if out:
        Path(out).parent.mkdir(parents=True, exist_ok=True)
        Path(out).write_text(text)


def raise_share(warnings: list[str]) -> float:
    """How much longer a correct kernel was scored than its reported median, as a share of that median (0 if it was
    scored as reported), from the evaluator's "scored at X ms a call, Y ms more ..." warning (runs.py)."""
    for w in warnings:
        found = re.match(r"scored at ([0-9.]+) ms a call, ([0-9.]+) ms more", w)
        if found:
            scored, more = float(found.group(1)), float(found.group(2))
            return more / max(scored - more, 1e-9)
    return 0.0
