"""The Ray-backed batch evaluator: its pure planning by hand, then on a real local Ray cluster (2 CPUs, cpu backend,
real compiles): verdicts of every kind in input order from two workers, a worker killed mid-batch replaced and its
candidates judged, and candidates given up as runtime errors when retries are spent."""

from __future__ import annotations

import os
import signal
import threading
import time

import pytest
import ray

from kevin.evaluation import Candidate, EvalConfig, Evaluator, Fault, Status
from kevin.evaluation.cluster import ClusterEvaluator, batch_evaluator
from kevin.evaluation.cluster_plan import (
    ClusterConfig,
    NodeSlots,
    WorkerSpec,
    lost_verdict,
    plan_chunks,
    plan_workers,
    ray_init_kwargs,
    split_for_retry,
    worker_compile_pool,
)
from tests.conftest import RELU_BODY, cpp_solution

# ------------------------------------------------------------------------------------------------ config


@pytest.mark.parametrize("bad, words", [
    ({"address": "localhost"}, "not a Ray address"),
    ({"address": "ray://head"}, "not a Ray address"),
    ({"gpus_per_worker": 0.5}, "whole number"),
    ({"gpus_per_worker": 0}, "whole number"),
    ({"max_attempts": 0}, "max_attempts"),
    ({"chunk_size": -1}, "chunk_size"),
    ({"workers_per_node": -1}, "workers_per_node"),
    ({"max_restarts": -2}, "max_restarts"),
    ({"start_timeout_s": 0}, "start_timeout_s"),
    ({"namespace": ""}, "namespace"),
])
def test_config_refuses_bad_values_and_says_what_to_write(bad, words):
    with pytest.raises(ValueError, match=words):
        ClusterConfig(**bad)


def test_config_takes_every_address_form_and_refuses_unknown_keys():
    for address in ("", "auto", "10.0.0.1:6379", "ray://head.example:10001"):
        assert ClusterConfig(address=address).address == address
    assert ClusterConfig(gpus_per_worker=2.0).gpus_per_worker == 2  # YAML may write a whole number as a float
    with pytest.raises(ValueError, match="unknown cluster settings: \\['adress'\\]"):
        ClusterConfig.from_dict({"adress": "auto"})


def test_ray_init_arguments():
    assert ray_init_kwargs(ClusterConfig()) == {"namespace": "kevin", "include_dashboard": False}
    assert ray_init_kwargs(ClusterConfig(local_cpus=2, namespace="ns")) == {"namespace": "ns", "include_dashboard": False,
                                                                           "num_cpus": 2}
    env = {"env_vars": {"KEVIN_CACHE_DIR": "/scratch"}}
    assert ray_init_kwargs(ClusterConfig(address="auto", local_cpus=8, runtime_env=env)) == {
        "namespace": "kevin", "address": "auto", "runtime_env": env}


# ---------------------------------------------------------------------------------------------- planning


def test_compile_pool_is_the_workers_cores_minus_two_per_device():
    assert worker_compile_pool(16, 1) == 14
    assert worker_compile_pool(16, 2) == 12
    assert worker_compile_pool(8, 0) == 6   # cpu backend: one device
    assert worker_compile_pool(2, 0) == 1   # never below one
    assert worker_compile_pool(16, 1, configured=3) == 3


NODES = [NodeSlots("b", "10.0.0.2", cpus=32, gpus=2), NodeSlots("a", "10.0.0.1", cpus=16, gpus=1),
         NodeSlots("c", "10.0.0.3", cpus=8, gpus=0)]


def test_cuda_layout_one_worker_per_gpu_cores_shared_on_each_node():
    specs = plan_workers(NODES, "cuda", ClusterConfig())
    assert specs == [WorkerSpec("10.0.0.1#0", "a", num_cpus=16, num_gpus=1, compile_workers=14),
                     WorkerSpec("10.0.0.2#0", "b", num_cpus=16, num_gpus=1, compile_workers=14),
                     WorkerSpec("10.0.0.2#1", "b", num_cpus=16, num_gpus=1, compile_workers=14)]


def test_cuda_layout_with_fixed_cores_workers_per_node_and_two_gpus_each():
    fixed = plan_workers(NODES, "cuda", ClusterConfig(cpus_per_worker=6), compile_workers=0)
    assert [(s.label, s.num_cpus, s.compile_workers) for s in fixed] == [("10.0.0.1#0", 6, 4), ("10.0.0.2#0", 6, 4),
                                                                        ("10.0.0.2#1", 6, 4)]
    one = plan_workers(NODES, "cuda", ClusterConfig(workers_per_node=1), compile_workers=5)
    assert [(s.label, s.num_cpus, s.compile_workers) for s in one] == [("10.0.0.1#0", 16, 5), ("10.0.0.2#0", 32, 5)]
    pairs = plan_workers(NODES, "cuda", ClusterConfig(gpus_per_worker=2))
    assert [(s.label, s.num_gpus, s.num_cpus, s.compile_workers) for s in pairs] == [("10.0.0.2#0", 2, 32, 28)]


def test_cpu_layout_one_worker_per_node_unless_asked():
    assert [(s.label, s.num_cpus, s.num_gpus) for s in plan_workers(NODES, "cpu", ClusterConfig())] == [
        ("10.0.0.1#0", 16, 0), ("10.0.0.2#0", 32, 0), ("10.0.0.3#0", 8, 0)]
    small = [NodeSlots("n", "127.0.0.1", cpus=2, gpus=0)]
    assert [(s.label, s.num_cpus, s.compile_workers) for s in plan_workers(small, "cpu", ClusterConfig(workers_per_node=2))] == [
        ("127.0.0.1#0", 1, 1), ("127.0.0.1#1", 1, 1)]
    assert len(plan_workers(small, "cpu", ClusterConfig(cpus_per_worker=1))) == 2
    assert len(plan_workers(small, "cpu", ClusterConfig(workers_per_node=5))) == 2  # capped: one core each at least
    assert plan_workers(small, "cuda", ClusterConfig()) == []


def test_chunks_keep_a_tasks_candidates_together_and_split_evenly():
    ids = ["a", "b", "a", "c", "b"]
    assert plan_chunks(ids, 2) == [[0, 2, 1], [4, 3]]
    assert plan_chunks(ids, 3) == [[0, 2], [1, 4], [3]]
    assert plan_chunks(ids, 2, chunk_size=2) == [[0, 2], [1, 4], [3]]
    assert plan_chunks(ids, 10) == [[0], [2], [1], [4], [3]]
    assert plan_chunks([], 4) == []


def test_retries_split_a_chunk_in_two():
    assert split_for_retry([4, 7, 9]) == [[4, 7], [9]]
    assert split_for_retry([4, 7, 9, 1]) == [[4, 7], [9, 1]]
    assert split_for_retry([5]) == [[5]]


def test_a_lost_candidate_is_a_runtime_error_with_its_reason(relu_task):
    cand = Candidate(task_id=relu_task.task_id, source="x = 1", candidate_id="c7")
    r = lost_verdict(relu_task, cand, "cpu", "its worker died")
    assert (r.task_id, r.candidate_id, r.status, r.score, r.correct) == (relu_task.task_id, "c7", Status.RUNTIME_ERROR, 0.0, False)
    assert r.error == "evaluator: its worker died" and r.fault is Fault.EVALUATOR  # never reused for a repeat
    assert r.feedback


def test_batch_evaluator_is_this_machines_evaluator_unless_the_cluster_is_enabled(cache_dir):
    ev = batch_evaluator(EvalConfig(backend="cpu", cache_dir=str(cache_dir)), ClusterConfig(enabled=False))
    assert type(ev) is Evaluator
    ev.close()


def test_the_cluster_refuses_gpu_indices_of_one_machine():
    with pytest.raises(ValueError, match="leave evaluation.gpus empty"):
        ClusterEvaluator(EvalConfig(backend="cuda", gpus=[0]), ClusterConfig(enabled=True))


# ------------------------------------------------------------------------------------- a real cluster


@pytest.fixture(scope="module")
def local_ray():
    """A real one-machine Ray cluster with the 2 cores CI has (no dashboard)."""
    ray.init(num_cpus=2, include_dashboard=False, namespace="kevin-test", log_to_driver=False)
    yield
    ray.shutdown()


def _config(cache_dir) -> EvalConfig:
    return EvalConfig(backend="cpu", timing_trials=20, warmup_trials=2, timeout_s=30, cache_dir=str(cache_dir))


def _item(task, body: str, name: str, candidate_id: str = "") -> tuple:
    return task, Candidate(task_id=task.task_id, source=cpp_solution(body, name=name), candidate_id=candidate_id or name)


def _honest(task, n: int, prefix: str) -> list[tuple]:
    """``n`` correct candidates whose sources are those of the first batch (compiled then, so the kill tests spend
    their time running, not compiling, when the module runs in order)."""
    return [_item(task, RELU_BODY, ("c_ok", "c_ok2")[i % 2], f"{prefix}{i}") for i in range(n)]


def test_a_cuda_evaluator_on_a_cluster_without_gpus_says_so(local_ray):
    with pytest.raises(RuntimeError, match="offers no GPUs"):
        ClusterEvaluator(EvalConfig(backend="cuda"), ClusterConfig(enabled=True))


def test_verdicts_of_every_kind_come_back_in_order_from_two_workers(local_ray, cache_dir, relu_task):
    wrong = RELU_BODY.replace("in[i] > 0.f ? in[i] : 0.f", "in[i]")
    broken = RELU_BODY.replace("auto y = torch::empty_like(xc);", "auto y = torch::empty_like(xc)\n    undeclared_thing;")
    crash = RELU_BODY.replace("return y;", "volatile float* p = nullptr; *p = 1.0f; return y;")
    items = [_item(relu_task, RELU_BODY, "c_ok"), _item(relu_task, wrong, "c_wrong"), _item(relu_task, broken, "c_cerr"),
             _item(relu_task, crash, "c_segv"),
             (relu_task, Candidate(task_id=relu_task.task_id, source="this is not python", candidate_id="c_junk")),
             _item(relu_task, RELU_BODY, "c_ok2")]
    seen: list[str] = []
    with ClusterEvaluator(_config(cache_dir), ClusterConfig(enabled=True, workers_per_node=2)) as cluster:
        workers = cluster.workers()
        assert len(workers) == 2 and len({w.pid for w in workers}) == 2
        assert all(w.num_cpus == 1 and w.compile_workers == 1 and w.devices == ["cpu"] and w.gpu_ids == [] for w in workers)
        results = cluster.evaluate_many(items, progress=lambda r: seen.append(r.candidate_id))
        after = {w.label: w for w in cluster.workers()}
        report = cluster.last_report

    assert [r.candidate_id for r in results] == ["c_ok", "c_wrong", "c_cerr", "c_segv", "c_junk", "c_ok2"]
    assert [r.status for r in results] == [Status.CORRECT, Status.INCORRECT, Status.COMPILE_ERROR, Status.RUNTIME_ERROR,
                                           Status.PARSE_ERROR, Status.CORRECT]
    ok = results[0]
    assert ok.runtime_ms > 0 and ok.baseline_ms > 0 and ok.score == pytest.approx(0.3 + ok.speedup)
    assert "undeclared_thing" in results[2].error
    assert "SIGSEGV" in results[3].error or "SIGILL" in results[3].error
    assert sorted(seen) == sorted(r.candidate_id for r in results)  # progress once per candidate
    # One task, two workers: the batch was split in two halves, each judged by its own worker.
    labels = sorted(after)
    assert report.judged_by == [labels[0]] * 3 + [labels[1]] * 3 or report.judged_by == [labels[1]] * 3 + [labels[0]] * 3
    assert [after[label].judged for label in labels] == [3, 3]
    assert report.failures == [] and report.replaced == [] and report.given_up == []


def _kill_a_busy_worker(cluster: ClusterEvaluator, deadline_s: float = 60.0) -> tuple[str, int]:
    """SIGKILL the process of the first worker seen with candidates in hand; (its label, its pid)."""
    end = time.monotonic() + deadline_s
    while time.monotonic() < end:
        for info in cluster.workers():
            if info.busy:
                os.kill(info.pid, signal.SIGKILL)
                return info.label, info.pid
        time.sleep(0.2)
    raise AssertionError("no worker was seen busy")


def _evaluate_in_thread(cluster: ClusterEvaluator, items: list) -> tuple[threading.Thread, list]:
    out: list = []
    # With the progress bar on (rich, on stderr), so a crash in it would show here too.
    thread = threading.Thread(target=lambda: out.append(cluster.evaluate_many(items, show_progress=True)), daemon=True)
    thread.start()
    return thread, out


def test_a_worker_killed_mid_batch_is_replaced_and_its_candidates_are_judged(local_ray, cache_dir, relu_task):
    items = _honest(relu_task, 4, "k_ok")
    with ClusterEvaluator(_config(cache_dir), ClusterConfig(enabled=True, workers_per_node=2)) as cluster:
        thread, out = _evaluate_in_thread(cluster, items)
        label, old_pid = _kill_a_busy_worker(cluster)
        thread.join(timeout=240)
        assert not thread.is_alive()
        report = cluster.last_report
        # Ray restarts it in place (the batch may have ended before it was back: then workers() sees it return).
        end = time.monotonic() + 60
        while len(after := {w.label: w for w in cluster.workers()}) < 2 and time.monotonic() < end:
            time.sleep(0.5)
        replacements = cluster.replacements

    results = out[0]
    assert [r.candidate_id for r in results] == [f"k_ok{i}" for i in range(4)]
    assert [r.status for r in results] == [Status.CORRECT] * 4, [r.error for r in results]
    assert len(report.failures) == 1 and report.failures[0].startswith(f"{label}: its process died")
    assert sorted(after) == sorted({label, *report.judged_by}) and after[label].pid != old_pid
    assert replacements == [f"{label}: pid {old_pid} -> {after[label].pid}"]
    assert set(report.replaced) <= set(replacements) and report.given_up == []
    assert all(report.judged_by)  # every verdict came from a worker, none was given up


def test_candidates_come_back_as_runtime_errors_when_their_attempts_are_spent(local_ray, cache_dir, relu_task):
    items = _honest(relu_task, 2, "d_ok")
    cfg = ClusterConfig(enabled=True, workers_per_node=2, chunk_size=1, max_attempts=1)
    with ClusterEvaluator(_config(cache_dir), cfg) as cluster:
        thread, out = _evaluate_in_thread(cluster, items)
        label, _ = _kill_a_busy_worker(cluster)
        thread.join(timeout=240)
        assert not thread.is_alive()
        report = cluster.last_report

    results = out[0]
    lost = [i for i, by in enumerate(report.judged_by) if by == ""]
    assert len(lost) == 1
    (i,) = lost
    kept = 1 - i
    assert results[i].candidate_id == f"d_ok{i}" and results[i].status is Status.RUNTIME_ERROR and results[i].score == 0.0
    assert "no verdict after 1 attempt(s)" in results[i].error and f"{label}: its process died" in report.failures[0]
    assert results[kept].status is Status.CORRECT and report.judged_by[kept] != label
