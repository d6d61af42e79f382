"""One training run: its live objects, and one method per step of the recipe, each reading and writing files.

    open()                               build or resume everything; the first step to run
    for each step:
        sample_batch(step)               tasks of the step                       steps/step_N/batch.json
        for each turn, for each wave:
            generate(step, turn, wave)   every live trajectory's response        rollout/generated_T.jsonl
            parse(step, turn, wave)      reasoning / kernel / summary            rollout/parsed_T.jsonl
            evaluate(step, turn, wave)   every kernel of the turn, in parallel   rollout/verdicts_T.jsonl, turn_T.jsonl
        aggregate(step)                  turn returns, per-task advantages       samples.jsonl, kernels.jsonl
        update(step)                     the GRPO update (k optimiser steps)     update.json
        check_collapse(step)             the collapse monitor; alerts            monitor.json
        checkpoint(step)                 weights, optimiser, RNG, sampler, monitor   checkpoints/step_N
        sync_weights(step)               a generation server gets the new weights (openai backend)
        track(step)                      MLflow metrics and artifacts, the step report   summary.json, report.md
    close()

``flows/train.py`` runs each method as a Prefect task and passes the paths they return. The methods do the work
and keep the run's state; none of them knows about Prefect.

The run is split along its seams: ``track``, ``result`` and the MLflow run are ``RunTracking``'s
(``run_tracking.py``), the folder layout and JSON helpers are ``files.py``, the task selection ``splits.py``.

Waves (``experiment.rollout_waves`` W > 1): the step's trajectories are cut into W waves (``kevin/rollout/waves.py``),
each a rollout folder of its own (``rollout/wave_K``), and a wave's parse and evaluation run beside the next wave's
generation. Generation stays in the caller's thread, in one fixed order; parse and evaluate of different waves may
run at once in other threads, so the run's shared files (``timings.json``) and folders are guarded by a lock.

What a kill loses (``kevin train --resume``): the run restarts from its newest checkpoint (weights, optimiser,
every RNG, the task sampler, the monitor, the policy's sampler). The steps after it are redone from their files:
a turn that was generated is not generated again (the policy's sampler state after it is restored from
``policy_T.pt``), a kernel that was judged is not judged again (its verdict is in ``verdicts_T.jsonl``), the
samples are rebuilt from the turns; only the update of the step in flight (its ``train.grad_steps`` optimiser
steps, on the same samples) is recomputed. Nothing else is lost.
"""

from __future__ import annotations

import json
import logging
import os
import statistics
import threading
import time
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any, Iterator

import yaml

from kevin.config import RunConfig
from kevin.experiment.interfaces import close_all, takes_concurrent_batches
from kevin.experiment.progress import Progress
from kevin.experiment.device_share import generation_hold, time_baselines_first
from kevin.experiment.files import CHECKPOINTS_DIR, existing_run, read_json, torch_threads, write_json
from kevin.experiment.report import verdict_counts
from kevin.experiment.run_tracking import RunTracking
from kevin.experiment.splits import train_tasks
from kevin.policy.protocol import Policy
from kevin.pipeline import KERNELS_FILE, kernel_rows, read_step_summaries
from kevin.records.jsonl import atomic_write_text, read_jsonl, write_jsonl
from kevin.records.rollout import TrainingSample, Trajectory, load_records
from kevin.records.target import KernelTarget
from kevin.rollout.stages import TurnStages, generated_path
from kevin.rollout.waves import wave_slots
from kevin.tasks.task import Task

if TYPE_CHECKING:  # the types of the live objects; their modules load torch, MLflow or Ray, so only when built
    from kevin.evaluation.cluster import BatchEvaluator
    from kevin.experiment.policies import WeightSync
    from kevin.monitor import CollapseMonitor
    from kevin.tasks.sampler import TaskSampler
    from kevin.tracking import Tracker
    from kevin.training.trainer import GRPOTrainer

log = logging.getLogger(__name__)

__all__ = ["TrainingRun"]


RECENT_STEPS = 5
"""How many of the run's last recorded steps set the floor of the time a next step is expected to take."""


def recent_step_seconds(summaries: list[dict[str, Any]], last: int = RECENT_STEPS) -> float:
    """The median wall time of the last ``last`` steps' summaries (``seconds.step``), 0 without any."""
    times = [float(s["seconds"]["step"]) for s in summaries[-last:] if "step" in s.get("seconds", {})]
    return statistics.median(times) if times else 0.0


class TrainingRun(RunTracking):
    """The live objects of one training run (model, trainer, policy, evaluator, monitor, tracker, task sampler)
    and the steps of the recipe. ``project_dir`` is the project folder (the MLflow store and the default output
    folder are taken from it); ``resume`` continues the run found in the output folder."""

    def __init__(self, config: RunConfig, *, project_dir: str | Path = ".", resume: bool = False,
                 progress: Progress | None = None):
        self.config = config
        self.project_dir = Path(project_dir).resolve()
        self.resume = resume
        self.progress = progress or Progress()
        self.out_dir = config.experiment.resolved_output_dir(self.project_dir)
        self.name = config.experiment.name
        self.steps = config.experiment.steps
        self.next_step = 0
        self.stop_reason = ""
        self.paused = ""
        """Why the run paused before its last step (``experiment.time_limit_s``); unlike a stop, a resume goes on."""
        self._began = time.monotonic()
        self._step_began: float | None = None
        self._step_seconds: list[float] = []
        self._recorded_step_s: float | None = None  # the run's recent steps on disk (read once, when first needed)
        self.tasks: dict[str, Task] = {}
        # The live objects, built by open(); None until then.
        self.sampler: TaskSampler = None  # type: ignore[assignment]
        self.trainer: GRPOTrainer = None  # type: ignore[assignment]
        self.tokenizer: Any = None  # a transformers tokenizer (no narrower type is named for one)
        self.policy: Policy = None  # type: ignore[assignment]
        self.weight_sync: WeightSync | None = None
        self.evaluator: BatchEvaluator = None  # type: ignore[assignment]
        self.monitor: CollapseMonitor = None  # type: ignore[assignment]
        self.tracker: Tracker | None = None
        self.mlflow: dict[str, str] = {}
        self.waves = config.experiment.rollout_waves
        self._stages: dict[tuple[int, int], TurnStages] = {}
        self._lock = threading.Lock()  # the waves' threads share the stage table and timings.json
        self._evaluations = threading.Lock()  # held by an evaluation when the evaluator takes one batch at a time

    # ------------------------------------------------------------------------------------------ set-up

    def open(self) -> int:
        """Build (or, resuming, restore) everything; returns the first step to run."""
        from kevin.alerts import ensure_collapse_automation
        from kevin.evaluation.cluster import batch_evaluator
        from kevin.experiment.policies import build_policy, load_model, resolve_wrap, sync_mode
        from kevin.monitor import CollapseMonitor
        from kevin.tasks.sampler import TaskSampler
        from kevin.training.rng import seed_everything
        from kevin.training.trainer import GRPOTrainer

        cfg = self.config
        self._check_output_dir()
        sync_mode(cfg)  # a contradictory weight-sync setting fails before anything is loaded
        if cfg.experiment.torch_threads:
            import torch

            torch.set_num_threads(cfg.experiment.torch_threads)
        seed_everything(cfg.train.seed)  # before the model is built: the same initial weights and LoRA factors
        tasks = train_tasks(cfg)
        self.tasks = {t.task_id: t for t in tasks}
        by_level: dict[int, list[str]] = {}
        for task in tasks:
            by_level.setdefault(task.level, []).append(task.task_id)
        self.sampler = TaskSampler(by_level, cfg.experiment.tasks_per_batch, cfg.experiment.seed,
                                   rest_epochs=cfg.experiment.rest_barren_epochs)
        model, self.tokenizer = load_model(cfg, self.project_dir)
        self.trainer = GRPOTrainer(model, cfg.train, tokenizer=self.tokenizer)
        self.policy, self.weight_sync = build_policy(cfg, self.trainer, self.tokenizer, self.out_dir)
        if cfg.policy.wrap:
            self.policy = resolve_wrap(cfg.policy.wrap)(self.policy, cfg, tasks)
            if not isinstance(self.policy, Policy):  # checked now, not at the first checkpoint
                raise TypeError(f"policy.wrap {cfg.policy.wrap} returned a {type(self.policy).__name__}, which is not a "
                                "kevin.policy.protocol.Policy (state_dict, load_state_dict, close, max_response_tokens, "
                                "set_max_response_tokens, config)")
        self.evaluator = batch_evaluator(cfg.evaluation, cfg.cluster)
        if self.waves > 1 and not KernelTarget.parse(cfg.backend).is_gpu and cfg.policy.backend != "openai":
            log.warning("experiment.rollout_waves=%d on the cpu backend: a wave's timed runs share the cores with the "
                        "next wave's generation, which slows them unevenly; use 1 unless the policy runs elsewhere",
                        self.waves)
        self.monitor = CollapseMonitor(cfg.monitor)
        if self.resume:
            self._restore()
        self._start_tracking()
        if self.next_step and self.stop_reason:
            self.tracker.set_stop(self.stop_reason)
        self._catch_up_tracking()
        # Now, not before the first alert: a sqlite-backed server loads a new automation a moment after making it.
        ensure_collapse_automation(config=cfg.alerts)
        if self.weight_sync is not None and self.next_step:
            self._push_weights(self.next_step)  # the server may have restarted with the base weights
        self.progress.run_started(self.name, self.next_step, self.steps, str(self.out_dir), self.resume)
        return self.next_step

    def _check_output_dir(self) -> None:
        started = existing_run(self.out_dir)
        if started and not self.resume:
            raise FileExistsError(f"{self.out_dir} already holds a run of experiment {self.name!r}; continue it with "
                                  "--resume, or give this run another experiment.name (or experiment.output_dir)")
        if self.resume and not started:
            log.info("nothing to resume in %s: starting the run", self.out_dir)
        self.out_dir.mkdir(parents=True, exist_ok=True)
        config_file = self.out_dir / "config.yaml"
        # The config the run started with stays; a resume's config goes to MLflow (config.resume<N>.yaml).
        if not config_file.is_file():
            atomic_write_text(config_file, yaml.safe_dump(json.loads(json.dumps(self.config.params_dict(), default=str)),
                                                          sort_keys=False))

    def _restore(self) -> None:
        self.next_step = self.trainer.resume(self.out_dir / CHECKPOINTS_DIR)
        if not self.next_step:
            return
        extra = self.trainer.resumed_extra
        self.sampler.load_state_dict(extra["sampler"])
        self.monitor.load_state_dict(extra["monitor"])
        if "solved" not in extra["monitor"]:
            self._recall_solved()
        self._load_policy_state(extra.get("policy"))
        self.stop_reason = extra.get("stop_reason", "")

    def _recall_solved(self) -> None:
        """A checkpoint written before the monitor kept which tasks each draw solved (``forgotten_share``): read it
        from the checkpointed steps' ``kernels.jsonl``, so tasks drawn before the resume are not forgotten."""
        from kevin.monitor import solved_tasks

        for step in range(self.next_step):
            path = self._dir(step) / KERNELS_FILE
            if path.is_file():
                self.monitor.remember(solved_tasks((r["task_id"], r["correct"]) for r in read_jsonl(path)))

    # ------------------------------------------------------------------------------------------ helpers

    @contextmanager
    def _timed(self, step: int, key: str) -> Iterator[None]:
        """Add the seconds of the block to the step's ``timings.json`` under ``key`` (``phase``, ``phase/turn`` or
        ``phase/turn/wave``), and its start and end (seconds since the epoch) to ``spans.json``: with waves the
        phases overlap, and the spans give the rollout's wall time."""
        began, start = time.time(), time.perf_counter()
        yield
        seconds = round(time.perf_counter() - start, 4)
        with self._lock:
            for name, value in (("timings.json", seconds), ("spans.json", [round(began, 4), round(began + seconds, 4)])):
                path = self._dir(step) / name
                table = read_json(path) if path.is_file() else {}
                table[key] = value
                write_json(path, table)

    def _turn_key(self, phase: str, turn: int, wave: int) -> str:
        return f"{phase}/{turn}" if self.waves == 1 else f"{phase}/{turn}/{wave}"

    def _label(self, turn: int, wave: int) -> str:
        text = f"turn {turn + 1}/{self.config.rollout.turns}"
        return text if self.waves == 1 else f"{text}, wave {wave + 1}/{self.waves}"

    def _stage(self, step: int, wave: int = 0) -> TurnStages:
        """The rollout folder of one wave of the step: ``rollout`` itself with one wave, else ``rollout/wave_K``."""
        with self._lock:
            if (step, wave) not in self._stages:
                batch = read_json(self._dir(step) / "batch.json")["tasks"]
                folder = self._dir(step) / "rollout"
                slots = None
                if self.waves > 1:
                    folder = folder / f"wave_{wave}"
                    slots = wave_slots(self.config.rollout.trajectories, self.waves)[wave]
                self._stages[(step, wave)] = TurnStages(folder, [self.tasks[t] for t in batch], self.config.rollout,
                                                        tokenizer=self.tokenizer, trajectory_indices=slots)
            return self._stages[(step, wave)]

    def _policy_state_file(self, step: int, turn: int, wave: int) -> Path:
        return self._stage(step, wave).out_dir / f"policy_{turn:03d}.pt"

    def _save_policy_state(self, path: Path) -> None:
        import torch

        tmp = path.with_name(f".{path.name}.tmp")
        torch.save(self.policy.state_dict(), tmp)
        os.replace(tmp, path)

    def _load_policy_state(self, state: dict[str, Any] | None) -> None:
        if state is not None:
            self.policy.load_state_dict(state)

    # ------------------------------------------------------------------------------------------ the steps

    def sample_batch(self, step: int) -> Path:
        """Draw the step's tasks (``batch.json``; a redone step must draw the tasks it drew before) and set the
        step's response length limit on the policy."""
        from kevin.training.step import apply_response_limit

        self._step_began = time.monotonic()
        path = self._dir(step) / "batch.json"
        with self._timed(step, "sample"):
            batch = self.sampler.next_batch()
            if path.is_file():
                before = read_json(path)
                if before["tasks"] != batch:
                    raise ValueError(f"step {step} was rolled out on {before['tasks']} but the sampler now draws {batch}: "
                                     "the split or experiment settings changed since; resume with the ones it started "
                                     "with, or start a new run")
                if before.get("waves", 1) != self.waves:
                    raise ValueError(f"step {step} was rolled out in {before.get('waves', 1)} waves and this run has "
                                     f"experiment.rollout_waves={self.waves}; resume with the setting it started with")
            else:
                write_json(path, {"step": step, "tasks": batch, "epoch": self.sampler.epoch, "waves": self.waves})
            apply_response_limit(self.policy, self.trainer, self.config.response_tokens_at(step))
        self.progress.step_started(step, self.steps, batch)
        # Timed while nothing generates (kevin/experiment/device_share.py says why).
        time_baselines_first(self.evaluator, [self.tasks[t] for t in batch if t in self.tasks], self.waves,
                             self._timed(step, "baselines"))
        return path

    def live_trajectories(self, step: int) -> int:
        """Trajectories the step's next turn continues, over every wave (0: the rollout is over)."""
        return sum(len(self._stage(step, wave).live()) for wave in range(self.waves))

    def generate(self, step: int, turn: int, wave: int = 0) -> Path | None:
        """Every live trajectory's response of ``turn`` in ``wave`` (one batch); None when none is live. A turn
        generated before is kept, and the policy's sampler continues from where that generation left it (waves
        generate in one fixed order, so the last kept generation is the last one made)."""
        stages = self._stage(step, wave)
        state_file = self._policy_state_file(step, turn, wave)
        if generated_path(stages.out_dir, turn).is_file() or turn < stages.turns_done:
            if state_file.is_file():
                import torch

                self._load_policy_state(torch.load(state_file, map_location="cpu", weights_only=False))
            return stages.generate(turn, self.policy)
        live = len(stages.live())
        if not live:
            return None
        self.progress.phase(step, f"{self._label(turn, wave)}: generating {live} responses")

        def generate_and_keep_state(prompts: list[Any]) -> list[Any]:
            with generation_hold(self.evaluator, self.trainer.device, self.waves, self.config.policy.backend):
                outs = self.policy(prompts)  # no kernel is timed on the device meanwhile (device_share.py)
            # Before the outputs are written: a generated turn always has the sampler state that follows it.
            self._save_policy_state(state_file)
            return outs

        with self._timed(step, self._turn_key("generate", turn, wave)):
            path = stages.generate(turn, generate_and_keep_state)
        return path

    def parse(self, step: int, turn: int, wave: int = 0) -> Path:
        """Split the turn's responses (of ``wave``) into reasoning, kernel and summary."""
        with self._timed(step, self._turn_key("parse", turn, wave)):
            return self._stage(step, wave).parse(turn)

    def evaluate(self, step: int, turn: int, wave: int = 0) -> Path:
        """Judge every kernel of the turn in ``wave`` (the batch evaluator: compile pool, every device); verdicts
        already on disk are kept. Writes the turn's records. Evaluations of different waves run at once when the
        evaluator takes several batches at a time (``concurrent_batches``), else one after the other."""
        stages = self._stage(step, wave)
        total = len(read_jsonl(generated_path(stages.out_dir, turn))) if turn >= stages.turns_done else 0
        if not total:
            return stages.evaluate(turn, self.evaluator.evaluate_many)
        label = self._label(turn, wave)
        one_at_a_time = None if takes_concurrent_batches(self.evaluator) else self._evaluations
        if one_at_a_time is not None:
            one_at_a_time.acquire()
        self.progress.evaluation_started(step, label, total)
        try:
            with self._timed(step, self._turn_key("evaluate", turn, wave)):
                path = stages.evaluate(turn, self.evaluator.evaluate_many,
                                       on_verdict=lambda result: self.progress.verdict(result, label))
        finally:
            self.progress.evaluation_finished(step, label)
            if one_at_a_time is not None:
                one_at_a_time.release()
        turns = [t for traj in stages.trajectories() for t in traj.turns if t.turn == turn]
        counts = verdict_counts([Trajectory("", 0, turns)])
        self.progress.phase(step, f"{label}: " + ", ".join(f"{k} {v}" for k, v in counts.items()))
        return path

    def trajectories(self, step: int) -> list[Trajectory]:
        """Every trajectory of the step with its finished turns, in batch order then trajectory index."""
        found = [traj for wave in range(self.waves) for traj in self._stage(step, wave).trajectories()]
        if self.waves == 1:
            return found
        order = {task_id: i for i, task_id in enumerate(read_json(self._dir(step) / "batch.json")["tasks"])}
        return sorted(found, key=lambda traj: (order[traj.task_id], traj.index))

    def aggregate(self, step: int) -> Path:
        """Turn returns and per-task advantages of every turn of the step: ``samples.jsonl``, written before the
        update reads it."""
        from kevin.training.step import build_samples, save_samples, taught_tasks

        with self._timed(step, "aggregate"):
            trajectories = self.trajectories(step)
            # The step's judged kernels in one small file: it travels (and reports per turn) where the rollout does not.
            write_jsonl(self._dir(step) / KERNELS_FILE, kernel_rows(trajectories))
            samples = build_samples(trajectories, self.config.rewards, self.tokenizer, self.trainer.config.response_limit)
            # What each task taught goes to the sampler before the next step draws (a redone step records it again,
            # from the same files: the sampler ends where the uninterrupted run's did).
            for task_id, taught in taught_tasks(read_json(self._dir(step) / "batch.json")["tasks"], samples).items():
                self.sampler.record(task_id, taught)
            return save_samples(self._dir(step), samples)

    def update(self, step: int) -> Path:
        """The GRPO update on the step's samples (``train.grad_steps`` optimiser steps): ``update.json``."""
        from kevin.training.step import SAMPLES_FILE, grpo_update

        samples = load_records(self._dir(step) / SAMPLES_FILE, TrainingSample)
        self.progress.phase(step, f"update: {len(samples)} samples, {self.config.train.grad_steps} optimiser steps")
        with self._timed(step, "update"), torch_threads(self.config.experiment.update_threads):
            metrics = grpo_update(self.trainer, samples)
        return write_json(self._dir(step) / "update.json", metrics)

    def check_collapse(self, step: int) -> Path:
        """Feed the step to the collapse monitor: ``monitor.json`` (its row and alerts). Each alert becomes a
        Prefect event (``kevin.alerts``); a stop alert records the reason (MLflow tag; the flow's final state)."""
        from kevin.alerts import emit_collapse_alert, stop_reason
        from kevin.monitor import TRAIN_METRICS, solved_tasks

        with self._timed(step, "monitor"):
            turns = [t for traj in self.trajectories(step) for t in traj.turns]
            update = read_json(self._dir(step) / "update.json")
            # An update with nothing to train on (every advantage 0) measures no entropy or gradient: its zeros are
            # not the policy's, so the monitor does not see them.
            trained = [m for m in update if m.get("trained_sequences", 0.0) > 0]
            train = {k: sum(m[k] for m in trained) / len(trained) for k in TRAIN_METRICS if trained and k in trained[0]}
            alerts = self.monitor.observe(step, [t.response for t in turns], [t.truncated for t in turns], train,
                                          token_counts=[t.response_tokens for t in turns], turns=[t.turn for t in turns],
                                          solved=solved_tasks((t.task_id, t.correct) for t in turns))
            row = self.monitor.history[-1]
            run_id = self.mlflow.get("run_id") or self.name
            for alert in alerts:
                emit_collapse_alert(alert, row, run_id=run_id, run_name=self.name, config=self.config.alerts)
            stop = next((a for a in alerts if a.should_stop), None)
            if stop is not None:
                self.stop_reason = stop_reason(stop)
                self.tracker.set_stop(self.stop_reason, step=step, metric=stop.metric)
                self.progress.phase(step, f"STOP: {self.stop_reason}")
            return write_json(self._dir(step) / "monitor.json",
                               {"row": row, "alerts": [a.to_dict() for a in alerts], "stop_reason": self.stop_reason})

    def checkpoint(self, step: int) -> Path | None:
        """Save everything a resume needs, every ``experiment.checkpoint_every`` steps, at the last step and when
        the run stops or pauses; None when this step is not one of them."""
        self.paused = self._pause_reason(step)
        due = ((step + 1) % self.config.experiment.checkpoint_every == 0 or step + 1 == self.steps or self.stop_reason
               or self.paused)
        if not due:
            return None
        with self._timed(step, "checkpoint"):
            extra = {"sampler": self.sampler.state_dict(), "monitor": self.monitor.state_dict(),
                     "policy": self.policy.state_dict(), "stop_reason": self.stop_reason}
            path = self.trainer.save_checkpoint(self.out_dir / CHECKPOINTS_DIR, step, extra=extra)
        self.progress.phase(step, f"checkpoint: {path}")
        return path

    def sync_weights(self, step: int) -> str:
        """Hand the updated weights to the generation server (``openai`` backend); "" in-process."""
        if self.weight_sync is None:
            return ""
        with self._timed(step, "sync"):
            return self._push_weights(step + 1)

    def _push_weights(self, version: int) -> str:
        served = self.weight_sync.push(self.trainer, self.tokenizer, version)
        log.info("weights version %d served: %s", version, served)
        return served

    # ------------------------------------------------------------------------------------------ the end

    def close(self, error: BaseException | None = None) -> None:
        """End the MLflow run (FINISHED; KILLED when stopped early or interrupted; FAILED on an error) and release
        the evaluator's judges, the weight sync and the policy's connections."""
        try:
            if self.tracker is not None:
                self.tracker.__exit__(type(error) if error else None, error, None)
        finally:
            close_all(self.evaluator, self.weight_sync, self.policy)

    def done(self, step: int) -> bool:
        """Whether the run ends before ``step`` (it stopped, paused, or ran every step)."""
        return bool(self.stop_reason) or bool(self.paused) or step >= self.steps

    def _pause_reason(self, step: int) -> str:
        """Why the run pauses after ``step`` (``experiment.time_limit_s``), or "". The slowest step this process has
        run stands in for the next one (the update and checkpoint are short beside the rollout), less the process's
        first step once there is another: that one pays once for what later steps find ready (CUDA graphs, compiler
        and baseline caches on a fresh machine; 192 s against 107 s the step after it on the H200, 2026-12-04).
        Never less than the median of the run's last ``RECENT_STEPS`` recorded steps: a resumed process whose one
        step so far was quick (its kernels judged before, 28 s) otherwise starts a step that takes 60 s and overruns
        (the eighth H200 run's step 23, 2026-12-06)."""
        limit = self.config.experiment.time_limit_s
        if not limit or step + 1 >= self.steps or self._step_began is None:
            return ""
        now = time.monotonic()
        self._step_seconds.append(now - self._step_began)
        if self._recorded_step_s is None:
            self._recorded_step_s = recent_step_seconds(read_step_summaries(self.out_dir))
        expected = max(max(self._step_seconds[1:] or self._step_seconds), self._recorded_step_s)
        used = now - self._began
        if used + expected <= limit:
            return ""
        reason = (f"time limit: {used:.0f} s of experiment.time_limit_s={limit:g} used and a step takes up to "
                  f"{expected:.0f} s; continue with --resume")
        self.progress.phase(step, f"PAUSE: {reason}")
        log.info("%s paused after step %d: %s", self.name, step + 1, reason)
        return reason

    @property
    def turns(self) -> int:
        return self.config.rollout.turns
