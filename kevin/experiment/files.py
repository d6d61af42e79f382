"""The files a run keeps: the step folders of a training run and JSON written atomically.

Shared by the training run (``run.py``), its tracking (``run_tracking.py``) and the evaluation run
(``evaluate.py``). The layout is what a resumed run reads back: ``<out_dir>/steps/step_NNNNNN/`` and
``<out_dir>/checkpoints/``; changing a name here breaks the resume of every run made before.
"""

from __future__ import annotations

import json
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterator

from kevin.pipeline import STEPS_DIR  # read there too, by the DVC stages and the run scripts
from kevin.records.jsonl import atomic_write_text

__all__ = ["CHECKPOINTS_DIR", "STEPS_DIR", "TRACKED", "existing_run", "read_json", "step_dir", "torch_threads",
           "write_json"]

CHECKPOINTS_DIR = "checkpoints"
TRACKED = ".tracked"
"""Marker file: the step's metrics and artifacts are in MLflow (a redone step does not log them twice)."""


@contextmanager
def torch_threads(threads: int) -> Iterator[None]:
    """PyTorch's intra-op threads set to ``threads`` inside the block (0: left as they are), restored after."""
    if not threads:
        yield
        return
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def step_dir(out_dir: str | Path, step: int) -> Path:
    return Path(out_dir) / STEPS_DIR / f"step_{step:06d}"


def existing_run(out_dir: str | Path) -> bool:
    """Whether ``out_dir`` holds a run (a step was started there)."""
    steps = Path(out_dir) / STEPS_DIR
    return steps.is_dir() and any(steps.iterdir())


def write_json(path: Path, data: Any) -> Path:
    return atomic_write_text(path, json.dumps(data, indent=1, default=str) + "\n")


def read_json(path: Path) -> Any:
    return json.loads(path.read_text(encoding="utf-8"))
