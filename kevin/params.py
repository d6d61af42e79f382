"""params.yaml: reading it, ``--set key.sub=value`` overrides, and handing the shared values down.

A few values are read by several sections: the backend and size profile (the rollout's prompts and the
evaluator), the sampling temperature (the policy samples at it, the trainer recomputes log-probs at it) and
the maximum response length (the policy stops there, the loss divides by it: Dr-GRPO's constant). Each is set
ONCE, at the top of params.yaml, and written into every section that reads it before any section is built.
A section that sets one of them itself must agree, else the file is refused: two values that must be equal
are never reconciled at run time.

This module reads plain data only (no torch), so ``kevin eval`` can use it without loading the trainer.
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any, Collection, Mapping, Sequence

import yaml

from kevin.evaluation.config import EvalConfig
from kevin.experiment.config import ExperimentConfig

SECTIONS = ("experiment", "evaluation", "cluster", "policy", "sampling", "openai", "rollout", "rewards", "train", "monitor",
            "splits", "tracking", "alerts", "evaluate", "analysis", "beam", "sft")
"""The sections of params.yaml, one config dataclass each (``kevin.config.RunConfig`` composes them)."""

SHARED_DEFAULTS: dict[str, Any] = {
    "backend": "cpu",
    "profile": "",
    "temperature": 0.9,
    "max_response_tokens": 16384,
    "response_length_schedule": {30: 22528},
}
"""Top-level values and their defaults (the paper's temperature, response length and its raise at step 30)."""

HANDED_DOWN: dict[str, tuple[tuple[str, ...], ...]] = {
    "backend": (("evaluation", "backend"), ("rollout", "backend")),
    "profile": (("evaluation", "profile"), ("rollout", "profile")),
    "temperature": (("sampling", "temperature"), ("openai", "temperature"), ("train", "temperature")),
    "max_response_tokens": (("sampling", "max_new_tokens"), ("openai", "max_tokens"),
                            ("train", "loss", "max_completion_length")),
}
"""Where each shared value goes. ``train.loss.max_completion_length`` (the Dr-GRPO constant) takes the limit of
step 0 and keeps it across a length schedule (docs/rl_core.md, "Response length")."""

DERIVED: dict[tuple[str, ...], str] = {
    ("train", "max_response_tokens"): "the largest limit of response_length_schedule (and max_response_tokens)",
    ("openai", "model"): "policy.model",
    ("train", "total_steps"): "experiment.steps",
}
"""Section fields computed from other values: set those instead."""


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


def merge_params(base: Mapping[str, Any], top: Mapping[str, Any],
                 sections: Collection[str] | None = SECTIONS) -> dict[str, Any]:
    """``top`` laid over ``base``: a section (and everything within one, ``train.loss`` say) setting by setting, so
    a later params file changes only the settings it names; a top-level value whole (``sections``: the keys merged
    at this level, None for all). ``response_length_schedule`` is such a value, so ``{}`` in a later file clears the
    base's raise. Merged entry by entry, ``{}`` changed nothing: the eighth learning run's second leg, layered over
    params.yaml's ``{30: 22528}``, generated up to 22,528 tokens from step 30 on where its own file said 512."""
    out = copy.deepcopy(dict(base))
    for key, value in top.items():
        if isinstance(value, Mapping) and isinstance(out.get(key), dict) and (sections is None or key in sections):
            out[key] = merge_params(out[key], value, None)
        else:
            out[key] = copy.deepcopy(value)
    return out


def read_params_files(paths: Sequence[str | Path]) -> dict[str, Any]:
    """Several params files merged in order: ``params.yaml`` and then a profile such as ``configs/cpu.yaml``."""
    merged: dict[str, Any] = {}
    for path in paths:
        merged = merge_params(merged, read_params(path))
    return merged


def apply_overrides(params: Mapping[str, Any], overrides: list[str] | tuple[str, ...] = ()) -> dict[str, Any]:
    """``params`` with each ``key.sub=value`` applied (value read as YAML: 0.8, true, null, [1, 2], {30: 22528})."""
    out = copy.deepcopy(dict(params))
    for item in overrides:
        key, sep, text = item.partition("=")
        path = [p for p in key.strip().split(".")]
        if not sep or not all(path):
            raise ValueError(f"override {item!r} is not key.sub=value (e.g. train.lr=1.0e-6 or temperature=1.0)")
        try:
            value = yaml.safe_load(text)
        except yaml.YAMLError as exc:
            raise ValueError(f"override {item!r}: the value is not valid YAML ({exc})") from exc
        node = out
        for part in path[:-1]:
            child = node.get(part)
            if child is None:
                child = node[part] = {}
            if not isinstance(child, dict):
                raise ValueError(f"override {item!r}: {part} is a value, not a section")
            node = child
        node[path[-1]] = value
    return out


def _schedule(value: Any) -> dict[int, int]:
    """``response_length_schedule`` with integer keys (``--set response_length_schedule.30=22528`` gives "30")."""
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        raise ValueError(f"response_length_schedule must map a step to the response length from that step on, "
                         f"e.g. {{30: 22528}}; got {value!r}")
    out = {}
    for step, tokens in value.items():
        try:
            out[int(step)] = tokens
        except (TypeError, ValueError):
            raise ValueError(f"response_length_schedule: {step!r} is not a step number") from None
    return dict(sorted(out.items()))


def shared_values(params: Mapping[str, Any]) -> dict[str, Any]:
    """The top-level shared values of ``params``, defaults filled in."""
    values = {key: params.get(key, default) for key, default in SHARED_DEFAULTS.items()}
    values["response_length_schedule"] = _schedule(values["response_length_schedule"])
    return values


def _set_once(sections: dict[str, Any], path: tuple[str, ...], value: Any, owner: str) -> None:
    """Write ``value`` at ``path``; a value already there must be the same (else say where to set it)."""
    node = sections
    for part in path[:-1]:
        child = node.get(part)
        if child is None:
            child = node[part] = {}
        if not isinstance(child, dict):
            raise ValueError(f"{'.'.join(path[:-1])} must be a section (a mapping), got {child!r}")
        node = child
    name = path[-1]
    if name in node and node[name] != value:
        raise ValueError(f"{'.'.join(path)} is {node[name]!r} but {owner} is {value!r}; {owner} is set once for the "
                         "whole run and handed to every section that reads it: remove it from the section or change "
                         f"{owner} instead")
    node[name] = value


def hand_down(params: Mapping[str, Any]) -> dict[str, dict[str, Any]]:
    """Every section's settings (a dict each) with the shared values written in.

    Raises ValueError for an unknown top-level key or a section that contradicts a shared value."""
    known = set(SECTIONS) | set(SHARED_DEFAULTS)
    unknown = sorted(set(params) - known)
    if unknown:
        raise ValueError(f"unknown params.yaml keys {unknown}; the top level holds the sections {list(SECTIONS)} and "
                         f"the shared values {list(SHARED_DEFAULTS)}")
    sections: dict[str, Any] = {}
    for name in SECTIONS:
        body = params.get(name)
        if body is None:
            body = {}
        if not isinstance(body, Mapping):
            raise ValueError(f"params section {name!r} must be a mapping of settings, got {body!r}")
        sections[name] = copy.deepcopy(dict(body))
    shared = shared_values(params)
    for key, paths in HANDED_DOWN.items():
        for path in paths:
            _set_once(sections, path, shared[key], key)
    longest = max([shared["max_response_tokens"], *shared["response_length_schedule"].values()],
                  key=lambda v: v if isinstance(v, int) else 0)
    _set_once(sections, ("train", "max_response_tokens"), longest, "the longest response length of the run")
    _set_once(sections, ("openai", "model"), (sections["policy"].get("model") or ""), "policy.model")
    # The lr schedule's length is the run's length: one number, set where the run is described.
    _set_once(sections, ("train", "total_steps"), sections["experiment"].get("steps", ExperimentConfig.steps),
              "experiment.steps")
    return sections


def eval_config_from_params(
    params: str | Path | None = None, *, backend: str = "", profile: str = "", timing_trials: int = 0,
    correctness_trials: int = 0, timeout_s: float = 0.0,
) -> EvalConfig:
    """EvalConfig from params.yaml (its ``evaluation`` section and the shared backend and profile), with
    command-line values on top (a command-line backend or profile replaces the shared one)."""
    raw = read_params(params)
    for key, value in (("backend", backend), ("profile", profile)):
        if value:  # the command line wins over the file: for the whole run, so no section disagrees
            raw[key] = value
            evaluation = raw.get("evaluation") or {}
            if isinstance(evaluation, dict):
                evaluation.pop(key, None)
    section = hand_down(raw)["evaluation"]
    for key, value in (("timing_trials", timing_trials), ("correctness_trials", correctness_trials), ("timeout_s", timeout_s)):
        if value:
            section[key] = value
    return EvalConfig.from_dict(section)
