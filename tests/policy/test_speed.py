"""kevin.policy.speed (the library part of benchmarks/bench_generate.py) and the script itself on the CPU."""

from __future__ import annotations

import json
import subprocess
import sys

import torch

from kevin.policy.speed import Measurement, response_lengths
from tests.conftest import REPO

SCRIPT = str(REPO / "benchmarks" / "bench_generate.py")


def test_response_lengths_count_up_to_the_first_end_token():
    generated = torch.tensor([[4, 5, 1, 0, 0], [4, 5, 6, 7, 8], [2, 9, 9, 1, 0]])
    assert response_lengths(generated, [1, 2]) == [3, 5, 1]


def test_measurement_figures_by_hand():
    m = Measurement("x", batch=4, first_call_s=9.0, seconds=[1.0, 3.0], tokens=[40, 80])
    assert m.tokens_per_s == 30.0  # 120 tokens in 4 s
    assert m.ms_per_step == 4000 / 30  # 120 tokens / 4 rows = 30 steps in 4 s
    assert m.to_dict()["tokens_per_s"] == 30.0


def test_bad_batch_is_refused():
    r = subprocess.run([sys.executable, SCRIPT, "--device", "cpu", "--batch", "2,x"], capture_output=True, text=True,
                       timeout=120)
    assert r.returncode == 2 and "--batch must be comma-separated integers" in r.stderr


def test_a_tiny_run_on_the_cpu_prints_every_backend_side_by_side(tmp_path):
    out = tmp_path / "gen.md"
    r = subprocess.run([sys.executable, SCRIPT, "--device", "cpu", "--preset", "tiny", "--layers", "1", "--batch", "3",
                        "--max-new-tokens", "4", "--reference-tokens", "4", "--repeats", "1",
                        "--tasks", "01_relu,level2/01_linear_relu_add_bias", "--out", str(out)],
                       capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    figures = json.loads(out.with_suffix(".json").read_text())
    rows = {row["name"]: row for row in figures["rows"]}
    assert set(rows) == {"kevin", "kevin reference loop (4 tokens)", "transformers generate (static)"}
    for row in rows.values():
        assert "error" not in row and row["batch"] == 3
        assert 3 <= row["tokens"][0] <= 12 and row["tokens_per_s"] > 0  # 1 to 4 tokens per response
        assert row["prompt_tokens"][0] < row["prompt_tokens"][1]  # prompts of different lengths: left padding
    text = out.read_text()
    assert "| batch | prompt tokens | kevin tokens/s | kevin + torch.compile tokens/s | transformers generate (static)" in text
    assert "\n| 3 | " in text and "| - |" in text  # no compiled row on the CPU
