"""One step's numbers: ``StepSummary`` (what a step produced, by phase), ``summarize_step`` (filled from its
records) and ``step_metrics`` (its MLflow metric names, in fixed namespaces so ablations line up column for column).

Pure: docs/tracking.md lists every name made here.
"""

from __future__ import annotations

import re
import statistics
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any

from kevin.tracking.params import mlflow_key

if TYPE_CHECKING:  # only for annotations: these records are read by duck typing
    from kevin.records.rollout import Trajectory, Turn

# The metric namespaces a step logs under (and the ones Tracker.history reads back).
NAMESPACES = ("reward", "eval", "loss", "monitor", "perf")
# The verdicts of the evaluator, in the order kernel samples and tables show them (best first). Written out
# rather than read from the Status enum so the metric keys of a run never change with an import.
STATUSES = ("correct", "incorrect", "runtime_error", "compile_error", "timeout", "rule_violation", "parse_error")
FAST_P = (1.0, 1.5)  # eval/fast_1 and eval/fast_1.5, the paper's fast_p thresholds


@dataclass
class StepSummary:
    """What one training step produced, by phase; ``step_metrics`` turns it into MLflow metric names.

    ``summarize_step`` fills it from the step's records; a flow can also fill it by hand. Every field but
    ``step`` may be left empty, and then adds no metrics.
    """

    step: int
    """The training step (MLflow's x axis; 0-based like the checkpoints)."""

    reward: dict[str, float] = field(default_factory=dict)
    """Reward phase, logged as ``reward/<key>``: kernel scores and turn returns (``summarize_step`` gives
    score_mean, score_max, best_score_mean, return_mean, and ``turn_<n>`` the mean score of the n-th turn,
    counted from 1)."""

    statuses: dict[str, int] = field(default_factory=dict)
    """Evaluation phase: how many kernels got each verdict (keys from STATUSES)."""

    speedups: list[float] = field(default_factory=list)
    """Evaluation phase: the speedup of every correct kernel."""

    best_speedups: list[float] = field(default_factory=list)
    """Evaluation phase: per trajectory, the speedup of its fastest correct kernel (0 when none is correct)."""

    loss: list[dict[str, float]] = field(default_factory=list)
    """Update phase: the trainer's metrics, one dict per optimiser step of the batch (``GRPOTrainer.update``)."""

    monitor: dict[str, float] = field(default_factory=dict)
    """The collapse monitor's row for this step (``CollapseMonitor.history[-1]``)."""

    seconds: dict[str, float] = field(default_factory=dict)
    """Wall seconds per phase, e.g. {"rollout": 80.1, "update": 12.3, "checkpoint": 1.2, "step": 95.0}."""

    tokens: dict[str, float] = field(default_factory=dict)
    """Tokens handled per phase; with ``seconds`` of the same phase they give ``perf/<phase>_tokens_per_s``."""

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def summarize_step(
    step: int,
    trajectories: Sequence[Trajectory],
    *,
    returns: Sequence[float] = (),
    update_metrics: Sequence[Mapping[str, float]] = (),
    monitor_row: Mapping[str, float] | None = None,
    seconds: Mapping[str, float] | None = None,
) -> StepSummary:
    """A StepSummary from one step's trajectories (turns with verdicts), the turn returns of its samples
    (``TrainingSample.reward``), the trainer's metrics, the monitor's row and the phase timings.
    ``tokens["rollout"]`` is set to the response tokens generated."""
    turns = [t for traj in trajectories for t in traj.turns]
    reward: dict[str, float] = {}
    if turns:
        scores = [t.score for t in turns]
        reward = {"score_mean": sum(scores) / len(scores), "score_max": max(scores),
                  "best_score_mean": sum(tr.best_score for tr in trajectories) / len(trajectories)}
        by_turn: dict[int, list[float]] = {}
        for t in turns:
            by_turn.setdefault(t.turn, []).append(t.score)
        for index in sorted(by_turn):
            reward[turn_name(index)] = sum(by_turn[index]) / len(by_turn[index])
    if returns:
        reward["return_mean"] = sum(returns) / len(returns)
    return StepSummary(
        step=step,
        reward=reward,
        statuses=dict(Counter(turn_status(t) for t in turns)),
        speedups=[t.speedup for t in turns if t.correct],
        best_speedups=[tr.best_speedup for tr in trajectories],
        loss=[dict(m) for m in update_metrics],
        monitor=dict(monitor_row or {}),
        seconds=dict(seconds or {}),
        tokens={"rollout": float(sum(t.response_tokens for t in turns))} if turns else {},
    )


def turn_name(index: int) -> str:
    """A turn in MLflow metric names, counted from 1 as the pipeline's metrics.json counts them
    (``score_mean_turn_1``): ``turn_1`` for the turn of 0-based index 0."""
    return f"turn_{index + 1}"


_MONITOR_TURN = re.compile(r"(?<=/)turn(\d+)$")


def monitor_metric_key(key: str) -> str:
    """A monitor row key as an MLflow metric name (without ``monitor/``): the row's 0-based per-turn keys (the
    keys its thresholds use) counted from 1, ``junk_share/turn0`` -> ``junk_share/turn_1``; others unchanged."""
    return _MONITOR_TURN.sub(lambda m: turn_name(int(m.group(1))), key)


def turn_status(turn: Turn) -> str:
    """A turn's verdict as its STATUSES name (a Status enum or plain text alike)."""
    return getattr(turn.status, "value", str(turn.status))


# Trainer metrics that are counters: the last optimiser step's value, not the mean, describes the batch.
_LAST_VALUE = frozenset({"optimizer_step"})
# Trainer metrics that describe speed: logged under perf/ with a train_ prefix.
_PERF_KEYS = frozenset({"tokens_per_s"})


def step_metrics(summary: StepSummary) -> dict[str, float]:
    """One step's MLflow metrics, by namespace (pure; docs/tracking.md lists every name):

    - ``reward/<key>``: each entry of ``summary.reward``;
    - ``eval/kernels``: kernels judged; ``eval/status/<status>``: share of them with each verdict, for every
      status in STATUSES (0 when none), so every run has the same keys;
    - ``eval/speedup_mean|median|max``: over correct kernels (absent when none is correct: the mean of nothing
      is not 0); ``eval/best_speedup_mean``: mean over trajectories of the best correct speedup (0 if none);
      ``eval/fast_1``, ``eval/fast_1.5``: share of trajectories with a correct kernel at least that fast;
    - ``loss/<key>``: each trainer metric, averaged over the optimiser steps of the batch (``optimizer_step``:
      the last); ``perf/train_tokens_per_s``: the trainer's tokens per second, averaged;
    - ``monitor/<key>``: the monitor row without ``step`` (``not_okay_ratio``, ``junk_share``, ``not_okay_check``,
      per turn ``not_okay_ratio/turn_<n>`` with the row's 0-based ``turn<t>`` counted from 1, ...);
    - ``perf/<phase>_s``: seconds per phase; ``perf/<phase>_tokens_per_s``: tokens / seconds of that phase.
    """
    out: dict[str, float] = {f"reward/{key}": float(value) for key, value in summary.reward.items()}
    out.update(_eval_metrics(summary))
    out.update(_update_metrics(summary.loss))
    out.update({f"monitor/{monitor_metric_key(k)}": float(v) for k, v in summary.monitor.items() if k != "step"})
    out.update(_phase_metrics(summary.seconds, summary.tokens))
    return {mlflow_key(k): v for k, v in out.items()}


def _eval_metrics(summary: StepSummary) -> dict[str, float]:
    """The ``eval/`` part of ``step_metrics``: verdict shares, speedups over correct kernels, fast_p."""
    unknown = sorted(set(summary.statuses) - set(STATUSES))
    if unknown:
        raise ValueError(f"unknown verdict statuses {unknown}; expected keys from {list(STATUSES)}")
    out: dict[str, float] = {}
    kernels = sum(summary.statuses.values())
    if kernels:
        out["eval/kernels"] = float(kernels)
        for status in STATUSES:
            out[f"eval/status/{status}"] = summary.statuses.get(status, 0) / kernels
    if summary.speedups:
        out["eval/speedup_mean"] = sum(summary.speedups) / len(summary.speedups)
        out["eval/speedup_median"] = float(statistics.median(summary.speedups))
        out["eval/speedup_max"] = float(max(summary.speedups))
    if summary.best_speedups:
        n = len(summary.best_speedups)
        out["eval/best_speedup_mean"] = sum(summary.best_speedups) / n
        for p in FAST_P:
            out[f"eval/fast_{p:g}"] = sum(s >= p for s in summary.best_speedups) / n
    return out


def _update_metrics(loss: Sequence[Mapping[str, float]]) -> dict[str, float]:
    """The trainer's metrics over the optimiser steps of a batch: ``loss/<key>`` (``perf/train_<key>`` for speed)."""
    out: dict[str, float] = {}
    for key in sorted({k for row in loss for k in row}):
        values = [float(row[key]) for row in loss if key in row]
        value = values[-1] if key in _LAST_VALUE else sum(values) / len(values)
        out[f"perf/train_{key}" if key in _PERF_KEYS else f"loss/{key}"] = value
    return out


def _phase_metrics(seconds: Mapping[str, float], tokens: Mapping[str, float]) -> dict[str, float]:
    """``perf/<phase>_s`` for every timed phase, ``perf/<phase>_tokens_per_s`` for those that also counted tokens."""
    out = {f"perf/{phase}_s": float(s) for phase, s in seconds.items()}
    for phase, count in tokens.items():
        phase_seconds = seconds.get(phase, 0.0)
        if phase_seconds > 0:
            out[f"perf/{phase}_tokens_per_s"] = float(count) / phase_seconds
    return out
