"""The DVC pipeline for real, in a temporary git repository holding a copy of the project: `dvc repro` on tiny
settings from a shell whose PATH lacks the virtual environment, a second `dvc repro` that does nothing, an
ablation with `dvc exp run -S` that changes a metric and is its own MLflow run, and a broken split that stops the
pipeline at the validate stage with the data checks' report.

The tiny settings (configs/cpu.yaml of the copy): a 2-layer model from tests/flows, the level-1 tasks only, one
step of 1 task x 2 trajectories x 1 turn with 32-token responses (parse errors: nothing is compiled); the evaluate
stage rolls out the trained checkpoint on 1 eval task x 2 trajectories x 1 turn."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]


def _run(args: list[str], cwd: Path, env: dict[str, str], timeout: int = 600) -> subprocess.CompletedProcess:
    return subprocess.run(args, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)


@pytest.fixture(scope="module")
def project(tmp_path_factory, cache_dir):
    """The project's files (tracked and new, not ignored) in a fresh git repo, the tiny settings committed; `.venv` links to the interpreter's environment (as `make venv` makes one), PATH does not have it."""
    from tests.flows.conftest import build_model_dir

    root = tmp_path_factory.mktemp("dvc")
    model = build_model_dir(root / "model")
    repo = root / "repo"
    files = subprocess.run(["git", "ls-files", "-co", "--exclude-standard", "-z"], cwd=REPO, capture_output=True,
                           check=True).stdout.decode().split("\0")
    for name in filter(None, files):
        src = REPO / name
        if src.is_file():
            (repo / name).parent.mkdir(parents=True, exist_ok=True)
            (repo / name).write_bytes(src.read_bytes())
    (repo / ".venv").symlink_to(sys.prefix)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PREFECT_", "DVC_", "MLFLOW_", "VIRTUAL_ENV"))}
    env.update(PATH="/usr/bin:/bin", HOME=str(root / "home"), PREFECT_HOME=str(root / "prefect"),
               PREFECT_SERVER_ANALYTICS_ENABLED="false", OMP_NUM_THREADS="1", GIT_AUTHOR_NAME="t",
               GIT_AUTHOR_EMAIL="t@t", GIT_COMMITTER_NAME="t", GIT_COMMITTER_EMAIL="t@t", DVC_NO_ANALYTICS="1")
    (root / "home").mkdir()
    tiny = {"backend": "cpu", "max_response_tokens": 32, "response_length_schedule": {},
            "experiment": {"name": "tiny", "steps": 1, "tasks_per_batch": 1, "torch_threads": 1},
            "policy": {"backend": "hf", "model": str(model)},
            "rollout": {"trajectories": 2, "turns": 1},
            "evaluation": {"timing_trials": 2, "warmup_trials": 1, "correctness_trials": 1,
                           "cache_dir": str(cache_dir)},
            "monitor": {"stop_on": []}, "train": {"micro_batch_size": 2},
            "evaluate": {"max_tasks": 1}, "analysis": {"budget_splits": ["2x1"], "pass_ks": [1, 2]}}
    (repo / "configs" / "cpu.yaml").write_text(yaml.safe_dump(tiny, sort_keys=False))
    params = (repo / "params.yaml").read_text()
    assert "  levels: [1, 2]\n" in params
    (repo / "params.yaml").write_text(params.replace("  levels: [1, 2]\n", "  levels: [1]\n"))
    dvc = [sys.executable, "-m", "dvc"]
    # The project ships its .dvc folder (so a fresh clone needs no `dvc init`): only git is initialised here.
    assert (repo / ".dvc" / "config").is_file() and (repo / ".dvcignore").is_file()
    for args in (["git", "init", "-q"], ["git", "add", "-A"], ["git", "commit", "-qm", "copy"]):
        done = _run(args, repo, env)
        assert done.returncode == 0, done.stderr
    (repo / ".git" / "info" / "exclude").write_text(".venv\n")  # a link, which `.venv/` in .gitignore misses
    return repo, env, dvc


def test_repro_then_a_noop_then_an_ablation_then_a_broken_split(project):
    repo, env, dvc = project
    first = _run(dvc + ["repro"], repo, env)
    assert first.returncode == 0, (first.stdout + first.stderr)[-4000:]
    for stage in ("prepare", "validate", "baseline", "sft", "train", "evaluate", "check", "report"):
        assert f"Running stage '{stage}'" in first.stdout
    metrics = json.loads((repo / "outputs" / "train" / "metrics.json").read_text())
    assert (metrics["steps_done"], metrics["kernels"], metrics["verdicts"]) == (1, 2, {"parse_error": 2})
    assert json.loads((repo / "outputs" / "sft" / "sft.json").read_text()) == {"enabled": False}
    baselines = json.loads((repo / "outputs" / "baseline" / "baselines.json").read_text())
    (hardware,) = baselines
    split = json.loads((repo / "data" / "splits" / "split.json").read_text())
    ids = {e["task_id"] for e in split["train"] + split["eval"]}
    assert len(ids) == 30 and set(baselines[hardware]["ms"]) == ids
    assert all(ms > 0 for ms in baselines[hardware]["ms"].values())
    assert (repo / "outputs" / "train" / "checkpoints" / "step_000000").is_dir()
    checked = json.loads((repo / "outputs" / "validate" / "rollouts.json").read_text())
    assert [r["success"] for r in checked] == [True, True]  # the train step's rollout and the eval split's
    assert "outputs/train/steps/step_000000/rollout" in checked[0]["suite"]
    headline = json.loads((repo / "metrics" / "headline.json").read_text())["headline"]
    assert headline["train"] == {k: metrics[k] for k in ("steps_done", "correct_share", "score_mean",
                                                          "score_mean_last_step")}
    assert headline["evaluation"]["tasks"] == 1 and headline["evaluation"]["k"] == 2
    report = (repo / "outputs" / "report" / "report.md").read_text()
    assert report.startswith("# tiny\n") and "| training | 1 steps x 1 tasks x 2 trajectories x 1 turns" in report
    assert (repo / "outputs" / "train" / "plots" / "steps.png").stat().st_size > 10_000
    done = _run(["git", "add", "-A"], repo, env)
    done = _run(["git", "commit", "-qm", "first run"], repo, env)
    assert done.returncode == 0, done.stderr

    stamp = (repo / "outputs" / "train" / "metrics.json").stat().st_mtime_ns
    second = _run(dvc + ["repro"], repo, env)
    assert second.returncode == 0 and "Data and pipelines are up to date." in second.stdout, second.stdout
    assert "Running stage" not in second.stdout
    assert (repo / "outputs" / "train" / "metrics.json").stat().st_mtime_ns == stamp

    # --temp: in a copy of the project under .dvc/tmp/exps, as a queued experiment runs (scripts/kevin must find
    # the .venv of the original, and the MLflow run its store).
    exp = _run(dvc + ["exp", "run", "--temp", "-n", "traj3", "-S", "configs/cpu.yaml:rollout.trajectories=3"], repo,
               env)
    assert exp.returncode == 0, (exp.stdout + exp.stderr)[-4000:]
    assert "Running stage 'train'" in exp.stdout and "Running stage 'baseline'" not in exp.stdout
    # The committed dvc.lock is the copy's record of the first run: no output it cannot restore, no stage redone
    # whose inputs did not change (without it: "No file hash info found", prepare and baseline run again).
    assert "No file hash info found" not in exp.stdout + exp.stderr and "Running stage 'prepare'" not in exp.stdout
    shown = _run(dvc + ["exp", "show", "--json"], repo, env)
    assert shown.returncode == 0 and '"traj3"' in shown.stdout
    applied = _run(dvc + ["exp", "apply", "traj3"], repo, env)
    assert applied.returncode == 0, applied.stderr
    # The headline of the ablation against the committed run's, the evaluation's figures included; nothing
    # else is printed by default.
    diff = _run(dvc + ["metrics", "diff", "--json", "--all"], repo, env)
    assert diff.returncode == 0 and "failed to load" not in diff.stderr, diff.stderr
    diff = json.loads(diff.stdout)
    assert list(diff) == ["metrics/headline.json"]
    assert set(diff["metrics/headline.json"]) >= {"headline.train.steps_done", "headline.train.score_mean",
                                                 "headline.evaluation.best_correct", "headline.evaluation.tasks"}
    assert diff["metrics/headline.json"]["headline.evaluation.tasks"]["old"] == 1
    plots = _run(dvc + ["plots", "show", "--out", str(repo.parent / "plots")], repo, env)
    assert plots.returncode == 0, plots.stderr
    page = (repo.parent / "plots" / "index.html").read_text()
    assert "steps.png" in page and "<img" in page
    from mlflow.tracking import MlflowClient

    client = MlflowClient(f"sqlite:///{repo / 'mlflow.db'}")
    runs = client.search_runs([client.get_experiment_by_name("kevin").experiment_id])
    stages = sorted((r.data.tags.get("dvc.stage"), r.data.tags.get("dvc.exp_name", "")) for r in runs)
    assert stages == [("evaluate", ""), ("evaluate", "traj3"), ("train", ""), ("train", "traj3")]
    (ablation,) = [r for r in runs if r.data.tags.get("dvc.stage") == "train" and r.data.tags.get("dvc.exp_name")]
    assert ablation.info.run_name == "traj3"

    # A task whose cpu size profile is gone: prepare re-runs (its dependency changed) and validate fails.
    task = repo / "data" / "tasks" / "level1" / "01_relu.py"
    text = task.read_text()
    task.write_text(text[:text.index("KEVIN_PROFILES")])
    broken = _run(dvc + ["repro"], repo, env)
    output = broken.stdout + broken.stderr
    assert broken.returncode != 0, output[-3000:]
    assert "Running stage 'validate'" in output and "Running stage 'train'" not in output
    assert "every bundled task has a cpu size profile" in output and "level1/01_relu" in output
    assert "failed to reproduce 'validate'" in output
