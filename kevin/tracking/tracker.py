"""``Tracker``: one MLflow run's lifecycle (start or resume, log, end with its real status) over an explicit
``MlflowClient``.

Everything a run logs is computed by the pure modules beside this one; this module only writes it to the store.
mlflow is imported inside the methods that need it, and a disabled tracker never imports it.
"""

from __future__ import annotations

import json
import logging
import os
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from kevin.tracking.artifacts import kernel_sample, kernels_markdown, steps_table_markdown, tasks_table_markdown
from kevin.tracking.config import (
    TrackingConfig,
    experiment_ui_path,
    resolve_artifact_location,
    resolve_tracking_uri,
    store_folder,
)
from kevin.tracking.metrics import NAMESPACES, StepSummary, step_metrics
from kevin.tracking.params import (
    MAX_TAG_VALUE,
    RUN_KINDS,
    clip_text,
    config_dict,
    config_params,
    mlflow_key,
    run_config,
)
from kevin.tracking.plots import plot_not_okay_ratio, plot_reward_per_turn, reward_turn_keys
from kevin.tracking.store import (
    BATCH_METRICS,
    BATCH_PARAMS,
    RUN_FILE,
    batches,
    experiment_id,
    read_run_file,
    training_run_record,
    write_run_file,
)
from kevin.tracking.tags import run_tags

if TYPE_CHECKING:  # only for annotations: these records are read by duck typing
    from kevin.monitor import Alert
    from kevin.records.rollout import Trajectory

# The package's logger, as before it was split into modules.
logger = logging.getLogger(__package__)

RUN_STATUSES = ("FINISHED", "FAILED", "KILLED")


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
        previous = read_run_file(self.run_file) if resume else None
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
        write_run_file(self.run_file, {"run_id": self.run_id, "experiment_id": self.experiment_id,
                                       "experiment_name": self.config.experiment_name,
                                       "tracking_uri": self.tracking_uri})
        logger.info("MLflow run %s (experiment %r) in %s; in the UI: %s", self.run_id, self.config.experiment_name,
                    self.tracking_uri, experiment_ui_path(self.experiment_id))
        return self

    def _create(self) -> None:
        location = resolve_artifact_location(self.config.artifact_location, self.tracking_uri, self.store_dir)
        self.experiment_id = experiment_id(self.client, self.config.experiment_name, location)
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
        for batch in batches(new, BATCH_PARAMS):
            self.client.log_batch(self.run_id, params=batch)
        plain = json.loads(json.dumps(config_dict(config), default=str))  # plain types for YAML
        # The config a run started with stays; a resume with changes adds its own copy beside it.
        name = f"config.resume{self._resumes}.yaml" if existing else "config.yaml"
        if changed or not existing:
            self.client.log_text(self.run_id, yaml.safe_dump(plain, sort_keys=False), name)

    def _set_tags(self, tags: Mapping[str, str]) -> None:
        from mlflow.entities import RunTag

        items = [RunTag(mlflow_key(k), clip_text(str(v), MAX_TAG_VALUE)) for k, v in tags.items()]
        for batch in batches(items, BATCH_PARAMS):
            self.client.log_batch(self.run_id, tags=batch)

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
        for batch in batches(items, BATCH_METRICS):
            self.client.log_batch(self.run_id, metrics=batch)
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
        if reward_turn_keys(history):
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
