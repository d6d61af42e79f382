"""The device scripts' pure parts: what a run's pack keeps (scripts/run_pack_filter.sh) and how the carried files are
shared among device calls (scripts/device_carry.py)."""

from __future__ import annotations

import importlib.util
import subprocess

import pytest

from tests.conftest import REPO

RUN = "outputs/h200-learn-rest"


def pack(paths: list[str], newest: str) -> list[str]:
    out = subprocess.run(["bash", str(REPO / "scripts" / "run_pack_filter.sh"), RUN, newest], input="\n".join(paths),
                         capture_output=True, text=True, check=True)
    return out.stdout.splitlines()


def test_the_pack_keeps_the_newest_checkpoint_and_the_rollouts_after_it():
    paths = [
        f"{RUN}/checkpoints/step_000009/model/adapter.safetensors",
        f"{RUN}/checkpoints/step_000010/model/adapter.safetensors",
        f"{RUN}/steps/step_000000/kernels.jsonl",
        f"{RUN}/steps/step_000000/rollout/wave_0/turn_000.jsonl",
        f"{RUN}/steps/step_000010/rollout/wave_1/verdicts_001.jsonl",
        f"{RUN}/steps/step_000010/rollout/wave_1/policy_001.pt",
        f"{RUN}/steps/step_000011/rollout/wave_0/generated_000.jsonl",
        f"{RUN}/mlflow.db",
        "outputs/h200-sft/model/adapter_model.safetensors",
        f"{RUN}-eval-last-train/report.json",
    ]
    assert pack(paths, "10") == [paths[1], paths[2], paths[6], paths[7], paths[8], paths[9]]
    assert pack(paths, "") == paths  # no checkpoint yet: everything goes on


def test_files_are_shared_first_fit_largest_first():
    spec = importlib.util.spec_from_file_location("device_carry", REPO / "scripts" / "device_carry.py")
    carry = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(carry)
    # a (40) opens call 1, b (30) does not fit beside it and opens call 2, c (25) joins b, d (10) fits beside a.
    assert carry.plan({"a": 40, "b": 30, "c": 25, "d": 10}, 60) == [["a", "d"], ["b", "c"]]
    with pytest.raises(SystemExit, match="split it"):
        carry.plan({"big": 61}, 60)
