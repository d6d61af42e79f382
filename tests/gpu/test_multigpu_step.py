"""GPU test (two or more GPUs): the training step with one process per GPU over two GPUs, launched as
scripts/gpu_train_multi.sh launches it (torchrun, NCCL, NVLink multicast off), replicated and under ZeRO-3.

Each process rolls out half of each task's trajectories, judges its kernels on its own GPU, and the update and
checkpoint follow; the figures the script reports are checked for what only a real two-GPU step gives.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import torch

from tests.conftest import REPO

pytestmark = pytest.mark.gpu


@pytest.mark.parametrize("zero", [0, 3], ids=["replicated", "zero3"])
def test_two_process_step_on_two_gpus(zero, tmp_path):
    if torch.cuda.device_count() < 2:
        pytest.skip("needs two GPUs (one process per GPU)")
    if zero == 3:
        pytest.importorskip("deepspeed", reason="not on the device image: scripts/gpu_train_multi.sh carries it")
    results = tmp_path / "results.jsonl"
    env = {**os.environ, "NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1", "NVSHMEM_DISABLE_NVLS": "1"}
    proc = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
                           str(REPO / "scripts" / "gpu_train_multi.py"), "--preset", "tiny", "--zero", str(zero),
                           "--backend", "cuda", "--tasks", "2", "--trajectories", "4", "--turns", "2",
                           "--max-response-tokens", "32", "--work", str(tmp_path / "work"), "--results", str(results)],
                          capture_output=True, text=True, timeout=900, env=env, cwd=REPO, check=False)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    (record,) = [json.loads(line) for line in results.read_text().splitlines()]
    assert record["gpus"] == 2 and record["zero"] == zero and record["samples"] == 2 * 4 * 2
    assert record["verdicts"].get("correct", 0) == 8  # the replayed references (1 of 2 per process and task)
    assert record["nonzero_advantages"] > 0 and record["update_tokens_per_s"] > 0
    ranks = record["ranks"]
    assert [r["rank"] for r in ranks] == [0, 1]
    for r in ranks:  # every GPU generated, judged its own share and held memory of its own
        assert r["prompts"] == 8 and r["judged"] >= 4 and r["generated_tokens"] > 0 and r["peak_gb"] > 0
        assert r["seconds"]["update"] > 0 and "checkpoint" in r["seconds"]
