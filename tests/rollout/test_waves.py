"""Waves: which trajectories each wave holds, and the order run_waves generates and judges in (a wave's next turn
waits for its own verdicts only; the other waves' evaluations run meanwhile)."""

from __future__ import annotations

import threading
import time
from concurrent.futures import ThreadPoolExecutor

import pytest

from kevin.rollout.waves import run_waves, wave_slots


def test_wave_slots_are_strided_over_the_trajectories():
    assert wave_slots(5, 2) == [[0, 2, 4], [1, 3]]
    assert wave_slots(4, 1) == [[0, 1, 2, 3]]
    assert wave_slots(3, 3) == [[0], [1], [2]]
    with pytest.raises(ValueError, match="at least 3 trajectories"):
        wave_slots(2, 3)
    with pytest.raises(ValueError, match="positive"):
        wave_slots(4, 0)


class Recorder:
    """generate/judge callables that log events; judging runs in a thread pool."""

    def __init__(self, pool: ThreadPoolExecutor, judge_seconds: float = 0.0, ends: set[tuple[int, int]] = frozenset()):
        self.pool, self.judge_seconds, self.ends = pool, judge_seconds, ends
        self.events: list[tuple[str, int, int]] = []
        self.lock = threading.Lock()

    def log(self, *event) -> None:
        with self.lock:
            self.events.append(event)

    def generate(self, wave: int, turn: int) -> bool:
        self.log("generate", wave, turn)
        return (wave, turn) not in self.ends

    def judge(self, wave: int, turn: int):
        def work():
            time.sleep(self.judge_seconds)
            self.log("judged", wave, turn)
            return f"w{wave}t{turn}"

        return self.pool.submit(work)


def test_generations_keep_one_order_and_wait_only_for_their_own_wave():
    with ThreadPoolExecutor(4) as pool:
        rec = Recorder(pool, judge_seconds=0.05)
        results = run_waves(2, 3, rec.generate, rec.judge)
    gens = [(w, t) for kind, w, t in rec.events if kind == "generate"]
    assert gens == [(0, 0), (1, 0), (0, 1), (1, 1), (0, 2), (1, 2)]
    assert results == ["w0t0", "w1t0", "w0t1", "w1t1", "w0t2", "w1t2"]
    at = {event: i for i, event in enumerate(rec.events)}
    for wave in (0, 1):
        for turn in (1, 2):  # a turn is generated after the wave's previous verdicts, never before
            assert at[("judged", wave, turn - 1)] < at[("generate", wave, turn)]
    # Wave 1 generated turn 0 while wave 0's turn 0 was still being judged (judging takes 50 ms, generating nothing).
    assert at[("generate", 1, 0)] < at[("judged", 0, 0)]


def test_one_waves_generation_runs_while_the_other_wave_is_judged():
    """The overlap itself: wave 0's evaluation of turn 0 does not finish until wave 1 has generated turn 0."""
    wave1_generated = threading.Event()
    with ThreadPoolExecutor(2) as pool:
        def generate(wave, turn):
            if (wave, turn) == (1, 0):
                wave1_generated.set()
            return True

        def judge(wave, turn):
            def work():
                if (wave, turn) == (0, 0) and not wave1_generated.wait(timeout=10):
                    raise AssertionError("wave 1 was not generated while wave 0 was judged")
                return (wave, turn)
            return pool.submit(work)

        assert run_waves(2, 2, generate, judge) == [(0, 0), (1, 0), (0, 1), (1, 1)]


def test_one_wave_is_the_plain_loop():
    with ThreadPoolExecutor(2) as pool:
        rec = Recorder(pool, judge_seconds=0.01)
        run_waves(1, 3, rec.generate, rec.judge)
    assert rec.events == [("generate", 0, 0), ("judged", 0, 0), ("generate", 0, 1), ("judged", 0, 1),
                          ("generate", 0, 2), ("judged", 0, 2)]


def test_a_wave_without_live_trajectories_ends_and_the_others_go_on():
    with ThreadPoolExecutor(2) as pool:
        rec = Recorder(pool, ends={(1, 1)})
        results = run_waves(2, 3, rec.generate, rec.judge)
    gens = [(w, t) for kind, w, t in rec.events if kind == "generate"]
    assert gens == [(0, 0), (1, 0), (0, 1), (1, 1), (0, 2)]
    assert results == ["w0t0", "w1t0", "w0t1", "w0t2"]


def test_a_failed_evaluation_stops_the_waves_after_the_others_are_done():
    finished = threading.Event()
    with ThreadPoolExecutor(2) as pool:
        def generate(wave, turn):
            return True

        def judge(wave, turn):
            def work():
                if wave == 0:
                    raise RuntimeError("the evaluator died")
                time.sleep(0.1)
                finished.set()
            return pool.submit(work)

        with pytest.raises(RuntimeError, match="the evaluator died"):
            run_waves(2, 3, generate, judge)
        # The error surfaced before wave 0's next generation, and wave 1's evaluation had been waited for.
        assert finished.is_set()
