"""The full evaluation path on the cpu backend with real compiled C++: every verdict kind and hack."""

from __future__ import annotations

from dataclasses import replace

import pytest

from kevin.evaluation import Candidate, EvalConfig, Evaluator, Status
from tests.conftest import RELU_BODY, cpp_solution


@pytest.fixture(scope="module")
def evaluator(cache_dir):
    return Evaluator(EvalConfig(backend="cpu", timing_trials=20, warmup_trials=2, timeout_s=20, cache_dir=str(cache_dir)))


def judge(evaluator, task, source):
    return evaluator.evaluate(task, source)


def test_correct_kernel_scores_its_speedup(evaluator, relu_task):
    r = judge(evaluator, relu_task, cpp_solution(RELU_BODY, name="t_ok"))
    assert r.status is Status.CORRECT, r.error
    assert r.correct and r.compiled and r.trials_passed == 5 and r.max_abs_error == 0.0
    assert r.runtime_ms > 0 and r.baseline_ms > 0
    assert r.speedup == pytest.approx(r.baseline_ms / r.runtime_ms)
    assert r.score == pytest.approx(0.3 + r.speedup)
    assert "correct" in r.feedback and f"{r.speedup:.2f}x" in r.feedback


def test_wrong_result_is_incorrect(evaluator, relu_task):
    body = RELU_BODY.replace("in[i] > 0.f ? in[i] : 0.f", "in[i]")
    r = judge(evaluator, relu_task, cpp_solution(body, name="t_wrong"))
    assert r.status is Status.INCORRECT and r.score == 0.0
    assert "outside atol" in r.error


def test_compile_error_shows_the_compiler_lines(evaluator, relu_task):
    body = RELU_BODY.replace("auto y = torch::empty_like(xc);", "auto y = torch::empty_like(xc)  // missing semicolon\n    undeclared_thing;")
    r = judge(evaluator, relu_task, cpp_solution(body, name="t_cerr"))
    assert r.status is Status.COMPILE_ERROR and not r.compiled and r.score == 0.0
    assert "error" in r.error and "undeclared_thing" in r.error
    assert r.feedback.startswith("Your kernel failed to compile")


def test_segfault_is_a_runtime_error(evaluator, relu_task):
    body = RELU_BODY.replace("return y;", "volatile float* p = nullptr; *p = 1.0f; return y;")
    r = judge(evaluator, relu_task, cpp_solution(body, name="t_segv"))
    assert r.status is Status.RUNTIME_ERROR and r.score == 0.0
    assert "killed by signal SIGSEGV" in r.error or "killed by signal SIGILL" in r.error


def test_infinite_loop_in_cpp_times_out(evaluator, relu_task):
    body = RELU_BODY.replace("return y;", "volatile int spin = 1; while (spin) {} return y;")
    # The module's 20 s limit is for honest runs on a slow machine; a kernel that never returns waits it all out.
    with Evaluator(replace(evaluator.config, timeout_s=5)) as short:
        r = judge(short, relu_task, cpp_solution(body, name="t_hang"))
    assert r.status is Status.TIMEOUT and r.score == 0.0 and "within 5 s" in r.error


def test_in_place_input_modification_is_caught(evaluator, relu_task):
    body = """
torch::Tensor relu_forward(torch::Tensor x) {
    float* p = x.data_ptr<float>();
    for (int64_t i = 0; i < x.numel(); ++i) p[i] = p[i] > 0.f ? p[i] : 0.f;
    return x;
}
"""
    r = judge(evaluator, relu_task, cpp_solution(body, name="t_inplace"))
    assert r.status is Status.RULE_VIOLATION and r.rule_id == "input_mutation" and r.score == 0.0


def test_uninitialised_output_is_incorrect(evaluator, relu_task):
    body = "torch::Tensor relu_forward(torch::Tensor x) { return torch::empty_like(x); }"
    r = judge(evaluator, relu_task, cpp_solution(body, name="t_uninit"))
    assert r.status is Status.INCORRECT and r.score == 0.0


def test_output_cached_by_input_pointer_is_incorrect(evaluator, relu_task):
    body = RELU_BODY.replace("torch::Tensor relu_forward(torch::Tensor x) {", """
#include <unordered_map>
static std::unordered_map<const void*, torch::Tensor> cache;
torch::Tensor relu_forward_impl(torch::Tensor x);
torch::Tensor relu_forward(torch::Tensor x) {
    auto it = cache.find(x.data_ptr());
    if (it != cache.end()) return it->second;
    auto y = relu_forward_impl(x);
    cache[x.data_ptr()] = y;
    return y;
}
torch::Tensor relu_forward_impl(torch::Tensor x) {""")
    r = judge(evaluator, relu_task, cpp_solution(body, name="t_cache"))
    assert r.status is Status.INCORRECT and r.score == 0.0, r.error


def test_tensor_arithmetic_in_python_is_caught_at_run_time(evaluator, relu_task):
    src = cpp_solution(RELU_BODY, name="t_pyadd", forward="return ext.relu_forward(x) * 1.0")
    r = judge(evaluator, relu_task, src)
    assert r.status is Status.RULE_VIOLATION and r.rule_id == "torch_compute_runtime" and r.score == 0.0


def test_tensor_subclass_output_is_rejected(evaluator, relu_task):
    extra = "\n\nclass Lazy(torch.Tensor):\n    def sum_later(self):\n        return 0\n"
    src = cpp_solution(RELU_BODY, name="t_sub", extra_py=extra, forward="return ext.relu_forward(x).as_subclass(Lazy)")
    r = judge(evaluator, relu_task, src)
    assert r.status is Status.RULE_VIOLATION and r.rule_id in ("output_type", "torch_compute_runtime")


def test_early_exit_with_no_verdict_scores_zero(cache_dir, relu_task):
    relaxed = Evaluator(EvalConfig(backend="cpu", timing_trials=10, warmup_trials=1, timeout_s=20, cache_dir=str(cache_dir),
                                   rules={"forbidden_import": {"enabled": False}}))
    src = cpp_solution(RELU_BODY, name="t_exit", extra_py="import os", forward="os._exit(0)")
    r = relaxed.evaluate(relu_task, src)
    assert r.status is Status.RUNTIME_ERROR and r.score == 0.0
    assert "ended without finishing (exit code 0)" in r.error


def test_timer_patching_is_caught_at_run_time_even_with_static_rules_off(cache_dir, relu_task):
    relaxed = EvalConfig(backend="cpu", timing_trials=10, warmup_trials=1, timeout_s=20, cache_dir=str(cache_dir),
                         rules={"forbidden_import": {"enabled": False}, "patching": {"enabled": False}})
    src = cpp_solution(RELU_BODY, name="t_timer", extra_py="import time\ntime.perf_counter_ns = lambda: 0")
    r = Evaluator(relaxed).evaluate(relu_task, src)
    assert r.status is Status.RULE_VIOLATION and r.rule_id == "harness_tampering"


def test_a_pytorch_operator_re_registered_is_caught_at_run_time_even_with_static_rules_off(cache_dir, relu_task):
    """A kernel registered for an aten operator replaces PyTorch's silently (work could hide in an op the harness
    runs); the static rules refuse every named way to the registration API, so they are switched off here to show
    that the dispatcher's entries compared before and after loading catch it anyway."""
    relaxed = EvalConfig(backend="cpu", timing_trials=10, warmup_trials=1, timeout_s=20, cache_dir=str(cache_dir),
                         rules={"torch_namespaces": {"enabled": False}, "torch_compute": {"enabled": False}})
    extra = 'LIB = torch.library.Library("aten", "IMPL")\nLIB.impl("frac", lambda x: x, "CPU")'
    r = Evaluator(relaxed).evaluate(relu_task, cpp_solution(RELU_BODY, name="t_rereg", extra_py=extra))
    assert r.status is Status.RULE_VIOLATION and r.rule_id == "harness_tampering", (r.status, r.rule_id, r.error)
    assert "aten::frac" in r.error and "re-registered" in r.error


def test_the_dispatcher_entries_show_a_registration_and_its_removal():
    import torch

    from kevin.evaluation.checks import aten_registrations, changed_registrations

    before = aten_registrations()
    torch.ones(3).relu().sum()  # running operators registers nothing
    assert changed_registrations(before, aten_registrations()) == []
    lib = torch.library.Library("aten", "IMPL")
    lib.impl("frac", lambda x: x, "CPU")
    assert changed_registrations(before, aten_registrations()) == ["aten::frac"]
    lib._destroy()
    assert changed_registrations(before, aten_registrations()) == []


def test_static_violation_costs_no_compile(evaluator, relu_task):
    r = judge(evaluator, relu_task, cpp_solution(RELU_BODY, forward="return torch.sigmoid(x)"))
    assert r.status is Status.RULE_VIOLATION and r.rule_id == "torch_compute" and not r.compiled
    assert r.times.compile == 0.0


@pytest.mark.parametrize("source,expected", [("", "empty"), ("\x00\x01binary", "binary"), ("def f(:\n", "not valid Python"),
                                             ("import torch\nx = 1\n", "ModelNew")])
def test_unparseable_input_is_a_parse_error(evaluator, relu_task, source, expected):
    r = judge(evaluator, relu_task, source)
    assert r.status is Status.PARSE_ERROR and expected in r.error and r.score == 0.0


def test_batch_crash_then_correct_and_results_in_order(evaluator, relu_task):
    crash = cpp_solution(RELU_BODY.replace("return y;", "volatile float* p = nullptr; *p = 1.0f; return y;"), name="t_segv")
    good = cpp_solution(RELU_BODY, name="t_ok")
    wrong = cpp_solution(RELU_BODY.replace("in[i] > 0.f ? in[i] : 0.f", "in[i]"), name="t_wrong")
    items = [(relu_task, Candidate(relu_task.task_id, s, candidate_id=f"c{i}")) for i, s in enumerate([crash, good, wrong, good])]
    results = evaluator.evaluate_many(items)
    assert [r.candidate_id for r in results] == ["c0", "c1", "c2", "c3"]
    assert [r.status for r in results] == [Status.RUNTIME_ERROR, Status.CORRECT, Status.INCORRECT, Status.CORRECT]


def test_references_of_several_tasks_are_timed_in_one_request_to_the_judge(cache_dir, relu_task, monkeypatch):
    from kevin.evaluation.judge import JudgeClient
    from kevin.tasks import load_bundled_suite

    tasks = [t for t in load_bundled_suite((1,)) if t.name in ("01_relu", "02_gelu")]
    ev = Evaluator(EvalConfig(backend="cpu", timing_trials=10, warmup_trials=1, timeout_s=20, cache_dir=str(cache_dir / "refs")))
    calls = []
    real = JudgeClient.request

    def spy(self, message, *a, **k):
        calls.append((message["t"], len(message.get("tasks", []))))
        return real(self, message, *a, **k)

    monkeypatch.setattr(JudgeClient, "request", spy)
    seen = []
    ev.prefetch_baselines(tasks, progress=lambda done, total: seen.append((done, total)))
    assert calls == [("baselines", 2)] and seen == [(1, 2), (2, 2)]  # both tasks, one request, progress per task
    for t in tasks:
        assert ev.baselines.get(ev.baseline_key(t)) > 0
    assert ev.baseline_ms(tasks[0]) == ev.baselines.get(ev.baseline_key(tasks[0]))
    ev.prefetch_baselines(tasks)
    assert calls == [("baselines", 2)]  # cached: nothing measured again
    ev.close()


def test_a_baseline_timed_slow_once_is_timed_again_before_a_correct_kernel_leans_on_it(fresh_cache, relu_task):
    """A baseline timed beside other work (the policy generating on the same device) inflates every speedup of its
    task. The first correct kernel of the task has it timed a second time, and is scored against the faster."""
    import json

    def evaluator(confirm):
        return Evaluator(EvalConfig(backend="cpu", timing_trials=10, warmup_trials=1, timeout_s=20,
                                    cache_dir=str(fresh_cache), confirm_baselines=confirm))

    solution = cpp_solution(RELU_BODY, name="t_slow_baseline")
    without = evaluator(False)
    key = without.baseline_key(relu_task)
    slow = 1000.0 * without.measure_reference_ms(relu_task)
    without.baselines.put(key, slow, {"measured": "beside other work"})
    r = without.evaluate(relu_task, solution)
    # What a run gets without the second timing: every speedup of the task 1000x too high.
    assert r.status is Status.CORRECT and r.baseline_ms == slow, r.error
    without.close()

    ev = evaluator(True)  # the same cache file: the slow timing, not confirmed
    r = ev.evaluate(relu_task, solution)
    assert r.status is Status.CORRECT, r.error
    assert r.baseline_ms < slow / 100 and r.speedup == pytest.approx(r.baseline_ms / r.runtime_ms)
    assert r.score == pytest.approx(0.3 + r.speedup)
    assert any("the second: scored against the faster" in w for w in r.warnings)
    entry = json.loads((fresh_cache / "baselines.json").read_text())[key]
    assert entry["confirmed"] is True and entry["ms"] == r.baseline_ms and entry["timings_ms"][0] == slow
    again = ev.evaluate(relu_task, solution)
    assert again.baseline_ms == r.baseline_ms and not any("second" in w for w in again.warnings)
    ev.close()


def test_a_held_device_starts_no_run_until_it_is_released(evaluator, relu_task):
    """The policy generating on the device holds it (kevin/experiment/device_share.py): a candidate's run waits for
    the release, so it is never timed beside that work."""
    import threading
    import time

    source = cpp_solution(RELU_BODY, name="t_ok")
    assert judge(evaluator, relu_task, source).status is Status.CORRECT  # built now: the next ones only run
    began = time.monotonic()
    assert judge(evaluator, relu_task, source).status is Status.CORRECT
    alone = time.monotonic() - began
    results = []
    worker = threading.Thread(target=lambda: results.append(judge(evaluator, relu_task, source)))
    with evaluator.hold_device("cpu"):
        worker.start()
        time.sleep(max(3.0, 2 * alone))  # twice what the whole evaluation took unheld
        assert worker.is_alive() and not results  # unheld it would have finished by now: it waits for the device
    worker.join(timeout=120)
    (r,) = results
    assert r.status is Status.CORRECT, r.error


def test_a_broken_reference_is_named_and_does_not_hide_the_others(fresh_cache, relu_task):
    broken = replace(relu_task, task_id="level1/99_broken", name="99_broken", source=relu_task.source.replace("-> torch.Tensor:", "-> torch.Tensor:\n        raise ValueError('bad task')"))
    ev = Evaluator(EvalConfig(backend="cpu", timing_trials=10, warmup_trials=1, timeout_s=20, cache_dir=str(fresh_cache)))
    with pytest.raises(RuntimeError, match="99_broken.*bad task"):
        ev.measure_references_ms([relu_task, broken])
    ev.prefetch_baselines([relu_task, broken])  # logged, not raised: the good one is cached, the other retried lazily
    assert ev.baselines.get(ev.baseline_key(relu_task)) > 0
    assert ev.baselines.get(ev.baseline_key(broken)) is None
    with pytest.raises(RuntimeError, match="bad task"):
        ev.baseline_ms(broken)
    # A candidate of that task gets a verdict that names the task as the cause, not an exception.
    r = ev.evaluate(broken, cpp_solution(RELU_BODY, name="t_broken_ref"))
    assert r.status is Status.RUNTIME_ERROR and "task's reference could not be timed" in r.error and "bad task" in r.error
    ev.close()


def _started(evaluator, task, source, gated=True):
    candidate = Candidate(task.task_id, source)
    compiled = evaluator.compile(candidate)
    assert compiled.failure is None
    return candidate, compiled, evaluator.start_run(task, candidate, compiled, "cpu", gated=gated)


def test_gated_job_waits_before_candidate_code_until_handed_the_device(evaluator, relu_task):
    import time

    source = cpp_solution(RELU_BODY, name="t_gate", extra_py="print('CANDIDATE-IMPORTED', flush=True)")
    candidate, compiled, started = _started(evaluator, relu_task, source)
    evaluator.baseline_ms(relu_task)
    job = started[0]
    time.sleep(4)  # plenty for the set-up; the candidate's module must not have been imported yet
    assert job.proc.poll() is None and b"CANDIDATE-IMPORTED" not in job.out_tail.data
    item = job.reader.get(5)
    assert item.message["t"] == "ready"  # set up and waiting
    job.reader._queue.put(item)  # hand it back to the driver
    result = evaluator.run_phase(relu_task, candidate, compiled, "cpu", started)
    assert result.status is Status.CORRECT and b"CANDIDATE-IMPORTED" in job.out_tail.data
    assert result.times.setup > 0

    cancelled = _started(evaluator, relu_task, source)[2][0]
    cancelled.cancel()
    assert cancelled.proc.poll() is not None and not cancelled.workdir.exists()


def test_runs_started_ahead_keep_verdicts_and_order(evaluator, relu_task):
    crash = cpp_solution(RELU_BODY.replace("return y;", "volatile float* p = nullptr; *p = 1.0f; return y;"), name="t_segv")
    good = cpp_solution(RELU_BODY, name="t_ok")
    wrong = cpp_solution(RELU_BODY.replace("in[i] > 0.f ? in[i] : 0.f", "in[i]"), name="t_wrong")
    items = [(relu_task, Candidate(relu_task.task_id, s, candidate_id=f"p{i}")) for i, s in enumerate([good, crash, wrong, good, crash])]
    evaluator.prestart = 2  # as cuda does (default 4); on cpu only to test the pipeline itself
    try:
        results = evaluator.evaluate_many(items)
    finally:
        evaluator.prestart = 0
    assert [r.candidate_id for r in results] == ["p0", "p1", "p2", "p3", "p4"]
    assert [r.status for r in results] == [Status.CORRECT, Status.RUNTIME_ERROR, Status.INCORRECT, Status.CORRECT, Status.RUNTIME_ERROR]


def test_a_job_whose_set_up_fails_ahead_of_its_turn_exits_without_a_verdict(evaluator, relu_task):
    from kevin.evaluation.protocol import SETUP_FAILED_EXIT

    source = cpp_solution(RELU_BODY)
    candidate = Candidate(relu_task.task_id, source)
    compiled = evaluator.compile(candidate)
    plan, spec = evaluator._plan(relu_task, compiled, "cuda:0")  # no GPU here: the set-up fails
    from kevin.evaluation.sandbox import HarnessJob

    job = HarnessJob({**spec, "solution_source": source, "gated": True}, memory_limit_mb=8192, backend="cpu",
                     read_only=[str(compiled.ext_dir)])
    assert job.proc.wait(timeout=120) == SETUP_FAILED_EXIT  # before its turn: no verdict, a distinct exit code
    job.end()
    job.close()


def test_a_broken_task_is_reported_as_the_tasks_failure(evaluator, relu_task):
    from dataclasses import replace

    broken = replace(relu_task, task_id="level1/98_broken_init", name="98_broken_init",
                     source=relu_task.source.replace("super().__init__()", "super().__init__()\n        raise MemoryError('no room')"))
    evaluator.baselines.put(evaluator.baseline_key(broken), 1.0, {"note": "test"})  # so only the run phase runs
    r = evaluator.evaluate(broken, cpp_solution(RELU_BODY))
    assert r.status is Status.RUNTIME_ERROR and "the task could not be evaluated" in r.error and "no room" in r.error


def test_a_waiting_job_killed_by_someone_else_is_run_again_and_ignores_a_forged_start(evaluator, relu_task):
    import os
    import signal
    import time

    from kevin.evaluation.protocol import BAD_START_EXIT

    source = cpp_solution(RELU_BODY, name="t_gate")
    evaluator.baseline_ms(relu_task)
    candidate, compiled, victim = _started(evaluator, relu_task, source)
    time.sleep(3)
    os.kill(victim[0].proc.pid, signal.SIGKILL)  # e.g. a hostile candidate running beside it
    victim[0].proc.wait(timeout=10)
    result = evaluator.run_phase(relu_task, candidate, compiled, "cpu", victim)
    assert result.status is Status.CORRECT

    forged = _started(evaluator, relu_task, source)[2][0]
    assert forged.reader.get(60).message["t"] == "ready"
    forged.send({"t": "start", "token": "0" * 64})  # a start without the job's token
    assert forged.proc.wait(timeout=60) == BAD_START_EXIT
    forged.cancel()


def test_one_run_worker_per_device_shares_the_batch(evaluator, relu_task, monkeypatch):
    """The multi-GPU path on CPU: two devices (both the CPU here) get a run worker each; the batch is
    spread over them and the results still come back complete, right and in input order."""
    import threading

    crash = cpp_solution(RELU_BODY.replace("return y;", "volatile float* p = nullptr; *p = 1.0f; return y;"), name="t_segv")
    good = cpp_solution(RELU_BODY, name="t_ok")
    wrong = cpp_solution(RELU_BODY.replace("in[i] > 0.f ? in[i] : 0.f", "in[i]"), name="t_wrong")
    sources = [good, crash, wrong, good, good, crash]
    items = [(relu_task, Candidate(relu_task.task_id, s, candidate_id=f"d{i}")) for i, s in enumerate(sources)]
    threads: set[int] = set()
    real_run_phase = evaluator.run_phase

    def recording(*args, **kwargs):
        threads.add(threading.get_ident())
        return real_run_phase(*args, **kwargs)

    monkeypatch.setattr(evaluator, "devices", lambda: ["cpu", "cpu"])
    monkeypatch.setattr(evaluator, "run_phase", recording)
    results = evaluator.evaluate_many(items)
    assert [r.candidate_id for r in results] == [f"d{i}" for i in range(6)]
    assert [r.status for r in results] == [Status.CORRECT, Status.RUNTIME_ERROR, Status.INCORRECT, Status.CORRECT,
                                           Status.CORRECT, Status.RUNTIME_ERROR]
    assert len(threads) == 2  # both run workers judged candidates


OPENMP_RELU = """
torch::Tensor relu_forward(torch::Tensor x) {
    auto xc = x.contiguous();
    auto y = torch::empty_like(xc);
    const float* in = xc.data_ptr<float>();
    float* out = y.data_ptr<float>();
    const int64_t n = xc.numel();
    #pragma omp parallel for schedule(static)
    for (int64_t i = 0; i < n; ++i) out[i] = in[i] > 0.f ? in[i] : 0.f;
    return y;
}
"""

OUTLIVING_THREAD = """
#include <thread>
#include <atomic>
static std::atomic<bool> started{false};
torch::Tensor relu_forward(torch::Tensor x) {
    if (!started.exchange(true)) {
        std::thread([] { volatile double s = 0; for (;;) s += 1.0; }).detach();  // keeps computing after the call
    }
    auto xc = x.contiguous();
    auto y = torch::empty_like(xc);
    const float* in = xc.data_ptr<float>();
    float* out = y.data_ptr<float>();
    for (int64_t i = 0; i < xc.numel(); ++i) out[i] = in[i] > 0.f ? in[i] : 0.f;
    return y;
}
"""


@pytest.mark.parametrize("threads", [1, 2])
def test_an_openmp_kernel_is_honest_and_gets_the_baselines_thread_count(cache_dir, relu_task, threads):
    ev = Evaluator(EvalConfig(backend="cpu", timing_trials=20, warmup_trials=2, timeout_s=30, cache_dir=str(cache_dir),
                              cpu_threads=threads))
    src = cpp_solution(OPENMP_RELU, name="t_omp").replace('verbose=False)', 'extra_cflags=["-fopenmp"], verbose=False)')
    r = ev.evaluate(relu_task, src)
    assert r.status is Status.CORRECT, r.error
    assert r.threads == threads and r.score > 0.3
    ev.close()


def test_a_thread_that_outlives_the_call_scores_zero(cache_dir, relu_task):
    # With the default rules the library's thread call is refused from its symbol table ...
    ev = Evaluator(EvalConfig(backend="cpu", timing_trials=20, warmup_trials=2, timeout_s=30, cache_dir=str(cache_dir)))
    r = ev.evaluate(relu_task, cpp_solution(OUTLIVING_THREAD, name="t_thread"))
    assert r.status is Status.RULE_VIOLATION and r.score == 0.0 and r.rule_id in ("cpp_forbidden_calls", "native_symbols")
    ev.close()
    # ... and with those rules off, the run-time check sees the thread computing after the call returned.
    relaxed = Evaluator(EvalConfig(backend="cpu", timing_trials=20, warmup_trials=2, timeout_s=30, cache_dir=str(cache_dir),
                                   rules={"cpp_forbidden_calls": {"enabled": False}, "native_symbols": {"enabled": False}}))
    r = relaxed.evaluate(relu_task, cpp_solution(OUTLIVING_THREAD, name="t_thread"))
    assert r.status is Status.RULE_VIOLATION and r.rule_id == "threads_spawned" and "after the call returned" in r.error
    relaxed.close()


def test_two_batches_on_one_evaluator_at_once_keep_their_own_results(evaluator, relu_task):
    import threading

    good = cpp_solution(RELU_BODY, name="t_ok")
    wrong = cpp_solution(RELU_BODY.replace("in[i] > 0.f ? in[i] : 0.f", "in[i]"), name="t_wrong")
    batches = {"a": [good, wrong], "b": [wrong, good, good]}
    out: dict[str, list] = {}

    def run(name: str) -> None:
        items = [(relu_task, Candidate(relu_task.task_id, s, candidate_id=f"{name}{i}")) for i, s in enumerate(batches[name])]
        out[name] = evaluator.evaluate_many(items)

    threads = [threading.Thread(target=run, args=(n,)) for n in batches]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert [r.candidate_id for r in out["a"]] == ["a0", "a1"] and [r.candidate_id for r in out["b"]] == ["b0", "b1", "b2"]
    assert [r.status for r in out["a"]] == [Status.CORRECT, Status.INCORRECT]
    assert [r.status for r in out["b"]] == [Status.INCORRECT, Status.CORRECT, Status.CORRECT]


def test_python_api_reached_through_token_pasting_is_refused_from_the_symbol_table(evaluator, relu_task):
    from tests.evaluation.hostile import NO_INTEGRITY, native

    src = cpp_solution(native(NO_INTEGRITY + "import torch\ntorch.allclose = lambda *a, **k: True\n") + RELU_BODY, name="t_pyapi")
    r = evaluator.evaluate(relu_task, src)
    assert r.status is Status.RULE_VIOLATION and r.rule_id == "native_symbols" and "the Python C API" in r.error


def test_batches_at_once_share_the_compile_slots(cache_dir, relu_task, monkeypatch):
    """Two evaluate_many calls at once (two waves of a rollout) compile in as many processes as one call would:
    with one compile worker, never two compiles at the same time; every verdict goes to its own batch."""
    import threading
    import time

    from kevin.evaluation.compile_cache import Compiled
    from kevin.evaluation.verdict import Failure

    ev = Evaluator(EvalConfig(backend="cpu", compile_workers=1, cache_dir=str(cache_dir)))
    assert ev.concurrent_batches is False  # cpu: a caller takes one batch at a time (timed runs share the cores)
    active, peak, lock = [0], [0], threading.Lock()

    def compile_slowly(candidate, rank=0):
        with lock:
            active[0] += 1
            peak[0] = max(peak[0], active[0])
        time.sleep(0.1)
        with lock:
            active[0] -= 1
        return Compiled(failure=Failure(Status.COMPILE_ERROR, f"stand-in for {candidate.candidate_id}"))

    monkeypatch.setattr(ev, "compile", compile_slowly)
    batches = {name: [(relu_task, Candidate(task_id=relu_task.task_id, source=cpp_solution(RELU_BODY, name=f"t_{name}{i}"),
                                            candidate_id=f"{name}{i}")) for i in range(3)] for name in ("a", "b")}
    results: dict[str, list] = {}
    threads = [threading.Thread(target=lambda n=name: results.__setitem__(n, ev.evaluate_many(batches[n])))
               for name in batches]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert peak[0] == 1
    for name in ("a", "b"):
        assert [r.status for r in results[name]] == [Status.COMPILE_ERROR] * 3
        assert [r.error for r in results[name]] == [f"stand-in for {name}{i}" for i in range(3)]


def test_a_compile_gets_the_cores_the_waiting_compiles_leave_it(cache_dir):
    """A lone compile may run the host unit and nvcc's two chains at once (3); a full queue runs one process each."""
    ev = Evaluator(EvalConfig(backend="cpu", cache_dir=str(cache_dir), cpu_cores=16))
    assert ev.compile_slots.jobs() == 3  # nothing queued: a single evaluate()
    expected = {1: 3, 5: 3, 6: 2, 8: 2, 9: 1, 16: 1, 28: 1}
    for waiting, jobs in expected.items():
        ev.compile_slots.add_demand(waiting)
        assert ev.compile_slots.jobs() == jobs, waiting
        ev.compile_slots.add_demand(-waiting)
    assert Evaluator(EvalConfig(backend="cpu", cache_dir=str(cache_dir), cpu_cores=16, compile_jobs=2)).compile_slots.jobs() == 2
    assert Evaluator(EvalConfig(backend="cpu", cache_dir=str(cache_dir), cpu_cores=2)).compile_slots.jobs() == 2
    with pytest.raises(ValueError, match="compile_jobs"):
        EvalConfig(compile_jobs=-1)


def test_a_batch_gives_back_its_compile_demand(evaluator, relu_task):
    good = cpp_solution(RELU_BODY)
    results = evaluator.evaluate_many([(relu_task, Candidate(relu_task.task_id, good)),
                                       (relu_task, Candidate(relu_task.task_id, good.replace("return", "return undefined_q +", 1)))])
    assert [r.status for r in results] == [Status.CORRECT, Status.COMPILE_ERROR]
    assert evaluator.compile_slots.demand == 0


def test_the_first_compile_of_a_batch_goes_first():
    from kevin.evaluation.batch import compile_priority

    assert [compile_priority(rank, 1) for rank in (0, 1, 2, 9, 10, 40)] == [(10, 3), (11, 1), (12, 1), (19, 1), (19, 1), (19, 1)]
    assert compile_priority(3, 2) == (13, 2)


def test_a_batchs_compile_jobs_get_their_priority_in_queue_order(cache_dir, relu_task, monkeypatch):
    import kevin.evaluation.evaluator as evaluator_module

    seen = []

    class Recorded(evaluator_module.HarnessJob):
        def __init__(self, job, **kw):
            if job["mode"] == "compile":
                seen.append((job["solution_source"], kw["nice"], job["max_jobs"]))
            super().__init__(job, **kw)

    monkeypatch.setattr(evaluator_module, "HarnessJob", Recorded)
    ev = Evaluator(EvalConfig(backend="cpu", cache_dir=str(cache_dir), compile_workers=1, cpu_cores=2))
    sources = [cpp_solution(RELU_BODY.replace("return", f"/* variant {k} */ return", 1)) for k in range(3)]
    results = ev.evaluate_many([(relu_task, Candidate(relu_task.task_id, s)) for s in sources])
    assert [r.status for r in results] == [Status.CORRECT] * 3
    # One worker: the compiles start in queue order. The first gets a lone compile's 3 processes; the cores
    # (2) shared by the two still waiting give the second one process each, the third two (alone by then).
    assert seen == [(sources[0], 10, 3), (sources[1], 11, 1), (sources[2], 12, 2)]
