"""MLflow tracking: the pure helpers with hand-computed values, then a real sqlite MLflow store in tmp_path
(params, per-step metrics, tags, artifacts, resume into the same run, two runs side by side)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from kevin.config import RunConfig
from kevin.records.evaluation import EvalResult, Status
from kevin.monitor import Alert, Severity
from kevin.records.rollout import Trajectory, Turn
from kevin.tracking import (
    MAX_PARAM_VALUE,
    StepSummary,
    Tracker,
    TrackingConfig,
    clip_text,
    config_params,
    dvc_tags,
    flatten_config,
    kernel_sample,
    kernels_markdown,
    launcher_tags,
    mlflow_key,
    monitor_metric_key,
    plot_not_okay_ratio,
    plot_reward_per_turn,
    resolve_artifact_location,
    resolve_tracking_uri,
    run_config,
    step_metrics,
    steps_table_markdown,
    store_folder,
    summarize_step,
    tasks_table_markdown,
    turn_name,
)

REPO = Path(__file__).resolve().parents[2]


def turn(task: str, traj: int, index: int, status: Status, speedup: float = 0.0, kernel: str = "class ModelNew: ...") -> Turn:
    correct = status is Status.CORRECT
    result = EvalResult(task_id=task, candidate_id=f"{task}:{traj}:{index}", status=status, correct=correct,
                        speedup=speedup if correct else 0.0, score=0.3 + speedup if correct else 0.0,
                        feedback=f"{status.value} feedback")
    return Turn(task_id=task, trajectory=traj, turn=index, response="Okay, ...", kernel=kernel,
                result=result, response_tokens=100)


def make_step() -> list[Trajectory]:
    """Two tasks, three trajectories of two turns: statuses and speedups chosen for round numbers."""
    return [
        Trajectory("L1/relu", 0, [turn("L1/relu", 0, 0, Status.COMPILE_ERROR), turn("L1/relu", 0, 1, Status.CORRECT, 1.2)]),
        Trajectory("L1/relu", 1, [turn("L1/relu", 1, 0, Status.CORRECT, 0.5), turn("L1/relu", 1, 1, Status.INCORRECT)]),
        Trajectory("L2/gemm", 0, [turn("L2/gemm", 0, 0, Status.PARSE_ERROR, kernel=""),
                                  turn("L2/gemm", 0, 1, Status.CORRECT, 2.0)]),
    ]


UPDATE = [{"loss": 0.5, "grad_norm": 1.0, "tokens_per_s": 100.0, "optimizer_step": 1.0},
          {"loss": 0.3, "grad_norm": 3.0, "tokens_per_s": 300.0, "optimizer_step": 2.0}]
MONITOR_ROW = {"step": 3, "n_responses": 6, "not_okay_ratio": 0.5, "junk_share": 0.0, "not_okay_ratio/turn1": 0.25}


# ---------------------------------------------------------------------------------------------------
# Pure helpers


def test_step_metrics_of_a_hand_computed_step():
    summary = summarize_step(3, make_step(), returns=[0.1, 0.2], update_metrics=UPDATE, monitor_row=MONITOR_ROW,
                             seconds={"rollout": 2.0, "update": 4.0})
    # scores: 0, 1.5, 0.8, 0, 0, 2.3; turn 0: 0, 0.8, 0; turn 1: 1.5, 0, 2.3; best per trajectory 1.5, 0.8, 2.3
    assert summary.statuses == {"compile_error": 1, "correct": 3, "incorrect": 1, "parse_error": 1}
    assert summary.speedups == [1.2, 0.5, 2.0] and summary.best_speedups == [1.2, 0.5, 2.0]
    assert summary.tokens == {"rollout": 600.0}
    expected = {
        "reward/score_mean": 4.6 / 6, "reward/score_max": 2.3, "reward/best_score_mean": 4.6 / 3,
        "reward/turn_1": 0.8 / 3, "reward/turn_2": 3.8 / 3, "reward/return_mean": 0.15,
        "eval/kernels": 6.0,
        "eval/status/correct": 0.5, "eval/status/incorrect": 1 / 6, "eval/status/runtime_error": 0.0,
        "eval/status/compile_error": 1 / 6, "eval/status/timeout": 0.0, "eval/status/rule_violation": 0.0,
        "eval/status/parse_error": 1 / 6,
        "eval/speedup_mean": 3.7 / 3, "eval/speedup_median": 1.2, "eval/speedup_max": 2.0,
        "eval/best_speedup_mean": 3.7 / 3, "eval/fast_1": 2 / 3, "eval/fast_1.5": 1 / 3,
        "loss/loss": 0.4, "loss/grad_norm": 2.0, "loss/optimizer_step": 2.0, "perf/train_tokens_per_s": 200.0,
        "monitor/n_responses": 6.0, "monitor/not_okay_ratio": 0.5, "monitor/junk_share": 0.0,
        "monitor/not_okay_ratio/turn_2": 0.25,  # the row's 0-based turn1 is the second turn
        "perf/rollout_s": 2.0, "perf/update_s": 4.0, "perf/rollout_tokens_per_s": 300.0,
    }
    metrics = step_metrics(summary)
    assert set(metrics) == set(expected)
    for key, value in expected.items():
        assert metrics[key] == pytest.approx(value, rel=1e-12, abs=1e-15), key


def test_step_metrics_leave_out_what_cannot_be_computed():
    # No correct kernel: no speedup mean (the mean of nothing is not 0), but best_speedup_mean 0 and fast_p 0.
    trajs = [Trajectory("t", 0, [turn("t", 0, 0, Status.INCORRECT)])]
    metrics = step_metrics(summarize_step(0, trajs))
    assert "eval/speedup_mean" not in metrics and metrics["eval/best_speedup_mean"] == 0.0
    assert metrics["eval/fast_1"] == 0.0 and metrics["eval/status/incorrect"] == 1.0
    assert step_metrics(StepSummary(step=5)) == {}
    # Tokens without the phase's seconds give no rate (no division by zero).
    assert step_metrics(StepSummary(step=0, tokens={"rollout": 10.0}, seconds={"rollout": 0.0})) == {"perf/rollout_s": 0.0}
    with pytest.raises(ValueError, match="unknown verdict statuses"):
        step_metrics(StepSummary(step=0, statuses={"passed": 1}))


def test_uris_are_pinned_to_the_project_folder(tmp_path):
    assert store_folder(tmp_path, {}) == tmp_path
    assert store_folder(tmp_path, {"DVC_ROOT": "/repo"}) == Path("/repo")
    assert resolve_tracking_uri("sqlite:///mlflow.db", tmp_path) == f"sqlite:///{tmp_path.resolve()}/mlflow.db"
    assert resolve_tracking_uri("sqlite:////abs/m.db", tmp_path) == "sqlite:////abs/m.db"
    assert resolve_tracking_uri("http://127.0.0.1:5000", tmp_path) == "http://127.0.0.1:5000"
    sqlite = f"sqlite:///{tmp_path}/m.db"
    assert resolve_artifact_location("mlartifacts", sqlite, tmp_path) == (tmp_path / "mlartifacts").resolve().as_uri()
    assert resolve_artifact_location("s3://b/k", "http://h:5000", tmp_path) == "s3://b/k"
    assert resolve_artifact_location("mlartifacts", "http://h:5000", tmp_path) is None  # the server decides


def test_config_validation_says_what_to_do():
    with pytest.raises(ValueError, match="file store"):
        TrackingConfig(tracking_uri="./mlruns")
    with pytest.raises(ValueError, match="file store"):
        TrackingConfig(tracking_uri="file:///tmp/mlruns")
    with pytest.raises(ValueError, match="plot_every"):
        TrackingConfig(plot_every=0)
    with pytest.raises(ValueError, match="unknown tracking settings"):
        TrackingConfig.from_dict({"tracking_url": "x"})


def test_config_params_flatten_and_fit_mlflow_limits():
    config = {"train": {"lr": 2e-6, "grad_steps": 2}, "monitor": {"stop_on": ["junk_share"], "min_thresholds": {}},
              "rewards": {"mode": "sum", "gamma": 0.4}, "bad key!": 1, "long": "x" * 7000}
    assert flatten_config(config)["monitor.min_thresholds"] == {}
    params = config_params(config)
    assert params["train.lr"] == "2e-06" and params["train.grad_steps"] == "2"
    assert params["monitor.stop_on"] == '["junk_share"]' and params["monitor.min_thresholds"] == "{}"
    assert params["bad key_"] == "1"
    assert len(params["long"]) == MAX_PARAM_VALUE and params["long"].endswith("...[1020 more chars]")
    assert clip_text("abcdefghij" * 3, 20) == "ab...[28 more chars]"
    assert clip_text("short", 20) == "short"
    assert mlflow_key("a/b.c-d e:f") == "a/b.c-d e:f" and mlflow_key("a#b") == "a_b"


def test_dvc_tags_come_from_the_variables_dvc_sets():
    env = {"DVC_EXP_NAME": "lr-sweep-1", "DVC_EXP_BASELINE_REV": "abc123", "DVC_STAGE": "train", "HOME": "/x"}
    assert dvc_tags(env) == {"dvc.exp_name": "lr-sweep-1", "dvc.baseline_rev": "abc123", "dvc.stage": "train"}
    assert dvc_tags({"DVC_STAGE": "train"}) == {"dvc.stage": "train"}  # plain dvc repro: no experiment


def test_kernel_sample_spans_the_verdicts_fastest_correct_first():
    picked = kernel_sample(make_step(), 4, seed=0)
    assert [(t.status.value, t.speedup) for t in picked] == [
        ("correct", 2.0), ("incorrect", 0.0), ("compile_error", 0.0), ("parse_error", 0.0)]
    second = kernel_sample(make_step(), 5, seed=0)
    assert second[:4] == picked and (second[4].status.value, second[4].speedup) == ("correct", 1.2)
    assert len(kernel_sample(make_step(), 50)) == 6 and kernel_sample(make_step(), 0) == []


def test_markdown_artifacts():
    trajs = make_step()
    table = tasks_table_markdown(trajs, 3)
    assert table == (
        "# Step 3: tasks\n\n"
        "| task | kernels | correct | best speedup | mean score | verdicts |\n"
        "|---|---|---|---|---|---|\n"
        "| L1/relu | 4 | 2 | 1.2 | 0.575 | correct 2, incorrect 1, compile_error 1 |\n"
        "| L2/gemm | 2 | 1 | 2 | 1.15 | correct 1, parse_error 1 |\n"
    )
    tricky = turn("t", 0, 0, Status.CORRECT, 1.0, kernel="s = '''```'''\nclass ModelNew: ...")
    text = kernels_markdown([tricky, trajs[2].turns[0]], 3)
    assert "````python\ns = '''```'''\nclass ModelNew: ...\n````" in text  # a longer fence than the code's
    assert "## L2/gemm / trajectory 0 / turn 0: parse_error" in text and "(no kernel" in text
    assert "> correct feedback" in text
    history = {"reward/score_mean": {0: 0.5, 1: 0.75}, "monitor/junk_share": {1: 0.1}}
    assert steps_table_markdown(history) == (
        "# Steps\n\n| step | reward/score_mean | monitor/junk_share |\n|---|---|---|\n"
        "| 0 | 0.5 | - |\n| 1 | 0.75 | 0.1 |\n")


def test_turns_are_counted_from_1_in_every_mlflow_name():
    # The pipeline's metrics.json says score_mean_turn_1 for the first turn; MLflow says turn_1 too.
    assert turn_name(0) == "turn_1"
    # The monitor's row (and its thresholds) keep 0-based keys; MLflow gets them counted from 1.
    assert monitor_metric_key("not_okay_ratio/turn0") == "not_okay_ratio/turn_1"
    assert monitor_metric_key("junk_share/turn11") == "junk_share/turn_12"
    assert monitor_metric_key("junk_share/last_turn") == "junk_share/last_turn"
    assert monitor_metric_key("not_okay_ratio") == "not_okay_ratio"


HISTORY = {"reward/turn_1": {0: 0.1, 1: 0.2}, "reward/turn_2": {0: 0.3, 1: 0.5}, "reward/score_mean": {0: 1.0},
           "monitor/not_okay_ratio": {0: 0.0, 1: 0.4}, "monitor/not_okay_ratio/turn_2": {1: 0.6}}


def x_ticks(ax) -> list[float]:
    lo, hi = ax.get_xlim()
    return [float(t) for t in ax.get_xticks() if lo <= t <= hi]


def test_plots_draw_one_line_per_turn_on_whole_steps():
    ax = plot_reward_per_turn(HISTORY).axes[0]
    assert [line.get_label() for line in ax.lines] == ["turn 1", "turn 2"]
    assert list(ax.lines[1].get_ydata()) == [0.3, 0.5]
    assert x_ticks(ax) == [0.0, 1.0]  # whole steps (matplotlib's default puts ticks at 0.2, 0.4 ...)
    # One step: matplotlib's integer locator alone falls back to 3.84, 3.88 ... ticks.
    one = {"reward/turn_1": {3: 0.5}, "monitor/not_okay_ratio": {3: 0.5}}
    assert x_ticks(plot_reward_per_turn(one).axes[0]) == [3.0]
    assert x_ticks(plot_not_okay_ratio(one, threshold=0.2).axes[0]) == [3.0]
    with pytest.raises(ValueError, match="reward/turn_<n>"):
        plot_reward_per_turn({"reward/score_mean": {0: 1.0}})


def test_not_okay_plot_draws_the_threshold_only_while_the_ratio_is_checked():
    checked = dict(HISTORY, **{"monitor/not_okay_check": {0: 1.0, 1: 1.0}})
    ax = plot_not_okay_ratio(checked, threshold=0.2).axes[0]
    assert [line.get_label() for line in ax.lines] == ["all turns", "turn 2", "alert threshold 0.2"]
    assert list(ax.lines[2].get_ydata()) == [0.2, 0.2] and list(ax.texts) == []
    # No calibrated opening: the monitor skips the check, so no line claims a limit; a note says why.
    unchecked = dict(HISTORY, **{"monitor/not_okay_check": {0: 0.0, 1: 0.0}})
    ax = plot_not_okay_ratio(unchecked, threshold=0.2).axes[0]
    assert [line.get_label() for line in ax.lines] == ["all turns", "turn 2"]
    assert [t.get_text() for t in ax.texts] == ["opening not calibrated: check off (no alert)"]
    # A history from before the check was recorded: the threshold as before.
    assert [line.get_label() for line in plot_not_okay_ratio(HISTORY, 0.2).axes[0].lines][-1] == "alert threshold 0.2"


def test_each_run_kind_logs_the_sections_it_depends_on():
    config = RunConfig().to_dict()
    shared = {"backend", "profile", "temperature", "max_response_tokens", "response_length_schedule"}
    training = {k.split(".")[0] for k in config_params(run_config(config, "training"))}
    assert training == shared | {"experiment", "evaluation", "cluster", "policy", "sampling", "rollout", "rewards",
                                 "train", "monitor", "splits", "sft"}
    evaluation = {k.split(".")[0] for k in config_params(run_config(config, "evaluation"))}
    # The response length schedule raises the limit at training steps: nothing an evaluation reads.
    assert evaluation == shared - {"response_length_schedule"} | {"evaluate", "analysis", "beam", "evaluation", "policy",
                                                                  "sampling", "rollout", "splits"}
    # The openai section counts only when that backend generates.
    served = dict(config, policy=dict(config["policy"], backend="openai"))
    assert "openai" in run_config(served, "training") and "openai" in run_config(served, "evaluation")
    with pytest.raises(ValueError, match="run kind"):
        run_config(config, "eval")


def test_the_launcher_comes_from_dvc_or_the_prefect_deployment():
    run = {"id": "7d3c", "name": "crimson-mole"}
    assert launcher_tags({}, {}) == {"kevin.launcher": "cli"}
    assert launcher_tags({}, run) == {"kevin.launcher": "cli", "prefect.flow_run_id": "7d3c",
                                      "prefect.flow_run_name": "crimson-mole"}
    assert launcher_tags({}, dict(run, deployment_id="d1"))["kevin.launcher"] == "prefect"
    # dvc repro / dvc exp run run kevin train, whose flow runs in-process: DVC launched it.
    assert launcher_tags({"DVC_STAGE": "train"}, run) == {"kevin.launcher": "dvc", "prefect.flow_run_id": "7d3c",
                                                          "prefect.flow_run_name": "crimson-mole"}


# ---------------------------------------------------------------------------------------------------
# A real MLflow store


@pytest.fixture(scope="module")
def store(tmp_path_factory) -> Path:
    """One sqlite store for the module (creating its tables takes a few seconds), and a git checkout as the
    project folder so the commit tag can be checked."""
    project = tmp_path_factory.mktemp("project")
    git = ["git", "-C", str(project), "-c", "user.email=t@example.com", "-c", "user.name=t"]
    subprocess.run(["git", "init", "-q", str(project)], check=True)
    (project / "README.md").write_text("project\n")
    subprocess.run([*git, "add", "README.md"], check=True)
    subprocess.run([*git, "commit", "-q", "-m", "init"], check=True)
    return project


def client_for(project: Path):
    from mlflow.tracking import MlflowClient

    return MlflowClient(tracking_uri=f"sqlite:///{project}/mlflow.db")


def step_summary(step: int, scale: float = 1.0) -> StepSummary:
    row = dict(MONITOR_ROW, step=step, not_okay_ratio=0.1 * step)
    update = [{k: v * scale for k, v in m.items()} for m in UPDATE]
    return summarize_step(step, make_step(), update_metrics=update, monitor_row=row, seconds={"rollout": 2.0})


def test_a_run_holds_params_metrics_tags_and_artifacts(store, tmp_path):
    config = {"train": {"lr": 2e-6, "grad_steps": 2}, "rewards": {"gamma": 0.4}, "monitor": {"stop_on": ["junk_share"]}}
    env = {"DVC_EXP_NAME": "gamma-0.4", "DVC_STAGE": "train"}
    tracker = Tracker(TrackingConfig(experiment_name="full"), tmp_path / "out", project_dir=store, env=env,
                      nor_threshold=0.2)
    alert = Alert(metric="junk_share", value=0.5, threshold=0.1, step=2, severity=Severity.CRITICAL,
                  should_stop=True, message="step 2: junk_share 0.5 > 0.1: junk. Stopping training.")
    with tracker.start(config, model="tiny-llama", backend="cpu"):
        run_id = tracker.run_id
        for step in range(3):
            tracker.log_step(step_summary(step), trajectories=make_step(), alerts=[alert] if step == 2 else [])
        tracker.set_stop(alert.message, step=2, metric="junk_share")

    client = client_for(store)
    run = client.get_run(run_id)
    assert run.info.status == "KILLED"  # stopped before its planned end
    assert run.info.run_name == "gamma-0.4"  # the DVC experiment names the run
    assert run.data.params == {"train.lr": "2e-06", "train.grad_steps": "2", "rewards.gamma": "0.4",
                               "monitor.stop_on": '["junk_share"]'}
    head = subprocess.run(["git", "-C", str(store), "rev-parse", "HEAD"], capture_output=True, text=True).stdout.strip()
    tags = run.data.tags
    assert tags["git.commit"] == head and tags["mlflow.source.git.commit"] == head and tags["git.dirty"] == "false"
    assert (tags["model"], tags["backend"], tags["dvc.exp_name"], tags["dvc.stage"]) == ("tiny-llama", "cpu", "gamma-0.4", "train")
    assert (tags["kind"], tags["kevin.launcher"]) == ("training", "dvc") and "prefect.flow_run_id" not in tags
    assert tags["stop.reason"] == alert.message and tags["stop.step"] == "2" and tags["stop.metric"] == "junk_share"
    assert tags["monitor.last_alert"] == alert.message

    expected = step_metrics(step_summary(1))
    assert set(run.data.metrics) == set(expected)
    nor = client.get_metric_history(run_id, "monitor/not_okay_ratio")
    assert [(m.step, m.value) for m in nor] == [(0, 0.0), (1, 0.1), (2, 0.2)]
    assert [m.value for m in client.get_metric_history(run_id, "loss/loss")] == pytest.approx([0.4] * 3)
    assert client.get_metric_history(run_id, "eval/status/correct")[0].value == 0.5

    root = Path(run.info.artifact_uri.removeprefix("file://"))
    assert root.is_relative_to(store / "mlartifacts")  # the configured location under the project folder
    files = {p.relative_to(root).as_posix() for p in root.rglob("*") if p.is_file()}
    per_step = {f"steps/step_{s:06d}/{name}" for s in range(3) for name in ("rollout.jsonl", "kernels.md", "tasks.md")}
    assert files == per_step | {"steps/step_000002/alerts.json", "config.yaml", "steps.md",
                                "plots/reward_per_turn.png", "plots/not_okay_ratio.png"}
    lines = (root / "steps/step_000001/rollout.jsonl").read_text().splitlines()
    assert [Turn.from_dict(json.loads(line)) for line in lines] == [t for tr in make_step() for t in tr.turns]
    assert json.loads((root / "steps/step_000002/alerts.json").read_text()) == [alert.to_dict()]
    assert "| 2 | 0.7667 | 0.5 | 1.233 | 0.2 | 0 | 0.4 |" in (root / "steps.md").read_text()
    assert (root / "plots/not_okay_ratio.png").read_bytes()[:4] == b"\x89PNG"


def test_resume_logs_into_the_same_run(store, tmp_path):
    out = tmp_path / "out"
    config = {"train": {"lr": 2e-6, "max_steps": 2}}
    first = Tracker(TrackingConfig(experiment_name="resume"), out, project_dir=store, env={})
    with pytest.raises(RuntimeError, match="node lost"):
        with first.start(config):
            first.log_step(step_summary(0))
            raise RuntimeError("node lost")
    run_id = json.loads((out / "mlflow_run.json").read_text())["run_id"]
    client = client_for(store)
    crashed = client.get_run(run_id)
    assert crashed.info.status == "FAILED" and crashed.data.tags["error"] == "RuntimeError: node lost"

    again = Tracker(TrackingConfig(experiment_name="resume"), out, project_dir=store, env={})
    with again.start({"train": {"lr": 2e-6, "max_steps": 4}}, resume=True):
        assert again.run_id == run_id
        assert client.get_run(run_id).info.status == "RUNNING"
        again.log_step(step_summary(1))
    run = client.get_run(run_id)
    assert run.info.status == "FINISHED" and run.data.tags["resumes"] == "1" and "error" not in run.data.tags
    assert run.data.params["train.max_steps"] == "2"  # MLflow params cannot change ...
    assert run.data.tags["resume.changed_params"] == '["train.max_steps"]'  # ... so the change is noted
    assert [m.step for m in client.get_metric_history(run_id, "loss/loss")] == [0, 1]
    assert len(client.search_runs([crashed.info.experiment_id])) == 1
    root = Path(run.info.artifact_uri.removeprefix("file://"))
    assert "max_steps: 2" in (root / "config.yaml").read_text()  # the config the run started with stays
    assert "max_steps: 4" in (root / "config.resume1.yaml").read_text()
    table = (root / "steps.md").read_text()
    assert "\n| 0 |" in table and "\n| 1 |" in table  # the plots and table cover the steps before the resume

    # A fresh (not resumed) start in the same folder is a new run.
    fresh = Tracker(TrackingConfig(experiment_name="resume"), out, project_dir=store, env={})
    with fresh.start(config):
        assert fresh.run_id != run_id
    assert len(client.search_runs([crashed.info.experiment_id])) == 2


def test_resume_of_a_run_the_store_lacks_is_refused(store, tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    (out / "mlflow_run.json").write_text(json.dumps({"run_id": "0" * 32, "tracking_uri": "sqlite:////elsewhere.db"}))
    tracker = Tracker(TrackingConfig(experiment_name="resume-missing"), out, project_dir=store, env={})
    with pytest.raises(ValueError, match="does not hold"):
        tracker.start({}, resume=True)


def test_two_ablation_runs_line_up_in_one_experiment(store, tmp_path):
    runs = []
    # The second runs as a queued DVC experiment would: in a temporary copy (no git checkout here), with
    # DVC_ROOT naming the repository, whose database it must use.
    copy = tmp_path / "dvc-temp-copy"
    copy.mkdir()
    setups = ((0.4, 1.0, store, {}), (0.8, 2.0, copy, {"DVC_ROOT": str(store), "DVC_EXP_NAME": "gamma-0.8"}))
    for gamma, scale, project, env in setups:
        tracker = Tracker(TrackingConfig(experiment_name="ablation", run_name=f"gamma-{gamma}"), tmp_path / str(gamma),
                          project_dir=project, env=env)
        with tracker.start({"rewards": {"gamma": gamma, "mode": "sum"}}):
            for step in range(2):
                tracker.log_step(step_summary(step, scale))
            runs.append(tracker.run_id)
    client = client_for(store)
    a, b = (client.get_run(r) for r in runs)
    assert a.info.experiment_id == b.info.experiment_id
    assert set(a.data.metrics) == set(b.data.metrics) and set(a.data.params) == set(b.data.params)
    assert (a.data.params["rewards.gamma"], b.data.params["rewards.gamma"]) == ("0.4", "0.8")
    assert (a.data.metrics["loss/loss"], b.data.metrics["loss/loss"]) == pytest.approx((0.4, 0.8))
    assert "git.commit" in a.data.tags and "git.commit" not in b.data.tags and b.data.tags["dvc.exp_name"] == "gamma-0.8"
    assert not (copy / "mlflow.db").exists() and not (copy / "mlartifacts").exists()
    found = client.search_runs([a.info.experiment_id], filter_string="params.`rewards.gamma` = '0.8'")
    assert [r.info.run_id for r in found] == [runs[1]]


def test_a_disabled_tracker_touches_nothing(tmp_path):
    tracker = Tracker(TrackingConfig(enabled=False), tmp_path / "out", project_dir=tmp_path, env={})
    with tracker.start({"a": 1}):
        metrics = tracker.log_step(step_summary(0), trajectories=make_step())
        tracker.set_stop("why", step=0)
    assert tracker.run_id is None and metrics == step_metrics(step_summary(0))
    assert not (tmp_path / "mlflow.db").exists() and not (tmp_path / "out").exists()


def test_ctrl_c_ends_the_run_killed_with_the_reason(store, tmp_path):
    tracker = Tracker(TrackingConfig(experiment_name="interrupt"), tmp_path / "out", project_dir=store, env={})
    with pytest.raises(KeyboardInterrupt):
        with tracker.start({"a": 1}):
            run_id = tracker.run_id
            raise KeyboardInterrupt
    run = client_for(store).get_run(run_id)
    assert run.info.status == "KILLED" and run.data.tags["stop.reason"] == "interrupted (KeyboardInterrupt)"
    assert tracker.run_id is None


def test_the_experiment_is_a_model_training_one_new_or_reused(store, tmp_path):
    client = client_for(store)
    client.create_experiment("kind-untagged", artifact_location=(tmp_path / "a").as_uri())
    client.create_experiment("kind-genai", artifact_location=(tmp_path / "b").as_uri(),
                             tags={"mlflow.experimentKind": "genai_development"})  # the UI's first-visit default
    for name in ("kind-new", "kind-untagged", "kind-genai"):
        Tracker(TrackingConfig(experiment_name=name), tmp_path / name, project_dir=store, env={}).start({}).end()
        assert client.get_experiment_by_name(name).tags["mlflow.experimentKind"] == "custom_model_development", name


def test_an_evaluation_links_its_training_run_and_logs_only_its_own_params(store, tmp_path):
    from kevin.experiment.evaluate import EvaluationRun

    config = RunConfig.from_dict({"tracking": {"tracking_uri": f"sqlite:///{store}/mlflow.db", "experiment_name": "linked"},
                                  "evaluate": {"name": "ckpt", "output_dir": str(tmp_path / "eval")}})
    trainer = Tracker(config.tracking, tmp_path / "train", project_dir=store, env={})
    with trainer.start(config.to_dict()):
        train_id = trainer.run_id
    checkpoint = tmp_path / "train" / "checkpoints" / "step_000002"
    checkpoint.mkdir(parents=True)

    run = EvaluationRun(config, project_dir=store)
    run.checkpoint, run.tasks = checkpoint, []
    run.identity = {"checkpoint": str(checkpoint), "checkpoint_step": 2, "budget_splits": ["4x2"],
                    "model": f"checkpoint {checkpoint}"}
    run._start_tracking()
    out = run.out_dir
    for folder in ("tables", "curves", "plots"):
        (out / folder).mkdir()
    (out / "metrics.json").write_text(json.dumps({"turn_1/kernels": 8, "split_4x2/turn_2/best_at_4/perf": 1.5}))
    (out / "report.json").write_text("{}")
    (out / "run.json").write_text("{}")
    assert run.track({"metrics": out / "metrics.json"})
    run.tracker.end()

    client = client_for(store)
    evaluation, training = client.get_run(run.mlflow["run_id"]), client.get_run(train_id)
    tags = evaluation.data.tags
    assert (tags["kind"], tags["kevin.training_run_id"], tags["mlflow.parentRunId"]) == ("evaluation", train_id, train_id)
    assert training.data.tags["kind"] == "training"
    assert evaluation.data.metrics == {"turn_1/kernels": 8.0, "split_4x2/turn_2/best_at_4/perf": 1.5}
    params = evaluation.data.params
    assert params["training_run_id"] == train_id and params["evaluate.name"] == "ckpt"
    assert {k.split(".")[0] for k in params} == {"backend", "profile", "temperature", "max_response_tokens", "evaluate",
                                                 "analysis", "beam", "evaluation", "policy", "sampling", "rollout",
                                                 "splits", "training_run_id"}
    assert "train.lr" in training.data.params and not any(k.startswith("evaluate.") for k in training.data.params)
    # The whole config stays an artifact of both.
    for r in (evaluation, training):
        saved = yaml.safe_load(Path(r.info.artifact_uri.removeprefix("file://"), "config.yaml").read_text())
        assert saved["train"]["lr"] == config.train.lr and saved["evaluate"]["name"] == "ckpt"


FLOW = """
import json, sys
from prefect import flow
from prefect.runtime import flow_run
from kevin.tracking import Tracker, TrackingConfig

@flow(name="probe")
def probe():
    tracker = Tracker(TrackingConfig(tracking_uri=sys.argv[1], experiment_name="launched"), sys.argv[2], env={})
    with tracker.start({"a": 1}):
        return {"run_id": tracker.run_id, "flow_run_id": flow_run.id, "flow_run_name": flow_run.name}

print(json.dumps(probe()))
"""


def test_a_run_inside_a_prefect_flow_run_carries_its_id(store, tmp_path):
    # A real flow run (Prefect's temporary local server), in a subprocess so its settings stay out of this one.
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PREFECT_", "DVC_"))}
    # Prefect waits 20 s for its temporary server by default: too short on a loaded 2-core machine (kevin's CLI
    # raises it the same way; this flow is called without the CLI).
    env.update(PYTHONPATH=str(REPO), PREFECT_HOME=str(tmp_path / "prefect"), PREFECT_SERVER_ANALYTICS_ENABLED="false",
               PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS="180")
    proc = subprocess.run([sys.executable, "-c", FLOW, f"sqlite:///{store}/mlflow.db", str(tmp_path / "out")],
                          env=env, cwd=store, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    seen = json.loads(proc.stdout.strip().splitlines()[-1])
    tags = client_for(store).get_run(seen["run_id"]).data.tags
    assert tags["prefect.flow_run_id"] == seen["flow_run_id"] and tags["prefect.flow_run_name"] == seen["flow_run_name"]
    assert tags["kevin.launcher"] == "cli" and "prefect.deployment_id" not in tags  # a flow called, not deployed
