"""benchmarks/bench_train_step.py: its tokenizer, argument checks, oracle mapping, and one tiny step on the CPU."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
pytest.importorskip("transformers")


@pytest.fixture(scope="module")
def bench():
    spec = importlib.util.spec_from_file_location("bench_train_step", REPO / "benchmarks" / "bench_train_step.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up by name
    spec.loader.exec_module(module)
    yield module
    sys.modules.pop(spec.name, None)


CPU = ["--preset", "tiny", "--device", "cpu", "--backend", "cpu"]


def test_tokenizer_round_trips_and_has_a_chat_template(bench):
    tok = bench.build_tokenizer(["def forward(self, x):\n    return torch.relu(x)\n"] * 3, vocab_size=600)
    assert len(tok) == 600 and bench.learned_tokens(tok) < 600  # the rest is reserved tokens
    text = "ModelNew(nn.Module) é ✓"
    assert tok.decode(tok.encode(text, add_special_tokens=False)) == text  # byte-level: any text
    prompt = tok.apply_chat_template([{"role": "user", "content": "hi"}], add_generation_prompt=True, tokenize=False)
    assert prompt == "<|user|>\nhi<|end|>\n<|assistant|>\n"
    ids = tok.encode(prompt, add_special_tokens=False)
    assert tok.convert_tokens_to_ids("<|user|>") == ids[0] and tok.eos_token == "<|end|>"
    assert tok.decode([tok.convert_tokens_to_ids("<|reserved_0|>")], skip_special_tokens=True) == ""


@pytest.mark.parametrize("extra, message", [
    (["--tasks", "no_such_task"], "unknown task"),
    (["--oracle-share", "1.5"], "oracle-share"),
    (["--trajectories", "0"], "trajectories"),
])
def test_bad_arguments_are_refused(bench, capsys, extra, message):
    with pytest.raises(SystemExit) as exc:
        bench.parse_args(CPU + extra)
    assert exc.value.code == 2 and message in capsys.readouterr().err


def test_cuda_without_a_gpu_is_refused(bench, capsys):
    import torch

    if torch.cuda.is_available():
        pytest.skip("a GPU is visible")
    with pytest.raises(SystemExit):
        bench.parse_args(["--preset", "tiny", "--device", "cuda", "--backend", "cpu"])
    assert "no CUDA GPU" in capsys.readouterr().err


def test_oracle_replays_by_prompt_position_and_checks_the_order(bench):
    from kevin.rollout.loop import GenerationOut

    class Policy:
        config = tokenizer = None

        def __call__(self, prompts):
            return [GenerationOut(text=f"sampled {p}", token_ids=[1, 2]) for p in prompts]

    tasks = bench.select_tasks("01_relu,02_gelu")
    sources = {t.task_id: f"SOURCE-{t.name}" for t in tasks}
    gen = bench.OracleMixGenerate(Policy(), tasks, 3, 1, {t.task_id: f"ORACLE-{t.name}" for t in tasks}, sources,
                                  bench.PeakMemory("cpu"))
    prompts = [f"p{i} {sources[tasks[i // 3].task_id]}" for i in range(6)]
    outs = gen(prompts)
    assert [o.text for o in outs] == ["ORACLE-01_relu", f"sampled {prompts[1]}", f"sampled {prompts[2]}",
                                      "ORACLE-02_gelu", f"sampled {prompts[4]}", f"sampled {prompts[5]}"]
    assert outs[0].token_ids == [] and gen.calls[0]["sampled"] == 4 and gen.calls[0]["tokens"] == 8
    with pytest.raises(RuntimeError, match="order"):
        gen(prompts[3:] + prompts[:3])


@pytest.mark.slow
def test_one_tiny_step_on_the_cpu(bench, tmp_path, cache_dir):
    out = tmp_path / "step.md"
    figures = bench.main(CPU + ["--tasks", "01_relu", "--trajectories", "2", "--max-new-tokens", "8",
                                "--cache", str(cache_dir), "--out", str(out)])
    assert json.loads(out.with_suffix(".json").read_text())["model"]["parameters"] == figures["model"]["parameters"]
    assert "replayed" in out.read_text()
    rewards = figures["rewards"]
    assert all(row["score_oracle"] > 0.3 and row["score_model"] == 0.0 for row in rewards["per_turn"])
    assert rewards["nonzero_advantages"] == figures["throughput"]["samples"] == 4
    assert figures["verdicts"]["evaluator"] == {"correct": 2}
    assert figures["throughput"]["generated_tokens"] > 0 and figures["seconds"]["update"] > 0
    assert [m["grad_norm"] > 0 for m in figures["update_steps"]] == [True, True]
