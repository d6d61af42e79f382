"""One turn of the rollout as three file-to-file stages: generate, parse, evaluate.

These stages are the one engine of a turn: ``run_rollouts`` (loop.py) drives them through a whole rollout in one
call, and an orchestrator that runs each stage as its own task, retries a failed generation, and must lose no
judged kernel when it is killed (the training flow) calls them one by one: every stage reads the files of the
stage before it and writes its own, and a stage whose output is already on disk is not run again. In the rollout directory (next to loop.py's ``rollout.json`` and
``turn_NNN.jsonl``)::

    generated_NNN.jsonl   per live trajectory: the prompt as built (messages, rendering, tokens, attempts kept
                          and dropped) and the policy's output (text, token ids, log-probs, truncation)
    parsed_NNN.jsonl      per trajectory: reasoning, kernel, summary, parse error
    verdicts_NNN.jsonl    one EvalResult a line, APPENDED as each verdict arrives (fsynced): a kill during a
                          long evaluation batch keeps every verdict already given, and the evaluation
                          resumes with the candidates that have none
    turn_NNN.jsonl        the turn's records (loop.py's format), written once every verdict is in
    parents_NNN.json      only when trajectories branch (beam-style selection, ``TurnStages.branch``): per task,
                          which trajectory each slot of turn NNN+1 continues

A stage output is written atomically (the verdict file line by line; a line cut by a kill is ignored), so a
file that exists is complete. The records are those ``run_rollouts`` would write for the same outputs.

Branching: after turn t a selection may continue slot j of the next turn from trajectory ``parents[j]`` (its
attempts and feedback become slot j's history; several slots sharing a parent are branches). The turn records
keep the slot they were generated in (``Turn.trajectory``), so a slot's history is its lineage, rebuilt from the
turn files and the parents files: read it with ``trajectories()`` / ``trajectories_after(t)``, not by grouping
turn records by their trajectory index (``load_rollout`` does that, and knows nothing of branches).
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import threading
from pathlib import Path
from typing import Any, Callable, Mapping, Protocol, Sequence

from kevin.records.evaluation import Candidate, EvalResult
from kevin.records.generation import GenerationOut
from kevin.records.jsonl import atomic_write_text, read_jsonl, write_jsonl
from kevin.records.rollout import Trajectory, Turn
from kevin.records.verdicts import feedback_line, parse_error_verdict
from kevin.rollout.config import RolloutConfig
from kevin.rollout.loop import Generate, RolloutStore, candidate_id, make_turn, past_attempts, turn_path, update_stop
from kevin.rollout.parsing import ParsedResponse, parse_response
from kevin.rollout.prompts import PromptBuilder, PromptContext, TokenCounter
from kevin.tasks.task import Task

log = logging.getLogger(__name__)

__all__ = ["EvaluateWithProgress", "TurnStages", "generated_path", "parents_path", "parsed_path", "read_verdicts",
           "verdicts_path"]

VerdictCallback = Callable[[EvalResult], None]


class EvaluateWithProgress(Protocol):
    """A batch evaluator that reports each verdict as it is given (``Evaluator.evaluate_many``)."""

    def __call__(self, items: list[tuple[Task, Candidate]], progress: VerdictCallback | None = None
                 ) -> list[EvalResult]: ...


def generated_path(out_dir: str | Path, turn: int) -> Path:
    return Path(out_dir) / f"generated_{turn:03d}.jsonl"


def parsed_path(out_dir: str | Path, turn: int) -> Path:
    return Path(out_dir) / f"parsed_{turn:03d}.jsonl"


def verdicts_path(out_dir: str | Path, turn: int) -> Path:
    return Path(out_dir) / f"verdicts_{turn:03d}.jsonl"


def parents_path(out_dir: str | Path, turn: int) -> Path:
    return Path(out_dir) / f"parents_{turn:03d}.json"


def read_verdicts(path: str | Path) -> dict[str, EvalResult]:
    """The verdicts of an append-only verdict file by candidate id; a line cut off by a kill (only the last can
    be) is skipped, and a candidate judged twice keeps its first verdict."""
    path = Path(path)
    found: dict[str, EvalResult] = {}
    if not path.is_file():
        return found
    with path.open(encoding="utf-8") as fh:
        for line in fh:
            try:
                result = EvalResult.from_dict(json.loads(line))
            except (ValueError, KeyError, TypeError):
                continue
            found.setdefault(result.candidate_id, result)
    return found


def _append_line(path: Path, row: dict[str, Any]) -> None:
    # One write per verdict, then fsync: a verdict that was reported is on disk before the next one is judged.
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, (json.dumps(row, ensure_ascii=False) + "\n").encode("utf-8"))
        os.fsync(fd)
    finally:
        os.close(fd)


def _context_dict(ctx: PromptContext) -> dict[str, Any]:
    return dataclasses.asdict(ctx)


def _context_from(data: dict[str, Any]) -> PromptContext:
    return PromptContext(**data)


class TurnStages:
    """The stages of the turns of one rollout directory (``out_dir``) for ``tasks`` under ``config``.

    Built on a directory that holds finished turns, it continues after them (the directory must have been
    rolled out with the same settings and tasks: ``RolloutStore``). ``tokenizer`` renders prompts with the chat
    template and counts their tokens (as in ``run_rollouts``). ``trajectory_indices`` keeps only those trajectories
    of every task (one wave of a step, ``kevin.rollout.waves``); None keeps all ``config.trajectories``.
    ``resume=False`` refuses a directory that already holds finished turns (``run_rollouts(resume=False)``).
    """

    def __init__(self, out_dir: str | Path, tasks: Sequence[Task], config: RolloutConfig, *,
                 tokenizer: Any | None = None, count_tokens: TokenCounter | None = None,
                 trajectory_indices: Sequence[int] | None = None, resume: bool = True):
        self.out_dir = Path(out_dir)
        self.tasks = list(tasks)
        self.by_id = {t.task_id: t for t in self.tasks}
        self.config = config
        indices = list(range(config.trajectories)) if trajectory_indices is None else sorted(set(trajectory_indices))
        if not indices or any(not 0 <= i < config.trajectories for i in indices):
            raise ValueError(f"trajectory_indices must be some of 0..{config.trajectories - 1}, got {trajectory_indices}")
        self.indices = indices
        self.builder = PromptBuilder(backend=config.backend, max_prompt_tokens=config.max_prompt_tokens,
                                     tokenizer=tokenizer, count_tokens=count_tokens, profile=config.profile,
                                     include_example=config.include_example, system_prompt=config.system_prompt,
                                     reasoning_open=config.prompt_opens_reasoning,
                                     style=config.prompt_style)
        self.store = RolloutStore(self.out_dir, config, self.tasks,
                                  trajectory_indices=None if trajectory_indices is None else indices)
        self._trajectories = {(t.task_id, j): Trajectory(task_id=t.task_id, index=j)
                              for t in self.tasks for j in indices}
        self._after: list[list[Trajectory]] = []  # per finished turn: every slot's history right after it
        by_turn: dict[int, list[Turn]] = {}
        for record in self.store.start(resume=resume):
            by_turn.setdefault(record.turn, []).append(record)
        # Replayed turn by turn: a branch recorded after turn t rewires the histories before turn t+1's records.
        for turn in sorted(by_turn):
            self._append(by_turn[turn])
            saved = parents_path(self.out_dir, turn)
            if saved.is_file():
                self._rewire(json.loads(saved.read_text(encoding="utf-8")))
        if self.turns_done and (self.turns_done == config.turns or not self.live()):
            self.store.finish(self.turns_done)  # reopened after its last turn: still a complete rollout

    # -- state

    @property
    def turns_done(self) -> int:
        """Turns whose records are written (every trajectory ran them, or had stopped)."""
        return max((len(t.turns) for t in self._trajectories.values()), default=0)

    def trajectories(self) -> list[Trajectory]:
        """Every trajectory (slot) with its finished turns, in task order then trajectory index. After a branch a
        slot's turns are its lineage: its parent's turns, then its own."""
        return list(self._trajectories.values())

    def trajectories_after(self, turn: int) -> list[Trajectory]:
        """Every slot's history as it was right after ``turn`` (0-based) was recorded, before any branch that
        followed it: what the rollout held had it stopped there. Without branches these are the trajectories
        cut after ``turn``."""
        if not 0 <= turn < len(self._after):
            raise ValueError(f"turn {turn} is not finished (finished: {len(self._after)})")
        return [dataclasses.replace(t, turns=list(t.turns)) for t in self._after[turn]]

    def live(self) -> list[tuple[Task, Trajectory]]:
        """The trajectories the next turn continues (not stopped early), in task order then index."""
        return [(self.by_id[tid], traj) for (tid, _), traj in self._trajectories.items() if not traj.stopped]

    def _check_turn(self, turn: int) -> None:
        if not 0 <= turn < self.config.turns:
            raise ValueError(f"turn {turn} is outside the rollout's {self.config.turns} turns")
        if turn > self.turns_done:
            raise ValueError(f"turn {turn} cannot start before turn {self.turns_done} is finished")

    # -- stages

    def generate(self, turn: int, generate: Generate) -> Path | None:
        """Build every live trajectory's prompt, generate them as one batch, write ``generated_NNN.jsonl``.
        Returns its path (None when no trajectory is live); an existing file is kept, not generated again."""
        self._check_turn(turn)
        path = generated_path(self.out_dir, turn)
        if path.is_file() or turn < self.turns_done:  # generated before (a finished turn keeps its records)
            return path if path.is_file() else turn_path(self.out_dir, turn)
        live = self.live()
        if not live:
            return None
        contexts = [self.builder.build(task, past_attempts(traj)) for task, traj in live]
        over = sum(c.over_budget for c in contexts)
        if over:
            log.warning("turn %d: %d prompts exceed max_prompt_tokens=%d even without earlier attempts",
                        turn, over, self.builder.max_prompt_tokens)
        outs = list(generate([c.prompt_for(task.task_id, traj.index) for c, (task, traj) in zip(contexts, live)]))
        if len(outs) != len(contexts):
            raise RuntimeError(f"generate returned {len(outs)} outputs for {len(contexts)} prompts")
        rows = [{"task_id": task.task_id, "trajectory": traj.index, "context": _context_dict(ctx),
                 "output": dataclasses.asdict(out)} for (task, traj), ctx, out in zip(live, contexts, outs)]
        return write_jsonl(path, rows)

    def parse(self, turn: int) -> Path:
        """Split each generated response into reasoning, kernel and summary: ``parsed_NNN.jsonl``."""
        path = parsed_path(self.out_dir, turn)
        if path.is_file() or turn < self.turns_done:
            return path if path.is_file() else turn_path(self.out_dir, turn)
        rows = []
        for row in self._generated(turn):
            out, ctx = row["output"], row["context"]
            parsed = parse_response(out["text"], truncated=out["truncated"], reasoning_open=ctx["reasoning_open"])
            rows.append({"task_id": row["task_id"], "trajectory": row["trajectory"], **dataclasses.asdict(parsed)})
        return write_jsonl(path, rows)

    def evaluate(self, turn: int, evaluate: EvaluateWithProgress, on_verdict: VerdictCallback | None = None) -> Path:
        """Judge every parsed kernel of the turn that has no verdict yet (one batch), appending each verdict to
        ``verdicts_NNN.jsonl`` as it is given; then write the turn's records (``turn_NNN.jsonl``). Parse errors
        get their verdict here, without the evaluator. ``on_verdict`` sees every verdict (kept ones too)."""
        final = turn_path(self.out_dir, turn)
        if final.is_file() or turn < self.turns_done:
            return final
        generated = self._generated(turn)
        parsed = [ParsedResponse(**{k: v for k, v in row.items() if k not in ("task_id", "trajectory")})
                  for row in read_jsonl(self.parse(turn))]
        vpath = verdicts_path(self.out_dir, turn)
        kept = read_verdicts(vpath)
        verdicts: dict[str, EvalResult] = {}
        batch: list[tuple[Task, Candidate]] = []
        for row, p in zip(generated, parsed):
            task, cid = self.by_id[row["task_id"]], candidate_id(row["task_id"], row["trajectory"], turn)
            if cid in kept:
                verdicts[cid] = kept[cid]
                if on_verdict is not None:
                    on_verdict(kept[cid])
            elif p.parse_error:
                verdicts[cid] = parse_error_verdict(task.task_id, cid, p.error, self.config.backend)
                self._record(vpath, verdicts[cid], on_verdict)
            else:
                batch.append((task, Candidate(task_id=task.task_id, source=p.kernel, trajectory=row["trajectory"],
                                              turn=turn, candidate_id=cid)))
        if batch:
            wanted = {cand.candidate_id for _, cand in batch}
            lock = threading.Lock()  # the evaluator reports from its worker threads

            def arrived(result: EvalResult) -> None:
                with lock:
                    if result.candidate_id in wanted and result.candidate_id not in verdicts:
                        verdicts[result.candidate_id] = result
                        self._record(vpath, result, on_verdict)

            results = list(evaluate(batch, progress=arrived))
            if len(results) != len(batch):
                raise RuntimeError(f"evaluate returned {len(results)} results for {len(batch)} candidates")
            for (_, cand), result in zip(batch, results):
                if cand.candidate_id not in verdicts:  # an evaluator that reports no progress
                    arrived(dataclasses.replace(result, candidate_id=cand.candidate_id))
        return self._write_turn(turn, generated, parsed, verdicts)

    def branch(self, turn: int, parents: Mapping[str, Sequence[int]]) -> Path:
        """Continue slot j of each task's next turn from trajectory ``parents[task_id][j]`` of finished turn
        ``turn`` (the newest): ``parents_NNN.json``, written atomically before the histories are rewired, so a
        rollout reopened later continues the same lineages. A branch already recorded for ``turn`` is kept (a
        different one is an error: the turns after it were generated from the recorded one)."""
        if self.indices != list(range(self.config.trajectories)):
            raise ValueError("a branch chooses among all of a task's trajectories; these stages hold only "
                             f"trajectories {self.indices}")
        if turn != self.turns_done - 1:
            raise ValueError(f"a branch follows the newest finished turn ({self.turns_done - 1}), not turn {turn}")
        wanted = {t.task_id: [int(p) for p in parents.get(t.task_id, ())] for t in self.tasks}
        m = self.config.trajectories
        bad = {tid: ps for tid, ps in wanted.items() if len(ps) != m or any(not 0 <= p < m for p in ps)}
        if bad:
            raise ValueError(f"parents must give each task {m} trajectory indices in 0..{m - 1}; got {bad}")
        path = parents_path(self.out_dir, turn)
        if path.is_file():
            saved = json.loads(path.read_text(encoding="utf-8"))
            if saved != wanted:
                raise ValueError(f"{path} already continues turn {turn} from {saved}, not {wanted}; the later turns "
                                 "were generated from it: roll out into a new directory to select differently")
            return path  # recorded before, and applied when this rollout was opened
        atomic_write_text(path, json.dumps(wanted, indent=1) + "\n")
        self._rewire(wanted)
        return path

    # -- helpers

    def _append(self, records: Sequence[Turn]) -> None:
        """Add one turn's records to their slots and remember every slot's history after it."""
        for record in records:
            traj = self._trajectories[(record.task_id, record.trajectory)]
            traj.turns.append(record)
            update_stop(traj, self.config)
        self._after.append([dataclasses.replace(t, turns=list(t.turns)) for t in self._trajectories.values()])

    def _rewire(self, parents: Mapping[str, Sequence[int]]) -> None:
        """Give slot j of each task a copy of its parent's history (the same Turn records, shared)."""
        before = dict(self._trajectories)
        for task in self.tasks:
            for j, p in enumerate(parents[task.task_id]):
                parent = before[(task.task_id, int(p))]
                slot = Trajectory(task_id=task.task_id, index=j, turns=list(parent.turns))
                update_stop(slot, self.config)
                self._trajectories[(task.task_id, j)] = slot

    def _generated(self, turn: int) -> list[dict[str, Any]]:
        path = generated_path(self.out_dir, turn)
        if not path.is_file():
            raise FileNotFoundError(f"{path}: turn {turn} has not been generated; run the generate stage first")
        return read_jsonl(path)

    def _record(self, path: Path, result: EvalResult, on_verdict: VerdictCallback | None) -> None:
        if not result.feedback:  # the next turn's context needs a feedback line for every attempt
            result.feedback = feedback_line(result)
        _append_line(path, result.to_dict())
        if on_verdict is not None:
            on_verdict(result)

    def _write_turn(self, turn: int, generated: list[dict[str, Any]], parsed: list[ParsedResponse],
                    verdicts: dict[str, EvalResult]) -> Path:
        records: list[Turn] = []
        for row, p in zip(generated, parsed):
            task = self.by_id[row["task_id"]]
            traj = self._trajectories[(row["task_id"], row["trajectory"])]
            result = verdicts[candidate_id(row["task_id"], row["trajectory"], turn)]
            if not result.feedback:
                result.feedback = feedback_line(result)
            out = GenerationOut(**row["output"])
            records.append(make_turn(task, traj, turn, _context_from(row["context"]), out, p, result,
                                      self.builder.count_tokens))
        path = self.store.save_turn(turn, records)
        self._append(records)
        if turn + 1 == self.config.turns or not self.live():
            self.store.finish(turn + 1)
        return path
