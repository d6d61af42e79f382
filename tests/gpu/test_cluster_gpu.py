"""GPU test (a machine with two or more GPUs): the Ray cluster evaluator with one GPU per worker.

A local Ray cluster over the machine's GPUs; every worker must own a different GPU (Ray's CUDA_VISIBLE_DEVICES), a
batch of honest and crashing CUDA candidates comes back in order with every worker judging, and a worker killed
mid-batch is restarted on its GPU while its candidates are judged. With OUT set, the layout and the batch's times go
to $OUT/gpu_ray.json. scripts/gpu_ray.sh runs it in one device call.
"""

from __future__ import annotations

import json
import os
import signal
import threading
import time
from pathlib import Path

import pytest

from kevin.evaluation import Candidate, EvalConfig, Status
from kevin.evaluation.isolation import SandboxConfig
from tests.conftest import RELU_CUDA, cuda_solution

ray = pytest.importorskip("ray")  # not on the device image: scripts/gpu_ray.sh carries it

pytestmark = pytest.mark.gpu


def _gpu_count() -> int:
    from kevin.evaluation.hardware import gpu_info

    return len(gpu_info()[0])


@pytest.fixture(scope="module")
def cluster():
    from kevin.evaluation.cluster import ClusterConfig, ClusterEvaluator

    if _gpu_count() < 2:
        pytest.skip("needs two GPUs (one per Ray worker)")
    layers = os.environ.get("KEVIN_TEST_FILESYSTEM", "on")
    config = EvalConfig(backend="cuda", cache_dir=os.environ.get("KEVIN_CACHE_DIR", ""),
                        sandbox=SandboxConfig(filesystem=layers, seccomp=os.environ.get("KEVIN_TEST_SECCOMP", layers)))
    ray.init(include_dashboard=False, namespace="kevin-gpu-test")
    ev = ClusterEvaluator(config, ClusterConfig(enabled=True))
    yield ev
    ev.close()
    ray.shutdown()


def _honest(task, n: int, prefix: str) -> list[tuple]:
    return [(task, Candidate(task_id=task.task_id, source=cuda_solution(RELU_CUDA, name=f"{prefix}{i}"), candidate_id=f"{prefix}{i}"))
            for i in range(n)]


def _write(name: str, data: dict) -> None:
    if os.environ.get("OUT"):
        path = os.path.join(os.environ["OUT"], "gpu_ray.json")
        known = json.loads(Path(path).read_text()) if os.path.exists(path) else {}
        known[name] = data
        Path(path).write_text(json.dumps(known, indent=1, default=str))


def test_each_worker_owns_its_own_gpu(cluster):
    workers = cluster.workers()
    assert len(workers) == _gpu_count()
    assert all(len(w.gpu_ids) == 1 and w.devices == ["cuda:0"] for w in workers)
    assert len({w.gpu_ids[0] for w in workers}) == len(workers)  # no GPU shared
    _write("workers", {w.label: {"gpu": w.gpu_ids, "cores": w.num_cpus, "compile_workers": w.compile_workers,
                                 "pid": w.pid} for w in workers})


def test_a_batch_is_judged_on_every_gpu_in_order(cluster, relu_task):
    crash = RELU_CUDA.replace("if (i < n) out[i]", "if (i < n) out[i + ((int64_t)1 << 40)]")
    items = _honest(relu_task, 6, "g_ok")
    items.insert(3, (relu_task, Candidate(task_id=relu_task.task_id, source=cuda_solution(crash, name="g_crash"),
                                          candidate_id="g_crash")))
    started = time.monotonic()
    results = cluster.evaluate_many(items)
    seconds = time.monotonic() - started
    report = cluster.last_report
    assert [r.candidate_id for r in results] == [c.candidate_id for _, c in items]
    assert [r.status for r in results] == [Status.CORRECT] * 3 + [Status.RUNTIME_ERROR] + [Status.CORRECT] * 3, \
        [r.error[:300] for r in results]
    assert len(set(report.judged_by)) == len(cluster.workers())  # every GPU's worker judged some
    _write("batch", {"seconds": round(seconds, 1), "judged_by": report.judged_by,
                     "speedups": [round(r.speedup, 3) for r in results]})


def test_a_worker_killed_mid_batch_comes_back_on_its_gpu(cluster, relu_task):
    items = _honest(relu_task, 6, "g_kill")
    out: list = []
    thread = threading.Thread(target=lambda: out.append(cluster.evaluate_many(items)), daemon=True)
    thread.start()
    victim = None
    end = time.monotonic() + 120
    while victim is None and time.monotonic() < end:
        victim = next((w for w in cluster.workers() if w.busy), None)
        time.sleep(0.2)
    assert victim is not None, "no worker was seen busy"
    os.kill(victim.pid, signal.SIGKILL)
    thread.join(timeout=400)
    assert not thread.is_alive()
    assert [r.status for r in out[0]] == [Status.CORRECT] * 6, [r.error[:300] for r in out[0]]
    end = time.monotonic() + 120
    while len(back := {w.label: w for w in cluster.workers()}) < _gpu_count() and time.monotonic() < end:
        time.sleep(1)
    assert back[victim.label].pid != victim.pid and back[victim.label].gpu_ids == victim.gpu_ids
    _write("kill", {"failures": cluster.last_report.failures, "replacements": cluster.replacements})
