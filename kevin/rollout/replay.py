"""Stand-ins for a model that writes kernels: a policy that replays known responses, and the texts an in-process
tokenizer for these prompts learns from.

A randomly initialised model never writes a parseable kernel, so every reward and advantage would be 0 and an
update would train on nothing. ``ReplayPolicy`` gives the first trajectories of every task a known response
instead, e.g. the task's bundled reference solution (``replay_response``): the real evaluator judges that real
kernel, rewards and advantages are non-zero, and the trainer tokenizes the replayed text and computes its
log-probs itself, as for any backend that returns no token ids. The other trajectories sample from the wrapped
policy. The training-step benchmark is built on it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Sequence

from kevin.policy.protocol import Policy, PolicyWrapper
from kevin.records.generation import GenerationOut, Prompt
from kevin.rollout.prompts import Attempt, resolved_profile, turn_user_message
from kevin.tasks import bundled_solution_path, bundled_solutions_dir, bundled_tasks_dir
from kevin.tasks.task import Task

__all__ = ["REPLAY_SUMMARY", "ReferenceReplay", "ReplayPolicy", "longest_response_tokens", "reference_responses",
           "replay_references", "replay_response", "tokenizer_corpus"]

REPLAY_SUMMARY = "Replayed reference solution (benchmark oracle): the bundled kernel for this task, not a model sample."


def replay_response(source: str, summary: str = REPLAY_SUMMARY) -> str:
    """A response in the shape the prompt asks for: the solution in one ```python block, then a summary."""
    return f"```python\n{source.rstrip()}\n```\n\n{summary}"


def reference_responses(tasks: Sequence[Task], backend: str) -> dict[str, str]:
    """Each task's bundled reference solution as a replayable response (FileNotFoundError naming the tasks
    without one)."""
    missing = [t.task_id for t in tasks if not bundled_solution_path(t, backend).is_file()]
    if missing:
        raise FileNotFoundError(f"no bundled {backend} reference solution for {missing}")
    return {t.task_id: replay_response(bundled_solution_path(t, backend).read_text(encoding="utf-8")) for t in tasks}


def longest_response_tokens(tokenizer: Any, responses: dict[str, str]) -> int:
    """Tokens of the longest response as the trainer scores it: its text tokenized, plus the end-of-sequence
    token the trainer appends to a response that ended by choice (0 for no responses)."""
    eos = 1 if getattr(tokenizer, "eos_token_id", None) is not None else 0
    return max((len(tokenizer.encode(t, add_special_tokens=False)) + eos for t in responses.values()), default=0)


@dataclass
class ReplayPolicy(PolicyWrapper):
    """A ``Generate`` that answers the first ``replayed`` trajectories of each task with ``responses[task_id]``
    and samples the others from ``policy``.

    The rollout asks for every live trajectory of a turn in ONE call, task by task and, within a task, by
    trajectory index. With no early stopping every trajectory is live each turn, so prompt i belongs to task
    i // m, trajectory i % m. That order is checked on every call: each prompt must show its task's source.
    """

    policy: Any
    """The wrapped ``Generate`` for the trajectories that are not replayed."""
    tasks: Sequence[Task]
    trajectories: int
    replayed: int
    """Trajectories per task that replay (0 .. trajectories)."""
    responses: dict[str, str]
    """Task id -> the response to replay."""
    task_sources: dict[str, str]
    """Task id -> the task source as the prompts show it (the order check)."""
    calls: list[dict[str, float]] = field(default_factory=list)
    """Per call: prompts, sampled (given to ``policy``), tokens (the sampled responses' token ids)."""

    def __post_init__(self) -> None:
        if not 0 <= self.replayed <= self.trajectories:
            raise ValueError(f"replayed must be in [0, {self.trajectories}], got {self.replayed}")
        missing = [t.task_id for t in self.tasks if t.task_id not in self.task_sources
                   or (self.replayed and t.task_id not in self.responses)]
        if missing:
            raise ValueError(f"no replay response or task source for {missing}")

    @property
    def max_response_tokens(self) -> int:
        """The longest response this policy gives: the wrapped policy's limit, or a longer replayed response."""
        longest = longest_response_tokens(self.tokenizer, self.responses) if self.replayed else 0
        return max(self.policy.max_response_tokens, longest)

    def __call__(self, prompts: Sequence[Prompt | str]) -> list[GenerationOut]:
        expected = len(self.tasks) * self.trajectories
        if len(prompts) != expected:
            raise RuntimeError(f"expected {expected} prompts (every trajectory live: no early stopping), got "
                               f"{len(prompts)}; the replay cannot tell which prompt is which trajectory")
        outs: list[GenerationOut | None] = [None] * len(prompts)
        sampled: list[int] = []
        for i, prompt in enumerate(prompts):
            task = self.tasks[i // self.trajectories]
            text = prompt.text if isinstance(prompt, Prompt) else prompt
            if self.task_sources[task.task_id] not in text:
                raise RuntimeError(f"prompt {i} does not hold the source of {task.task_id}: the rollout's prompt order "
                                   "changed; fix ReplayPolicy's position mapping")
            if i % self.trajectories < self.replayed:
                outs[i] = GenerationOut(text=self.responses[task.task_id])  # no ids: the trainer tokenizes
            else:
                sampled.append(i)
        tokens = 0
        if sampled:
            for i, out in zip(sampled, self.policy([prompts[i] for i in sampled])):
                outs[i] = out
                tokens += len(out.token_ids)
        self.calls.append({"prompts": float(len(prompts)), "sampled": float(len(sampled)), "tokens": float(tokens)})
        return [o for o in outs if o is not None]


class ReferenceReplay(PolicyWrapper):
    """``ReplayPolicy`` for a training run, whose batch of tasks changes every step: the first ``replayed`` of each
    task's ``trajectories`` answer with the task's bundled reference solution, the others sample from ``policy``.

    A prompt's task is the one whose source it shows (``tasks`` are every task a batch may hold); its trajectory is
    the one the rollout names on the prompt (``slots``), so a call may hold any of the trajectories (one wave of a
    step, one process's share).
    """

    def __init__(self, policy: Policy, tasks: Sequence[Task], trajectories: int, replayed: int, backend: str,
                 profile: str = ""):
        if not 0 <= replayed <= trajectories:
            raise ValueError(f"replayed must be in [0, {trajectories}], got {replayed}")
        self.policy = policy
        self.trajectories, self.replayed, self.backend = trajectories, replayed, backend
        shown = resolved_profile(backend, profile)
        self.sources = {t.task_id: t.render(shown) for t in tasks}
        self.tasks = {t.task_id: t for t in tasks}
        self._responses: dict[str, str] = {}
        self._longest: int | None = None
        self.calls: list[dict[str, float]] = []
        """Per call: prompts, sampled (given to ``policy``)."""

    # The rest of the policy's surface, for the run's checkpoints.
    @property
    def max_response_tokens(self) -> int:
        """The wrapped policy's limit, or a longer replayed response."""
        if self._longest is None:  # tokenizing every reference once is enough: they do not change
            self._longest = longest_response_tokens(self.tokenizer, self._all_responses()) if self.replayed else 0
        return max(self.policy.max_response_tokens, self._longest)

    def state_dict(self) -> dict[str, Any]:
        return self.policy.state_dict()

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.policy.load_state_dict(state)

    def close(self) -> None:
        self.policy.close()

    def _all_responses(self) -> dict[str, str]:
        return {tid: self._response(tid) for tid in self.tasks}

    def _response(self, task_id: str) -> str:
        if task_id not in self._responses:
            self._responses.update(reference_responses([self.tasks[task_id]], self.backend))
        return self._responses[task_id]

    def task_of(self, text: str) -> str:
        """The id of the task whose source the prompt shows (RuntimeError when none, or several, do)."""
        found = [tid for tid, source in self.sources.items() if source in text]
        if len(found) != 1:
            raise RuntimeError(f"the prompt shows {'no' if not found else 'several'} known task source(s) {found}; "
                               "ReferenceReplay needs the run's training tasks")
        return found[0]

    def slots(self, prompts: Sequence[Prompt | str]) -> list[tuple[str, int]]:
        """(task id, trajectory index) of each prompt. The rollout names them on each ``Prompt``; without names
        (plain texts), every trajectory must be live and each task's m trajectories come one after another, so
        prompt i is trajectory i % m (checked). The task is always read off the source the prompt shows."""
        ids = [self.task_of(p.text if isinstance(p, Prompt) else p) for p in prompts]
        named = [p.trajectory if isinstance(p, Prompt) else None for p in prompts]
        if all(j is not None for j in named):
            wrong = [(p.task_id, tid) for p, tid in zip(prompts, ids) if isinstance(p, Prompt) and p.task_id
                     and p.task_id != tid]
            if wrong:
                raise RuntimeError(f"prompts name tasks that are not the ones they show: {wrong[:3]}")
            return [(tid, int(j)) for tid, j in zip(ids, named)]  # type: ignore[arg-type]
        m = self.trajectories
        if len(prompts) % m:
            raise RuntimeError(f"{len(prompts)} prompts is not a multiple of {m} trajectories: some trajectory "
                               "stopped early, and the replay cannot tell which prompt is which trajectory")
        if any(ids[i] != ids[i - i % m] for i in range(len(ids))):
            raise RuntimeError("the prompts do not come in groups of one task's trajectories; the replay cannot "
                               "tell which prompt is which trajectory")
        return [(ids[i], i % m) for i in range(len(prompts))]

    def __call__(self, prompts: Sequence[Prompt | str]) -> list[GenerationOut]:
        slots = self.slots(prompts)
        outs: list[GenerationOut | None] = [None] * len(prompts)
        sampled = [i for i, (_, j) in enumerate(slots) if j >= self.replayed]
        for i, (task_id, j) in enumerate(slots):
            if j < self.replayed:
                outs[i] = GenerationOut(text=self._response(task_id))  # no ids: the trainer tokenizes it
        # Called even with nothing to sample: a policy sharded over processes (ZeRO-3) takes part in the others'
        # forward passes in every call.
        for i, out in zip(sampled, self.policy([prompts[i] for i in sampled])):
            outs[i] = out
        self.calls.append({"prompts": float(len(prompts)), "sampled": float(len(sampled))})
        return [o for o in outs if o is not None]


def replay_references(policy: Policy, run: Any, tasks: Sequence[Task]) -> ReferenceReplay:
    """A ``policy.wrap`` for training runs (``policy.wrap: kevin.rollout.replay:replay_references``): half of each
    task's trajectories (rounded up) replay the bundled reference solution, so even a model that writes no kernel
    yet gets rewards and advantages to learn from. Used by the GPU training-step script and the tests; a real
    experiment leaves ``policy.wrap`` empty. ``run`` is the run's ``RunConfig``."""
    m = run.rollout.trajectories
    return ReferenceReplay(policy, tasks, m, (m + 1) // 2, run.rollout.backend, run.rollout.profile)


def tokenizer_corpus(tasks: Sequence[Task], backend: str, profile: str = "") -> list[str]:
    """Texts an in-process tokenizer learns from: every bundled task and reference solution, and the prompts
    (a first turn and a later turn) of ``tasks``, so the prompts' own wording gets merged tokens too."""
    solutions_root = bundled_solutions_dir(backend).parent
    files = sorted(bundled_tasks_dir().rglob("*.py")) + sorted(solutions_root.rglob("*.py"))
    texts = [f.read_text(encoding="utf-8") for f in files]
    prof = resolved_profile(backend, profile)
    for task in tasks:
        source = task.render(prof)
        texts.append(turn_user_message(source, backend, []))
        later = Attempt(turn=0, kernel=source, summary="A summary.", feedback="Correct; 1.0x the reference.")
        texts.append(turn_user_message(source, backend, [later]))
    return texts
