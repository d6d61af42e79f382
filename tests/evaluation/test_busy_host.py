"""The evaluator inside a busy Python process: a training run generates the next wave in the same process while the
evaluator times the last wave's kernels. Every timing mark passes through Python threads of that process, so a
busy thread there used to hold each mark up to Python's 5 ms switch interval, which the evaluator's clock counted
against the call: honest kernels were flagged ``timing_mismatch`` (3 of 8 warm-start kernels on 2 cores with two
busy threads; 16 times in two runs on the H200). ``EvalConfig.switch_interval_s`` keeps the waits short."""

from __future__ import annotations

import sys
import threading
from pathlib import Path

import pytest

from kevin.evaluation import Candidate, Evaluator
from kevin.evaluation.config import EvalConfig
from kevin.tasks.loader import find_task, load_tasks

ROOT = Path(__file__).resolve().parents[2]


def test_the_switch_interval_holds_while_the_judges_run_and_is_given_back(tmp_path):
    before = sys.getswitchinterval()
    assert before > 0.0002  # Python's default is 0.005
    ev = Evaluator(EvalConfig(backend="cpu", cache_dir=str(tmp_path)))
    assert sys.getswitchinterval() == before  # nothing changes before a judge starts
    ev.judge("cpu")
    assert sys.getswitchinterval() == pytest.approx(0.0002, abs=1e-7)  # Python keeps whole microseconds
    ev.close()
    assert sys.getswitchinterval() == before
    ev = Evaluator(EvalConfig(backend="cpu", cache_dir=str(tmp_path), switch_interval_s=0.0))
    ev.judge("cpu")
    assert sys.getswitchinterval() == before  # 0: left alone
    ev.close()
    with pytest.raises(ValueError, match="switch_interval_s"):
        EvalConfig(switch_interval_s=-1.0)


def test_honest_kernels_stay_correct_while_the_evaluators_process_is_busy(fresh_cache):
    """Two threads spin in pure Python (as a generation loop does between its CUDA calls) while four honest
    kernels are judged. Without the shorter switch interval about 3 in 8 failed, so this fails with probability
    about 0.85 when the guard is lost. The kernels are compiled before the threads spin: what is under test is the
    timed run, and compiling beside two spinning threads on 2 cores took two minutes."""
    tasks = load_tasks("bundled")
    names = ("level1/02_gelu", "level1/03_sigmoid", "level1/04_leaky_relu", "level1/05_softplus")
    sources = {name: (ROOT / "data" / "warmstart" / "cpu" / f"{name}.py").read_text() for name in names}
    stop = threading.Event()

    def spin() -> None:
        x = 0
        while not stop.is_set():
            x += 1

    spinners = [threading.Thread(target=spin, daemon=True) for _ in range(2)]
    verdicts = []
    with Evaluator(EvalConfig(backend="cpu", cache_dir=str(fresh_cache), timing_trials=10)) as ev:
        for name, source in sources.items():
            built = ev.compile(Candidate(find_task(tasks, name).task_id, source))
            assert built.failure is None, built.failure
        for thread in spinners:
            thread.start()
        try:
            for name, source in sources.items():
                verdicts.append(ev.evaluate(find_task(tasks, name), source))
        finally:
            stop.set()
    assert [(v.status.value, v.rule_id) for v in verdicts] == [("correct", "")] * 4, [v.error for v in verdicts]


def test_a_kernel_timed_under_more_load_than_its_calibration_is_judged_again_in_a_fresh_process(fresh_cache, monkeypatch):
    """The load on the machine when a job calibrated need not be its load when the kernel is timed: on a 2-core CI
    machine a neighbour's work began in between and two honest kernels were flagged, every one of their calls 3.5 ms
    longer by the evaluator's clock than the calibration allowed. Here the first process's calibration is understated
    by 5 ms (as if the machine had been quieter then): its timed loops disagree and it is flagged; the evaluator then
    judges the kernel in a fresh process, calibrated before the candidate's code loads, and it is correct."""
    from kevin.evaluation import runs
    from kevin.evaluation.verdict import Overhead

    calibrations = []

    def measured(evidence):
        overhead = runs_measure(evidence)
        calibrations.append(overhead.window_ms)
        return Overhead(overhead.window_ms - 5.0, overhead.typical_ms - 5.0) if len(calibrations) == 1 else overhead

    runs_measure = runs.measure_overhead
    monkeypatch.setattr(runs, "measure_overhead", measured)
    task = find_task(load_tasks("bundled"), "level1/02_gelu")
    source = (ROOT / "data" / "warmstart" / "cpu" / "level1/02_gelu.py").read_text()
    with Evaluator(EvalConfig(backend="cpu", cache_dir=str(fresh_cache), timing_trials=10)) as ev:
        verdict = ev.evaluate(task, source)
    assert (verdict.status.value, verdict.rule_id) == ("correct", ""), verdict.error
    assert len(calibrations) == 2  # one per process
    again = [w for w in verdict.warnings if w.startswith("judged again in a fresh process")]
    assert len(again) == 1 and "timing does not match the evaluator's clock" in again[0], verdict.warnings
