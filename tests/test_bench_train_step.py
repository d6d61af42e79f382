"""benchmarks/bench_train_step.py as a script (its library parts are tested in tests/policy and tests/rollout)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from tests.conftest import REPO

SCRIPT = str(REPO / "benchmarks" / "bench_train_step.py")
CPU = ["--preset", "tiny", "--device", "cpu", "--backend", "cpu"]


def run(*args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, SCRIPT, *args], capture_output=True, text=True, timeout=900, env=env)


def test_bad_arguments_are_refused_with_exit_code_2():
    r = run(*CPU, "--tasks", "no_such_task", "--oracle-share", "0.5")
    assert r.returncode == 2 and "unknown task 'no_such_task'" in r.stderr


@pytest.mark.slow
def test_one_tiny_step_on_the_cpu(tmp_path, cache_dir):
    pytest.importorskip("transformers")
    out = tmp_path / "step.md"
    r = run(*CPU, "--tasks", "01_relu", "--trajectories", "2", "--max-new-tokens", "8", "--cache", str(cache_dir),
            "--out", str(out))
    assert r.returncode == 0, r.stderr[-3000:]
    figures = json.loads(out.with_suffix(".json").read_text())
    assert "replayed" in out.read_text()
    rewards = figures["rewards"]
    assert all(row["score_oracle"] > 0.3 and row["score_model"] == 0.0 for row in rewards["per_turn"])
    assert rewards["nonzero_advantages"] == figures["throughput"]["samples"] == 4
    assert figures["verdicts"]["evaluator"] == {"correct": 2}
    assert figures["throughput"]["generated_tokens"] > 0 and figures["seconds"]["update"] > 0
    assert [m["grad_norm"] > 0 for m in figures["update_steps"]] == [True, True]
