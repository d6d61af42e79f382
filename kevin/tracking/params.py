"""The resolved config as MLflow params: which sections a run of each kind logs, flattened to dotted keys, with keys
and values made valid for MLflow (its characters, its length limits).

Pure functions: what a run logs is decided here and tested without a store.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import asdict, is_dataclass
from typing import Any

# MLflow's limits (mlflow.utils.validation); checked here so a long value is shortened, not a failed run.
MAX_PARAM_VALUE = 6000
MAX_TAG_VALUE = 8000
MAX_KEY = 250
# What MLflow refuses in a key (mlflow_key turns each into "_").
_KEY_BAD_CHARS = re.compile(r"[^/\w.\- :]")
# The config sections a run logs as params (the whole config is the artifact config.yaml either way), so that the
# compare view of a training run and an evaluation run shows what differs between them, not 200 equal rows.
# Training: every section but those only an evaluation or the bookkeeping reads.
NOT_TRAINING_SECTIONS = frozenset({"evaluate", "analysis", "beam", "tracking", "alerts"})
# Evaluation: what decides its numbers: the tasks and budgets, the judge, the model and how it samples and is prompted.
EVALUATION_SECTIONS = frozenset({"evaluate", "analysis", "beam", "evaluation", "policy", "sampling", "rollout", "splits"})
RUN_KINDS = ("training", "evaluation")


def config_dict(config: Any) -> Mapping[str, Any]:
    """``config`` as a mapping: a dataclass (a RunConfig) as its dict, a mapping as is."""
    if is_dataclass(config) and not isinstance(config, type):
        return asdict(config)
    if not isinstance(config, Mapping):
        raise TypeError(f"config must be a mapping or a dataclass, got {type(config).__name__}")
    return config


def flatten_config(config: Any, prefix: str = "") -> dict[str, Any]:
    """Nested mappings (or dataclasses) as one level of dotted keys: {"train": {"lr": 2e-6}} -> {"train.lr": 2e-6}.
    Lists stay values; an empty mapping stays a value ({}) so the key still shows up."""
    config = config_dict(config)
    out: dict[str, Any] = {}
    for key, value in config.items():
        name = f"{prefix}.{key}" if prefix else str(key)
        if is_dataclass(value) and not isinstance(value, type):
            value = asdict(value)
        if isinstance(value, Mapping) and value:
            out.update(flatten_config(value, name))
        else:
            out[name] = value
    return out


def _value_text(value: Any) -> str:
    # JSON for containers, so a list reads back as one ("[1, 2]"), str for scalars ("2e-06", "True", "None").
    if isinstance(value, (Mapping, list, tuple)):
        return json.dumps(value, sort_keys=True, default=str)
    return str(value)


def clip_text(text: str, limit: int) -> str:
    """``text`` cut to at most ``limit`` characters, ending with a marker that says how many were cut."""
    if len(text) <= limit:
        return text
    # The marker's length depends on the count it reports; size it for the largest count (the whole text).
    keep = limit - len(f"...[{len(text)} more chars]")
    if keep <= 0:
        return text[:limit]
    return text[:keep] + f"...[{len(text) - keep} more chars]"


def mlflow_key(name: str) -> str:
    """A valid MLflow param/metric/tag key: characters MLflow refuses become "_", at most 250 characters."""
    return _KEY_BAD_CHARS.sub("_", name)[:MAX_KEY]


def config_params(config: Any) -> dict[str, str]:
    """The resolved config as MLflow params: dotted keys, text values within MLflow's length limit."""
    return {mlflow_key(k): clip_text(_value_text(v), MAX_PARAM_VALUE) for k, v in flatten_config(config).items()}


def _generator_sections(config: Mapping[str, Any]) -> set[str]:
    # The openai section only matters when that backend generates; it is dead weight otherwise.
    policy = config.get("policy")
    backend = policy.get("backend") if isinstance(policy, Mapping) else None
    return {"openai"} if backend == "openai" else set()


def run_config(config: Any, kind: str = "training") -> dict[str, Any]:
    """The part of ``config`` a run of ``kind`` logs as params: the plain top-level values (backend, temperature,
    ...) and its sections (mapping values): for "training" every one but NOT_TRAINING_SECTIONS (and ``openai`` unless
    that backend generates); for "evaluation" the EVALUATION_SECTIONS (and ``openai`` when it generates), which
    leaves out ``response_length_schedule`` too: a mapping of training steps."""
    if kind not in RUN_KINDS:
        raise ValueError(f"run kind {kind!r}; use one of {RUN_KINDS}")
    config = config_dict(config)
    sections = {k for k, v in config.items() if isinstance(v, Mapping)}
    openai = _generator_sections(config)
    if kind == "training":
        keep = sections - NOT_TRAINING_SECTIONS - ({"openai"} - openai)
    else:
        keep = sections & (EVALUATION_SECTIONS | openai)
    return {k: v for k, v in config.items() if k in keep or k not in sections}
