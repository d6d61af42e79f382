"""Experiment tracking: the one package that talks to MLflow.

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
- mlflow is imported inside the functions that need it: ``import kevin.tracking`` stays cheap and works where
  mlflow is not installed (the pure functions need only the standard library and matplotlib).
- Resume = the same run id, kept in ``<out_dir>/mlflow_run.json`` next to the run's outputs, so
  ``kevin train --resume`` keeps logging into the run it started.
- Only one process of a multi-process job should track: build the Tracker on rank 0, or with ``enabled=False``
  elsewhere (every method is then a no-op, so calling code needs no branches).

The modules, one responsibility each (every name below is importable from ``kevin.tracking`` itself):
- ``config``: ``TrackingConfig`` and where the store and artifacts live;
- ``params``: the config as params (sections per run kind, dotted keys, MLflow's key and length rules);
- ``tags``: git, DVC and Prefect tags, and what launched the run;
- ``metrics``: ``StepSummary``, ``summarize_step`` and the metric names of a step (``step_metrics``);
- ``artifacts``: the readable markdown artifacts (kernel sample, task table, step table);
- ``plots``: reward per turn and the Not-Okay Ratio over steps (matplotlib imported there, on demand);
- ``store``: the experiment, the run file, MLflow's batch sizes;
- ``tracker``: ``Tracker``, a run's lifecycle over the store.

See docs/tracking.md for every metric name, tag and artifact.
"""

from __future__ import annotations

from kevin.tracking.artifacts import (
    STEP_TABLE_COLUMNS,
    kernel_sample,
    kernels_markdown,
    markdown_table,
    steps_table_markdown,
    tasks_table_markdown,
)
from kevin.tracking.config import (
    TrackingConfig,
    experiment_ui_path,
    resolve_artifact_location,
    resolve_tracking_uri,
    store_folder,
)
from kevin.tracking.metrics import (
    FAST_P,
    NAMESPACES,
    STATUSES,
    StepSummary,
    monitor_metric_key,
    step_metrics,
    summarize_step,
    turn_name,
)
from kevin.tracking.params import (
    EVALUATION_SECTIONS,
    MAX_KEY,
    MAX_PARAM_VALUE,
    MAX_TAG_VALUE,
    NOT_TRAINING_SECTIONS,
    RUN_KINDS,
    clip_text,
    config_params,
    flatten_config,
    mlflow_key,
    run_config,
)
from kevin.tracking.plots import NOT_OKAY_CHECK, not_okay_check, plot_not_okay_ratio, plot_reward_per_turn
from kevin.tracking.store import EXPERIMENT_KIND, EXPERIMENT_KIND_TAG, RUN_FILE, training_run_record
from kevin.tracking.tags import dvc_tags, git_commit, launcher, launcher_tags, prefect_flow_run, run_tags
from kevin.tracking.tracker import RUN_STATUSES, Tracker

__all__ = [
    "EVALUATION_SECTIONS",
    "EXPERIMENT_KIND",
    "EXPERIMENT_KIND_TAG",
    "FAST_P",
    "MAX_KEY",
    "MAX_PARAM_VALUE",
    "MAX_TAG_VALUE",
    "NAMESPACES",
    "NOT_OKAY_CHECK",
    "NOT_TRAINING_SECTIONS",
    "RUN_FILE",
    "RUN_KINDS",
    "RUN_STATUSES",
    "STATUSES",
    "STEP_TABLE_COLUMNS",
    "StepSummary",
    "Tracker",
    "TrackingConfig",
    "clip_text",
    "config_params",
    "dvc_tags",
    "experiment_ui_path",
    "flatten_config",
    "git_commit",
    "kernel_sample",
    "kernels_markdown",
    "launcher",
    "launcher_tags",
    "markdown_table",
    "mlflow_key",
    "monitor_metric_key",
    "not_okay_check",
    "plot_not_okay_ratio",
    "plot_reward_per_turn",
    "prefect_flow_run",
    "resolve_artifact_location",
    "resolve_tracking_uri",
    "run_config",
    "run_tags",
    "step_metrics",
    "steps_table_markdown",
    "store_folder",
    "summarize_step",
    "tasks_table_markdown",
    "training_run_record",
    "turn_name",
]
