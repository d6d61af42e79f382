"""One training step over several processes (one per GPU): rollout split by trajectory, verdicts gathered per
turn, then the data-parallel or ZeRO-3 update and a checkpoint.

    tasks        = rank 0 draws the step's tasks, every process receives them        broadcast_object
    for each turn:
        prompts  = every process builds the prompts of ITS trajectories               shard(range(m), rank, N)
        outputs  = generate(its prompts)              ZeRO-3: all processes in lockstep (HFPolicy)
        verdicts = evaluate(its parsed kernels)       on its own GPU (one evaluator per process)
        turns    = all_gather(its Turn records)       every process now holds the whole turn, so turn t+1's
                                                      prompts carry turn t's feedback and the stop rule
                                                      sees every verdict
    samples      = build_samples(every trajectory)    the same list, turn returns and per-task advantages on
                                                      every process (no collective: same inputs, same maths)
    update       = trainer.update(samples)            each process backpropagates its strided share; the
                                                      gradients are summed (or reduced into ZeRO-3 partitions)
    checkpoint   = trainer.save_checkpoint(...)       rank 0 writes (ZeRO-3: every process its partitions)

Process r rolls out trajectories ``r, r + N, ...`` of EVERY task, so each process judges a mix of tasks and
the m x n group a task's advantage is normalised over is complete only after the gather, on every process.
The prompts, outputs and verdicts of a turn are the turn stages' (``kevin.rollout.stages.TurnStages``, the one
turn engine), run by each process over its own trajectories in a scratch folder; this module adds the
collectives around them.

Every process must call ``generate`` once per turn, with an empty list when it has no live trajectory: a
ZeRO-3 policy gathers its parameters from all processes at every forward pass (``kevin.policy.hf``).
The number of turns is agreed too (``max_over_processes``), so a process whose trajectories all stopped
early keeps taking part until the last live one anywhere is done.
"""

from __future__ import annotations

import logging
import tempfile
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from kevin.distributed import max_over_processes, shard, world
from kevin.records.evaluation import Candidate, EvalResult
from kevin.records.generation import GenerationOut, Prompt
from kevin.records.rollout import TrainingSample, Trajectory, Turn
from kevin.rewards import RewardConfig
from kevin.rollout.config import RolloutConfig
from kevin.rollout.loop import Evaluate, Generate, update_stop
from kevin.rollout.stages import TurnStages
from kevin.tasks.task import Task
from kevin.training.step import build_samples, check_policy, grpo_update, rollout_metrics

log = logging.getLogger(__name__)

__all__ = ["DistributedStep", "DistributedStepResult", "all_gather_objects", "broadcast_object", "phase_table",
           "trajectory_share"]


def broadcast_object(obj: Any, src: int = 0) -> Any:
    """``obj`` of process ``src`` on every process (``obj`` itself without a process group)."""
    import torch.distributed as dist

    if world()[1] == 1:
        return obj
    box = [obj]
    dist.broadcast_object_list(box, src=src, device=_object_device())
    return box[0]


def all_gather_objects(obj: Any) -> list[Any]:
    """Every process's ``obj``, in rank order (``[obj]`` without a process group)."""
    import torch.distributed as dist

    size = world()[1]
    if size == 1:
        return [obj]
    out: list[Any] = [None] * size
    dist.all_gather_object(out, obj)
    return out


def _object_device() -> torch.device | None:
    # NCCL moves pickled objects through a CUDA tensor on the current device; gloo through the CPU.
    import torch.distributed as dist

    return torch.device("cuda", torch.cuda.current_device()) if dist.get_backend() == "nccl" else None


def trajectory_share(trajectories: int, rank: int, size: int) -> list[int]:
    """The trajectory indices (of every task) that process ``rank`` of ``size`` rolls out."""
    return shard(range(trajectories), rank, size)


@dataclass
class DistributedStepResult:
    """What one multi-process step produced, the same on every process except ``seconds`` and ``local``."""

    tasks: list[str]
    trajectories: list[Trajectory]
    samples: list[TrainingSample]
    update_metrics: list[dict[str, float]] = field(default_factory=list)
    rollout_metrics: dict[str, float] = field(default_factory=dict)
    seconds: dict[str, float] = field(default_factory=dict)
    """This process's seconds per phase: ``generate/T``, ``evaluate/T``, ``gather/T``, ``aggregate``, ``update``,
    ``checkpoint``, ``step`` (the whole step)."""
    local: dict[str, float] = field(default_factory=dict)
    """This process's own counts: ``prompts`` (generated here), ``generated_tokens`` (token ids the policy
    returned here), ``judged`` (candidates this process's evaluator judged)."""
    intervals: list[tuple[str, float, float]] = field(default_factory=list)
    """(phase key, start, end) on ``time.perf_counter``'s clock, for lining up samples of GPU use with phases."""
    checkpoint: Path | None = None


class DistributedStep:
    """The step's live parts: the trainer (data-parallel or ZeRO-3 over the process group), the policy that
    samples from its model, this process's evaluator, and the rollout and reward settings.

    ``generate`` and ``evaluate`` are this process's: the policy (every process calls it every turn) and a batch
    evaluator on this process's GPU. ``tokenizer`` (default ``generate.tokenizer``) renders prompts and
    tokenizes responses that came without token ids (e.g. a replayed reference)."""

    def __init__(self, trainer: Any, generate: Generate, evaluate: Evaluate, rollout: RolloutConfig,
                 rewards: RewardConfig, *, tokenizer: Any | None = None, sync_cuda: bool | None = None):
        self.trainer = trainer
        self.generate = generate
        self.evaluate = evaluate
        self.rollout = rollout
        self.rewards = rewards
        self.tokenizer = tokenizer if tokenizer is not None else getattr(generate, "tokenizer", None)
        self.rank, self.size = world()
        self._intervals: list[tuple[str, float, float]] = []
        # Phase times on a GPU are only true once its queued work is done.
        self.sync_cuda = torch.cuda.is_available() if sync_cuda is None else sync_cuda
        check_policy(generate, trainer)

    @contextmanager
    def _timed(self, seconds: dict[str, float], key: str) -> Iterator[None]:
        start = time.perf_counter()
        yield
        if self.sync_cuda:
            torch.cuda.synchronize()
        end = time.perf_counter()
        seconds[key] = seconds.get(key, 0.0) + end - start
        self._intervals.append((key, start, end))

    def run(self, tasks: Sequence[Task] | None, *, checkpoint_dir: str | Path | None = None, step: int = 0,
            extra: dict[str, Any] | None = None) -> DistributedStepResult:
        """One step. ``tasks``: rank 0's draw (the others may pass None; rank 0's list is used everywhere).
        ``checkpoint_dir``: save ``step`` there after the update (every process must pass it)."""
        start = time.perf_counter()
        seconds: dict[str, float] = {}
        self._intervals: list[tuple[str, float, float]] = []
        by_id = broadcast_object({t.task_id: t for t in tasks} if self.rank == 0 and tasks is not None else None)
        if by_id is None:
            raise ValueError("rank 0 must pass the step's tasks")
        batch = list(by_id.values())
        trajectories = self.rollout_all(batch, seconds, local := {"prompts": 0.0, "generated_tokens": 0.0,
                                                                  "judged": 0.0})
        with self._timed(seconds, "aggregate"):
            samples = build_samples(trajectories, self.rewards, self.tokenizer, self.trainer.config.response_limit)
        with self._timed(seconds, "update"):
            metrics = grpo_update(self.trainer, samples)
        path = None
        if checkpoint_dir is not None:
            with self._timed(seconds, "checkpoint"):
                path = self.trainer.save_checkpoint(checkpoint_dir, step, extra=extra)
        seconds["step"] = time.perf_counter() - start
        return DistributedStepResult(tasks=list(by_id), trajectories=trajectories, samples=samples,
                                     update_metrics=metrics, rollout_metrics=rollout_metrics(trajectories),
                                     seconds=seconds, local=local, intervals=self._intervals, checkpoint=path)

    def rollout_all(self, tasks: list[Task], seconds: dict[str, float], local: dict[str, float]) -> list[Trajectory]:
        """Every trajectory of every task, each turn rolled out by the process that owns the trajectory and
        gathered to all: the same list (task order, then trajectory index) on every process.

        A driver over the turn stages (``kevin.rollout.stages.TurnStages``), the engine every other rollout runs:
        this process's stages hold only its share of every task's trajectories, in a scratch folder of its own
        (removed after the step), and write the same records the single-process loop would."""
        m = self.rollout.trajectories
        every = {(t.task_id, j): Trajectory(task_id=t.task_id, index=j) for t in tasks for j in range(m)}
        share = trajectory_share(m, self.rank, self.size)
        with tempfile.TemporaryDirectory(prefix=f"kevin-dp-rank{self.rank}-") as scratch:
            # A process that owns no trajectory (more processes than trajectories) holds no stages; it still
            # enters every collective below.
            stages = (TurnStages(scratch, tasks, self.rollout, tokenizer=self.tokenizer, trajectory_indices=share)
                      if share else None)
            for turn in range(self.rollout.turns):
                live = stages is not None and bool(stages.live())
                if max_over_processes(int(live)) == 0:
                    break
                records = self._turn(stages if live else None, turn, seconds, local)
                with self._timed(seconds, f"gather/{turn}"):
                    gathered: list[list[Turn]] = all_gather_objects(records)
                for record in (r for part in gathered for r in part):
                    every[(record.task_id, record.trajectory)].turns.append(record)
                for traj in every.values():
                    update_stop(traj, self.rollout)
        return list(every.values())

    def _turn(self, stages: TurnStages | None, turn: int, seconds: dict[str, float],
              local: dict[str, float]) -> list[Turn]:
        """This process's part of ``turn``: its live trajectories generated, parsed and judged through the stages
        (``stages`` None: none live here); returns their Turn records."""

        def generate(prompts: list[Prompt]) -> list[GenerationOut]:
            with self._timed(seconds, f"generate/{turn}"):  # the policy call alone, as the phase table means it
                return list(self.generate(prompts))

        def judge(items: list[tuple[Task, Candidate]], progress: Any = None) -> list[EvalResult]:
            return self.evaluate(items)  # a plain Evaluate reports no progress: the stage records its verdicts after

        if stages is None:
            generate([])  # lockstep: a ZeRO-3 policy's forward passes need every process, with prompts or not
            with self._timed(seconds, f"evaluate/{turn}"):
                pass  # nothing to judge; the key is kept so that every process reports the same phases
            return []
        stages.generate(turn, generate)
        stages.parse(turn)
        with self._timed(seconds, f"evaluate/{turn}"):
            stages.evaluate(turn, judge)
        records = [t for traj in stages.trajectories() for t in traj.turns if t.turn == turn]
        local["prompts"] += len(records)
        local["generated_tokens"] += sum(len(r.response_token_ids) for r in records)
        local["judged"] += sum(not r.parse_error for r in records)
        return records


def phase_table(per_rank: Sequence[dict[str, float]]) -> list[tuple[str, list[float]]]:
    """Phases summed over turns (``generate/0`` + ``generate/1`` -> ``generate``), as rows of seconds per process,
    in the step's order."""
    order = ["generate", "evaluate", "gather", "aggregate", "update", "checkpoint", "step"]
    rows = []
    for phase in order:
        values = [sum(v for k, v in seconds.items() if k.split("/")[0] == phase) for seconds in per_rank]
        if any(phase == k.split("/")[0] for seconds in per_rank for k in seconds):
            rows.append((phase, values))
    return rows

