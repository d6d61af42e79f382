"""Identical candidates judged once per evaluator (EvalConfig.reuse_verdicts): the memo's rules by hand, then real
batches on the cpu backend, counting the run processes that judged them."""

from __future__ import annotations

from dataclasses import replace
from types import SimpleNamespace

import pytest

from kevin.evaluation import Candidate, EvalConfig, Evaluator, Status
from kevin.evaluation.cluster_plan import lost_verdict
from kevin.evaluation.compile_cache import Compiled
from kevin.evaluation.judge import JudgeError
from kevin.evaluation.runs import reported_failure
from kevin.evaluation.verdict import Failure, RunFacts, assemble
from kevin.evaluation.verdict_memo import Pending, VerdictMemo, reusable, reused, verdict_key
from kevin.records.evaluation import EvalResult, Fault, PhaseTimes, TimingFigures
from tests.conftest import RELU_BODY, cpp_solution


def _verdict(status=Status.CORRECT, **kw) -> EvalResult:
    return EvalResult(task_id="t", candidate_id="a", status=status, correct=status is Status.CORRECT, score=1.3,
                      speedup=1.0, warnings=["w"], times=PhaseTimes(compile=2.0, timing=0.5, total=3.0), **kw)


def test_what_is_reused_and_what_is_judged_again():
    for status in (Status.CORRECT, Status.INCORRECT, Status.COMPILE_ERROR, Status.RUNTIME_ERROR, Status.RULE_VIOLATION):
        assert reusable(_verdict(status))
    assert not reusable(_verdict(Status.TIMEOUT))  # the machine's moment as much as the candidate
    assert not reusable(_verdict(Status.RULE_VIOLATION, rule_id="timing_mismatch"))  # the load can raise it
    assert reusable(_verdict(Status.RULE_VIOLATION, rule_id="cuda_not_used"))
    assert not reusable(_verdict(Status.RUNTIME_ERROR, error="evaluator: worker w0 returned no verdict",
                                 fault=Fault.EVALUATOR))
    assert not reusable(_verdict(Status.RUNTIME_ERROR, error="the task could not be evaluated: task: the reference raised",
                                 fault=Fault.TASK))
    assert reusable(_verdict(Status.RUNTIME_ERROR, error="killed by signal SIGSEGV"))
    # Whose failure it is comes from the field, never the text: a candidate's crash may print anything.
    assert reusable(_verdict(Status.RUNTIME_ERROR, error="task: evaluator: printed by the candidate"))


def test_a_reused_verdict_is_the_repeats_own_and_costs_nothing():
    first = _verdict()
    copy = reused(first, Candidate("t", "src", candidate_id="b"))
    assert copy.candidate_id == "b" and copy.reused and copy.times == PhaseTimes()
    assert (copy.status, copy.score, copy.speedup, copy.warnings) == (first.status, 1.3, 1.0, ["w"])
    copy.warnings.append("x")
    assert first.warnings == ["w"] and first.candidate_id == "a" and not first.reused  # the first is untouched


def test_the_key_is_the_task_and_the_source_byte_for_byte():
    k = verdict_key("level1/01_relu", "task text", "src")
    assert k == verdict_key("level1/01_relu", "task text", "src")
    assert len({k, verdict_key("level1/02_gelu", "task text", "src"), verdict_key("level1/01_relu", "task text 2", "src"),
                verdict_key("level1/01_relu", "task text", "src ")}) == 4
    assert verdict_key("a\0b", "c", "d") != verdict_key("a", "b\0c", "d")  # fields cannot slide into each other


def test_the_memo_keeps_the_first_reusable_verdict_of_a_key_and_the_newest_keys():
    memo = VerdictMemo(capacity=2)
    cand = Candidate("t", "s", candidate_id="c")
    memo.put("k1", _verdict(Status.TIMEOUT))
    assert memo.get("k1", cand) is None and len(memo) == 0
    memo.put("k1", _verdict(Status.INCORRECT))
    memo.put("k1", _verdict(Status.CORRECT))  # the first stays
    assert memo.get("k1", cand).status is Status.INCORRECT and memo.hits == 1
    memo.put("k2", reused(_verdict(), cand))  # a copy is never a source
    assert memo.get("k2", cand) is None
    memo.put("k2", _verdict())
    memo.get("k1", cand)  # k1 used last: k2 is the oldest now
    memo.put("k3", _verdict())
    assert memo.get("k2", cand) is None and memo.get("k1", cand) is not None and memo.get("k3", cand) is not None
    with pytest.raises(ValueError):
        VerdictMemo(capacity=0)


def test_a_key_in_flight_is_waited_for_not_judged_twice():
    """claim: the kept verdict; else the judging batch's Pending; else None, and the key is the caller's to judge."""
    memo = VerdictMemo()
    cand = Candidate("t", "s", candidate_id="c")
    assert memo.claim("k", cand) is None  # the first batch judges it
    pending = memo.claim("k", cand)  # a second batch waits
    assert isinstance(pending, Pending) and memo.claim("k", cand) is pending
    memo.put("k", _verdict(Status.INCORRECT))
    assert pending.wait().status is Status.INCORRECT  # handed to the waiter
    again = memo.claim("k", cand)
    assert (again.status, again.reused, again.candidate_id, memo.hits) == (Status.INCORRECT, True, "c", 1)

    # A verdict of the moment reaches the waiters (who then judge their own) but is not kept: the key is free again.
    assert memo.claim("t", cand) is None
    waiting = memo.claim("t", cand)
    memo.put("t", _verdict(Status.TIMEOUT))
    assert waiting.wait().status is Status.TIMEOUT and memo.claim("t", cand) is None
    # A batch that fails releases its keys: the waiters get nothing and judge their own; the key can be claimed anew.
    waiting = memo.claim("t", cand)
    memo.release("t")
    assert waiting.wait() is None and memo.claim("t", cand) is None


@pytest.fixture(scope="module")
def config(cache_dir):
    return EvalConfig(backend="cpu", timing_trials=20, warmup_trials=2, timeout_s=20, cache_dir=str(cache_dir),
                      reuse_verdicts=True)


GOOD = cpp_solution(RELU_BODY, name="t_reuse_ok")
WRONG = cpp_solution(RELU_BODY.replace("in[i] > 0.f ? in[i] : 0.f", "in[i]"), name="t_reuse_wrong")
CRASH = cpp_solution(RELU_BODY.replace("return y;", "volatile float* p = nullptr; *p = 1.0f; return y;"), name="t_reuse_segv")
BROKEN = cpp_solution(RELU_BODY.replace("return y;", "return y  // no semicolon"), name="t_reuse_cerr")


def _items(task, sources, prefix):
    return [(task, Candidate(task.task_id, s, trajectory=i, candidate_id=f"{prefix}{i}")) for i, s in enumerate(sources)]


def test_the_task_is_rendered_once_for_every_candidates_key(config, relu_task, monkeypatch):
    import kevin.tasks.task as task_module

    real, renders = task_module.render_profile, []
    monkeypatch.setattr(task_module, "render_profile", lambda source, profile: renders.append(profile) or real(source, profile))
    with Evaluator(config) as ev:
        keys = [ev.verdict_key(relu_task, Candidate(relu_task.task_id, s)) for s in ("a", "b", "a")]
        assert keys[0] == keys[2] != keys[1] and len(renders) == 1
        assert keys[1] == verdict_key(relu_task.task_id, real(relu_task.source, config.resolved_profile), "b")
        edited = replace(relu_task, source=relu_task.source + "\n# edited\n")  # the same id, another task
        assert ev.verdict_key(edited, Candidate(relu_task.task_id, "b")) != keys[1] and len(renders) == 2


def _raise(exc):
    raise exc


def test_each_failure_says_whose_it_is_where_it_is_made(config, relu_task, monkeypatch):
    cand = Candidate(relu_task.task_id, "src", candidate_id="f")
    timeout = assemble("t", "f", "cpu", RunFacts(failure=Failure(Status.TIMEOUT, "no verdict within 20 s")), 1.0, 3, 10.0)
    assert (timeout.fault, reusable(timeout)) == (Fault.CANDIDATE, False)  # the candidate's, but the moment's too
    with Evaluator(config) as ev:
        compile_error = ev.failed(relu_task, cand, Failure(Status.COMPILE_ERROR, "compilation failed", "x.cpp:3: error"))
        assert (compile_error.fault, reusable(compile_error)) == (Fault.CANDIDATE, True)

        lost = lost_verdict(relu_task, cand, "cpu", "its worker died")
        assert (lost.fault, lost.error, reusable(lost)) == (Fault.EVALUATOR, "evaluator: its worker died", False)

        # The task's three failures: its reference fails to load in the run process, to be timed, or to be laid out.
        loaded = assemble("t", "f", "cpu", RunFacts(failure=reported_failure(
            {"status": "task_error", "message": "the task itself failed to load", "error": "task: boom"})), 1.0, 3, 10.0)
        assert loaded.error == "the task could not be evaluated (the task itself failed to load): task: boom"
        monkeypatch.setattr(ev, "baseline_ms", lambda task, device=None: _raise(RuntimeError("no time")))
        timed = ev.run_phase(relu_task, cand, Compiled(), "cpu")
        assert timed.error == "the task's reference could not be timed: task: no time"
        monkeypatch.setattr(ev, "layout", lambda task, device: _raise(JudgeError("no channel")))
        laid_out = ev._drive(SimpleNamespace(cancel=lambda: None), None, "cpu", relu_task)
        assert laid_out.failure.error == "task: no channel"
        for result in (loaded, timed, assemble("t", "f", "cpu", laid_out, 1.0, 3, 10.0)):
            assert (result.status, result.fault, reusable(result)) == (Status.RUNTIME_ERROR, Fault.TASK, False)


def test_a_judge_that_fails_mid_run_is_the_evaluators_fault_and_the_kernel_is_judged_again(config, relu_task):
    """The judge dies while it checks an honest kernel's first outputs: the verdict is a runtime error that says it was
    the evaluator's (not remembered as the kernel's), and the same kernel submitted again is judged anew, correct."""
    with Evaluator(config) as ev:
        judge = ev.judge("cpu")
        real = judge.request

        def failing(message, answer, *args, **kwargs):
            if message.get("mode") == "check":
                raise JudgeError("the judge on cpu ended (killed)")
            return real(message, answer, *args, **kwargs)

        judge.request = failing
        lost = ev.evaluate(relu_task, Candidate(relu_task.task_id, GOOD, candidate_id="a"))
        assert (lost.status, lost.fault, reusable(lost)) == (Status.RUNTIME_ERROR, Fault.EVALUATOR, False)
        assert lost.error == "evaluator: the judge failed while checking this candidate: the judge on cpu ended (killed)"
        assert judge not in ev._judges.values()  # the failed judge is dropped; the next run starts a fresh one
        again = ev.evaluate(relu_task, Candidate(relu_task.task_id, GOOD, candidate_id="b"))
        assert (again.status, again.reused, again.fault) == (Status.CORRECT, False, Fault.CANDIDATE)


def test_a_batch_judges_each_distinct_candidate_once_and_a_later_batch_none(config, relu_task):
    seen = []
    with Evaluator(config) as ev:
        results = ev.evaluate_many(_items(relu_task, [GOOD, GOOD, WRONG, BROKEN, GOOD, CRASH, BROKEN, CRASH], "a"),
                                   progress=seen.append)
        assert [r.candidate_id for r in results] == [f"a{i}" for i in range(8)]
        assert [r.status for r in results] == [Status.CORRECT, Status.CORRECT, Status.INCORRECT, Status.COMPILE_ERROR,
                                               Status.CORRECT, Status.RUNTIME_ERROR, Status.COMPILE_ERROR,
                                               Status.RUNTIME_ERROR]
        assert [r.reused for r in results] == [False, True, False, False, True, False, True, True]
        assert all(r.fault is Fault.CANDIDATE for r in results)  # a compile error and a crash are the candidate's own
        assert len(ev.run_intervals) == 3 and len(ev.compile_intervals) == 4  # good, wrong, crash ran; 4 compiled
        assert sorted(r.candidate_id for r in seen) == [f"a{i}" for i in range(8)]  # every verdict reported once
        assert results[1].score == results[4].score == results[0].score > 0.3
        # How the first good kernel's time was established, by the real evaluator: scored at the larger of what its
        # stamps vouch for and the evaluator's own clock; its repeats share the judgement, figures and all. (The
        # clock's figure is 0 when the machine's load spread the calibration more than the call: CI's 2 cores.)
        timing = results[0].timing
        assert 0 < timing.reported_ms <= timing.vouched_ms and timing.clock_ms >= 0 and timing.loops >= 1
        assert results[0].runtime_ms == max(timing.vouched_ms, timing.clock_ms)
        assert timing.min_ms <= timing.vouched_ms and timing.std_ms >= 0
        assert results[1].timing == results[4].timing == timing and results[2].timing == TimingFigures()
        assert results[1].times == PhaseTimes() and results[0].times.total > 0
        assert ev.verdicts.hits == 0 and len(ev.verdicts) == 4

        # The next turn repeats two of them and writes one new: only the new one is compiled and run.
        again = ev.evaluate_many(_items(relu_task, [WRONG, GOOD, GOOD.replace("t_reuse_ok", "t_reuse_ok2")], "b"))
        assert [(r.candidate_id, r.status, r.reused) for r in again] == [
            ("b0", Status.INCORRECT, True), ("b1", Status.CORRECT, True), ("b2", Status.CORRECT, False)]
        assert len(ev.run_intervals) == 1 and ev.verdicts.hits == 2
        assert again[1].runtime_ms == results[0].runtime_ms  # the same measurement, not a new one

        # One candidate at a time goes through the same memo.
        single = ev.evaluate(relu_task, Candidate(relu_task.task_id, CRASH, candidate_id="c"))
        assert (single.candidate_id, single.status, single.reused) == ("c", Status.RUNTIME_ERROR, True)
        # ... both ways: what it judges, a later batch reuses.
        broken = BROKEN.replace("t_reuse_cerr", "t_reuse_cerr2")
        assert not ev.evaluate(relu_task, Candidate(relu_task.task_id, broken, candidate_id="d")).reused
        later = ev.evaluate_many(_items(relu_task, [broken], "d"))
        assert [(r.status, r.reused) for r in later] == [(Status.COMPILE_ERROR, True)] and not ev.compile_intervals


def test_without_reuse_every_candidate_is_judged(config, relu_task):
    with Evaluator(replace(config, reuse_verdicts=False)) as ev:
        results = ev.evaluate_many(_items(relu_task, [GOOD, GOOD, GOOD], "n"))
        assert [r.status for r in results] == [Status.CORRECT] * 3 and not any(r.reused for r in results)
        assert len(ev.run_intervals) == 3 and len(ev.verdicts) == 0


def test_repeats_of_a_timeout_are_each_judged(config, relu_task):
    hang = cpp_solution(RELU_BODY.replace("return y;", "volatile int spin = 1; while (spin) {} return y;"),
                        name="t_reuse_hang")
    with Evaluator(replace(config, timeout_s=5)) as ev:
        results = ev.evaluate_many(_items(relu_task, [hang, hang], "h"))
        assert [(r.status, r.reused) for r in results] == [(Status.TIMEOUT, False), (Status.TIMEOUT, False)]
        assert len(ev.run_intervals) == 2  # the second had a process of its own (its build from the cache)
        later = ev.evaluate_many(_items(relu_task, [hang], "l"))
        assert later[0].status is Status.TIMEOUT and not later[0].reused and len(ev.run_intervals) == 1


def test_repeats_of_an_evaluator_or_task_failure_are_each_judged(config, relu_task, monkeypatch):
    with Evaluator(config) as ev:
        judged = []

        def lost(task, cand, *args, **kw):  # the evaluator loses the run (batch.Batch.run_worker catches it)
            judged.append(cand.key)
            raise RuntimeError("the judge went away")

        monkeypatch.setattr(ev, "run_phase", lost)
        results = ev.evaluate_many(_items(relu_task, [GOOD, GOOD], "e"))
        assert [(r.fault, r.error, r.reused) for r in results] == [(Fault.EVALUATOR, "evaluator: the judge went away", False)] * 2
        assert judged == ["e0", "e1"] and len(ev.verdicts) == 0

        monkeypatch.undo()
        monkeypatch.setattr(ev, "prefetch_baselines", lambda *args, **kw: None)
        monkeypatch.setattr(ev, "baseline_ms", lambda task, device=None: _raise(RuntimeError("no time")))
        results = ev.evaluate_many(_items(relu_task, [GOOD, GOOD], "t"))
        assert [(r.fault, r.reused) for r in results] == [(Fault.TASK, False)] * 2 and len(ev.verdicts) == 0
        assert len(ev.run_intervals) == 2  # the repeat went through a run phase of its own


def _when_one_waits(ev, monkeypatch):
    """An event set once a batch's claim found its key in flight in another batch (so two batches overlap on it)."""
    import threading

    waits, real_claim = threading.Event(), ev.verdicts.claim

    def claim(key, cand):
        found = real_claim(key, cand)
        if isinstance(found, Pending):
            waits.set()
        return found

    monkeypatch.setattr(ev.verdicts, "claim", claim)
    return waits


def _at_once(ev, first, second):
    """Both batches' ``evaluate_many`` started together; each one's results, or the exception it raised."""
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(2) as pool:
        futures = [pool.submit(ev.evaluate_many, items) for items in (first, second)]
        return [f.exception(timeout=300) or f.result() for f in futures]


def test_batches_at_once_judge_a_shared_candidate_once(config, relu_task, monkeypatch):
    """A rollout's waves are judged at once: the wave that finds a kernel being judged by the other waits for that
    verdict (one judgement for both copies) instead of judging it again.

    The shared kernel computes the wrong thing and the other crashes: verdicts that no machine load can change. A
    correct kernel's verdict can be one of the moment (a timing the load flagged), which the waiter judges again by
    design (test_what_is_reused_and_what_is_judged_again), and a loaded CI machine made that happen here."""
    source = WRONG.replace("t_reuse_wrong", "t_reuse_inflight")
    with Evaluator(config) as ev:
        waits, real_run, runs = _when_one_waits(ev, monkeypatch), ev.run_phase, []

        def run_phase(task, cand, *args, **kw):  # no run ends before the other batch has found the key in flight
            runs.append(cand.candidate_id)
            assert waits.wait(120)
            return real_run(task, cand, *args, **kw)

        monkeypatch.setattr(ev, "run_phase", run_phase)
        (a,), (b, crash) = _at_once(ev, _items(relu_task, [source], "w0-"), _items(relu_task, [source, CRASH], "w1-"))
        # The shared kernel ran once, in whichever batch claimed it first; the other batch ran only its new one.
        assert sorted(runs) in (["w0-0", "w1-1"], ["w1-0", "w1-1"])
        assert (a.status, b.status) == (Status.INCORRECT, Status.INCORRECT) and a.reused != b.reused
        assert (a.candidate_id, b.candidate_id) == ("w0-0", "w1-0")
        assert b.error == a.error and b.score == a.score == 0.0
        assert crash.status is Status.RUNTIME_ERROR and not crash.reused


def test_a_batch_that_fails_lets_the_waiting_batch_judge_its_own(config, relu_task, monkeypatch):
    source = GOOD.replace("t_reuse_ok", "t_reuse_inflight_lost")
    with Evaluator(config) as ev:
        waits, real_compile, builds = _when_one_waits(ev, monkeypatch), ev.compile, []

        def compile_first_fails(cand, rank=0):  # the claiming batch's build raises once the other batch waits on it
            builds.append(cand.candidate_id)
            if len(builds) == 1:
                assert waits.wait(120)
                raise RuntimeError("the build machinery broke")
            return real_compile(cand, rank)

        monkeypatch.setattr(ev, "compile", compile_first_fails)
        outcomes = _at_once(ev, _items(relu_task, [source], "x0-"), _items(relu_task, [source], "x1-"))
        raised = [o for o in outcomes if isinstance(o, BaseException)]
        judged = [o[0] for o in outcomes if not isinstance(o, BaseException)]
        assert [str(e) for e in raised] == ["the build machinery broke"]
        # The waiting batch got no verdict and judged its own: a build and a run phase of its own.
        assert [(r.status, r.reused) for r in judged] == [(Status.CORRECT, False)] and len(builds) == 2
