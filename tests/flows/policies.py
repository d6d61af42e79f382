"""Policy wraps for the flow tests (``policy.wrap: tests.flows.policies:<name>``), importable by a `kevin train`
subprocess that has the repository on its path."""

from __future__ import annotations

from typing import Any, Sequence

from kevin.records.generation import GenerationOut, Prompt
from kevin.rollout.replay import ReferenceReplay
from kevin.tasks.task import Task

GIVE_UP = "I have nothing better to try; no code this time."


class FirstTurnReplay(ReferenceReplay):
    """The bundled reference solution in turn 0 of the replayed trajectories, an answer without code in their later
    turns. Each task's group of returns is then [S, 0, 0, ...] (one correct kernel), so its advantages do not depend
    on the kernel's measured speedup (normalising a group scales S away): two runs that time the kernel differently
    still compute the same update, which lets a test compare a resumed run with an uninterrupted one."""

    def __call__(self, prompts: Sequence[Prompt | str]) -> list[GenerationOut]:
        outs = super().__call__(prompts)
        for i, (prompt, (_, trajectory)) in enumerate(zip(prompts, self.slots(prompts))):
            text = prompt.text if isinstance(prompt, Prompt) else prompt
            if trajectory < self.replayed and "## Your previous attempts" in text:
                outs[i] = GenerationOut(text=GIVE_UP)
        return outs


def replay_first_turn(policy: Any, run: Any, tasks: Sequence[Task]) -> FirstTurnReplay:
    m = run.rollout.trajectories
    return FirstTurnReplay(policy, tasks, m, (m + 1) // 2, run.rollout.backend, run.rollout.profile)
