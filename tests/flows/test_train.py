"""The training flow end to end on the cpu backend with a tiny model and the real evaluator, under Prefect's test
harness: what it writes, tracks and shows; `kevin train` killed with SIGKILL and resumed; one run through a real
`transformers serve` with the weights synced after each update."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from kevin.records.jsonl import read_jsonl
from kevin.records.rollout import TrainingSample, load_records
from tests.conftest import REPO
from tests.flows.conftest import mlflow_run, replay_params, write_params

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")

PARAMS = REPO / "params.yaml"


def artifact_paths(client, run_id: str, path: str = "") -> list[str]:
    out = []
    for item in client.list_artifacts(run_id, path):
        out += artifact_paths(client, run_id, item.path) if item.is_dir else [item.path]
    return out


def weights(checkpoint: Path) -> dict:
    from kevin.training.checkpoint import load_safetensors_dir

    return load_safetensors_dir(checkpoint / "model")


def generated_texts(out: Path, step: int, turn: int) -> list[str]:
    rows = read_jsonl(out / "steps" / f"step_{step:06d}" / "rollout" / f"generated_{turn:03d}.jsonl")
    return [row["output"]["text"] for row in rows]


def statuses(out: Path, step: int, turn: int) -> list[str]:
    rows = read_jsonl(out / "steps" / f"step_{step:06d}" / "rollout" / f"turn_{turn:03d}.jsonl")
    return [row["result"]["status"] for row in rows]


@pytest.fixture(scope="module")
def uninterrupted(harness, model_dirs, split_file, cache_dir, tmp_path_factory):
    """One uninterrupted run of the flow in this process (2 steps), for the tests below to read and compare with."""
    import torch

    from flows.train import train

    root = tmp_path_factory.mktemp("straight")
    params = replay_params(root / "run.yaml", "straight", model_dirs["tiny"], split_file, cache_dir)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # a tiny model's generation is op-bound: extra threads only fight over 2 busy cores
    try:
        state = train(params=[str(PARAMS), str(params)], project_dir=str(root), return_state=True)
    finally:
        torch.set_num_threads(threads)
    return {"state": state, "root": root, "out": root / "outputs" / "straight", "params": params}


def test_the_flow_end_to_end_under_the_test_harness(uninterrupted, model_dirs):
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import ArtifactFilter, ArtifactFilterKey, FlowRunFilter, FlowRunFilterId

    state, out = uninterrupted["state"], uninterrupted["out"]
    assert state.is_completed() and state.name == "Completed" and state.message == "2 of 2 steps"
    result = state.result()
    # Per step and task: trajectory 0 replays the reference (turn 0 correct, turn 1 no code), trajectory 1 is the
    # tiny model's text: 2 correct kernels and 6 parse errors a step.
    assert result["verdicts"] == {"correct": 4, "parse_error": 12}
    assert result["steps_done"] == 2 and result["stop_reason"] == ""
    assert set(result["score_per_turn"]) == {0, 1} and all(result["score_per_turn"][s][1] == 0.0 for s in (0, 1))
    assert result["checkpoint"] == str(out / "checkpoints" / "step_000001")

    # Rewards and advantages (gamma 0.4): a task's returns are [S, 0, 0, 0] (S the correct kernel's score), so its
    # advantages are (R - S/4) / (std + 1e-4) with std = S/2 (unbiased, over the task's 2 x 2 samples).
    samples = load_records(out / "steps" / "step_000000" / "samples.jsonl", TrainingSample)
    turns = {(r["task_id"], r["trajectory"], r["turn"]): r for r in
             read_jsonl(out / "steps" / "step_000000" / "rollout" / "turn_000.jsonl")}
    for task in ("level1/01_relu", "level1/03_sigmoid"):
        score = turns[(task, 0, 0)]["result"]["score"]
        assert score > 0.3
        got = {(s.trajectory, s.turn): (s.reward, s.advantage) for s in samples if s.task_id == task}
        assert got[(0, 0)] == pytest.approx((score, 0.75 * score / (score / 2 + 1e-4)))
        for key in ((0, 1), (1, 0), (1, 1)):
            assert got[key] == pytest.approx((0.0, -0.25 * score / (score / 2 + 1e-4)))

    # Each step's judged kernels in one small file, the same verdicts its rollout holds (8 a step).
    from kevin.pipeline import KERNELS_FILE, read_step_verdicts

    def key(row):
        return row["candidate_id"]

    in_rollouts = sorted((v for v in read_step_verdicts(out) if v["step"] == 0), key=key)
    kernels = sorted(read_jsonl(out / "steps" / "step_000000" / KERNELS_FILE), key=key)
    assert len(kernels) == 8 and kernels == [{k: v for k, v in row.items() if k != "step"} for row in in_rollouts]

    # The update moved the weights; 2 steps x 2 optimiser steps were taken.
    from transformers import AutoModelForCausalLM

    initial = AutoModelForCausalLM.from_pretrained(model_dirs["tiny"]).state_dict()
    trained = weights(out / "checkpoints" / "step_000001")
    assert any(not (trained[k] == initial[k]).all() for k in trained)
    state_file = json.loads((out / "checkpoints" / "step_000001" / "trainer_state.json").read_text())
    assert state_file["optimizer_steps"] == 4
    # Every task taught (a correct kernel among wrong ones), so none rests.
    import torch

    sampler = torch.load(out / "checkpoints" / "step_000001" / "state.pt", weights_only=False)["extra"]["sampler"]
    assert (sampler["rest_epochs"], sampler["resting"]) == (1, {})

    # Prefect: the flow run is named after the experiment, one task run per step of the recipe, an artifact a step.
    with get_client(sync_client=True) as client:
        flow_run = client.read_flow_run(state.state_details.flow_run_id)
        assert flow_run.name == "straight"
        names = {t.name for t in client.read_task_runs(flow_run_filter=FlowRunFilter(id=FlowRunFilterId(any_=[flow_run.id])))}
        for step in (1, 2):  # counted from 1 in the UI, as in the report and MLflow
            expected = {f"sample-batch-{step}", f"aggregate-rewards-{step}", f"grpo-update-{step}",
                        f"collapse-check-{step}", f"checkpoint-{step}", f"sync-weights-{step}", f"track-{step}"}
            expected |= {f"{stage}-{step}-turn-{turn}-wave-1" for stage in ("generate", "parse", "evaluate") for turn in (1, 2)}
            assert expected <= names
        assert not any(n.startswith("sample-batch-0") for n in names)
        assert flow_run.tags == []  # a fresh run: not tagged resumed
        artifacts = client.read_artifacts(artifact_filter=ArtifactFilter(key=ArtifactFilterKey(like_="straight-")))
    # Keyed by the run (8 characters of its MLflow run id) and the step as users count it, from 1.
    run_key = result["mlflow"]["run_id"][:8]
    reports = {a.key: a.data for a in artifacts}
    assert set(reports) == {f"straight-{run_key}-step-1", f"straight-{run_key}-step-2"}
    report = reports[f"straight-{run_key}-step-1"]
    for heading in ("## Verdicts", "## Rewards per turn", "## Best speedup per task", "## Seconds per phase"):
        assert heading in report
    assert "| correct | 2 |" in report and "| parse_error | 6 |" in report and "| level1/01_relu | 4 | 1 |" in report
    assert report == (out / "steps" / "step_000000" / "report.md").read_text()

    # MLflow: one run named after the experiment, every namespace per step, the artifacts of docs/tracking.md.
    client, run = mlflow_run(uninterrupted["root"])
    assert run.info.status == "FINISHED" and run.info.run_name == "straight"
    assert run.data.tags["model"] == str(model_dirs["tiny"]) and run.data.tags["backend"] == "cpu"
    assert run.data.params["experiment.steps"] == "2" and run.data.params["train.total_steps"] == "2"
    for key in ("reward/turn_1", "reward/turn_2", "reward/return_mean", "eval/status/correct", "eval/best_speedup_mean",
                "loss/loss", "loss/grad_norm", "monitor/not_okay_ratio", "monitor/junk_share", "perf/generate_s",
                "perf/evaluate_s", "perf/update_s", "perf/step_s", "perf/rollout_tokens_per_s"):
        assert sorted(m.step for m in client.get_metric_history(run.info.run_id, key)) == [0, 1], key
    assert [m.value for m in client.get_metric_history(run.info.run_id, "eval/status/correct")] == [0.25, 0.25]
    paths = artifact_paths(client, run.info.run_id)
    for step in ("step_000000", "step_000001"):
        for name in ("rollout.jsonl", "kernels.md", "tasks.md", "report.md"):
            assert f"steps/{step}/{name}" in paths
    for name in ("config.yaml", "steps.md", "plots/reward_per_turn.png", "plots/not_okay_ratio.png"):
        assert name in paths


def cli(*args: str, harness_url: str, cwd: Path, **popen) -> subprocess.Popen:
    """`python -m kevin_cli train ...` in a subprocess running this checkout, against the harness's server."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("PREFECT_")}
    env.update(PYTHONPATH=str(REPO), PREFECT_API_URL=harness_url, PREFECT_HOME=str(cwd / "prefect"),
               PREFECT_SERVER_ANALYTICS_ENABLED="false", OMP_NUM_THREADS="1")
    return subprocess.Popen([sys.executable, "-m", "kevin_cli", "train", *args], cwd=cwd, env=env, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, **popen)


def test_kill_9_and_resume_lose_no_judged_turn(uninterrupted, harness, model_dirs, split_file, cache_dir, tmp_path,
                                                one_thread):
    import torch

    from flows.train import load_config
    from kevin.experiment.policies import load_model
    from kevin.policy.hf import HFPolicy
    from kevin.training.trainer import GRPOTrainer

    params = replay_params(tmp_path / "run.yaml", "killed", model_dirs["tiny"], split_file, cache_dir)
    args = ("--params", str(PARAMS), "--params", str(params))
    out = tmp_path / "outputs" / "killed"
    step1 = out / "steps" / "step_000001" / "rollout"

    # Kill -9 once step 1's first turn is judged: step 0 is checkpointed, step 1's second turn is under way.
    proc = cli(*args, harness_url=harness, cwd=tmp_path)
    deadline = time.monotonic() + 900
    while not (step1 / "turn_000.jsonl").is_file():
        assert proc.poll() is None, proc.stdout.read()[-3000:]
        assert time.monotonic() < deadline, "the run never finished step 1's first turn"
        time.sleep(0.2)
    proc.send_signal(signal.SIGKILL)
    proc.communicate(timeout=60)
    assert proc.returncode == -signal.SIGKILL
    assert not (out / "checkpoints" / "step_000001").exists()
    kept = {p: p.read_bytes() for p in [*step1.glob("*_000.jsonl"), *(out / "steps" / "step_000000").rglob("*.jsonl")]}
    saved_at = json.loads((out / "checkpoints" / "step_000000" / "trainer_state.json").read_text())["saved_at"]

    resumed = cli(*args, "--resume", harness_url=harness, cwd=tmp_path)
    log = resumed.communicate(timeout=900)[0]
    assert resumed.returncode == 0, log[-3000:]
    assert "finished 2 of 2 steps" in log

    # Nothing persisted was done again: step 0 (checkpointed) and step 1's first turn (generated, judged) are
    # byte for byte what the killed run wrote, verdicts and their timings included.
    for path, data in kept.items():
        assert path.read_bytes() == data, path
    assert json.loads((out / "checkpoints" / "step_000000" / "trainer_state.json").read_text())["saved_at"] == saved_at
    assert len(read_jsonl(step1 / "verdicts_000.jsonl")) == 4 and len(read_jsonl(step1 / "verdicts_001.jsonl")) == 4

    # Against an uninterrupted run: the same batches, the same verdicts, and before the weights first differ, the same
    # responses token for token. Kernel timings are measurements: they enter the rewards and the next turn's
    # feedback ("... runs at 0.41x ..."), so two runs, interrupted or not, train slightly different weights after
    # their first update, and sample differently from then on (docs/training.md, "Resume").
    straight = uninterrupted["out"]
    for step in (0, 1):
        folder = f"steps/step_{step:06d}"
        assert json.loads((out / folder / "batch.json").read_text()) == json.loads((straight / folder / "batch.json").read_text())
        for turn in (0, 1):
            assert statuses(out, step, turn) == statuses(straight, step, turn)
            if step == 0:
                assert generated_texts(out, step, turn) == generated_texts(straight, step, turn)
    for run in (out, straight):
        assert json.loads((run / "checkpoints" / "step_000001" / "trainer_state.json").read_text())["optimizer_steps"] == 4

    # What the resume itself adds is nothing: from step 0's checkpoint, the policy's sampler state saved after
    # step 1's first turn gives the second turn's responses token for token, and one update on step 1's samples
    # gives the final weights bit for bit.
    config = load_config([str(PARAMS), str(params)], [])
    model, tokenizer = load_model(config)
    trainer = GRPOTrainer(model, config.train, tokenizer=tokenizer)
    trainer.load_checkpoint(out / "checkpoints" / "step_000000")
    policy = HFPolicy(trainer.model, tokenizer, config.sampling)
    policy.load_state_dict(torch.load(step1 / "policy_000.pt", weights_only=False))
    sampled = [row for row in read_jsonl(step1 / "generated_001.jsonl") if row["trajectory"] == 1]
    again = policy([row["context"]["text"] for row in sampled])
    assert [o.text for o in again] == [row["output"]["text"] for row in sampled]
    trainer.update(load_records(step1.parent / "samples.jsonl", TrainingSample))
    final = weights(out / "checkpoints" / "step_000001")
    assert all(torch.equal(param.detach(), final[name]) for name, param in trainer.model.named_parameters())

    # Prefect: both flow runs are named after the experiment; only the one that continued the run is tagged.
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterName

    with get_client(sync_client=True) as prefect:
        flow_runs = prefect.read_flow_runs(flow_run_filter=FlowRunFilter(name=FlowRunFilterName(like_="killed")))
    assert sorted((r.name, r.tags) for r in flow_runs) == [("killed", []), ("killed", ["resumed"])]

    # One MLflow run, resumed once, each step logged once.
    client, run = mlflow_run(tmp_path)
    assert run.info.status == "FINISHED" and run.data.tags["resumes"] == "1"
    assert [m.step for m in client.get_metric_history(run.info.run_id, "reward/score_mean")] == [0, 1]

    # A finished run given more steps goes on from its last checkpoint (a second leg of a learning run): the steps
    # done stay as they were, the new one starts from step 1's weights, and MLflow's run gets the new step only.
    done = {p: p.read_bytes() for p in (out / "steps").rglob("*.jsonl")}
    longer = cli(*args, "--set", "experiment.steps=3", "--resume", harness_url=harness, cwd=tmp_path)
    log = longer.communicate(timeout=900)[0]
    assert longer.returncode == 0, log[-3000:]
    assert "finished 3 of 3 steps" in log
    assert all(path.read_bytes() == data for path, data in done.items())
    assert json.loads((out / "checkpoints" / "step_000002" / "trainer_state.json").read_text())["optimizer_steps"] == 6
    client, run = mlflow_run(tmp_path)
    assert run.info.status == "FINISHED" and run.data.tags["resumes"] == "2"
    assert [m.step for m in client.get_metric_history(run.info.run_id, "reward/score_mean")] == [0, 1, 2]


def test_waves_judge_one_wave_while_the_next_generates_and_change_nothing_else(uninterrupted, harness, model_dirs,
                                                                              split_file, cache_dir, tmp_path,
                                                                              one_thread):
    """experiment.rollout_waves=2: trajectory 0 of every task (the replayed reference) is wave 0, trajectory 1 (the
    tiny model) wave 1. Wave 1's turn is generated while wave 0's kernels are judged; the step holds what the
    uninterrupted run's first step holds: the same responses token for token, verdicts, rewards and advantages."""
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterId

    from flows.train import train

    params = replay_params(tmp_path / "run.yaml", "waves", model_dirs["tiny"], split_file, cache_dir,
                           experiment={"rollout_waves": 2, "steps": 1})
    state = train(params=[str(PARAMS), str(params)], project_dir=str(tmp_path), return_state=True)
    assert state.is_completed(), state.message
    out, straight = tmp_path / "outputs" / "waves", uninterrupted["out"]
    step = out / "steps" / "step_000000"
    assert json.loads((step / "batch.json").read_text())["waves"] == 2
    for wave in (0, 1):
        meta = json.loads((step / "rollout" / f"wave_{wave}" / "rollout.json").read_text())
        assert meta["trajectory_indices"] == [wave] and meta["complete"] is True

    def by_slot(rows):
        return {(r["task_id"], r["trajectory"], r["turn"]): r for r in rows}

    mine = by_slot(r for wave in (0, 1) for turn in (0, 1)
                   for r in read_jsonl(step / "rollout" / f"wave_{wave}" / f"turn_{turn:03d}.jsonl"))
    theirs = by_slot(r for turn in (0, 1)
                     for r in read_jsonl(straight / "steps" / "step_000000" / "rollout" / f"turn_{turn:03d}.jsonl"))
    assert set(mine) == set(theirs) and len(mine) == 8
    for key, row in mine.items():
        assert row["response"] == theirs[key]["response"], key
        assert row["result"]["status"] == theirs[key]["result"]["status"], key
    samples = load_records(step / "samples.jsonl", TrainingSample)
    for task in ("level1/01_relu", "level1/03_sigmoid"):
        score = mine[(task, 0, 0)]["result"]["score"]
        got = {(s.trajectory, s.turn): (s.reward, s.advantage) for s in samples if s.task_id == task}
        assert got[(0, 0)] == pytest.approx((score, 0.75 * score / (score / 2 + 1e-4)))
        for key in ((0, 1), (1, 0), (1, 1)):
            assert got[key] == pytest.approx((0.0, -0.25 * score / (score / 2 + 1e-4)))

    # The overlap: wave 1 started generating turn 0 before wave 0's kernels of turn 0 were judged, and the rollout's
    # wall time is shorter than its phases added up.
    spans = json.loads((step / "spans.json").read_text())
    assert spans["generate/0/1"][0] < spans["evaluate/0/0"][1]
    # ... and the step's baselines were timed before any wave generated, on a quiet device.
    assert spans["baselines"][1] <= spans["generate/0/0"][0]
    summary = json.loads((step / "summary.json").read_text())["seconds"]
    busy = sum(summary[p] for p in ("generate", "parse", "evaluate"))
    assert summary["rollout_wall"] < busy
    with get_client(sync_client=True) as client:
        names = {t.name for t in client.read_task_runs(
            flow_run_filter=FlowRunFilter(id=FlowRunFilterId(any_=[state.state_details.flow_run_id])))}
    assert {f"{stage}-1-turn-{turn}-wave-{wave}" for stage in ("generate", "parse", "evaluate")
            for turn in (1, 2) for wave in (1, 2)} <= names


def test_a_run_through_transformers_serve_syncs_the_weights_after_each_update(harness, model_dirs, split_file,
                                                                                cache_dir, tmp_path, one_thread):
    import shutil

    import torch

    from flows.train import train
    from tests.servers import free_port

    pytest.importorskip("fastapi")
    served = shutil.copytree(model_dirs["tiny"], tmp_path / "base")  # transformers serve serves folders by path
    port = free_port()
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false", "OMP_NUM_THREADS": "1"}
    serve = ("import sys; from transformers.cli.transformers import main; sys.exit(main())")
    with open(tmp_path / "serve.log", "wb") as log:
        server = subprocess.Popen([sys.executable, "-c", serve, "serve", "--host", "127.0.0.1", "--port", str(port),
                                   "--device", "cpu"], stdout=log, stderr=subprocess.STDOUT, env=env)
    try:
        import urllib.request

        deadline = time.monotonic() + 120
        while True:
            assert server.poll() is None, (tmp_path / "serve.log").read_text()[-3000:]
            try:
                urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2).read()
                break
            except OSError:
                assert time.monotonic() < deadline, "transformers serve did not come up"
                time.sleep(0.25)
        params = write_params(
            tmp_path / "serve.yaml", max_response_tokens=16, response_length_schedule={},
            experiment={"name": "served", "steps": 2, "tasks_per_batch": 1, "split": str(split_file)},
            policy={"backend": "openai", "model": str(served), "weight_sync": "folder"},
            openai={"base_url": f"http://127.0.0.1:{port}/v1", "api_key_env": "", "max_concurrency": 2,
                    "timeout_s": 120.0, "retries": 1, "backoff_s": 0.1},
            rollout={"trajectories": 2, "turns": 1}, evaluation={"cache_dir": str(cache_dir)})
        state = train(params=[str(PARAMS), str(params)], project_dir=str(tmp_path), return_state=True)
    finally:
        server.terminate()
        server.wait(timeout=30)
    assert state.is_completed(), state.message
    out = tmp_path / "outputs" / "served"
    # Each update's weights went to the server as a new folder; step 1 was generated from the first of them.
    first, second = out / "served" / "v000001", out / "served" / "v000002"
    assert (first / "model.safetensors").is_file() and (second / "model.safetensors").is_file()
    used = torch.load(out / "steps" / "step_000001" / "rollout" / "policy_000.pt", weights_only=False)
    assert used["model"] == str(first.resolve()) and used["requests"] == 4
    from kevin.training.checkpoint import load_safetensors_dir

    pushed, checkpoint = load_safetensors_dir(second), weights(out / "checkpoints" / "step_000001")
    assert all(torch.equal(pushed[k], checkpoint[k]) for k in checkpoint)
    rows = read_jsonl(out / "steps" / "step_000000" / "rollout" / "generated_000.jsonl")
    assert len(rows) == 2 and all(r["output"]["token_ids"] == [] for r in rows)  # the server gives none: we tokenize
    samples = load_records(out / "steps" / "step_000000" / "samples.jsonl", TrainingSample)
    assert all(s.completion_token_ids for s in samples)
