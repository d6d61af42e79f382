"""A training run's tracking: its MLflow run, each step's summary and report, and the run's result.

``TrainingRun`` (``run.py``) is a ``RunTracking``: these methods only read the step's files (``batch.json``, the
rollout, ``samples.jsonl``, ``update.json``, ``monitor.json``, ``timings.json``) and write ``summary.json``,
``report.md`` and the ``.tracked`` marker, so a step finished before a kill is tracked the same way after the resume.
Kept apart from the steps that train because it is the one part that talks to MLflow.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

from kevin.config import RunConfig
from kevin.experiment.files import CHECKPOINTS_DIR, STEPS_DIR, TRACKED, read_json, step_dir, write_json
from kevin.experiment.progress import Progress
from kevin.experiment.report import (
    ROLLOUT_PHASES,
    phase_seconds,
    run_summary,
    step_lines,
    step_report_markdown,
    task_rows,
    turn_rows,
    verdict_counts,
)
from kevin.records.jsonl import atomic_write_text
from kevin.records.rollout import TrainingSample, Trajectory, load_records

if TYPE_CHECKING:
    from kevin.tracking import Tracker

__all__ = ["RunTracking"]


class RunTracking:
    """The tracking half of ``TrainingRun``; the attributes below are the run's (set by ``TrainingRun.__init__``)."""

    config: RunConfig
    name: str
    out_dir: Path
    project_dir: Path
    resume: bool
    steps: int
    next_step: int
    stop_reason: str
    paused: str
    progress: Progress
    tracker: Tracker | None
    mlflow: dict[str, str]

    def trajectories(self, step: int) -> list[Trajectory]:
        raise NotImplementedError  # TrainingRun's: every trajectory of the step

    def _dir(self, step: int) -> Path:
        return step_dir(self.out_dir, step)

    def _start_tracking(self) -> None:
        import dataclasses

        from kevin.experiment.policies import model_label
        from kevin.tracking import Tracker

        tracking = self.config.tracking
        if not tracking.run_name and not os.environ.get("DVC_EXP_NAME"):
            tracking = dataclasses.replace(tracking, run_name=self.name)
        nor = self.config.monitor.max_thresholds.get("not_okay_ratio")
        self.tracker = Tracker(tracking, self.out_dir, project_dir=self.project_dir, nor_threshold=nor)
        # A --resume of a run that never got as far as MLflow starts its MLflow run (without the tracker's warning).
        resume = self.resume and self.tracker.run_file.is_file()
        self.tracker.start(self.config.to_dict(), model=model_label(self.config), backend=self.config.backend,
                           resume=resume, tags={"experiment": self.name})
        if self.tracker.enabled:
            uri = self.tracker.tracking_uri
            self.mlflow = {"run_id": self.tracker.run_id, "experiment": tracking.experiment_name, "tracking_uri": uri,
                           "ui": f"mlflow ui --backend-store-uri {uri}"}

    def _catch_up_tracking(self) -> None:
        """A kill between a step's checkpoint and its tracking left the step out of MLflow: log it now."""
        last = self.next_step - 1
        if last >= 0 and not (step_dir(self.out_dir, last) / TRACKED).is_file():
            self.track(last)


    def track(self, step: int) -> Path:
        """The step's summary (``summary.json``), its report (``report.md``, also the Prefect artifact) and, once, its
        MLflow metrics and artifacts. Built from the step's files, so it also works for a step finished before a
        kill."""
        from kevin.alerts import stop_reason as reason_of
        from kevin.monitor import Alert
        from kevin.tracking import summarize_step

        folder = self._dir(step)
        trajectories = self.trajectories(step)
        samples = load_records(folder / "samples.jsonl", TrainingSample)
        update = read_json(folder / "update.json")
        monitor = read_json(folder / "monitor.json")
        alerts = [Alert.from_dict(a) for a in monitor["alerts"]]
        timings = read_json(folder / "timings.json") if (folder / "timings.json").is_file() else {}
        spans = read_json(folder / "spans.json") if (folder / "spans.json").is_file() else {}
        seconds = phase_seconds(timings, spans)
        report = step_report_markdown(self.name, step, self.steps, trajectories, samples, seconds, update,
                                      monitor["row"], [a.message for a in alerts])
        summary = {"step": step, "tasks": task_rows(trajectories), "turns": turn_rows(trajectories, samples),
                   "verdicts": verdict_counts(trajectories), "seconds": seconds, "update": update,
                   "monitor": monitor["row"], "alerts": [a.message for a in alerts],
                   "stop_reason": next((reason_of(a) for a in alerts if a.should_stop), "")}
        write_json(folder / "summary.json", summary)
        path = atomic_write_text(folder / "report.md", report)
        if not (folder / TRACKED).is_file():
            # perf/rollout_s with the rollout's response tokens gives the generation throughput in MLflow.
            rollout = seconds.get("rollout_wall", sum(seconds.get(p, 0.0) for p in ROLLOUT_PHASES))
            tracked_seconds = dict(seconds, rollout=rollout)
            record = summarize_step(step, trajectories, returns=[s.reward for s in samples], update_metrics=update,
                                    monitor_row=monitor["row"], seconds=tracked_seconds)
            self.tracker.log_step(record, trajectories=trajectories, alerts=alerts)
            self.tracker.log_artifact(path, f"steps/step_{step:06d}")
            atomic_write_text(folder / TRACKED, "")
        self.progress.step_finished(step, step_lines(trajectories, samples, seconds, update, monitor["row"]))
        return path

    def finished_steps(self) -> list[dict[str, Any]]:
        """The summaries of every step that has one, in order."""
        found = sorted((self.out_dir / STEPS_DIR).glob("step_*/summary.json"))
        return [read_json(p) for p in found]

    def result(self) -> dict[str, Any]:
        """What the run produced, as plain data (the flow's result; ``kevin train`` prints it)."""
        from kevin.training.checkpoint import latest_checkpoint

        summaries = self.finished_steps()
        latest = latest_checkpoint(self.out_dir / CHECKPOINTS_DIR)
        return {"experiment": self.name, "out_dir": str(self.out_dir), "steps": self.steps,
                "steps_done": len(summaries), "stop_reason": self.stop_reason, "paused": self.paused, **run_summary(summaries),
                "checkpoint": str(latest) if latest else "", "mlflow": dict(self.mlflow)}
