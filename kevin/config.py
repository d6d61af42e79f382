"""Reading settings from params.yaml (the file DVC stages and `dvc exp run -S` edit)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from kevin.evaluation.config import EvalConfig


def read_params(path: str | Path | None) -> dict[str, Any]:
    """The params file as a dict ({} when no path is given)."""
    if path is None:
        return {}
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"no such params file: {path}")
    data = yaml.safe_load(path.read_text()) or {}
    if not isinstance(data, dict):
        raise ValueError(f"{path}: expected a mapping at the top level")
    return data


def eval_config_from_params(
    params: str | Path | None = None, *, backend: str = "", profile: str = "", timing_trials: int = 0,
    correctness_trials: int = 0, timeout_s: float = 0.0,
) -> EvalConfig:
    """EvalConfig from the ``evaluation`` section of params.yaml, with command-line values on top (a value
    of 0 or "" leaves the file's, or the default)."""
    section = dict(read_params(params).get("evaluation", {}) or {})
    for key, value in (("backend", backend), ("profile", profile), ("timing_trials", timing_trials),
                       ("correctness_trials", correctness_trials), ("timeout_s", timeout_s)):
        if value:
            section[key] = value
    return EvalConfig.from_dict(section)
