"""Rollout records: one Turn per (task, trajectory, turn), Trajectories of turns, TrainingSamples.

A Turn holds its verdict as a typed ``EvalResult``; records become plain JSON only at the file boundary
(``to_dict`` / ``from_dict``, JSONL through ``save_records`` / ``load_records``), so a rollout batch is a
file any stage (the trainer, the monitors, the analysis notebooks) can read without this package.
``TrainingSample`` is the trainer's input: the training layer imports it from here, never from the rollout.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable, TypeVar

from kevin.records.evaluation import EvalResult, Status
from kevin.records.jsonl import read_jsonl, write_jsonl


def _from_dict(cls: type, data: dict[str, Any], what: str) -> Any:
    """Build a dataclass from a dict: unknown keys are ignored (newer writers), missing ones are an error."""
    if not isinstance(data, dict):
        raise ValueError(f"{what}: expected a JSON object, got {type(data).__name__}")
    fields = {f.name: f for f in dataclasses.fields(cls)}
    required = [
        name for name, f in fields.items()
        if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING
    ]
    missing = [name for name in required if name not in data]
    if missing:
        raise ValueError(f"{what}: missing fields {missing} (is this a {cls.__name__} record?)")
    return cls(**{k: v for k, v in data.items() if k in fields})


@dataclass
class Turn:
    """One response of the policy and its verdict: the unit the trainer turns into one sample."""

    task_id: str
    trajectory: int
    """Index of the trajectory within its task (0 .. m-1)."""
    turn: int
    """0-based turn number within the trajectory."""
    result: EvalResult
    """The kernel's verdict (a parse-error verdict built without evaluation when nothing could be parsed)."""
    prompt: str = ""
    """The prompt rendered here: the chat template applied when a tokenizer was given, else the plain message
    text. It is what was sampled unless ``server_template`` (then the server's ``prompt_token_ids`` are)."""
    prompt_messages: list[dict[str, str]] = field(default_factory=list)
    """The chat messages the prompt was rendered from."""
    response: str = ""
    """The raw text the policy produced."""
    reasoning: str = ""
    kernel: str = ""
    """The parsed solution source (empty on a parse error)."""
    summary: str = ""
    parse_error: bool = False
    prompt_tokens: int = 0
    response_tokens: int = 0
    truncated: bool = False
    """The response hit the generation length limit."""
    attempts_in_context: int = 0
    """How many earlier attempts the prompt showed."""
    attempts_dropped: int = 0
    """How many earlier attempts were left out to fit the prompt token budget (oldest first)."""
    prompt_token_ids: list[int] = field(default_factory=list)
    response_token_ids: list[int] = field(default_factory=list)
    logprobs: list[float] | None = None
    """Per-token logprobs of the sampled response tokens under the generating policy (None if the backend gave none)."""
    server_template: bool = False
    """The server applied its own chat template to ``prompt_messages`` (an OpenAI chat endpoint): ``prompt`` is
    then not known to be what was sampled; the trainer uses the server's ``prompt_token_ids`` or refuses."""
    reasoning_opened_by_prompt: bool = False
    """The prompt ended inside an open ``<think>`` block (the chat template opened it): the response starts
    in its reasoning and must close it before any code counts."""

    @property
    def status(self) -> Status:
        return self.result.status

    @property
    def score(self) -> float:
        return float(self.result.score)

    @property
    def correct(self) -> bool:
        return bool(self.result.correct)

    @property
    def speedup(self) -> float:
        return float(self.result.speedup)

    @property
    def feedback(self) -> str:
        return self.result.feedback

    def training_sample(self, reward: float, advantage: float) -> "TrainingSample":
        """This turn as a training sample (prompt = its context, completion = its response)."""
        return TrainingSample(
            prompt_token_ids=list(self.prompt_token_ids),
            completion_token_ids=list(self.response_token_ids),
            old_logprobs=list(self.logprobs) if self.logprobs is not None else None,
            reward=reward,
            advantage=advantage,
            task_id=self.task_id,
            trajectory=self.trajectory,
            turn=self.turn,
        )

    def to_dict(self) -> dict[str, Any]:
        data = dataclasses.asdict(self)
        data["result"] = self.result.to_dict()  # the status as its value, as in every verdict file
        return data

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "Turn":
        data = dict(data) if isinstance(data, dict) else data
        if isinstance(data, dict) and isinstance(data.get("result"), dict):
            try:  # a corrupt verdict fails here, at load time, not deep in training
                data["result"] = EvalResult.from_dict(data["result"])
            except (KeyError, ValueError, TypeError) as exc:
                raise ValueError(f"Turn: its verdict is not an EvalResult ({exc})") from exc
        turn = _from_dict(cls, data, "Turn")
        if not isinstance(turn.result, EvalResult):
            raise ValueError(f"Turn: result must be an EvalResult or its dict, got {type(turn.result).__name__}")
        return turn


@dataclass
class Trajectory:
    """The turns of one trajectory of one task, in order."""

    task_id: str
    index: int
    turns: list[Turn] = field(default_factory=list)
    stop_reason: str = ""
    """Why the trajectory ended before the last turn ("" when it ran every turn)."""

    @property
    def stopped(self) -> bool:
        return bool(self.stop_reason)

    @property
    def correct(self) -> bool:
        """A trajectory is correct if any of its kernels is (docs/recipe.md §8)."""
        return any(t.correct for t in self.turns)

    @property
    def best_speedup(self) -> float:
        """Speedup of the fastest correct kernel, 0 if none."""
        return max((t.speedup for t in self.turns if t.correct), default=0.0)

    @property
    def best_score(self) -> float:
        return max((t.score for t in self.turns), default=0.0)

    def to_dict(self) -> dict[str, Any]:
        return {"task_id": self.task_id, "index": self.index, "stop_reason": self.stop_reason,
                "turns": [t.to_dict() for t in self.turns]}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "Trajectory":
        traj = _from_dict(cls, data, "Trajectory")
        traj.turns = [t if isinstance(t, Turn) else Turn.from_dict(t) for t in traj.turns]
        return traj


@dataclass
class TrainingSample:
    """One per-turn sample for the update: token ids, the behaviour policy's logprobs, reward, advantage."""

    prompt_token_ids: list[int]
    completion_token_ids: list[int]
    old_logprobs: list[float] | None
    """Logprobs of the completion tokens when sampled; None means the trainer recomputes them."""
    reward: float
    """The turn's return (e.g. discounted sum of its own and later turns' scores)."""
    advantage: float
    task_id: str
    trajectory: int
    turn: int

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "TrainingSample":
        return _from_dict(cls, data, "TrainingSample")


def group_trajectories(turns: Iterable[Turn]) -> list[Trajectory]:
    """Group turns into trajectories, ordered by first appearance of the task, then trajectory index."""
    groups: dict[tuple[str, int], Trajectory] = {}
    task_order: dict[str, int] = {}
    for turn in turns:
        task_order.setdefault(turn.task_id, len(task_order))
        key = (turn.task_id, turn.trajectory)
        groups.setdefault(key, Trajectory(task_id=turn.task_id, index=turn.trajectory)).turns.append(turn)
    for traj in groups.values():
        traj.turns.sort(key=lambda t: t.turn)
    return sorted(groups.values(), key=lambda tr: (task_order[tr.task_id], tr.index))


# ------------------------------------------------------------------------------------- JSONL I/O

R = TypeVar("R", Turn, Trajectory, TrainingSample)


def save_records(path: str | Path, records: Iterable[Turn | Trajectory | TrainingSample]) -> Path:
    """Save a rollout batch (Turns, Trajectories or TrainingSamples) as JSONL, atomically."""
    return write_jsonl(path, (r.to_dict() for r in records))


def load_records(path: str | Path, cls: type[R]) -> list[R]:
    """Load records of type ``cls`` saved by ``save_records``."""
    out = []
    for i, row in enumerate(read_jsonl(path), 1):
        try:
            out.append(cls.from_dict(row))
        except (TypeError, ValueError) as exc:
            raise ValueError(f"{path}: record {i}: {exc}") from exc
    return out


def save_turns(path: str | Path, turns: Iterable[Turn]) -> Path:
    return save_records(path, turns)


def load_turns(path: str | Path) -> list[Turn]:
    return load_records(path, Turn)
