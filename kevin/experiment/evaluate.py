"""One evaluation run: a model (or a training checkpoint) on the eval tasks at fixed budget splits, then the paper's
tables and plots. Each method reads and writes files, so an interrupted run continues where it stopped.

    open()                               tasks, model identity, run.json; nothing is loaded yet
    for each rollout of the plan:        (one rollout of the largest split; with beam selection one per split)
        for each turn:
            generate(rollout, turn)      every live trajectory's response        rollouts/<R>/generated_T.jsonl
            parse(rollout, turn)                                                 rollouts/<R>/parsed_T.jsonl
            evaluate(rollout, turn)      every kernel of the turn, one batch     rollouts/<R>/verdicts_T.jsonl, turn_T.jsonl
            select(rollout, turn)        beam-style selection (top_k only)       rollouts/<R>/parents_T.json
    analyse()                            the run's report                        report.json
    write_outputs()                      metrics, curves, tables, plots          metrics.json, curves/, tables/, plots/
    track()                              MLflow metrics and artifacts, once
    close()

Without beam selection every budget split ``MxN`` is read from ONE rollout of T x N' (T the largest M, N' the
largest N) with the unbiased subset estimators of ``kevin.analysis``: generating 128x8 once serves 16x8, 32x4 and
128x1. With selection (``beam.strategy`` other than ``independent``) the trajectories of a split depend on the
selection made at its size, so each split is rolled out on its own.

Resume: a generated turn is not generated again, a judged kernel not judged again (``TurnStages``); the model is
loaded and the evaluator started only when something is left to generate or judge.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import yaml

from kevin.analysis.beam import BeamConfig
from kevin.analysis.metrics import AnalysisConfig, RunReport
from kevin.config import RunConfig
from kevin.experiment.files import TRACKED, write_json
from kevin.experiment.interfaces import close_all
from kevin.experiment.outputs import REPORT_FILE, load_report, write_report_files
from kevin.experiment.progress import Progress
from kevin.records.jsonl import atomic_write_text, read_jsonl
from kevin.rollout.stages import TurnStages, generated_path, parents_path
from kevin.tasks.task import Task

if TYPE_CHECKING:
    from kevin.evaluation.cluster import BatchEvaluator
    from kevin.policy.protocol import Policy
    from kevin.tracking import Tracker

log = logging.getLogger(__name__)

__all__ = ["EvaluationRun", "RolloutPlan", "resolve_checkpoint", "rollout_plan"]

RUN_FILE = "run.json"
METRICS_FILE = "metrics.json"
ROLLOUTS_DIR = "rollouts"
IDENTITY = ("model", "checkpoint", "tasks", "rollouts", "beam")
"""What must not change when an evaluation is resumed: its rollouts were generated under these."""


# ------------------------------------------------------------------------------------------------- plan


@dataclass(frozen=True)
class RolloutPlan:
    """One rollout an evaluation generates: ``rollouts/<name>/``, ``trajectories`` x ``turns`` per task."""

    name: str
    trajectories: int
    turns: int
    select: bool
    """Beam-style selection after each turn but the last."""


def rollout_plan(analysis: AnalysisConfig, beam: BeamConfig) -> list[RolloutPlan]:
    """The rollouts that hold every budget split: one of (largest M) x (largest N) without selection, one per split
    with it (a split of one turn has nothing to select between)."""
    splits = analysis.splits
    if not splits:
        raise ValueError("analysis.budget_splits is empty: name at least one split, e.g. [16x8]")
    if beam.strategy == "independent":
        m, n = max(s.trajectories for s in splits), max(s.turns for s in splits)
        return [RolloutPlan(f"{m}x{n}", m, n, False)]
    if beam.strategy == "top_k":
        small = [s.name for s in splits if s.trajectories < beam.keep]
        if small:
            raise ValueError(f"beam.keep {beam.keep} survivors do not fit the splits {small}; lower beam.keep")
    return [RolloutPlan(s.name, s.trajectories, s.turns, s.turns > 1) for s in splits]


# ------------------------------------------------------------------------------------------- the model


def resolve_checkpoint(checkpoint: str, project_dir: str | Path) -> Path | None:
    """The checkpoint folder (``step_N``) that ``evaluate.checkpoint`` names: that folder, or the newest one in a
    checkpoints folder; None for ``none``/"" and for a checkpoints folder that holds none (yet)."""
    from kevin.experiment.config import NO_CHECKPOINT
    from kevin.training.checkpoint import STATE_FILE, latest_checkpoint

    if checkpoint.strip().lower() in NO_CHECKPOINT:
        return None
    path = Path(checkpoint)
    path = path if path.is_absolute() else Path(project_dir) / path
    if (path / STATE_FILE).is_file():
        return path
    found = latest_checkpoint(path)
    if found is None:
        log.info("no checkpoint in %s: evaluating the policy section's model", path)
    return found


def checkpoint_step(checkpoint: Path | None) -> int | None:
    """The training step a checkpoint was saved after (from its state file)."""
    from kevin.training.checkpoint import STATE_FILE

    if checkpoint is None:
        return None
    return int(json.loads((checkpoint / STATE_FILE).read_text(encoding="utf-8"))["step"])


def load_generator(config: RunConfig, checkpoint: Path | None) -> tuple[Policy, Any]:
    """(policy, tokenizer) that generates the evaluation's responses: the checkpoint's model in-process, else the
    ``policy`` section's model (embedded, an HF folder or hub id in-process, or an OpenAI-compatible server)."""
    import torch

    backend = config.policy.backend
    if backend == "openai":
        if checkpoint is not None:
            raise ValueError(f"evaluate.checkpoint {checkpoint} with policy.backend openai: serve {checkpoint / 'model'} "
                             "(vLLM or transformers serve), set policy.model to its name and evaluate.checkpoint: none; "
                             "or evaluate it in-process with policy.backend hf")
        from kevin.policy.openai_backend import OpenAIPolicy

        folder = config.policy.weights or config.policy.model
        tokenizer = None
        if Path(folder).is_dir():  # a local copy of the served model: its chat template renders the prompts
            from transformers import AutoTokenizer

            tokenizer = AutoTokenizer.from_pretrained(folder)
        return OpenAIPolicy(config.openai), tokenizer
    from kevin.policy.hf import HFPolicy

    from kevin.experiment.policies import load_checkpoint_model

    device = "cuda" if torch.cuda.is_available() else "cpu"
    dtype = torch.bfloat16 if device == "cuda" else torch.float32
    model, tokenizer = load_checkpoint_model(config, checkpoint, full_dtype=dtype)
    model = model.to(device=device, dtype=dtype)
    return HFPolicy(model.eval(), tokenizer, config.sampling), tokenizer


# ------------------------------------------------------------------------------------------------ a run


class EvaluationRun:
    """The live objects of one evaluation (tasks, rollouts, and once needed the model and the evaluator) and its
    steps. ``project_dir`` is the project folder (relative paths and the MLflow store are taken from it); ``resume``
    continues the run found in ``evaluate.output_dir``."""

    def __init__(self, config: RunConfig, *, project_dir: str | Path = ".", resume: bool = False,
                 progress: Progress | None = None):
        self.config = config
        self.project_dir = Path(project_dir).resolve()
        self.resume = resume
        self.progress = progress or Progress()
        self.name = config.evaluate.name
        self.out_dir = config.evaluate.resolved_output_dir(self.project_dir)
        self.plans = rollout_plan(config.analysis, config.beam)
        self.tasks: list[Task] = []
        self.checkpoint: Path | None = None
        self.identity: dict[str, Any] = {}
        self.calls = {"generations": 0, "evaluations": 0}
        """Batches handed to the model and kernels handed to the evaluator by this process (resume shows 0)."""
        self.tracker: Tracker | None = None
        self.mlflow: dict[str, str] = {}
        self._stages: dict[str, TurnStages] = {}
        self._generator: Policy | None = None
        self._tokenizer: Any = None
        self._policies: dict[str, Policy] = {}
        self._evaluator: BatchEvaluator | None = None

    # ------------------------------------------------------------------------------------------ set-up

    def open(self) -> list[RolloutPlan]:
        """Find the tasks and the model, write (or, resuming, check) ``run.json``, start the MLflow run; returns the
        rollouts to run. The model is not loaded here."""
        from kevin.experiment.policies import model_label
        from kevin.experiment.splits import split_side

        cfg = self.config
        rollouts = self.out_dir / ROLLOUTS_DIR
        started = rollouts.is_dir() and any(rollouts.iterdir())
        if started and not self.resume:
            raise FileExistsError(f"{self.out_dir} already holds an evaluation; continue it with --resume, or set "
                                  "evaluate.output_dir to another folder")
        # Without rollouts there is nothing to continue (e.g. DVC removed the stage's outputs before re-running it):
        # a fresh run, whatever an earlier run left beside them (its run.json, its MLflow run, its "tracked" mark).
        self.resume = self.resume and started
        if not started:
            (self.out_dir / TRACKED).unlink(missing_ok=True)
        split_file = cfg.evaluate.split
        if split_file:
            path = Path(split_file) if Path(split_file).is_absolute() else self.project_dir / split_file
            if path.is_file():
                split_file = str(path)
            else:
                log.info("no split file %s: the splits section draws the split", path)
                split_file = ""
        tasks = split_side(cfg, split_file, cfg.evaluate.tasks)
        if cfg.evaluate.max_tasks:
            tasks = tasks[:cfg.evaluate.max_tasks]
        if not tasks:
            raise ValueError(f"the split holds no {cfg.evaluate.tasks} task: set splits.eval_size or evaluate.split")
        self.tasks = tasks
        self.checkpoint = resolve_checkpoint(cfg.evaluate.checkpoint, self.project_dir)
        label = model_label(cfg) if self.checkpoint is None else f"checkpoint {self.checkpoint}"
        self.identity = {
            "name": self.name, "model": label, "checkpoint": str(self.checkpoint or ""),
            "checkpoint_step": checkpoint_step(self.checkpoint), "tasks": [t.task_id for t in tasks],
            "budget_splits": list(cfg.analysis.budget_splits), "beam": cfg.beam.to_dict(),
            "rollouts": [dataclasses.asdict(p) for p in self.plans], "backend": cfg.backend,
        }
        self._check_identity()
        self.out_dir.mkdir(parents=True, exist_ok=True)
        write_json(self.out_dir / RUN_FILE, self.identity)
        atomic_write_text(self.out_dir / "config.yaml", yaml.safe_dump(
            json.loads(json.dumps(cfg.params_dict(), default=str)), sort_keys=False))
        for plan in self.plans:
            self._stages[plan.name] = TurnStages(self.out_dir / ROLLOUTS_DIR / plan.name, tasks, self._rollout(plan),
                                                 tokenizer=self._prompt_tokenizer())
        self._start_tracking()
        self.progress.line(f"[{self.name}] {'resumed' if self.resume else 'starting'}: outputs in {self.out_dir}")
        self.progress.line(f"  {label} on {len(tasks)} {cfg.evaluate.tasks} tasks; rollouts "
                           + ", ".join(f"{p.name}{' (beam)' if p.select else ''}" for p in self.plans))
        return list(self.plans)

    def _check_identity(self) -> None:
        path = self.out_dir / RUN_FILE
        if not self.resume or not path.is_file():
            return
        before = json.loads(path.read_text(encoding="utf-8"))
        changed = [k for k in IDENTITY if before.get(k) != self.identity[k]]
        if changed:
            raise ValueError(f"{self.out_dir} was evaluated with other {changed} ({ {k: before.get(k) for k in changed} }); "
                             "resume it with the settings it started with, or evaluate into another evaluate.output_dir")

    def _rollout(self, plan: RolloutPlan) -> Any:
        return dataclasses.replace(self.config.rollout, trajectories=plan.trajectories, turns=plan.turns)

    def _prompt_tokenizer(self) -> Any:
        """The tokenizer that renders the prompts (chat template, token counts): the model's own, loaded without its
        weights, so the prompts of a resumed run are built as before. None for a server without a local folder."""
        from transformers import AutoTokenizer

        if self.checkpoint is not None:
            return AutoTokenizer.from_pretrained(str(self.checkpoint / "model"))
        policy = self.config.policy
        if policy.backend == "embedded":
            from kevin.policy.embedded import embedded_hf_dir

            return AutoTokenizer.from_pretrained(str(embedded_hf_dir()))
        folder = policy.model if policy.backend == "hf" else (policy.weights or policy.model)
        if policy.backend == "openai" and not Path(folder).is_dir():
            return None
        return AutoTokenizer.from_pretrained(folder)

    def _start_tracking(self) -> None:
        from kevin.tracking import Tracker

        tracking = self.config.tracking
        if not tracking.run_name and not os.environ.get("DVC_EXP_NAME"):
            tracking = dataclasses.replace(tracking, run_name=self.name)
        self.tracker = Tracker(tracking, self.out_dir, project_dir=self.project_dir)
        resume = self.resume and self.tracker.run_file.is_file()
        step = self.identity["checkpoint_step"]
        tags = {"kind": "evaluation", "evaluate": self.name, "checkpoint": self.identity["checkpoint"] or "none",
                "checkpoint_step": "" if step is None else str(step),
                "budget_splits": ",".join(self.identity["budget_splits"]), "beam": self.config.beam.strategy,
                "tasks": str(len(self.tasks))}
        self.tracker.start(self.config.to_dict(), model=self.identity["model"], backend=self.config.backend,
                           resume=resume, tags=tags, kind="evaluation")
        self.tracker.link_training_run(self.checkpoint)
        if self.tracker.enabled:
            uri = self.tracker.tracking_uri
            self.mlflow = {"run_id": self.tracker.run_id, "experiment": tracking.experiment_name, "tracking_uri": uri,
                           "ui": f"mlflow ui --backend-store-uri {uri}"}

    def _policy(self, plan: RolloutPlan) -> Policy:
        """The generator for ``plan`` (loaded at the first generation; ``policy.wrap`` applied per rollout size)."""
        from kevin.experiment.policies import resolve_wrap

        if self._generator is None:
            if self.config.experiment.torch_threads:
                import torch

                torch.set_num_threads(self.config.experiment.torch_threads)
            self.progress.line("  loading the model")
            self._generator, self._tokenizer = load_generator(self.config, self.checkpoint)
        if plan.name not in self._policies:
            policy = self._generator
            if self.config.policy.wrap:
                sized = dataclasses.replace(self.config, rollout=self._rollout(plan))
                policy = resolve_wrap(self.config.policy.wrap)(policy, sized, self.tasks)
            self._policies[plan.name] = policy
        return self._policies[plan.name]

    @property
    def evaluator(self) -> BatchEvaluator:
        """The batch evaluator, started at the first kernel to judge."""
        if self._evaluator is None:
            from kevin.evaluation.cluster import batch_evaluator

            self._evaluator = batch_evaluator(self.config.evaluation, self.config.cluster)
        return self._evaluator

    def plan(self, name: str) -> RolloutPlan:
        return next(p for p in self.plans if p.name == name)

    # ------------------------------------------------------------------------------------------ the turns

    def generate(self, rollout: str, turn: int) -> Path | None:
        """Every live trajectory's response of ``turn`` (one batch); a turn generated before is kept. None when no
        trajectory is live (all stopped early)."""
        stages = self._stages[rollout]
        if generated_path(stages.out_dir, turn).is_file() or turn < stages.turns_done:
            return stages.generate(turn, _nothing_to_generate)
        live = len(stages.live())
        if not live:
            return None
        plan = self.plan(rollout)
        policy = self._policy(plan)
        self.progress.line(f"  {rollout} turn {turn + 1}/{plan.turns}: generating {live} responses")
        self.calls["generations"] += 1
        return stages.generate(turn, policy)

    def parse(self, rollout: str, turn: int) -> Path:
        return self._stages[rollout].parse(turn)

    def evaluate(self, rollout: str, turn: int) -> Path:
        """Judge every kernel of the turn that has no verdict yet; writes the turn's records."""
        stages = self._stages[rollout]
        if turn < stages.turns_done:
            return stages.evaluate(turn, _nothing_to_judge)
        pending = len(read_jsonl(generated_path(stages.out_dir, turn)))
        label = f"{rollout}: turn {turn + 1}"
        self.progress.evaluation_started(0, label, pending)

        def judge(batch: Any, progress: Any = None) -> Any:
            self.calls["evaluations"] += len(batch)
            return self.evaluator.evaluate_many(batch, progress=progress)

        try:
            path = stages.evaluate(turn, judge, on_verdict=lambda result: self.progress.verdict(result, label))
        finally:
            self.progress.evaluation_finished(0, label)
        return path

    def select(self, rollout: str, turn: int) -> Path | None:
        """Beam-style selection after ``turn`` (not after the last): per task, ``beam`` picks the trajectories that
        continue and branches them (``parents_T.json``). None without selection."""
        from kevin.analysis.outcomes import outcomes_from_trajectories

        plan, stages = self.plan(rollout), self._stages[rollout]
        if not plan.select or turn + 1 >= plan.turns or not stages.live():
            return None
        saved = parents_path(stages.out_dir, turn)
        if saved.is_file():
            return saved  # chosen before the interruption, and applied when the rollout was reopened
        outcomes = outcomes_from_trajectories(stages.trajectories_after(turn))
        parents = {task.task_id: list(self.config.beam.step(task.trajectories).parents) for task in outcomes}
        path = stages.branch(turn, parents)
        self.progress.line(f"  {rollout} after turn {turn + 1}: continuing "
                           + "; ".join(f"{t} from {sorted(set(p))}" for t, p in parents.items()))
        return path

    def turns(self, rollout: str) -> int:
        return self.plan(rollout).turns

    # ------------------------------------------------------------------------------------------ the results

    def analyse(self) -> Path:
        """The run's report (``report.json``) from every rollout's finished turns."""
        from kevin.analysis.metrics import analyze_run, report_from_states
        from kevin.analysis.outcomes import outcomes_from_trajectories

        analysis = self.config.analysis
        if len(self.plans) == 1 and not self.plans[0].select:
            stages = self._stages[self.plans[0].name]
            report = analyze_run(self.name, outcomes_from_trajectories(stages.trajectories()), analysis)
        else:
            states = {}
            for plan in self.plans:
                stages = self._stages[plan.name]
                states[plan.name] = [outcomes_from_trajectories(stages.trajectories_after(t))
                                     for t in range(stages.turns_done)]
            report = report_from_states(self.name, states, analysis)
        return write_json(self.out_dir / REPORT_FILE, report.to_dict())

    def report(self) -> RunReport:
        return load_report(self.out_dir)

    def write_outputs(self) -> dict[str, Path]:
        """``metrics.json`` (flat names, for DVC and MLflow), the curves, Table 1 and Table 2, the plots."""
        from kevin.analysis.tables import flat_metrics

        report = self.report()
        paths = write_report_files([report], self.out_dir)
        paths["metrics"] = write_json(self.out_dir / METRICS_FILE, flat_metrics(report))
        return paths

    def track(self, paths: dict[str, Path]) -> bool:
        """Log the metrics and the tables, curves and plots to the MLflow run, once; False when already logged or
        tracking is off."""
        from mlflow.entities import Metric

        from kevin.tracking import mlflow_key

        if not self.tracker.enabled or (self.out_dir / TRACKED).is_file():
            return False
        metrics = json.loads(paths["metrics"].read_text(encoding="utf-8"))
        stamp = int(paths["metrics"].stat().st_mtime * 1000)
        # metrics.json's names, with turns written as the training runs write them (turn_1/...).
        batch = [Metric(key=mlflow_key(k), value=float(v), timestamp=stamp, step=0) for k, v in metrics.items()]
        for start in range(0, len(batch), 1000):  # MLflow takes at most 1000 metrics per call
            self.tracker.client.log_batch(self.tracker.run_id, metrics=batch[start:start + 1000])
        for folder in ("tables", "curves", "plots"):
            self.tracker.log_artifact(self.out_dir / folder, folder)
        for name in (METRICS_FILE, REPORT_FILE, RUN_FILE):
            self.tracker.log_artifact(self.out_dir / name)
        atomic_write_text(self.out_dir / TRACKED, "")
        return True

    def result(self) -> dict[str, Any]:
        """What the run produced, as plain data (the flow's result; ``kevin evaluate`` prints it)."""
        report = self.report()
        final = report.final
        return {"name": self.name, "out_dir": str(self.out_dir), "model": self.identity["model"],
                "checkpoint": self.identity["checkpoint"], "checkpoint_step": self.identity["checkpoint_step"],
                "tasks": report.tasks, "size": f"{report.trajectories}x{report.turns}",
                "final": {"best": final.best, "avg": final.avg, "geomean_speedup": final.geomean_speedup},
                "splits": {s: {"perf": c[-1].best["perf"], "correct": c[-1].best["correct"]}
                           for s, c in report.splits.items()},
                "table1": (self.out_dir / "tables" / "table1.md").read_text(encoding="utf-8"),
                "table2": (self.out_dir / "tables" / "table2.md").read_text(encoding="utf-8"),
                "calls": dict(self.calls), "mlflow": dict(self.mlflow)}

    def close(self, error: BaseException | None = None) -> None:
        """End the MLflow run (FINISHED, KILLED on an interruption, FAILED on an error) and release the evaluator
        and the model's connections."""
        try:
            if self.tracker is not None:
                self.tracker.__exit__(type(error) if error else None, error, None)
        finally:
            close_all(self._evaluator, self._generator)


def _nothing_to_generate(prompts: Any) -> Any:
    raise RuntimeError("a finished turn was asked to generate again")


def _nothing_to_judge(batch: Any, progress: Any = None) -> Any:
    raise RuntimeError("a finished turn was asked to judge again")
