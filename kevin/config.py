"""The root config of a run: every section of params.yaml in one typed object.

    run = RunConfig.from_params("params.yaml", ["train.lr=1.0e-6", "temperature=1.0"])
    run.train, run.rollout, run.sampling, ...        # the section dataclasses, shared values handed down
    run.response_tokens_at(step)                     # the response length limit in force at a step

Shared values (backend, profile, temperature, max_response_tokens, response_length_schedule) live at the top
and are written into every section that reads them (``kevin.params.HANDED_DOWN``); a section that sets one
differently is refused. Unknown keys are refused at every level with the list of known ones.
"""

from __future__ import annotations

import dataclasses
import numbers
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar, Mapping, Sequence

from kevin.alerts import AlertConfig
from kevin.analysis.beam import BeamConfig
from kevin.analysis.metrics import AnalysisConfig
from kevin.evaluation.cluster_plan import ClusterConfig
from kevin.evaluation.config import EvalConfig
from kevin.experiment.config import EvaluateConfig, ExperimentConfig
from kevin.monitor import MonitorConfig
from kevin.params import (
    DERIVED,
    HANDED_DOWN,
    SECTIONS,
    SHARED_DEFAULTS,
    apply_overrides,
    eval_config_from_params,
    hand_down,
    read_params,
    read_params_files,
)
from kevin.policy.config import PolicyConfig, SamplingConfig
from kevin.policy.openai_backend import OpenAIConfig
from kevin.rewards import RewardConfig
from kevin.records.target import TARGETS
from kevin.rollout.config import RolloutConfig
from kevin.settings import Settings, positive_int
from kevin.tasks.splits import SplitConfig
from kevin.tracking import TrackingConfig
from kevin.training.config import TrainConfig
from kevin.training.sft import SFTConfig

__all__ = ["RunConfig", "eval_config_from_params", "read_params"]


@dataclass
class RunConfig(Settings):
    """Everything a run reads, as params.yaml lays it out. Sections may be given as dicts of the settings that
    differ from their defaults (the shared values are then filled in) or as complete section objects (which
    must then agree with the shared values)."""

    section = "run"
    SECTION_CLASSES: ClassVar[dict[str, type]] = {
        "experiment": ExperimentConfig, "evaluation": EvalConfig, "cluster": ClusterConfig, "policy": PolicyConfig,
        "sampling": SamplingConfig,
        "openai": OpenAIConfig, "rollout": RolloutConfig, "rewards": RewardConfig, "train": TrainConfig,
        "monitor": MonitorConfig, "splits": SplitConfig, "tracking": TrackingConfig, "alerts": AlertConfig,
        "evaluate": EvaluateConfig, "analysis": AnalysisConfig, "beam": BeamConfig,
        "sft": SFTConfig,
    }

    backend: str = SHARED_DEFAULTS["backend"]
    """`cuda` (inline CUDA kernels on a GPU, the paper's setting) or `cpu` (inline C++): what the prompts ask
    for and what the evaluator compiles and runs."""

    profile: str = SHARED_DEFAULTS["profile"]
    """Task size profile for the prompts and the evaluator; empty: `cpu` on the cpu backend, the task's own sizes
    on cuda."""

    temperature: float = SHARED_DEFAULTS["temperature"]
    """Sampling temperature, and the temperature the trainer recomputes log-probs at (the paper: 0.9)."""

    max_response_tokens: int = SHARED_DEFAULTS["max_response_tokens"]
    """Response length limit from step 0 (the paper: 16384), and the Dr-GRPO constant the loss divides by for the
    whole run, also after a length schedule raises the limit (docs/rl_core.md, "Response length")."""

    response_length_schedule: dict[int, int] = field(
        default_factory=lambda: dict(SHARED_DEFAULTS["response_length_schedule"]))
    """Raises of the limit: {step: tokens} applies from that training step on (the paper: {30: 22528}); {} keeps
    max_response_tokens throughout."""

    experiment: ExperimentConfig = field(default_factory=dict)  # type: ignore[assignment]
    """The training run: name, output folder, steps, task batches, checkpoints (``kevin/experiment/config.py``)."""
    evaluation: EvalConfig = field(default_factory=lambda: {"reuse_verdicts": True})  # type: ignore[assignment]
    """The evaluator (``kevin/evaluation/config.py``). A run judges identical candidates once (``reuse_verdicts``
    on, where a bare ``EvalConfig`` has it off): a rollout's trajectories and turns repeat themselves, and each
    repeat judged again cost the GPU a run phase of its own."""
    cluster: ClusterConfig = field(default_factory=dict)  # type: ignore[assignment]
    """Evaluation spread over a Ray cluster (``kevin/evaluation/cluster.py``, its config in ``cluster_plan.py``; off: this
    machine's evaluator)."""
    policy: PolicyConfig = field(default_factory=dict)  # type: ignore[assignment]
    """Which model generates, through which backend."""
    sampling: SamplingConfig = field(default_factory=dict)  # type: ignore[assignment]
    """How the in-process model samples (backends `embedded` and `hf`)."""
    openai: OpenAIConfig = field(default_factory=dict)  # type: ignore[assignment]
    """The OpenAI-compatible server (backend `openai`)."""
    rollout: RolloutConfig = field(default_factory=dict)  # type: ignore[assignment]
    """Trajectories, turns, prompts."""
    rewards: RewardConfig = field(default_factory=dict)  # type: ignore[assignment]
    """Turn returns and advantages."""
    train: TrainConfig = field(default_factory=dict)  # type: ignore[assignment]
    """The GRPO update."""
    monitor: MonitorConfig = field(default_factory=dict)  # type: ignore[assignment]
    """Collapse indicators and alerts."""
    splits: SplitConfig = field(default_factory=dict)  # type: ignore[assignment]
    """Which tasks train and which are held out for evaluation (``kevin/tasks/splits.py``)."""
    tracking: TrackingConfig = field(default_factory=dict)  # type: ignore[assignment]
    """MLflow tracking of the run (``kevin/tracking/``)."""
    alerts: AlertConfig = field(default_factory=dict)  # type: ignore[assignment]
    """Where collapse alerts go (``kevin/alerts.py``)."""
    evaluate: EvaluateConfig = field(default_factory=dict)  # type: ignore[assignment]
    """The evaluation run of ``kevin evaluate`` (``kevin/experiment/config.py``)."""
    analysis: AnalysisConfig = field(default_factory=dict)  # type: ignore[assignment]
    """Budget splits and metrics of an evaluation (``kevin/analysis/metrics.py``)."""
    beam: BeamConfig = field(default_factory=dict)  # type: ignore[assignment]
    """Beam-style selection between the turns of an evaluation (``kevin/analysis/beam.py``)."""
    sft: SFTConfig = field(default_factory=dict)  # type: ignore[assignment]
    """The optional supervised warm start before RL (``kevin/training/sft.py``; off, as in the paper)."""

    def __post_init__(self) -> None:
        self._check_shared()
        params: dict[str, Any] = {key: getattr(self, key) for key in SHARED_DEFAULTS}
        for name in SECTIONS:
            value = getattr(self, name)
            params[name] = value.to_dict() if dataclasses.is_dataclass(value) else value
        try:
            resolved = hand_down(params)
        except ValueError as exc:
            raise ValueError(f"{exc} (a section given as an object must agree with the run's shared values; give "
                             "it as a dict of the settings you change to have them filled in)") from None
        for name, cls in self.SECTION_CLASSES.items():
            setattr(self, name, cls.from_dict(resolved[name]))
        self.response_length_schedule = dict(sorted((int(k), v) for k, v in self.response_length_schedule.items()))
        if self.experiment.rollout_waves > self.rollout.trajectories:
            raise ValueError(f"experiment.rollout_waves ({self.experiment.rollout_waves}) cannot exceed "
                             f"rollout.trajectories ({self.rollout.trajectories}): each wave holds some of every "
                             "task's trajectories")

    def _check_shared(self) -> None:
        if self.backend not in TARGETS:
            raise ValueError(f"backend must be one of {TARGETS} (cuda on a GPU machine), got {self.backend!r}")
        if not isinstance(self.profile, str):
            raise ValueError(f"profile must be a task size profile name or empty, got {self.profile!r}")
        t = self.temperature
        if isinstance(t, bool) or not isinstance(t, numbers.Real) or not t > 0:
            raise ValueError(f"temperature must be > 0 (the paper: 0.9; the trainer cannot train greedy decoding), "
                             f"got {t!r}")
        if not positive_int(self.max_response_tokens):
            raise ValueError(f"max_response_tokens must be a positive number of tokens (the paper: 16384), "
                             f"got {self.max_response_tokens!r}")
        schedule = self.response_length_schedule
        if schedule is None:
            schedule = self.response_length_schedule = {}
        if not isinstance(schedule, Mapping):
            raise ValueError(f"response_length_schedule must map steps to lengths, e.g. {{30: 22528}}; got {schedule!r}")
        for step, tokens in schedule.items():
            try:
                step_number = int(step)
            except (TypeError, ValueError):
                step_number = -1
            if step_number < 1 or not positive_int(tokens):
                raise ValueError(f"response_length_schedule: {step!r}: {tokens!r} must be a training step >= 1 and a "
                                 "positive number of tokens, e.g. {30: 22528}")
            if tokens < self.max_response_tokens:
                raise ValueError(f"response_length_schedule lowers the limit to {tokens} at step {step}; it may only "
                                 f"raise it above max_response_tokens ({self.max_response_tokens}), which the loss's "
                                 "Dr-GRPO constant keeps for the whole run")

    # -- building

    @classmethod
    def from_params(cls, path: str | Path | None, overrides: list[str] | tuple[str, ...] = ()) -> "RunConfig":
        """The run's config from params.yaml (``path``; None: defaults) with ``key.sub=value`` overrides on top."""
        return cls.from_dict(apply_overrides(read_params(path), overrides))

    @classmethod
    def from_files(cls, paths: Sequence[str | Path], overrides: Sequence[str] = ()) -> "RunConfig":
        """The run's config from params files merged in order (later ones win, setting by setting), then overrides:
        ``RunConfig.from_files(["params.yaml", "configs/cpu.yaml"], ["experiment.steps=1"])``."""
        return cls.from_dict(apply_overrides(read_params_files(paths), list(overrides)))

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> "RunConfig":
        known = set(SHARED_DEFAULTS) | set(SECTIONS)
        unknown = sorted(set(data) - known)
        if unknown:
            raise ValueError(f"unknown params.yaml keys {unknown}; the top level holds the sections {list(SECTIONS)} "
                             f"and the shared values {list(SHARED_DEFAULTS)}")
        return cls(**{k: (v if v is not None or k not in SECTIONS else {}) for k, v in data.items()})

    # -- reading

    def response_tokens_at(self, step: int) -> int:
        """The response length limit in force at training step ``step`` (0-based)."""
        limit = self.max_response_tokens
        for start, tokens in self.response_length_schedule.items():
            if step >= start:
                limit = tokens
        return limit

    def to_dict(self) -> dict[str, Any]:
        """Every value, sections complete and resolved (for tracking; ``from_dict`` reads it back)."""
        out: dict[str, Any] = {key: getattr(self, key) for key in SHARED_DEFAULTS}
        out["response_length_schedule"] = dict(self.response_length_schedule)
        out.update({name: getattr(self, name).to_dict() for name in SECTIONS})
        return out

    def params_dict(self) -> dict[str, Any]:
        """The run as params.yaml writes it: shared values at the top, sections without the values handed down
        or derived from others (those are set once, at the top)."""
        out = self.to_dict()
        for path in [p for paths in HANDED_DOWN.values() for p in paths] + list(DERIVED):
            node = out
            for part in path[:-1]:
                node = node[part]
            node.pop(path[-1], None)
        return out
