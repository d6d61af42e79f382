"""Experiment tracking: the one module that talks to MLflow.

One MLflow run per training run. A run holds:
- params: the sections of the resolved config the run's kind (training, evaluation) depends on, flattened to dotted
  keys (``train.lr``, ``monitor.max_thresholds.junk_share``); the whole config also goes in as ``config.yaml``;
- metrics per step, in fixed namespaces so ablations line up column for column in the UI (``step_metrics``):
  ``reward/`` kernel scores and turn returns, ``eval/`` verdict shares and speedups, ``loss/`` the update,
  ``monitor/`` Not-Okay Ratio and junk, ``perf/`` seconds per phase and tokens per second;
- tags: git commit, model, backend, the DVC experiment when run under ``dvc exp run``, what launched the run (DVC,
  a Prefect deployment, a shell) and its Prefect flow run, an evaluation's training run, and why the run stopped;
- the experiment: tagged a model-training one (``mlflow.experimentKind``), not MLflow 3's default GenAI kind;
- artifacts per step under ``steps/step_NNNNNN/`` (rollout JSONL, a sample of kernels with their verdicts,
  a table per task, the step's alerts) and, for the run, plots of reward per turn and of the Not-Okay Ratio
  over steps plus a table of the main metrics per step, redrawn from MLflow's own history (so a resumed run
  plots all of its steps).

Design choices:
- ``MlflowClient`` with an explicit run id everywhere, never the fluent API's global active run: the library
  keeps no process-wide state, and two trackers (two runs) can live in one process.
- mlflow is imported inside the methods that need it: ``import kevin.tracking`` stays cheap and works where
  mlflow is not installed (the pure functions need only the standard library and matplotlib).
- Resume = the same run id, kept in ``<out_dir>/mlflow_run.json`` next to the run's outputs, so
  ``kevin train --resume`` keeps logging into the run it started.
- Only one process of a multi-process job should track: build the Tracker on rank 0, or with ``enabled=False``
  elsewhere (every method is then a no-op, so calling code needs no branches).

See docs/tracking.md for every metric name, tag and artifact.
"""

from __future__ import annotations

import json
import logging
import os
import random
import re
import statistics
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field, is_dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from kevin.settings import Settings

if TYPE_CHECKING:  # only for annotations: these records are read by duck typing
    from kevin.monitor import Alert
    from kevin.records.rollout import Trajectory, Turn

logger = logging.getLogger(__name__)

NAMESPACES = ("reward", "eval", "loss", "monitor", "perf")
RUN_FILE = "mlflow_run.json"
# The verdicts of the evaluator, in the order kernel samples and tables show them (best first). Written out
# rather than read from the Status enum so the metric keys of a run never change with an import.
STATUSES = ("correct", "incorrect", "runtime_error", "compile_error", "timeout", "rule_violation", "parse_error")
FAST_P = (1.0, 1.5)  # eval/fast_1 and eval/fast_1.5, the paper's fast_p thresholds
RUN_STATUSES = ("FINISHED", "FAILED", "KILLED")
# MLflow's limits (mlflow.utils.validation); checked here so a long value is shortened, not a failed run.
MAX_PARAM_VALUE = 6000
MAX_TAG_VALUE = 8000
MAX_KEY = 250
_BATCH_PARAMS = 100
_BATCH_METRICS = 1000
_KEY_BAD_CHARS = re.compile(r"[^/\w.\- :]")
# MLflow 3's experiment tag that names what an experiment is for; "custom_model_development" is its model-training
# kind (the others: "genai_development", "finetuning", ...). Without it the UI treats the experiment as GenAI work.
EXPERIMENT_KIND_TAG = "mlflow.experimentKind"
EXPERIMENT_KIND = "custom_model_development"
# The config sections a run logs as params (the whole config is the artifact config.yaml either way), so that the
# compare view of a training run and an evaluation run shows what differs between them, not 200 equal rows.
# Training: every section but those only an evaluation or the bookkeeping reads.
NOT_TRAINING_SECTIONS = frozenset({"evaluate", "analysis", "beam", "tracking", "alerts"})
# Evaluation: what decides its numbers: the tasks and budgets, the judge, the model and how it samples and is prompted.
EVALUATION_SECTIONS = frozenset({"evaluate", "analysis", "beam", "evaluation", "policy", "sampling", "rollout", "splits"})
RUN_KINDS = ("training", "evaluation")


# ----------------------------------------------------------------------------------------------------
# Config


@dataclass
class TrackingConfig(Settings):
    """Where and how a training run is tracked in MLflow."""

    section = "tracking"

    enabled: bool = True
    """Track this run in MLflow; False turns every Tracker method into a no-op (mlflow is then never imported)."""

    tracking_uri: str = "sqlite:///mlflow.db"
    """The MLflow store. A relative sqlite path is taken from the project folder, so the README's
    ``mlflow ui --backend-store-uri sqlite:///mlflow.db`` run there opens it; ``sqlite:////abs/path.db`` or a
    server (``http://host:5000``) work too. The ``./mlruns`` file store is refused (MLflow deprecated it)."""

    artifact_location: str = "mlartifacts"
    """Where a NEW experiment of a sqlite store keeps its artifacts: a folder (relative to the project folder)
    or a URI (``s3://bucket/kevin``). With a tracking server the server decides unless this is a URI."""

    experiment_name: str = "kevin"
    """The MLflow experiment; ablations of one study share it, so the UI compares their runs side by side."""

    run_name: str = ""
    """The run's name; "" uses the DVC experiment name under ``dvc exp run``, else MLflow picks one."""

    kernel_sample_size: int = 8
    """How many kernels (with their verdicts) each step stores as a readable sample; 0 stores none."""

    log_rollouts: bool = True
    """Store each step's rollout records (JSONL) as artifacts; off saves space on long runs."""

    plot_every: int = 1
    """Redraw the run's plots and step table every this many steps (and always when the run ends)."""

    def __post_init__(self) -> None:
        uri = self.tracking_uri.strip()
        if not uri:
            raise ValueError("tracking.tracking_uri is empty; use sqlite:///mlflow.db (the default) or a server URL")
        if "://" not in uri or uri.startswith("file:"):
            raise ValueError(
                f"tracking.tracking_uri {self.tracking_uri!r} is a file store, which MLflow 3 refuses by default; "
                "use sqlite:///mlflow.db (a database in the project folder) or a tracking server URL"
            )
        if not self.experiment_name.strip():
            raise ValueError("tracking.experiment_name is empty; name the MLflow experiment, e.g. 'kevin'")
        if not isinstance(self.kernel_sample_size, int) or self.kernel_sample_size < 0:
            raise ValueError(f"tracking.kernel_sample_size must be an integer >= 0 (0 stores no sample), "
                             f"got {self.kernel_sample_size!r}")
        if not isinstance(self.plot_every, int) or self.plot_every < 1:
            raise ValueError(f"tracking.plot_every must be an integer >= 1, got {self.plot_every!r}")


def store_folder(project_dir: str | Path, env: Mapping[str, str]) -> Path:
    """The folder a relative store path is taken from: the DVC repository's root (``DVC_ROOT``) when DVC runs
    the command, else ``project_dir``. ``dvc exp run --queue`` / ``--temp`` run each experiment in a temporary
    copy of the repository and set ``DVC_ROOT`` to the original, so every ablation lands in its one database
    instead of a copy that is deleted afterwards."""
    return Path(env["DVC_ROOT"]) if env.get("DVC_ROOT") else Path(project_dir)


def resolve_tracking_uri(uri: str, project_dir: str | Path) -> str:
    """``uri`` with a relative sqlite path made absolute against ``project_dir`` (other URIs unchanged).

    ``sqlite:///mlflow.db`` names a path relative to the working directory; tracking must not depend on where
    the command was started, so it is pinned to the project folder: ``sqlite:////abs/project/mlflow.db``.
    """
    prefix = "sqlite:///"
    if not uri.startswith(prefix):
        return uri
    path = uri[len(prefix):]
    if not path or path.startswith("/") or path == ":memory:":
        return uri
    return prefix + str((Path(project_dir) / path).resolve())


def resolve_artifact_location(location: str, tracking_uri: str, project_dir: str | Path) -> str | None:
    """The artifact location for a new experiment: a URI as is; a folder, for a sqlite store, as an absolute
    ``file://`` URI under ``project_dir``; None (the store's default) for a folder with a tracking server."""
    if not location:
        return None
    if "://" in location:
        return location
    if not tracking_uri.startswith("sqlite:"):
        return None
    return (Path(project_dir) / location).resolve().as_uri()


def experiment_ui_path(experiment_id: str | None) -> str:
    """The experiment's runs in the MLflow UI, in its model-training view: append to the UI's address
    (``http://127.0.0.1:5000/``). MLflow 3.17's UI takes its view from a sidebar switch (GenAI / Model training,
    remembered by the browser, GenAI until switched) or from ``workflowType`` in the address, not from the
    experiment's kind tag; this address opens the training view whatever the switch says."""
    return f"#/experiments/{experiment_id}/runs?workflowType=machine_learning"


def training_run_record(checkpoint: str | Path) -> dict[str, str] | None:
    """The MLflow run of the training run that saved ``checkpoint`` (``<run folder>/checkpoints/step_N``), as its
    run folder's ``mlflow_run.json`` records it (run_id, experiment_id, tracking_uri); None when there is none (a
    checkpoint moved out of its run folder, a run trained with tracking off)."""
    path = Path(checkpoint).parent.parent / RUN_FILE
    if not path.is_file():
        return None
    data = json.loads(path.read_text(encoding="utf-8"))
    return data if isinstance(data, dict) and data.get("run_id") else None


# ----------------------------------------------------------------------------------------------------
# Params and tags


def _config_dict(config: Any) -> Mapping[str, Any]:
    if is_dataclass(config) and not isinstance(config, type):
        return asdict(config)
    if not isinstance(config, Mapping):
        raise TypeError(f"config must be a mapping or a dataclass, got {type(config).__name__}")
    return config


def flatten_config(config: Any, prefix: str = "") -> dict[str, Any]:
    """Nested mappings (or dataclasses) as one level of dotted keys: {"train": {"lr": 2e-6}} -> {"train.lr": 2e-6}.
    Lists stay values; an empty mapping stays a value ({}) so the key still shows up."""
    config = _config_dict(config)
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
    config = _config_dict(config)
    sections = {k for k, v in config.items() if isinstance(v, Mapping)}
    openai = _generator_sections(config)
    if kind == "training":
        keep = sections - NOT_TRAINING_SECTIONS - ({"openai"} - openai)
    else:
        keep = sections & (EVALUATION_SECTIONS | openai)
    return {k: v for k, v in config.items() if k in keep or k not in sections}


def git_commit(project_dir: str | Path) -> tuple[str, bool] | None:
    """(commit, dirty) of the git checkout holding ``project_dir``; None outside a repository or without git.
    dirty: tracked files differ from the commit (untracked files do not count)."""
    def git(*args: str) -> str:
        return subprocess.run(["git", "-C", str(project_dir), *args], capture_output=True, text=True,
                              timeout=30, check=True).stdout.strip()
    try:
        commit = git("rev-parse", "HEAD")
        dirty = bool(git("status", "--porcelain", "--untracked-files=no"))
    except (OSError, subprocess.SubprocessError):
        return None
    return commit, dirty


def dvc_tags(env: Mapping[str, str]) -> dict[str, str]:
    """Tags from the variables DVC sets for the command of a stage: ``DVC_EXP_NAME`` (the experiment's name,
    under ``dvc exp run`` only), ``DVC_EXP_BASELINE_REV`` (the commit it derives from) and ``DVC_STAGE``
    (the stage, also under ``dvc repro``)."""
    names = {"DVC_EXP_NAME": "dvc.exp_name", "DVC_EXP_BASELINE_REV": "dvc.baseline_rev", "DVC_STAGE": "dvc.stage"}
    return {tag: env[var] for var, tag in names.items() if env.get(var)}


def prefect_flow_run() -> dict[str, str]:
    """The Prefect flow run this process works for: {"id", "name", "deployment_id"} (name and deployment only
    inside the run's own context, where reading them costs no API call); {} outside a flow run or without
    Prefect. The id also comes from a task run's context or from ``PREFECT__FLOW_RUN_ID``, which a Prefect worker
    sets for the flow run's process."""
    # A flow run in this process has imported prefect; one in a parent process left its id in the environment.
    # Otherwise there is none, and importing prefect (seconds) is skipped.
    if "prefect" not in sys.modules and not os.environ.get("PREFECT__FLOW_RUN_ID"):
        return {}
    try:
        from prefect.context import FlowRunContext
        from prefect.runtime import flow_run
    except ImportError:
        return {}
    run_id = flow_run.id
    if not run_id:
        return {}
    found = {"id": str(run_id)}
    context = FlowRunContext.get()
    if context is not None and context.flow_run is not None and str(context.flow_run.id) == found["id"]:
        found["name"] = context.flow_run.name or ""
        found["deployment_id"] = str(context.flow_run.deployment_id or "")
    return {k: v for k, v in found.items() if v}


def launcher(env: Mapping[str, str], flow_run: Mapping[str, str]) -> str:
    """What started the run: "dvc" (``dvc repro`` / ``dvc exp run``, which set ``DVC_STAGE`` for a stage's
    command), "prefect" (a Prefect deployment's run: a schedule, an automation, ``prefect deployment run``), else
    "cli" (a command typed in a shell; ``kevin train`` runs its Prefect flow in-process, without a deployment)."""
    if env.get("DVC_STAGE"):
        return "dvc"
    if flow_run.get("deployment_id"):
        return "prefect"
    return "cli"


def launcher_tags(env: Mapping[str, str], flow_run: Mapping[str, str]) -> dict[str, str]:
    """``kevin.launcher`` and the Prefect flow run (``prefect.flow_run_id``, ``prefect.flow_run_name``,
    ``prefect.deployment_id``) when there is one, whoever launched it."""
    tags = {"kevin.launcher": launcher(env, flow_run)}
    names = {"id": "prefect.flow_run_id", "name": "prefect.flow_run_name", "deployment_id": "prefect.deployment_id"}
    tags.update({tag: flow_run[key] for key, tag in names.items() if flow_run.get(key)})
    return tags


def run_tags(project_dir: str | Path, env: Mapping[str, str], *, model: str = "", backend: str = "",
             flow_run: Mapping[str, str] | None = None) -> dict[str, str]:
    """The tags every run gets: git commit (also as MLflow's own source-commit tag, which the UI shows),
    whether the checkout was dirty, model, backend, the DVC experiment, and what launched the run
    (``launcher_tags`` of ``flow_run``, by default the Prefect flow run this process works for)."""
    tags: dict[str, str] = {}
    git = git_commit(project_dir)
    if git is not None:
        tags["git.commit"] = tags["mlflow.source.git.commit"] = git[0]
        tags["git.dirty"] = str(git[1]).lower()
    if model:
        tags["model"] = model
    if backend:
        tags["backend"] = backend
    tags.update(dvc_tags(env))
    tags.update(launcher_tags(env, prefect_flow_run() if flow_run is None else flow_run))
    return tags


# ----------------------------------------------------------------------------------------------------
# One step's numbers


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
        statuses=dict(Counter(_status(t) for t in turns)),
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


def _status(turn: Turn) -> str:
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
    out: dict[str, float] = {}
    for key, value in summary.reward.items():
        out[f"reward/{key}"] = float(value)

    unknown = sorted(set(summary.statuses) - set(STATUSES))
    if unknown:
        raise ValueError(f"unknown verdict statuses {unknown}; expected keys from {list(STATUSES)}")
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

    for key in sorted({k for row in summary.loss for k in row}):
        values = [float(row[key]) for row in summary.loss if key in row]
        value = values[-1] if key in _LAST_VALUE else sum(values) / len(values)
        out[f"perf/train_{key}" if key in _PERF_KEYS else f"loss/{key}"] = value

    for key, value in summary.monitor.items():
        if key != "step":
            out[f"monitor/{monitor_metric_key(key)}"] = float(value)

    for phase, seconds in summary.seconds.items():
        out[f"perf/{phase}_s"] = float(seconds)
    for phase, tokens in summary.tokens.items():
        seconds = summary.seconds.get(phase, 0.0)
        if seconds > 0:
            out[f"perf/{phase}_tokens_per_s"] = float(tokens) / seconds
    return {mlflow_key(k): v for k, v in out.items()}


# ----------------------------------------------------------------------------------------------------
# Readable artifacts


def kernel_sample(trajectories: Sequence[Trajectory], k: int, seed: int = 0) -> list[Turn]:
    """Up to ``k`` turns that show the step's range of verdicts: round-robin over the statuses (in STATUSES
    order), the correct kernels fastest first, the others in a seeded random order (seed the step, so a
    re-logged step shows the same kernels)."""
    groups: dict[str, list[Turn]] = {}
    for traj in trajectories:
        for turn in traj.turns:
            groups.setdefault(_status(turn), []).append(turn)
    rng = random.Random(seed)
    order = [s for s in STATUSES if s in groups] + sorted(s for s in groups if s not in STATUSES)
    for status in order:
        if status == "correct":
            groups[status].sort(key=lambda t: -t.speedup)
        else:
            rng.shuffle(groups[status])
    picked: list[Turn] = []
    depth = 0
    while len(picked) < k and any(depth < len(groups[s]) for s in order):
        picked += [groups[s][depth] for s in order if depth < len(groups[s])][: k - len(picked)]
        depth += 1
    return picked


def _fence(code: str) -> str:
    # A fence longer than any backtick run inside the code, so a kernel holding ``` cannot end it early.
    longest = max((len(m) for m in re.findall(r"`+", code)), default=0)
    return "`" * max(3, longest + 1)


def kernels_markdown(turns: Sequence[Turn], step: int) -> str:
    """The sampled kernels as markdown: task, trajectory, turn, verdict, speedup, score, feedback, code."""
    lines = [f"# Step {step}: sample of {len(turns)} kernels", ""]
    for t in turns:
        lines += [f"## {t.task_id} / trajectory {t.trajectory} / turn {t.turn}: {_status(t)}", "",
                  f"score {t.score:.4g}, speedup {t.speedup:.4g}" + (", truncated" if t.truncated else ""), ""]
        if t.feedback:
            lines += [f"> {line}" for line in t.feedback.splitlines()] + [""]
        if t.kernel:
            fence = _fence(t.kernel)
            lines += [fence + "python", t.kernel.rstrip("\n"), fence, ""]
        else:
            lines += ["(no kernel: the response could not be parsed)", ""]
    return "\n".join(lines)


def markdown_table(header: Sequence[str], rows: Iterable[Sequence[Any]]) -> str:
    """A markdown table; floats to 4 significant digits, ``|`` in a cell escaped."""
    def cell(value: Any) -> str:
        text = f"{value:.4g}" if isinstance(value, float) else str(value)
        return text.replace("|", "\\|")
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(cell(v) for v in row) + " |" for row in rows]
    return "\n".join(lines) + "\n"


def tasks_table_markdown(trajectories: Sequence[Trajectory], step: int) -> str:
    """One row per task of the step: kernels, correct kernels, best correct speedup, mean score, verdicts."""
    tasks: dict[str, list[Turn]] = {}
    for traj in trajectories:
        tasks.setdefault(traj.task_id, []).extend(traj.turns)
    rows = []
    for task_id in sorted(tasks):
        turns = tasks[task_id]
        counts = Counter(_status(t) for t in turns)
        verdicts = ", ".join(f"{s} {counts[s]}" for s in STATUSES if counts[s])
        best = max((t.speedup for t in turns if t.correct), default=0.0)
        mean = sum(t.score for t in turns) / len(turns) if turns else 0.0
        rows.append((task_id, len(turns), sum(t.correct for t in turns), best, mean, verdicts))
    header = ("task", "kernels", "correct", "best speedup", "mean score", "verdicts")
    return f"# Step {step}: tasks\n\n" + markdown_table(header, rows)


STEP_TABLE_COLUMNS = ("reward/score_mean", "eval/status/correct", "eval/best_speedup_mean", "monitor/not_okay_ratio",
                      "monitor/junk_share", "loss/loss", "perf/step_s")


def steps_table_markdown(history: Mapping[str, Mapping[int, float]], columns: Sequence[str] = STEP_TABLE_COLUMNS) -> str:
    """The run's main metrics, one row per step; ``history`` maps a metric key to {step: value}. A column no
    step has is left out; a step without a value shows "-"."""
    present = [c for c in columns if history.get(c)]
    steps = sorted({s for c in present for s in history[c]})
    rows = [(s, *(history[c].get(s, "-") for c in present)) for s in steps]
    return "# Steps\n\n" + markdown_table(("step", *present), rows)


# ----------------------------------------------------------------------------------------------------
# Plots (matplotlib Figures built without pyplot: no GUI backend, no global figure state)


def _series_plot(series: Mapping[str, Mapping[int, float]], title: str, ylabel: str,
                 thresholds: Mapping[str, float] | None = None, note: str = ""):
    from matplotlib.figure import Figure

    from kevin.monitor import whole_step_axis

    fig = Figure(figsize=(7, 3.5), layout="constrained")
    ax = fig.subplots()
    for label in series:
        points = sorted(series[label].items())
        if points:
            xs, ys = zip(*points)
            ax.plot(xs, ys, marker=".", label=label)
    for label, value in (thresholds or {}).items():
        ax.axhline(value, color="red", linestyle="--", linewidth=1, label=label)
    if note:
        ax.text(0.5, 0.5, note, transform=ax.transAxes, ha="center", va="center", color="dimgray",
                bbox={"facecolor": "white", "edgecolor": "lightgray"})
    ax.set_title(title)
    ax.set_xlabel("step")
    whole_step_axis(ax.xaxis)
    ax.set_ylabel(ylabel)
    if series:
        ax.legend(fontsize=7)
    return fig


_REWARD_TURN = re.compile(r"reward/turn_(\d+)")
_NOT_OKAY_TURN = re.compile(r"monitor/not_okay_ratio/turn_(\d+)")
NOT_OKAY_CHECK = "monitor/not_okay_check"


def _turn_number(key: str) -> int:
    return int(re.search(r"turn_(\d+)$", key).group(1))


def _turn_keys(history: Mapping[str, Any], pattern: re.Pattern) -> list[str]:
    return sorted((k for k in history if pattern.fullmatch(k)), key=_turn_number)


def plot_reward_per_turn(history: Mapping[str, Mapping[int, float]]):
    """Mean kernel score of each turn over steps, one line per ``reward/turn_<n>`` in ``history``."""
    keys = _turn_keys(history, _REWARD_TURN)
    if not keys:
        raise ValueError("no reward/turn_<n> metrics to plot; log steps with StepSummary.reward['turn_<n>'] first")
    series = {f"turn {_turn_number(k)}": history[k] for k in keys}
    return _series_plot(series, "Mean kernel score per turn", "score")


def not_okay_check(history: Mapping[str, Mapping[int, float]]) -> bool | None:
    """Whether the monitor checks the Not-Okay Ratio at the run's latest step (``monitor/not_okay_check``: it does
    not until the base model's opening is calibrated and trusted); None when the history does not say."""
    states = history.get(NOT_OKAY_CHECK)
    if not states:
        return None
    return bool(states[max(states)])


def plot_not_okay_ratio(history: Mapping[str, Mapping[int, float]], threshold: float | None = None):
    """The Not-Okay Ratio over steps (``monitor/not_okay_ratio`` and its per-turn series). The alert threshold is a
    dashed line only while the monitor checks the ratio (``not_okay_check``); while it does not (no calibrated
    opening, so no alert can fire) a note says so instead, and no line suggests a limit that is not applied."""
    keys = ["monitor/not_okay_ratio"] if history.get("monitor/not_okay_ratio") else []
    keys += _turn_keys(history, _NOT_OKAY_TURN)
    if not keys:
        raise ValueError("no monitor/not_okay_ratio metrics to plot; pass the monitor row in StepSummary.monitor")
    series = {("all turns" if k == "monitor/not_okay_ratio" else f"turn {_turn_number(k)}"): history[k] for k in keys}
    if not_okay_check(history) is False:
        from kevin.monitor import NOT_CHECKED_NOTE

        return _series_plot(series, "Not-Okay Ratio", "share of responses", note=NOT_CHECKED_NOTE)
    thresholds = {f"alert threshold {threshold:g}": threshold} if threshold is not None else None
    return _series_plot(series, "Not-Okay Ratio", "share of responses", thresholds)


# ----------------------------------------------------------------------------------------------------
# The tracker


class Tracker:
    """Logs one training run to MLflow. Typical use in a flow::

        tracker = Tracker(TrackingConfig(), out_dir="outputs/train", project_dir=".")
        with tracker.start(config, model="Qwen/QwQ-32B", backend="cuda", resume=args.resume):
            for step in ...:
                tracker.log_step(summarize_step(step, trajectories, ...), trajectories=trajectories,
                                 rollout=step_dir / "rollout", alerts=alerts)
                if monitor.should_stop:
                    alert = monitor.stop_alert
                    tracker.set_stop(kevin.alerts.stop_reason(alert), step=step, metric=alert.metric)
                    break

    Leaving the ``with`` block ends the run: FINISHED, or KILLED when a stop reason was set (the run did not
    reach its planned end) or on Ctrl-C, or FAILED on an exception (its text in the ``error`` tag).

    ``project_dir`` (default: the working directory) is the code's checkout, read for the git tags; the store
    and artifact folder are taken from it too, or from the DVC repository root when DVC runs the command
    (``store_folder``). ``env`` (default ``os.environ``) is where the DVC variables are read.
    """

    def __init__(self, config: TrackingConfig | None = None, out_dir: str | Path = ".", *,
                 project_dir: str | Path | None = None, env: Mapping[str, str] | None = None,
                 nor_threshold: float | None = None) -> None:
        self.config = config or TrackingConfig()
        self.out_dir = Path(out_dir)
        self.project_dir = Path(project_dir) if project_dir is not None else Path.cwd()
        self.env = dict(os.environ if env is None else env)
        self.store_dir = store_folder(self.project_dir, self.env)
        self.nor_threshold = nor_threshold  # drawn on the Not-Okay plot (MonitorConfig.max_thresholds)
        self.tracking_uri = resolve_tracking_uri(self.config.tracking_uri, self.store_dir)
        self.run_id: str | None = None
        self.experiment_id: str | None = None
        self.kind = "training"
        self.stop_reason = ""
        self._client: Any = None
        self._last_step: int | None = None
        self._resumes = 0

    @property
    def enabled(self) -> bool:
        return self.config.enabled

    @property
    def run_file(self) -> Path:
        return self.out_dir / RUN_FILE

    @property
    def client(self):
        """The MlflowClient of this tracker's store (created on first use)."""
        if self._client is None:
            from mlflow.tracking import MlflowClient

            self._client = MlflowClient(tracking_uri=self.tracking_uri)
        return self._client

    # -- start / resume

    def start(self, config: Any = None, *, tags: Mapping[str, str] | None = None, model: str = "",
              backend: str = "", resume: bool = False, kind: str = "training") -> "Tracker":
        """Start the run (or, with ``resume``, reopen the one recorded in ``out_dir``), log the sections of ``config``
        that a run of ``kind`` ("training" or "evaluation", also the tag ``kind``) depends on as params
        (``run_config``) and the whole of it as ``config.yaml``, and set the tags. Returns self, so
        ``with tracker.start(...):`` ends the run on the way out."""
        if kind not in RUN_KINDS:
            raise ValueError(f"run kind {kind!r}; use one of {RUN_KINDS}")
        self.kind = kind
        if not self.enabled:
            return self
        if self.run_id is not None:
            raise RuntimeError(f"this tracker already has run {self.run_id}; end it before starting another")
        all_tags = run_tags(self.project_dir, self.env, model=model, backend=backend) | {"kind": kind} | dict(tags or {})
        previous = self._read_run_file() if resume else None
        if resume and previous is None:
            logger.warning("resume asked but %s does not exist: starting a new MLflow run", self.run_file)
        if previous is not None:
            existing = self._reopen(previous)
            # A resumed run keeps the tags it started with; what differs now (another commit, say) is noted
            # beside them as resume.<tag>.
            all_tags = {(f"resume.{k}" if k in existing and existing[k] != v else k): v for k, v in all_tags.items()}
        else:
            self._create()
        self._set_tags(all_tags)
        if config is not None:
            self.log_config(config)
        self._write_run_file()
        logger.info("MLflow run %s (experiment %r) in %s; in the UI: %s", self.run_id, self.config.experiment_name,
                    self.tracking_uri, experiment_ui_path(self.experiment_id))
        return self

    def _experiment_id(self) -> str:
        from mlflow.exceptions import MlflowException

        name = self.config.experiment_name
        experiment = self.client.get_experiment_by_name(name)
        if experiment is None:
            location = resolve_artifact_location(self.config.artifact_location, self.tracking_uri, self.store_dir)
            try:
                return self.client.create_experiment(name, artifact_location=location,
                                                     tags={EXPERIMENT_KIND_TAG: EXPERIMENT_KIND})
            except MlflowException:  # another process created it between the lookup and the create
                experiment = self.client.get_experiment_by_name(name)
                if experiment is None:
                    raise
        if experiment.lifecycle_stage != "active":
            raise ValueError(f"MLflow experiment {name!r} is deleted; restore it (mlflow experiments restore "
                             f"--experiment-id {experiment.experiment_id}) or set tracking.experiment_name to another name")
        self._mark_training_experiment(experiment)
        return experiment.experiment_id

    def _mark_training_experiment(self, experiment: Any) -> None:
        # An experiment made before the kind was set, or typed GenAI in the UI's first-visit prompt (whose default
        # choice is GenAI), is marked a model-training one.
        from mlflow.exceptions import MlflowException

        kind = experiment.tags.get(EXPERIMENT_KIND_TAG)
        if kind == EXPERIMENT_KIND:
            return
        logger.info("MLflow experiment %r: %s %r -> %r", experiment.name, EXPERIMENT_KIND_TAG, kind, EXPERIMENT_KIND)
        try:
            self.client.set_experiment_tag(experiment.experiment_id, EXPERIMENT_KIND_TAG, EXPERIMENT_KIND)
        except MlflowException as exc:  # e.g. a shared server that lets us log runs but not edit the experiment
            logger.warning("MLflow experiment %r keeps %s %r: %s", experiment.name, EXPERIMENT_KIND_TAG, kind, exc)

    def _create(self) -> None:
        self.experiment_id = self._experiment_id()
        name = self.config.run_name or self.env.get("DVC_EXP_NAME") or None
        run = self.client.create_run(self.experiment_id, run_name=name, tags={"resumes": "0"})
        self.run_id = run.info.run_id

    def _reopen(self, previous: Mapping[str, str]) -> dict[str, str]:
        """Reopen the recorded run; returns its tags as they were."""
        from mlflow.exceptions import MlflowException

        run_id = previous["run_id"]
        try:
            run = self.client.get_run(run_id)
        except MlflowException as exc:
            raise ValueError(
                f"{self.run_file} names MLflow run {run_id} (store {previous.get('tracking_uri')}), which the store "
                f"{self.tracking_uri} does not hold; point tracking.tracking_uri at the store that has it, or delete "
                f"{self.run_file} to start a new run"
            ) from exc
        self.run_id, self.experiment_id = run_id, run.info.experiment_id
        self._resumes = int(run.data.tags.get("resumes", "0")) + 1
        self.client.update_run(run_id, status="RUNNING")
        self.client.set_tag(run_id, "resumes", str(self._resumes))
        for key in ("stop.reason", "stop.step", "stop.metric", "error"):  # the last ending no longer holds
            if key in run.data.tags:
                self.client.delete_tag(run_id, key)
        return dict(run.data.tags)

    def _read_run_file(self) -> dict[str, str] | None:
        if not self.run_file.is_file():
            return None
        data = json.loads(self.run_file.read_text())
        if not isinstance(data, dict) or "run_id" not in data:
            raise ValueError(f"{self.run_file} holds no run_id; delete it to start a new MLflow run")
        return data

    def _write_run_file(self) -> None:
        from kevin.records.jsonl import atomic_write_text

        data = {"run_id": self.run_id, "experiment_id": self.experiment_id,
                "experiment_name": self.config.experiment_name, "tracking_uri": self.tracking_uri}
        atomic_write_text(self.run_file, json.dumps(data, indent=1) + "\n")

    # -- params, tags

    def log_config(self, config: Any) -> None:
        """The resolved config as params (dotted keys; only the sections the run's kind depends on, ``run_config``)
        and, whole, as ``config.yaml``. MLflow params cannot change, so on a resumed run only new keys are logged;
        changed ones are listed in the ``resume.changed_params`` tag and the new config is stored as
        ``config.resume<N>.yaml``."""
        if not self.enabled:
            return
        import yaml
        from mlflow.entities import Param

        params = config_params(run_config(config, self.kind))
        existing = self.client.get_run(self.run_id).data.params
        changed = sorted(k for k, v in params.items() if k in existing and existing[k] != v)
        if changed:
            logger.warning("resumed run %s: config values changed since it started: %s", self.run_id, changed)
            self._set_tags({"resume.changed_params": json.dumps(changed)})
        new = [Param(k, v) for k, v in params.items() if k not in existing]
        for i in range(0, len(new), _BATCH_PARAMS):
            self.client.log_batch(self.run_id, params=new[i:i + _BATCH_PARAMS])
        plain = json.loads(json.dumps(_config_dict(config), default=str))  # plain types for YAML
        # The config a run started with stays; a resume with changes adds its own copy beside it.
        name = f"config.resume{self._resumes}.yaml" if existing else "config.yaml"
        if changed or not existing:
            self.client.log_text(self.run_id, yaml.safe_dump(plain, sort_keys=False), name)

    def _set_tags(self, tags: Mapping[str, str]) -> None:
        from mlflow.entities import RunTag

        items = [RunTag(mlflow_key(k), clip_text(str(v), MAX_TAG_VALUE)) for k, v in tags.items()]
        for i in range(0, len(items), _BATCH_PARAMS):
            self.client.log_batch(self.run_id, tags=items[i:i + _BATCH_PARAMS])

    def set_tags(self, tags: Mapping[str, str]) -> None:
        """Set run tags (values over MLflow's limit are shortened)."""
        if self.enabled:
            self._set_tags(tags)

    def link_training_run(self, checkpoint: str | Path | None) -> str | None:
        """Link this evaluation run to the training run that saved ``checkpoint`` (``training_run_record``): its
        run id as the tag ``kevin.training_run_id`` and the param ``training_run_id``, and, when both runs are in
        this store's same experiment, as MLflow's ``mlflow.parentRunId`` (the UI then lists the evaluation under
        its training run). Returns the training run id; None (and nothing logged) when none is found."""
        if not self.enabled or checkpoint is None:
            return None
        record = training_run_record(checkpoint)
        if record is None:
            logger.info("checkpoint %s: no %s in its run folder, so no training run to link", checkpoint, RUN_FILE)
            return None
        run_id = record["run_id"]
        tags = {"kevin.training_run_id": run_id}
        if self._in_this_experiment(record):
            tags["mlflow.parentRunId"] = run_id
        self._set_tags(tags)
        if "training_run_id" not in self.client.get_run(self.run_id).data.params:
            self.client.log_param(self.run_id, "training_run_id", run_id)
        return run_id

    def _in_this_experiment(self, record: Mapping[str, str]) -> bool:
        from mlflow.exceptions import MlflowException

        if record.get("tracking_uri", self.tracking_uri) != self.tracking_uri:
            return False
        try:
            return self.client.get_run(record["run_id"]).info.experiment_id == self.experiment_id
        except MlflowException:  # the record names a run this store does not hold
            return False

    def set_stop(self, reason: str, *, step: int | None = None, metric: str = "") -> None:
        """Record why the run stops before its planned end (``stop.reason``, ``stop.step``, ``stop.metric`` tags);
        the run then ends KILLED."""
        self.stop_reason = reason
        tags = {"stop.reason": reason}
        if step is not None:
            tags["stop.step"] = str(step)
        if metric:
            tags["stop.metric"] = metric
        self.set_tags(tags)

    # -- steps

    def log_step(self, summary: StepSummary, *, trajectories: Sequence[Trajectory] = (),
                 rollout: str | Path | None = None, alerts: Sequence[Alert] = ()) -> dict[str, float]:
        """Log one step: its metrics (``step_metrics``), its artifacts (``log_step_artifacts``) and, every
        ``plot_every`` steps, the run's plots and step table. Returns the metrics logged."""
        metrics = step_metrics(summary)
        if not self.enabled:
            return metrics
        from mlflow.entities import Metric

        stamp = _now_ms()
        items = [Metric(k, v, stamp, summary.step) for k, v in metrics.items()]
        for i in range(0, len(items), _BATCH_METRICS):
            self.client.log_batch(self.run_id, metrics=items[i:i + _BATCH_METRICS])
        self.log_step_artifacts(summary.step, trajectories=trajectories, rollout=rollout, alerts=alerts)
        self._last_step = summary.step
        if (summary.step + 1) % self.config.plot_every == 0:
            self.log_plots()
        return metrics

    def log_step_artifacts(self, step: int, *, trajectories: Sequence[Trajectory] = (),
                           rollout: str | Path | None = None, alerts: Sequence[Alert] = ()) -> None:
        """Under ``steps/step_NNNNNN/``: the rollout (``rollout`` as given, a JSONL file or the rollout folder;
        else ``rollout.jsonl`` written from ``trajectories``), ``kernels.md``, ``tasks.md`` and ``alerts.json``."""
        if not self.enabled:
            return
        folder = f"steps/step_{step:06d}"
        if self.config.log_rollouts:
            if rollout is not None:
                path = Path(rollout)
                if path.is_dir():
                    self.client.log_artifacts(self.run_id, str(path), f"{folder}/rollout")
                elif path.is_file():
                    self.client.log_artifact(self.run_id, str(path), folder)
                else:
                    raise FileNotFoundError(f"step {step}: no rollout file or folder at {path}")
            elif trajectories:
                text = "".join(json.dumps(t.to_dict(), ensure_ascii=False) + "\n" for tr in trajectories for t in tr.turns)
                self.client.log_text(self.run_id, text, f"{folder}/rollout.jsonl")
        if trajectories:
            if self.config.kernel_sample_size:
                sample = kernel_sample(trajectories, self.config.kernel_sample_size, seed=step)
                self.client.log_text(self.run_id, kernels_markdown(sample, step), f"{folder}/kernels.md")
            self.client.log_text(self.run_id, tasks_table_markdown(trajectories, step), f"{folder}/tasks.md")
        if alerts:
            self.client.log_text(self.run_id, json.dumps([a.to_dict() for a in alerts], indent=1), f"{folder}/alerts.json")
            self._set_tags({"monitor.last_alert": alerts[-1].message})

    def history(self, prefixes: Sequence[str] = NAMESPACES) -> dict[str, dict[int, float]]:
        """Every metric of the run whose namespace is in ``prefixes``, as {key: {step: value}}, read back from
        MLflow (so it covers the steps logged before a resume)."""
        if not self.enabled:
            return {}
        keys = [k for k in self.client.get_run(self.run_id).data.metrics if k.split("/")[0] in prefixes]
        return {k: {m.step: m.value for m in self.client.get_metric_history(self.run_id, k)} for k in keys}

    def log_plots(self) -> None:
        """Redraw ``plots/reward_per_turn.png``, ``plots/not_okay_ratio.png`` and ``steps.md`` from the run's history."""
        if not self.enabled:
            return
        history = self.history(("reward", "monitor", "eval", "loss", "perf"))
        if _turn_keys(history, _REWARD_TURN):
            self.client.log_figure(self.run_id, plot_reward_per_turn(history), "plots/reward_per_turn.png")
        if any(k.startswith("monitor/not_okay_ratio") for k in history):
            self.client.log_figure(self.run_id, plot_not_okay_ratio(history, self.nor_threshold),
                                   "plots/not_okay_ratio.png")
        if history:
            self.client.log_text(self.run_id, steps_table_markdown(history), "steps.md")

    def log_artifact(self, path: str | Path, artifact_path: str | None = None) -> None:
        """Store a file or folder as a run artifact (e.g. a checkpoint's manifest)."""
        if not self.enabled:
            return
        path = Path(path)
        if path.is_dir():
            self.client.log_artifacts(self.run_id, str(path), artifact_path)
        else:
            self.client.log_artifact(self.run_id, str(path), artifact_path)

    # -- end

    def end(self, status: str = "FINISHED") -> None:
        """Redraw the plots and end the run with ``status`` (FINISHED, FAILED or KILLED)."""
        if status not in RUN_STATUSES:
            raise ValueError(f"run status {status!r}; use one of {RUN_STATUSES}")
        if not self.enabled or self.run_id is None:
            return
        try:
            if self._last_step is not None:
                self.log_plots()
        except Exception:  # a plot must not keep the run from being closed with its real status
            logger.exception("MLflow run %s: final plots failed", self.run_id)
        finally:
            self.client.set_terminated(self.run_id, status=status)
            logger.info("MLflow run %s ended %s", self.run_id, status)
            self.run_id = None

    def __enter__(self) -> "Tracker":
        return self

    def __exit__(self, exc_type, exc, tb) -> bool:
        if not self.enabled or self.run_id is None:
            return False
        try:
            if exc_type is None:
                self.end("KILLED" if self.stop_reason else "FINISHED")
            elif issubclass(exc_type, KeyboardInterrupt):
                self.set_stop("interrupted (KeyboardInterrupt)")
                self.end("KILLED")
            else:
                self._set_tags({"error": f"{exc_type.__name__}: {exc}"})
                self.end("FAILED")
        except Exception:
            if exc_type is None:
                raise
            # The store failing too must not hide the exception that ended the run.
            logger.exception("MLflow run %s could not be closed", self.run_id)
        return False


def _now_ms() -> int:
    return int(time.time() * 1000)
