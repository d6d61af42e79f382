"""The training flow: one Prefect task per step of the recipe; all the work is ``kevin.experiment.run.TrainingRun``.

    sample batch -> per turn (and wave): generate -> parse -> evaluate -> aggregate -> update -> collapse check
                 -> checkpoint -> sync weights -> track (and a markdown artifact per step)

With ``experiment.rollout_waves`` > 1 a wave's parse and evaluate are submitted to the flow's task runner and run
while the next wave generates (``kevin.rollout.waves.run_waves`` says in which order); generation stays in the
flow's thread.

Tasks hand each other file paths (the turn files, the samples, the checkpoint folder), never tensors. The
generation of a turn is retried with exponential backoff when it failed in a way that passes (a generation
server timing out or refusing connections); no other task retries (each says why). The timeouts come from the
``experiment`` section. The flow run is named after the experiment, and tagged ``resumed`` when it continues a
run found in the output folder. The ``kevin.*`` loggers' lines (the collapse monitor's warnings, the trainer's,
and on a worker the progress lines) go to the flow run's logs too. Each step's report is an artifact keyed
``<experiment>-<run>-step-<N>`` (N from 1; <run>: 8 characters of the MLflow run id). A run stopped by a
collapse alert ends in a Completed state named ``Stopped`` whose message is the reason; the MLflow run carries it
as the ``stop.reason`` tag. A run that reached ``experiment.time_limit_s`` ends checkpointed in a Completed state
named ``Paused``; ``--resume`` continues it.

    python -m kevin_cli train --params params.yaml --set experiment.steps=2     # runs ``train`` in this process

Without ``PREFECT_API_URL`` Prefect runs the flow against a temporary local server of its own (the ephemeral
API); with one, the run, its task runs, artifacts and alert events show in that server's UI.
"""

from __future__ import annotations

import contextvars
import logging
from pathlib import Path
from typing import Any

from prefect import flow, task
from prefect.artifacts import create_markdown_artifact
from prefect.cache_policies import NO_CACHE
from prefect.states import Completed
from prefect.tasks import exponential_backoff

from flows.common import (RESUMED_TAG, artifact_key, one_based_name, project_logs_in_flow_run, run_key, run_name,
                          tag_flow_run, transient)
from kevin.config import RunConfig
from kevin.experiment.files import existing_run
from kevin.experiment.progress import LogProgress, Progress
from kevin.experiment.run import TrainingRun
from kevin.rollout.waves import run_waves

__all__ = ["load_config", "run_training", "train"]

PROGRESS: contextvars.ContextVar[Progress | None] = contextvars.ContextVar("kevin_train_progress", default=None)
"""What ``run_training`` shows the run's progress with (the flow runs in the caller's thread, so it sees it); unset
(a worker's run), the progress lines go to the ``kevin.train`` logger, hence to the flow run's logs."""


def load_config(params: list[str], overrides: list[str]) -> RunConfig:
    """The run's config: params files merged in order (later ones win, setting by setting), then ``--set``s."""
    return RunConfig.from_files(params, overrides)


def _flow_run_name() -> str:
    return run_name(lambda config: config.experiment.name, "kevin")


def _artifact_key(name: str, run: str, step: int) -> str:
    """The key of step ``step``'s report (0-based inside, 1-based as the progress lines and users count) in run
    ``run`` (``flows.common.run_key``), so two runs of one experiment name do not overwrite each other's."""
    return artifact_key(name, run, "step", str(step + 1))


# Each task is a method of the run; NO_CACHE because their inputs are live objects, and a step must never be
# skipped as "cached" (its files already say what is done). Only generation retries (docs/pipeline.md, "Which
# tasks retry"); every other failure is final for this flow run, and `--resume` (a deployment's next run)
# continues from the step's files and the last checkpoint. The comment at each task says why.


# No retry: drawing advances the task sampler, so a second attempt would draw the next batch (and refuse it
# against batch.json); what fails here is a setting or the split, which a retry does not change.
@task(name="sample-batch", cache_policy=NO_CACHE, task_run_name=one_based_name("sample-batch-{step}"))
def sample_batch(run: TrainingRun, step: int) -> str:
    return str(run.sample_batch(step))


# Retried (experiment.generation_retries, exponential backoff) on failures that pass, a generation server that
# timed out or refused the connection (``transient``): nothing is written until the whole turn is generated, so
# a second attempt starts clean. A bad prompt or a code error is not retried.
@task(name="generate", cache_policy=NO_CACHE,
      task_run_name=one_based_name("generate-{step}-turn-{turn}-wave-{wave}"),
      retry_condition_fn=transient)
def generate(run: TrainingRun, step: int, turn: int, wave: int) -> str | None:
    path = run.generate(step, turn, wave)
    return str(path) if path is not None else None


# No retry: parsing is a pure function of the generated file; it would fail the same way again.
@task(name="parse", cache_policy=NO_CACHE, task_run_name=one_based_name("parse-{step}-turn-{turn}-wave-{wave}"))
def parse(run: TrainingRun, step: int, turn: int, wave: int) -> str:
    return str(run.parse(step, turn, wave))


# No retry: a kernel's verdict (compile error, wrong output, timing) is the result, not a failure; the evaluator
# retries a candidate whose worker died itself (cluster.max_attempts), and verdicts on disk are kept by a resume.
@task(name="evaluate", cache_policy=NO_CACHE,
      task_run_name=one_based_name("evaluate-{step}-turn-{turn}-wave-{wave}"))
def evaluate(run: TrainingRun, step: int, turn: int, wave: int, parsed: str) -> str:
    return str(run.evaluate(step, turn, wave))


# No retry: returns and advantages are computed from the turn files; deterministic.
@task(name="aggregate-rewards", cache_policy=NO_CACHE,
      task_run_name=one_based_name("aggregate-rewards-{step}"))
def aggregate(run: TrainingRun, step: int, turn_files: list[str]) -> str:
    return str(run.aggregate(step))


# No retry: the update changes the weights and the optimiser in memory as it goes; a second attempt after a
# failure (or a timeout) part-way would train on top of a partial update. Only a resume, which restores the last
# checkpoint first, redoes it correctly.
@task(name="grpo-update", cache_policy=NO_CACHE, task_run_name=one_based_name("grpo-update-{step}"))
def update(run: TrainingRun, step: int, samples: str) -> str:
    return str(run.update(step))


# No retry: the monitor keeps streaks across steps; observing the step twice would count it twice (and emit
# its alerts twice).
@task(name="collapse-check", cache_policy=NO_CACHE, task_run_name=one_based_name("collapse-check-{step}"))
def check_collapse(run: TrainingRun, step: int, update_file: str) -> str:
    return str(run.check_collapse(step))


# No retry: what fails a save (a full disk, a permission) does not pass in seconds; the previous checkpoint stays.
@task(name="checkpoint", cache_policy=NO_CACHE, task_run_name=one_based_name("checkpoint-{step}"))
def checkpoint(run: TrainingRun, step: int, monitor_file: str) -> str | None:
    path = run.checkpoint(step)
    return str(path) if path is not None else None


# No retry: an NCCL transfer (policy.weight_sync full) broken part-way leaves the group in an unknown state, where a
# second attempt can hang; a server that refuses a LoRA or folder push is down or misconfigured (no --enable-lora),
# which seconds do not fix. A resume pushes the checkpoint's weights again before it generates.
@task(name="sync-weights", cache_policy=NO_CACHE, task_run_name=one_based_name("sync-weights-{step}"))
def sync_weights(run: TrainingRun, step: int, checkpoint_dir: str | None) -> str:
    return run.sync_weights(step)


# No retry: a second attempt after a failure part-way could log the step's metrics to MLflow twice; a resume logs a
# step whose tracking did not finish (``TrainingRun._catch_up_tracking``).
@task(name="track", cache_policy=NO_CACHE, task_run_name=one_based_name("track-{step}"))
def track(run: TrainingRun, step: int, monitor_file: str) -> str:
    report = run.track(step)
    create_markdown_artifact(key=_artifact_key(run.name, run_key(run.mlflow), step),
                             markdown=Path(report).read_text(encoding="utf-8"),
                             description=f"{run.name}: step {step + 1} of {run.steps}")
    return str(report)


def _run_step(run: TrainingRun, step: int) -> None:
    cfg = run.config.experiment
    gen = generate.with_options(retries=cfg.generation_retries,
                                retry_delay_seconds=exponential_backoff(cfg.retry_delay_s) if cfg.retry_delay_s else 0,
                                timeout_seconds=cfg.generation_timeout_s or None)
    sample_batch(run, step)

    def generate_wave(wave: int, turn: int) -> bool:
        return gen(run, step, turn, wave) is not None  # None: every trajectory of the wave stopped early

    def judge_wave(wave: int, turn: int) -> Any:
        parsed = parse.submit(run, step, turn, wave)
        return evaluate.submit(run, step, turn, wave, parsed)  # waits for the parse: its result is an argument

    turn_files = run_waves(run.waves, run.turns, generate_wave, judge_wave)
    samples = aggregate(run, step, turn_files)
    updated = update.with_options(timeout_seconds=cfg.update_timeout_s or None)(run, step, samples)
    monitor_file = check_collapse(run, step, updated)
    checkpoint_dir = checkpoint(run, step, monitor_file)
    sync_weights(run, step, checkpoint_dir)
    track(run, step, monitor_file)


@flow(name="kevin-train", flow_run_name=_flow_run_name)
def train(params: list[str] | None = None, overrides: list[str] | None = None, resume: bool = False,
          project_dir: str = ".") -> Any:
    """Train: ``params`` files (default params.yaml, merged in order), ``overrides`` (``key.sub=value``), and
    ``resume`` to continue the run in the experiment's output folder. Returns the run's results (plain data)."""
    with project_logs_in_flow_run():
        config = load_config(params if params is not None else ["params.yaml"], overrides or [])
        run = TrainingRun(config, project_dir=project_dir, resume=resume,
                          progress=PROGRESS.get() or LogProgress(logging.getLogger("kevin.train")))
        continues = resume and existing_run(run.out_dir)  # before open(), which starts the folder
        try:
            step = run.open()
            if continues:
                tag_flow_run(RESUMED_TAG)
            while not run.done(step):
                _run_step(run, step)
                step += 1
            result = run.result()
        except BaseException as exc:
            run.close(exc)
            raise
        run.close()
    if run.stop_reason:
        return Completed(name="Stopped", message=run.stop_reason, data=result)
    if run.paused:
        return Completed(name="Paused", message=run.paused, data=result)
    return Completed(message=f"{result['steps_done']} of {run.steps} steps", data=result)


def run_training(params: list[str], overrides: list[str], resume: bool = False, project_dir: str = ".",
                 progress: Progress | None = None) -> Any:
    """Run ``train`` in this process with ``progress`` showing its steps; returns the flow's final state."""
    token = PROGRESS.set(progress)
    try:
        return train(params=params, overrides=overrides, resume=resume, project_dir=project_dir, return_state=True)
    finally:
        PROGRESS.reset(token)
