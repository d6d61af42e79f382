"""Waves: a step's trajectories in groups, so that one group's kernels are judged while another group generates.

A turn's evaluation needs the turn's responses, and a trajectory's next turn needs its last verdict: within one
trajectory nothing overlaps. Between trajectories it can. With W waves, wave k holds the trajectories whose index
is k modulo W (every task in every wave, so each wave asks for the same tasks' baselines and takes as long as the
others), and the generations run in one fixed order, turn by turn and wave by wave:

    generate w0 t0 | generate w1 t0      | generate w0 t1      | generate w1 t1      | ...
                   | judge w0 t0 .........| judge w1 t0 .........| judge w0 t1 .........| judge w1 t1

A wave's generation of turn t waits only for that wave's verdicts of turn t-1; while it waits or generates, the
other waves' kernels compile and run. The order of the generations never depends on which evaluation ends first,
so the policy's sampler is drawn in the same order on every run and every resume. One wave is the plain loop:
generate, judge, generate, judge.
"""

from __future__ import annotations

from typing import Callable, Protocol, TypeVar

__all__ = ["Waitable", "run_waves", "wave_slots"]

T = TypeVar("T", covariant=True)


class Waitable(Protocol[T]):
    """What a submitted evaluation returns: a ``concurrent.futures.Future`` or a Prefect future."""

    def result(self) -> T: ...


def wave_slots(trajectories: int, waves: int) -> list[list[int]]:
    """The trajectory indices of each wave: wave k holds every index i with i % waves == k."""
    if waves < 1 or trajectories < 1:
        raise ValueError(f"waves and trajectories must be positive, got {waves} and {trajectories}")
    if waves > trajectories:
        raise ValueError(f"{waves} waves need at least {waves} trajectories per task, got {trajectories}")
    return [list(range(k, trajectories, waves)) for k in range(waves)]


def run_waves(waves: int, turns: int, generate: Callable[[int, int], bool],
              judge: Callable[[int, int], Waitable[T]]) -> list[T]:
    """Run ``turns`` turns of ``waves`` waves: ``generate(wave, turn)`` in the caller's thread (False: the wave has
    no live trajectory left, it ends), ``judge(wave, turn)`` submitted to run beside the later generations. Returns
    every judgement's result in submission order. An evaluation that failed raises here, at the latest before
    the wave's next generation; the evaluations already submitted are waited for before it propagates, so none is
    left running against a run that is closing."""
    pending: dict[int, Waitable[T]] = {}
    submitted: list[Waitable[T]] = []
    ended: set[int] = set()
    try:
        for turn in range(turns):
            for wave in range(waves):
                if wave in ended:
                    continue
                if wave in pending:
                    pending.pop(wave).result()  # its verdicts are the context of this turn
                if not generate(wave, turn):
                    ended.add(wave)
                    continue
                pending[wave] = judge(wave, turn)
                submitted.append(pending[wave])
        return [future.result() for future in submitted]
    except BaseException:
        for future in pending.values():
            try:
                future.result()
            except BaseException:  # the first error is the one to report
                pass
        raise
