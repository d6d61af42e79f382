"""The experiment section, the policy's new settings and how a run picks its weight sync: validated, with errors
that say what to do."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from kevin.config import RunConfig
from kevin.experiment.config import ExperimentConfig
from kevin.experiment.policies import sync_mode, weights_folder
from tests.conftest import REPO


def test_profiles_layer_over_params_yaml():
    run = RunConfig.from_files([REPO / "params.yaml", REPO / "configs" / "cpu.yaml"], ["experiment.steps=3"])
    assert (run.experiment.name, run.experiment.steps, run.train.total_steps) == ("cpu-demo", 3, 3)
    assert run.rollout.trajectories == 2 and run.max_response_tokens == run.sampling.max_new_tokens == 384
    assert run.train.lr == 2e-6  # params.yaml's value, which the profile leaves alone
    gpu = RunConfig.from_files([REPO / "params.yaml", REPO / "configs" / "gpu.yaml"], ["policy.model=/models/q"])
    assert gpu.backend == gpu.evaluation.backend == "cuda" and gpu.rollout.trajectories == 16
    assert gpu.experiment.tasks_per_batch == 8 and gpu.max_response_tokens == 16384
    assert gpu.sampling.compile and not run.sampling.compile  # compiled decoding pays over a long GPU run only
    with pytest.raises(ValueError, match=r"train.total_steps is 5 but experiment.steps is 40"):
        RunConfig.from_dict({"train": {"total_steps": 5}})


@pytest.mark.parametrize("run, what", [
    ("h200_learn_zero", {"experiment.name": "h200-learn-zero", "train.lr": 5e-4, "rewards.truncation": "zero",
                         "experiment.rest_barren_epochs": 0}),
    ("h200_learn_rest", {"experiment.name": "h200-learn-rest", "train.lr": 1e-3, "rewards.truncation": "zero",
                         "experiment.rest_barren_epochs": 1}),
])
def test_the_h200_learning_runs_layer_over_the_first(run, what):
    # Each run writes its own folder and MLflow database, and evaluates its own checkpoints.
    config = RunConfig.from_files([REPO / "params.yaml", REPO / "configs" / "h200_learn.yaml",
                                   REPO / "configs" / f"{run}.yaml"])
    for key, value in what.items():
        section, name = key.split(".")
        assert getattr(getattr(config, section), name) == value
    name = what["experiment.name"]
    assert config.tracking.tracking_uri == f"sqlite:///outputs/{name}/mlflow.db"
    assert config.evaluate.checkpoint == f"outputs/{name}/checkpoints"
    assert (config.backend, config.experiment.steps, config.train.lora) == ("cuda", 30, True)


def test_the_output_folder():
    assert ExperimentConfig(name="g-0.8").resolved_output_dir("/p") == Path("/p/outputs/g-0.8")
    assert ExperimentConfig(output_dir="runs/x").resolved_output_dir("/p") == Path("/p/runs/x")
    assert ExperimentConfig(output_dir="/abs").resolved_output_dir("/p") == Path("/abs")


@pytest.mark.parametrize("settings, message", [
    ({"name": "a b"}, "letters, digits"),
    ({"name": ""}, "letters, digits"),
    ({"steps": 0}, "experiment.steps must be a positive integer"),
    ({"tasks_per_batch": True}, "tasks_per_batch must be a positive integer"),
    ({"generation_retries": -1}, "generation_retries must be an integer >= 0"),
    ({"rest_barren_epochs": -1}, "rest_barren_epochs must be an integer >= 0"),
    ({"rest_barren_epochs": 1.5}, "rest_barren_epochs must be an integer >= 0"),
    ({"retry_delay_s": float("nan")}, "retry_delay_s must be a number of seconds"),
    ({"time_limit_s": -5}, "time_limit_s must be a number of seconds"),
    ({"torch_threads": -1}, "torch_threads must be an integer >= 0"),
    ({"update_threads": 1.5}, "update_threads must be an integer >= 0"),
    ({"stepz": 1}, r"unknown experiment settings: \['stepz'\]"),
])
def test_bad_experiment_settings(settings, message):
    with pytest.raises(ValueError, match=message):
        ExperimentConfig.from_dict(settings)


def test_the_update_runs_on_its_own_thread_count_and_gives_the_old_one_back():
    import torch

    from kevin.experiment.files import torch_threads

    before = torch.get_num_threads()
    with torch_threads(before + 1):
        assert torch.get_num_threads() == before + 1
    assert torch.get_num_threads() == before
    with torch_threads(0):  # 0: left as it is
        assert torch.get_num_threads() == before
    with pytest.raises(RuntimeError), torch_threads(before + 2):
        raise RuntimeError("an update that fails")
    assert torch.get_num_threads() == before


@pytest.mark.parametrize("policy, message", [
    ({"weight_sync": "nccl"}, "policy.weight_sync must be one of"),
    ({"wrap": "module_without_function"}, "policy.wrap must be 'module:function'"),
])
def test_bad_policy_settings(policy, message):
    with pytest.raises(ValueError, match=message):
        RunConfig.from_dict({"policy": policy})


def test_how_a_server_gets_the_weights(tmp_path):
    served = {"backend": "openai", "model": str(tmp_path)}
    assert sync_mode(RunConfig.from_dict({"policy": served})) == "folder"
    assert sync_mode(RunConfig.from_dict({"policy": served, "train": {"lora": True}})) == "lora"
    assert sync_mode(RunConfig.from_dict({"policy": {**served, "weight_sync": "full"}})) == "full"
    assert sync_mode(RunConfig()) == ""  # in-process: the trainer's model generates
    with pytest.raises(ValueError, match="train.lora is false"):
        sync_mode(RunConfig.from_dict({"policy": {**served, "weight_sync": "lora"}}))
    with pytest.raises(ValueError, match="use weight_sync lora"):
        sync_mode(RunConfig.from_dict({"policy": {**served, "weight_sync": "folder"}, "train": {"lora": True}}))
    assert weights_folder(RunConfig.from_dict({"policy": served})) == str(tmp_path)
    with pytest.raises(ValueError, match="set policy.weights to the folder the server was started from"):
        weights_folder(RunConfig.from_dict({"policy": {"backend": "openai", "model": "Qwen/QwQ-32B"}}))


class _Clock:
    """A monotonic clock the test moves by hand."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_the_time_limit_pauses_before_a_step_that_would_overrun_it(monkeypatch, tmp_path):
    from kevin.experiment import run as run_module

    clock = _Clock()
    monkeypatch.setattr(run_module.time, "monotonic", clock)
    config = RunConfig.from_dict({"experiment": {"steps": 5, "time_limit_s": 100.0, "output_dir": str(tmp_path)}})
    run = run_module.TrainingRun(config, project_dir=tmp_path)
    clock.now += 10.0  # loading the model
    for step, seconds in enumerate((20.0, 30.0)):  # began at 10, 30; ended at 30, 60
        run._step_began = clock.now
        clock.now += seconds
        assert run._pause_reason(step) == "" and not run.done(step + 1)
    run._step_began = clock.now  # the third step takes 25 s: ends at 85, and the slowest (30 s) would end at 115
    clock.now += 25.0
    reason = run._pause_reason(2)
    assert reason.startswith("time limit: 85 s of experiment.time_limit_s=100 used and a step takes up to 30 s")
    run.paused = reason
    assert run.done(3) and not run.stop_reason
    # The last step never pauses (the run ends anyway), and 0 means no limit.
    assert run._pause_reason(4) == ""
    unlimited = run_module.TrainingRun(RunConfig.from_dict({"experiment": {"steps": 5, "output_dir": str(tmp_path)}}),
                                       project_dir=tmp_path)
    unlimited._step_began = clock.now - 10_000.0
    assert unlimited._pause_reason(0) == ""


def test_the_time_limit_leaves_out_the_slow_first_step_of_a_process(monkeypatch, tmp_path):
    from kevin.experiment import run as run_module

    config = RunConfig.from_dict({"experiment": {"steps": 9, "time_limit_s": 300.0, "output_dir": str(tmp_path)}})

    def run_steps(*seconds):
        """A fresh process (its own clock from 0) running steps of these lengths; the last pause reason."""
        clock = _Clock()
        monkeypatch.setattr(run_module.time, "monotonic", clock)
        run = run_module.TrainingRun(config, project_dir=tmp_path)
        reasons = []
        for step, length in enumerate(seconds):
            run._step_began = clock.now
            clock.now += length
            reasons.append(run._pause_reason(step))
        return reasons

    # The first step alone is all there is to go by: 190 + 190 > 300.
    assert "190 s of experiment.time_limit_s=300 used and a step takes up to 190 s" in run_steps(190.0)[0]
    # 150 s, then 60 s: the next is expected at 60 s (not 150), ending at 270, so it runs; after a 70 s third step
    # (ending at 280) the slowest after the first, 70 s, would end past 300.
    reasons = run_steps(150.0, 60.0, 70.0)
    assert reasons[:2] == ["", ""]
    assert "280 s of experiment.time_limit_s=300 used and a step takes up to 70 s" in reasons[2]


def _gpu_learn_names(learn: str | None) -> dict[str, str]:
    """What scripts/gpu_learn.sh makes of LEARN (its `names` stage: the run's folder, warm start, pack and layers)."""
    env = {k: v for k, v in os.environ.items() if k != "LEARN"} | ({"LEARN": learn} if learn is not None else {})
    out = subprocess.run(["bash", "scripts/gpu_learn.sh", "names"], cwd=REPO, env=env, capture_output=True, text=True,
                         check=True).stdout
    return dict(line.split(": ", 1) for line in out.splitlines())


def _setting_differences(a: RunConfig, b: RunConfig) -> set[tuple[str, str]]:
    return {(section, key) for section, values in b.params_dict().items() if isinstance(values, dict)
            for key, value in values.items() if a.params_dict()[section][key] != value}


SIXTH = [REPO / "params.yaml", REPO / "configs" / "h200_learn.yaml", REPO / "configs" / "h200_learn_eps.yaml"]
RUN_PLACES = {("experiment", "name"), ("tracking", "tracking_uri"), ("tracking", "artifact_location"),
              ("evaluate", "checkpoint")}


def _over_the_sixth(name: str, layer: str) -> dict[str, str]:
    """What gpu_learn.sh's `names` says of a run whose own file ``layer`` is layered over the sixth run's."""
    return {"run": f"outputs/{name}", "warm start": "outputs/h200-sft-turns-both", "pack": f"runs/{name}",
            "params": "--params params.yaml --params configs/h200_learn.yaml --params configs/h200_learn_eps.yaml "
                      f"--params {layer}"}


def test_the_seventh_run_is_the_sixth_with_a_warmup_of_ten_steps():
    assert _gpu_learn_names("configs/h200_learn_eps.yaml configs/h200_learn_warmup.yaml") == \
        _over_the_sixth("h200-learn-warmup", "configs/h200_learn_warmup.yaml")
    sixth = RunConfig.from_files(SIXTH)
    seventh = RunConfig.from_files(SIXTH + [REPO / "configs" / "h200_learn_warmup.yaml"])
    assert (sixth.train.warmup_ratio, seventh.train.warmup_ratio) == (0.03, 0.33)
    # 30 steps of 2 optimiser steps: the lr rises over the first 20 (steps 1-10), where the sixth run's rose over 2.
    assert (sixth.train.warmup_steps, seventh.train.warmup_steps, seventh.train.total_optimizer_steps) == (2, 20, 60)
    assert (seventh.train.adam_eps, seventh.train.lr, seventh.rewards.group) == (1e-5, 1e-3, "turn")
    assert seventh.sft == sixth.sft and seventh.rollout == sixth.rollout
    assert seventh.tracking.tracking_uri == "sqlite:///outputs/h200-learn-warmup/mlflow.db"
    assert seventh.evaluate.checkpoint == "outputs/h200-learn-warmup/checkpoints"
    assert _setting_differences(sixth, seventh) == RUN_PLACES | {("train", "warmup_ratio")}


def test_the_eighth_run_is_the_sixth_at_a_quarter_of_the_lr_in_groups_of_eight():
    # The default of scripts/gpu_learn.sh layers the eighth run's file over the sixth's.
    assert _gpu_learn_names(None) == _over_the_sixth("h200-learn-quarter", "configs/h200_learn_quarter.yaml")
    sixth = RunConfig.from_files(SIXTH)
    eighth = RunConfig.from_files(SIXTH + [REPO / "configs" / "h200_learn_quarter.yaml"])
    assert (sixth.train.lr, eighth.train.lr) == (1e-3, 2.5e-4)
    # As many kernels a step: 4 tasks x 4 trajectories x 2 turns before, 2 x 8 x 2 now.
    assert (sixth.experiment.tasks_per_batch, sixth.rollout.trajectories) == (4, 4)
    assert (eighth.experiment.tasks_per_batch, eighth.rollout.trajectories) == (2, 8)
    assert (eighth.train.adam_eps, eighth.train.warmup_ratio, eighth.rewards.group) == (1e-5, 0.03, "turn")
    assert eighth.sft == sixth.sft and eighth.experiment.steps == 30
    assert eighth.tracking.tracking_uri == "sqlite:///outputs/h200-learn-quarter/mlflow.db"
    assert _setting_differences(sixth, eighth) == RUN_PLACES | {("train", "lr"), ("experiment", "tasks_per_batch"),
                                                                ("rollout", "trajectories")}


def test_the_eighths_second_leg_is_the_same_run_given_sixty_steps():
    """Layered last, it resumes the eighth run in its own folder, pack and MLflow run: only the length changes, and
    with a constant lr after a warmup long past, steps 31-60 train as steps 1-30 did."""
    leg = "configs/h200_learn_eps.yaml configs/h200_learn_quarter.yaml configs/h200_learn_quarter_60.yaml"
    names = _gpu_learn_names(leg)
    assert {k: v for k, v in names.items() if k != "params"} == \
        {k: v for k, v in _gpu_learn_names(None).items() if k != "params"}
    assert names["params"].endswith("--params configs/h200_learn_quarter.yaml --params configs/h200_learn_quarter_60.yaml")
    eighth = RunConfig.from_files(SIXTH + [REPO / "configs" / "h200_learn_quarter.yaml"])
    second = RunConfig.from_files(SIXTH + [REPO / "configs" / "h200_learn_quarter.yaml",
                                           REPO / "configs" / "h200_learn_quarter_60.yaml"])
    assert (eighth.experiment.steps, second.experiment.steps) == (30, 60)
    assert (second.train.lr_schedule, second.train.warmup_steps, second.train.total_optimizer_steps) == ("constant", 4, 120)
    assert _setting_differences(eighth, second) == {("experiment", "steps")}
    # The response limit too: params.yaml's raise at step 30 once survived h200_learn.yaml's {} (steps 31-42 ran
    # with 22,528 tokens).
    assert [second.response_tokens_at(s) for s in (0, 29, 30, 59)] == [512] * 4 and second.train.max_response_tokens == 512


@pytest.mark.parametrize("learn, run, warm_start", [
    ("configs/h200_learn.yaml", "outputs/h200-learn", "outputs/h200-sft"),
    ("configs/h200_learn_rest.yaml", "outputs/h200-learn-rest", "outputs/h200-sft-turns"),
    ("configs/h200_learn_turns.yaml", "outputs/h200-learn-turns", "outputs/h200-sft-turns-both"),
    ("configs/h200_learn_eps.yaml", "outputs/h200-learn-eps", "outputs/h200-sft-turns-both"),
])
def test_gpu_learn_names_a_run_by_its_last_layer(learn, run, warm_start):
    names = _gpu_learn_names(learn)
    assert (names["run"], names["warm start"], names["pack"]) == (run, warm_start, "runs/" + run.split("/")[1])
    assert names["params"].endswith("configs/h200_learn.yaml" if learn == "configs/h200_learn.yaml" else learn)


def test_gpu_learn_refuses_a_layer_that_is_not_a_file():
    env = dict(os.environ, LEARN="configs/h200_learn_eps.yaml configs/no_such.yaml")
    done = subprocess.run(["bash", "scripts/gpu_learn.sh", "names"], cwd=REPO, env=env, capture_output=True, text=True)
    assert done.returncode == 2 and "configs/no_such.yaml, which is not a file" in done.stderr


def test_a_resumed_run_expects_its_recent_steps_not_only_its_first_quick_one(monkeypatch, tmp_path):
    from kevin.experiment import run as run_module

    # Six recorded steps: the oldest (200 s) is not among the last five, whose median is 60 s.
    for step, seconds in enumerate((200.0, 40.0, 90.0, 60.0, 50.0, 70.0)):
        folder = tmp_path / "steps" / f"step_{step:06d}"
        folder.mkdir(parents=True)
        (folder / "summary.json").write_text(json.dumps({"step": step, "seconds": {"step": seconds}}))
    assert run_module.recent_step_seconds(run_module.read_step_summaries(tmp_path)) == 60.0
    assert run_module.recent_step_seconds([]) == 0.0
    clock = _Clock()
    monkeypatch.setattr(run_module.time, "monotonic", clock)
    config = RunConfig.from_dict({"experiment": {"steps": 9, "time_limit_s": 90.0, "output_dir": str(tmp_path)}})
    run = run_module.TrainingRun(config, project_dir=tmp_path)
    clock.now += 10.0  # loading the model
    run._step_began = clock.now
    clock.now += 28.0  # a quick step (its kernels judged before): alone it would promise 38 + 28 = 66 <= 90
    assert "38 s of experiment.time_limit_s=90 used and a step takes up to 60 s" in run._pause_reason(6)

