"""The multi-turn rollout loop: m trajectories x n turns for every task, and the storage of a rollout directory.

``run_rollouts`` drives the turn stages of ``kevin.rollout.stages`` (the ones the training flow runs one by one),
so there is one engine for a turn. Per turn: build the prompt of every live trajectory of every task, generate them as ONE batch (the
backend batches or parallelises them; each prompt goes out as a ``Prompt`` record, messages and their
rendering, so a chat endpoint gets the messages and never a rendered template), parse every response
(told whether its prompt opened the reasoning), evaluate every parsed kernel as ONE batch
(the evaluator spreads it over its compile pool and devices), record a Turn per trajectory, and write
the turn's batch to disk before starting the next turn. Generation and evaluation are callables, so
the loop is the same for the in-process model, an OpenAI-compatible server, and the fakes of the tests.

On disk (``out_dir``)::

    rollout.json        {"config": ..., "task_ids": [...], "turns_completed": k, "complete": bool}
    turn_000.jsonl      every Turn of turn 0 (one line each), written atomically when the turn ends
    turn_001.jsonl      ...

A crash loses at most the turn in progress; ``resume=True`` continues after the last complete turn, and
only under the settings the directory was rolled out with (a resumed rollout must be one rollout).
"""

from __future__ import annotations

import dataclasses
import json
import logging
import tempfile
from pathlib import Path
from typing import Any, Callable, Sequence

from kevin.records.evaluation import Candidate, EvalResult
from kevin.policy.protocol import Generate
from kevin.records.generation import GenerationOut
from kevin.records.jsonl import atomic_write_text
from kevin.records.rollout import Trajectory, Turn, group_trajectories, load_turns, save_turns
from kevin.records.verdicts import feedback_line, parse_error_verdict
from kevin.rollout.config import RolloutConfig
from kevin.rollout.parsing import ParsedResponse
from kevin.rollout.prompts import Attempt, PromptContext, TokenCounter
from kevin.tasks.task import Task

log = logging.getLogger(__name__)

META_FILE = "rollout.json"
FORMAT_VERSION = 1

RESUME_MAY_CHANGE = frozenset({"show_progress"})
"""RolloutConfig fields a resume may change: they alter nothing that a turn records."""


Evaluate = Callable[[list[tuple[Task, Candidate]]], list[EvalResult]]


# ------------------------------------------------------------------------------------- storage


def turn_path(out_dir: str | Path, turn: int) -> Path:
    return Path(out_dir) / f"turn_{turn:03d}.jsonl"


def _completed_turn_files(out_dir: Path) -> list[Path]:
    """Turn files 0, 1, ... k-1 (a gap means a damaged directory, which is an error, not a guess)."""
    files = sorted(out_dir.glob("turn_*.jsonl"))
    for expected, path in enumerate(files):
        if path != turn_path(out_dir, expected):
            raise ValueError(f"{out_dir}: turn files are not contiguous from turn_000.jsonl "
                             f"(found {[p.name for p in files]})")
    return files


def read_meta(out_dir: str | Path) -> dict[str, Any]:
    path = Path(out_dir) / META_FILE
    if not path.is_file():
        raise FileNotFoundError(f"{out_dir}: no {META_FILE}; not a rollout directory")
    return json.loads(path.read_text(encoding="utf-8"))


def load_rollout(out_dir: str | Path) -> list[Trajectory]:
    """Every completed turn under ``out_dir``, grouped into trajectories (early stops re-derived)."""
    out_dir = Path(out_dir)
    meta = read_meta(out_dir)
    config = RolloutConfig.from_dict(meta["config"])
    turns = [t for path in _completed_turn_files(out_dir) for t in load_turns(path)]
    trajectories = group_trajectories(turns)
    for traj in trajectories:
        update_stop(traj, config)
    return trajectories


class RolloutStore:
    """Writes a rollout directory turn by turn (each file atomically) and reloads it for a resume."""

    def __init__(self, out_dir: str | Path, config: RolloutConfig, tasks: Sequence[Task],
                 trajectory_indices: Sequence[int] | None = None):
        self.out_dir = Path(out_dir)
        self.config = config
        self.task_ids = [t.task_id for t in tasks]
        self.trajectory_indices = None if trajectory_indices is None else [int(i) for i in trajectory_indices]

    def _write_meta(self, turns_completed: int, complete: bool) -> None:
        meta = {"format": FORMAT_VERSION, "config": self.config.to_dict(), "task_ids": self.task_ids,
                "turns_completed": turns_completed, "complete": complete}
        if self.trajectory_indices is not None:  # one wave of a step: these trajectories of every task
            meta["trajectory_indices"] = self.trajectory_indices
        atomic_write_text(self.out_dir / META_FILE, json.dumps(meta, indent=1) + "\n")

    def start(self, resume: bool) -> list[Turn]:
        """Prepare the directory; return the turns already on disk when resuming (else none)."""
        existing = _completed_turn_files(self.out_dir) if self.out_dir.is_dir() else []
        if existing and not resume:
            raise FileExistsError(f"{self.out_dir} already holds a rollout ({len(existing)} turns); pass resume=True "
                                  "to continue it, or use an empty directory")
        turns: list[Turn] = []
        if existing:
            self._check_compatible(read_meta(self.out_dir))
            turns = [t for path in existing for t in load_turns(path)]
        self._write_meta(len(existing), complete=False)
        return turns

    def _check_compatible(self, meta: dict[str, Any]) -> None:
        old = RolloutConfig.from_dict(meta["config"])
        if meta.get("task_ids") != self.task_ids:
            raise ValueError(f"{self.out_dir}: cannot resume, it was rolled out for other tasks ({meta.get('task_ids')})")
        if meta.get("trajectory_indices") != self.trajectory_indices:
            raise ValueError(f"{self.out_dir}: cannot resume, it holds trajectories {meta.get('trajectory_indices')} "
                             f"(None: all) and this run asks for {self.trajectory_indices}")
        # Every setting that changes what a turn asks, shows or stops on must match; new settings are checked
        # unless listed here as presentation only.
        for f in dataclasses.fields(RolloutConfig):
            if f.name in RESUME_MAY_CHANGE:
                continue
            before, now = getattr(old, f.name), getattr(self.config, f.name)
            if before != now:
                raise ValueError(f"{self.out_dir}: cannot resume, it was rolled out with rollout.{f.name} = {before!r} "
                                 f"and this run has {now!r}; resume with the same settings, or roll out into a new "
                                 "directory")

    def save_turn(self, turn: int, turns: list[Turn]) -> Path:
        path = save_turns(turn_path(self.out_dir, turn), turns)
        self._write_meta(turn + 1, complete=False)
        return path

    def finish(self, turns_completed: int) -> None:
        self._write_meta(turns_completed, complete=True)


# ---------------------------------------------------------------------------------- one turn


def past_attempts(traj: Trajectory) -> list[Attempt]:
    return [Attempt(turn=t.turn, kernel=t.kernel, summary=t.summary, feedback=t.feedback) for t in traj.turns]


def candidate_id(task_id: str, trajectory: int, turn: int) -> str:
    return f"{task_id}#traj{trajectory}#turn{turn}"


def evaluate_turn(jobs: list[tuple[Task, Trajectory, ParsedResponse]], turn: int, evaluate: Evaluate,
                   backend: str) -> list[EvalResult]:
    """Verdicts in job order: parse errors locally, every parsed kernel in one evaluate() call."""
    results: list[EvalResult | None] = [None] * len(jobs)
    batch: list[tuple[Task, Candidate]] = []
    batch_index: list[int] = []
    for i, (task, traj, parsed) in enumerate(jobs):
        cid = candidate_id(task.task_id, traj.index, turn)
        if parsed.parse_error:
            results[i] = parse_error_verdict(task.task_id, cid, parsed.error, backend)
        else:
            batch.append((task, Candidate(task_id=task.task_id, source=parsed.kernel, trajectory=traj.index,
                                          turn=turn, candidate_id=cid)))
            batch_index.append(i)
    if batch:
        verdicts = list(evaluate(batch))
        if len(verdicts) != len(batch):
            raise RuntimeError(f"evaluate returned {len(verdicts)} results for {len(batch)} candidates")
        for i, verdict in zip(batch_index, verdicts):
            if not verdict.feedback:  # the next turn's context needs a feedback line for every attempt
                verdict.feedback = feedback_line(verdict)
            results[i] = verdict
    return [r for r in results if r is not None]


def make_turn(task: Task, traj: Trajectory, turn: int, ctx: PromptContext, out: GenerationOut,
               parsed: ParsedResponse, result: EvalResult, count_tokens: TokenCounter) -> Turn:
    return Turn(
        task_id=task.task_id, trajectory=traj.index, turn=turn, result=result,
        prompt=ctx.text, prompt_messages=ctx.messages, response=out.text,
        reasoning=parsed.reasoning, kernel=parsed.kernel, summary=parsed.summary, parse_error=parsed.parse_error,
        prompt_tokens=len(out.prompt_token_ids) or ctx.tokens,
        response_tokens=len(out.token_ids) or count_tokens(out.text),
        truncated=out.truncated, attempts_in_context=ctx.attempts_kept, attempts_dropped=ctx.attempts_dropped,
        prompt_token_ids=list(out.prompt_token_ids), response_token_ids=list(out.token_ids),
        logprobs=list(out.logprobs) if out.logprobs is not None else None,
        server_template=out.server_template, reasoning_opened_by_prompt=ctx.reasoning_open,
    )


def update_stop(traj: Trajectory, config: RolloutConfig) -> None:
    """Mark a trajectory stopped once it produced a correct kernel at or above the target speedup."""
    target = config.early_stop_speedup
    if target is None or traj.stopped:
        return
    for t in traj.turns:
        if t.correct and t.speedup >= target and t.turn < config.turns - 1:
            traj.stop_reason = f"turn {t.turn}: correct kernel at {t.speedup:.2f}x >= target {target:g}x"
            return


# ---------------------------------------------------------------------------------- the loop


def _check_tasks(tasks: Sequence[Task]) -> None:
    if not tasks:
        raise ValueError("run_rollouts needs at least one task")
    ids = [t.task_id for t in tasks]
    dupes = sorted({i for i in ids if ids.count(i) > 1})
    if dupes:
        raise ValueError(f"task ids must be unique within a rollout; repeated: {dupes}")


def _progress(config: RolloutConfig, start: int):
    if not config.show_progress:
        return None
    from tqdm import tqdm  # only when asked for: keeps the import optional

    return tqdm(total=config.turns, initial=start, desc="rollout", unit="turn", dynamic_ncols=True)


def run_rollouts(
    tasks: Sequence[Task],
    generate: Generate,
    evaluate: Evaluate,
    config: RolloutConfig | None = None,
    *,
    tokenizer: Any | None = None,
    count_tokens: TokenCounter | None = None,
    out_dir: str | Path | None = None,
    resume: bool = False,
) -> list[Trajectory]:
    """Roll out ``config.trajectories`` x ``config.turns`` for every task; trajectories in task order.

    ``tokenizer`` renders prompts with its chat template (and counts tokens unless ``count_tokens`` is
    given); without one, prompts are the plain message text. With ``out_dir`` every finished turn is on
    disk before the next starts; ``resume=True`` continues a directory's rollout after its last turn.

    A driver over the turn stages the training flow runs (``kevin.rollout.stages.TurnStages``): one engine writes
    every turn. The stages' own files (generated, parsed, verdicts) are scratch here: each turn's are removed once
    its records are written, and those of a turn a crash interrupted are dropped, so a resume redoes that turn and
    the directory holds only ``rollout.json`` and the turn files. Without ``out_dir`` the stages run in a temporary
    folder.
    """
    from kevin.rollout.stages import TurnStages  # stages builds on this module's storage: imported at the call

    config = config or RolloutConfig()
    _check_tasks(tasks)
    if out_dir is None:
        with tempfile.TemporaryDirectory(prefix="kevin-rollout-") as scratch:
            return run_rollouts(tasks, generate, evaluate, config, tokenizer=tokenizer, count_tokens=count_tokens,
                                out_dir=scratch)
    out = Path(out_dir)
    _drop_stage_files(out, len(_completed_turn_files(out)) if out.is_dir() else 0)
    stages = TurnStages(out, tasks, config, tokenizer=tokenizer, count_tokens=count_tokens, resume=resume)
    bar = _progress(config, stages.turns_done)

    def judge(items: list[tuple[Task, Candidate]], progress: Any = None) -> list[EvalResult]:
        return evaluate(items)  # a plain Evaluate reports no progress: the stage records its verdicts after it

    for turn in range(stages.turns_done, config.turns):
        if stages.generate(turn, generate) is None:  # every trajectory stopped early
            break
        stages.parse(turn)
        stages.evaluate(turn, judge)
        _drop_stage_files(out, turn)
        _log_turn(turn, config, [t for traj in stages.trajectories() for t in traj.turns if t.turn == turn], bar)
    if bar is not None:
        bar.close()
    return stages.trajectories()


STAGE_FILES = ("generated", "parsed", "verdicts")
"""The stage files of a turn (``kevin.rollout.stages``), scratch for ``run_rollouts``."""


def _drop_stage_files(out_dir: Path, turn: int) -> None:
    for stage in STAGE_FILES:
        (out_dir / f"{stage}_{turn:03d}.jsonl").unlink(missing_ok=True)


def _log_turn(turn: int, config: RolloutConfig, turns: list[Turn], bar: Any) -> None:
    n = len(turns)
    parse_errors = sum(t.parse_error for t in turns)
    correct = sum(t.correct for t in turns)
    log.info("turn %d/%d: %d responses, %d parse errors, %d correct", turn + 1, config.turns, n, parse_errors, correct)
    if bar is not None:
        bar.set_postfix(responses=n, correct=f"{correct}/{n}", parse_err=parse_errors)
        bar.update(1)
