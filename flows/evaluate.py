"""The evaluation flow: one Prefect task per stage; all the work is ``kevin.experiment.evaluate.EvaluationRun``.

    per rollout, per turn: generate -> parse -> evaluate -> select (beam only)
    -> analyse -> write outputs (metrics, curves, tables, plots) -> track (MLflow), and a markdown artifact

Tasks hand each other file paths, never tensors. The flow run is named after ``evaluate.name`` (tagged ``resumed``
when it continues the rollouts in ``evaluate.output_dir``); the tables' artifact is keyed
``<name>-<run>-evaluation``; as in training, the ``kevin.*`` loggers' lines go to the flow run's logs. As for training,
no Prefect server is needed (Prefect's ephemeral API); with ``PREFECT_API_URL`` set the run shows in that server.

    python -m kevin_cli evaluate --params params.yaml --checkpoint outputs/train/checkpoints
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
from kevin.experiment.evaluate import EvaluationRun
from kevin.experiment.progress import LogProgress, Progress

__all__ = ["evaluate", "load_config", "run_evaluation"]

PROGRESS: contextvars.ContextVar[Progress | None] = contextvars.ContextVar("kevin_evaluate_progress", default=None)


def load_config(params: list[str], overrides: list[str], checkpoint: str | None = None,
                model: str | None = None) -> RunConfig:
    """The run's config: params files merged in order, then ``--set``s; ``checkpoint`` sets ``evaluate.checkpoint``
    and ``model`` sets ``policy.model`` (an in-process ``hf`` model unless ``policy.backend`` says openai; without
    ``checkpoint`` it also sets ``evaluate.checkpoint: none``)."""
    extra = []
    if checkpoint is not None:
        extra.append(f"evaluate.checkpoint={checkpoint}")
    if model is not None:
        extra.append(f"policy.model={model}")
        if checkpoint is None:  # --model alone means that model, not a checkpoint params.yaml points at
            extra.append("evaluate.checkpoint=none")
    config = RunConfig.from_files(params, [*overrides, *extra])
    if model is not None and config.policy.backend == "embedded":
        config = RunConfig.from_files(params, [*overrides, *extra, "policy.backend=hf"])
    return config


def _flow_run_name() -> str:
    return run_name(lambda config: config.evaluate.name, "evaluate")


# NO_CACHE: the inputs are live objects, and the files say what is done. Only generation retries
# (docs/pipeline.md, "Which tasks retry"); a failed evaluation is continued by `--resume`, which keeps every file
# written. The comment at each task says why.


# Retried (experiment.generation_retries) on failures that pass (a server that timed out or refused the
# connection): nothing is written until the turn is generated, so a second attempt starts clean.


@task(name="generate", cache_policy=NO_CACHE, task_run_name=one_based_name("generate-{rollout}-turn-{turn}"),
      retry_condition_fn=transient)
def generate(run: EvaluationRun, rollout: str, turn: int) -> str | None:
    path = run.generate(rollout, turn)
    return str(path) if path is not None else None


# No retry: a pure function of the generated file.
@task(name="parse", cache_policy=NO_CACHE, task_run_name=one_based_name("parse-{rollout}-turn-{turn}"))
def parse(run: EvaluationRun, rollout: str, turn: int, generated: str) -> str:
    return str(run.parse(rollout, turn))


# No retry: a verdict is the result, not a failure; the evaluator retries a candidate whose worker died itself.
@task(name="evaluate", cache_policy=NO_CACHE, task_run_name=one_based_name("evaluate-{rollout}-turn-{turn}"))
def judge(run: EvaluationRun, rollout: str, turn: int, parsed: str) -> str:
    return str(run.evaluate(rollout, turn))


# No retry: the beam's choice is computed from the judged turn; deterministic.
@task(name="select", cache_policy=NO_CACHE, task_run_name=one_based_name("select-{rollout}-turn-{turn}"))
def select(run: EvaluationRun, rollout: str, turn: int, turn_file: str) -> str | None:
    path = run.select(rollout, turn)
    return str(path) if path is not None else None


# No retry: the analysis and the outputs are computed from the rollouts' files; deterministic.
@task(name="analyse", cache_policy=NO_CACHE)
def analyse(run: EvaluationRun, turn_files: list[str]) -> str:
    return str(run.analyse())


@task(name="write-outputs", cache_policy=NO_CACHE)
def write_outputs(run: EvaluationRun, report: str) -> dict[str, str]:
    return {name: str(path) for name, path in run.write_outputs().items()}


# No retry: a second attempt after a failure part-way could log the metrics twice; a resume logs them once.
@task(name="track", cache_policy=NO_CACHE)
def track(run: EvaluationRun, paths: dict[str, str]) -> bool:
    logged = run.track({name: Path(p) for name, p in paths.items()})
    tables = "\n".join(Path(paths[f"tables/{t}.md"]).read_text(encoding="utf-8") for t in ("table1", "table2"))
    # Keyed by run, as the training steps are: two evaluations of one name do not overwrite each other's tables.
    key = artifact_key(run.name, run_key(run.mlflow), "evaluation")
    create_markdown_artifact(key=key, markdown=f"# {run.name}: {run.identity['model']}\n\n{tables}",
                             description=f"{run.name}: Table 1 and Table 2")
    return logged


@flow(name="kevin-evaluate", flow_run_name=_flow_run_name)
def evaluate(params: list[str] | None = None, overrides: list[str] | None = None, resume: bool = False,
             checkpoint: str | None = None, model: str | None = None, project_dir: str = ".") -> Any:
    """Evaluate a model or checkpoint on the eval split at the budget splits of ``analysis``: ``params`` files
    (default params.yaml), ``overrides`` (``key.sub=value``), ``checkpoint`` / ``model`` (set
    ``evaluate.checkpoint`` / ``policy.model``), ``resume`` to continue the run in ``evaluate.output_dir``.
    Returns the run's results (plain data)."""
    with project_logs_in_flow_run():
        config = load_config(params if params is not None else ["params.yaml"], overrides or [], checkpoint, model)
        run = EvaluationRun(config, project_dir=project_dir, resume=resume,
                            progress=PROGRESS.get() or LogProgress(logging.getLogger("kevin.evaluate")))
        try:
            result = _evaluate(run, config)
        except BaseException as exc:
            run.close(exc)
            raise
        run.close()
    return Completed(message=f"{result['tasks']} tasks at {result['size']}", data=result)


def _evaluate(run: EvaluationRun, config: RunConfig) -> dict[str, Any]:
    cfg = config.experiment
    gen = generate.with_options(retries=cfg.generation_retries,
                                retry_delay_seconds=exponential_backoff(cfg.retry_delay_s) if cfg.retry_delay_s else 0,
                                timeout_seconds=cfg.generation_timeout_s or None)
    turn_files = []
    plans = run.open()
    if run.resume:  # open() keeps it only when there are rollouts to continue
        tag_flow_run(RESUMED_TAG)
    for plan in plans:
        for turn in range(plan.turns):
            generated = gen(run, plan.name, turn)
            if generated is None:  # every trajectory stopped early
                break
            parsed = parse(run, plan.name, turn, generated)
            turn_files.append(judge(run, plan.name, turn, parsed))
            select(run, plan.name, turn, turn_files[-1])
    report = analyse(run, turn_files)
    paths = write_outputs(run, report)
    track(run, paths)
    return run.result()


def run_evaluation(params: list[str], overrides: list[str], *, resume: bool = False, checkpoint: str | None = None,
                   model: str | None = None, project_dir: str = ".", progress: Progress | None = None) -> Any:
    """Run ``evaluate`` in this process with ``progress`` showing it; returns the flow's final state."""
    token = PROGRESS.set(progress)
    try:
        return evaluate(params=params, overrides=overrides, resume=resume, checkpoint=checkpoint, model=model,
                        project_dir=project_dir, return_state=True)
    finally:
        PROGRESS.reset(token)
