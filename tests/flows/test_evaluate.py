"""`kevin evaluate` end to end on the cpu backend with a tiny model and the real evaluator, under Prefect's test
harness: every table, curve and plot of a run; a run interrupted after its first generation and resumed (nothing
generated or judged twice); a training checkpoint evaluated and compared with the base model; beam selection.

Each task has 4 trajectories of 2 turns; trajectories 0 and 1 replay the task's reference kernel in turn 1 and give
up (no code) in turn 2 (tests/flows/policies.py), trajectories 2 and 3 are the tiny model's text (no kernel). So per
task exactly 2 of the 8 kernels are correct, both in turn 1, and every number below follows by hand."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest

from kevin.records.jsonl import read_jsonl
from tests.conftest import REPO
from tests.flows.conftest import write_params

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")

PARAMS = REPO / "params.yaml"
EVAL_TASKS = ("level1/01_relu", "level1/03_sigmoid")


@pytest.fixture(scope="module")
def eval_split(tmp_path_factory) -> Path:
    from kevin.tasks import Split, SplitConfig, SplitEntry, find_task, load_bundled_suite, write_split

    suite = load_bundled_suite()
    entries = tuple(SplitEntry(t.task_id, t.level, t.digest) for t in (find_task(suite, i) for i in EVAL_TASKS))
    other = find_task(suite, "level1/02_gelu")
    split = Split(SplitConfig(levels=(1,)), train=(SplitEntry(other.task_id, 1, other.digest),), eval=entries)
    return write_split(tmp_path_factory.mktemp("evalsplit") / "split.json", split)


def eval_params(path: Path, root: Path, name: str, model: Path, split: Path, cache: Path, **extra) -> Path:
    sections = {
        "max_response_tokens": 448,  # the longest replayed reference (sigmoid) is about 400 tokens
        "response_length_schedule": {},
        "experiment": {"torch_threads": 1},
        "policy": {"backend": "hf", "model": str(model), "wrap": "tests.flows.policies:replay_first_turn"},
        "sampling": {"batch_size": 8},
        "evaluation": {"timing_trials": 5, "warmup_trials": 1, "correctness_trials": 2, "cache_dir": str(cache),
                       "clock_slack_ms": 1000.0},
        "evaluate": {"name": name, "output_dir": str(root / name), "checkpoint": "none", "split": str(split)},
        "analysis": {"budget_splits": ["4x2", "2x2", "4x1"], "pass_ks": [1, 2]},
    }
    for key, value in extra.items():
        sections[key] = {**sections.get(key, {}), **value}
    return write_params(path, **sections)


def run_flow(params: Path, root: Path, **kwargs):
    from flows.evaluate import evaluate

    return evaluate(params=[str(PARAMS), str(params)], project_dir=str(root), return_state=True, **kwargs)


def turn_speedups(rollout: Path) -> dict[str, list[float]]:
    """Per task, the speedup of each correct kernel of turn 1 (the replayed references), in trajectory order."""
    out: dict[str, list[float]] = {}
    for row in read_jsonl(rollout / "turn_000.jsonl"):
        if row["result"]["correct"]:
            out.setdefault(row["task_id"], []).append(row["result"]["speedup"])
    return out


@pytest.fixture(scope="module")
def base_run(harness, model_dirs, eval_split, cache_dir, tmp_path_factory):
    root = tmp_path_factory.mktemp("evaluate")
    params = eval_params(root / "base.yaml", root, "base", model_dirs["tiny"], eval_split, cache_dir)
    state = run_flow(params, root)
    return {"state": state, "root": root, "out": root / "base"}


def test_a_run_writes_every_table_curve_and_plot_with_hand_computed_metrics(base_run, model_dirs):
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterId

    state, out = base_run["state"], base_run["out"]
    assert state.is_completed(), state.message
    result = state.result()
    assert result["size"] == "4x2" and result["tasks"] == 2 and result["checkpoint"] == ""
    assert result["calls"] == {"generations": 2, "evaluations": 4}  # 2 turns; 2 tasks x 2 reference kernels

    # One rollout of the largest split (4x2) serves every split.
    rollout = out / "rollouts" / "4x2"
    speedups = turn_speedups(rollout)
    assert sorted(speedups) == sorted(EVAL_TASKS) and all(len(v) == 2 and min(v) > 0 for v in speedups.values())
    metrics = json.loads((out / "metrics.json").read_text())
    # correct per task: trajectories [1, 1, 0, 0] -> best@4 = 1, avg = 1/2, best@1 = 1/2,
    # best@2 = 1 - C(2,2)/C(4,2) = 5/6, best@3 = 1 - C(2,3)/C(4,3) = 1.
    assert metrics["best_at_4/correct"] == 1.0 and metrics["avg_at_4/correct"] == 0.5
    assert metrics["best_at_1/correct"] == 0.5 and metrics["best_at_2/correct"] == pytest.approx(5 / 6)
    assert metrics["best_at_3/correct"] == 1.0
    # perf per task: values [s_a, s_b, 0, 0] -> best@4 = max, best@1 = mean, best@2 = (s_lo * 2 + s_hi * 3) / 6.
    per_task = [sorted(v) for v in speedups.values()]
    assert metrics["best_at_4/perf"] == pytest.approx(sum(hi for lo, hi in per_task) / 2)
    assert metrics["best_at_1/perf"] == pytest.approx(sum(lo + hi for lo, hi in per_task) / 8)
    assert metrics["best_at_2/perf"] == pytest.approx(sum((2 * lo + 3 * hi) / 6 for lo, hi in per_task) / 2)
    # Kernels: 2 tasks x 4 trajectories x 2 turns, 4 correct; pass@1 over kernels = 2/8 per task.
    assert metrics["kernels"] == 16.0 and metrics["correct_kernels"] == 4.0 and metrics["pass_at_1/kernels"] == 0.25
    assert metrics["turn_1/kernels"] == 8.0 and metrics["turn_1/best_at_4/correct"] == 1.0
    # Splits read from the same rollout: 2x2 = best@2 after turn 2, 4x1 = best@4 after turn 1.
    assert metrics["split_2x2/best_at_2/correct"] == pytest.approx(5 / 6)
    assert metrics["split_4x1/best_at_4/perf"] == metrics["best_at_4/perf"]
    geo = 1.0
    for s in speedups.values():
        geo *= s[0] * s[1]
    assert metrics["geomean_speedup"] == pytest.approx(geo ** (1 / 4))

    # Tables, curves (DVC plots: one x column, a column per metric) and plots.
    table1 = (out / "tables" / "table1.md").read_text()
    assert "| base" in table1 and "| 4x2" in table1 and "100% / 50%" in table1
    assert "| 4x2" in (out / "tables" / "table2.md").read_text() and "83%" in (out / "tables" / "table2.md").read_text()
    rows = list(csv.DictReader((out / "tables" / "table2.csv").open()))
    assert [r["split"] for r in rows] == ["4x2", "2x2", "4x1"]
    best_at_k = list(csv.DictReader((out / "curves" / "best_at_k.csv").open()))
    assert [r["k"] for r in best_at_k] == ["1", "2", "3", "4"] and float(best_at_k[1]["correct"]) == pytest.approx(5 / 6)
    for split, turns in (("4x2", 2), ("2x2", 2), ("4x1", 1)):
        curve = list(csv.DictReader((out / "curves" / "turns" / f"{split}.csv").open()))
        assert [r["turn"] for r in curve] == [str(t) for t in range(1, turns + 1)]
    for name in ("best_at_k.png", "turn_curves.png", "task_speedups.png"):
        assert (out / "plots" / name).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"

    # MLflow: tags, metrics and artifacts.
    from mlflow.tracking import MlflowClient

    client = MlflowClient(f"sqlite:///{base_run['root'] / 'mlflow.db'}")
    run = client.get_run(result["mlflow"]["run_id"])
    assert run.info.status == "FINISHED" and run.info.run_name == "base"
    assert run.data.tags["kind"] == "evaluation" and run.data.tags["checkpoint"] == "none"
    assert run.data.tags["budget_splits"] == "4x2,2x2,4x1" and run.data.tags["model"] == str(model_dirs["tiny"])
    assert run.data.metrics["best_at_4/correct"] == 1.0
    logged = {a.path for folder in ("tables", "plots", "curves") for a in client.list_artifacts(run.info.run_id, folder)}
    assert {"tables/table1.md", "tables/table2.csv", "plots/turn_curves.png", "curves/best_at_k.csv"} <= logged

    # Prefect: a task run per stage and turn, and the tables as an artifact.
    with get_client(sync_client=True) as prefect:
        flow_run = prefect.read_flow_run(state.state_details.flow_run_id)
        assert flow_run.name == "base"
        names = {t.name for t in prefect.read_task_runs(flow_run_filter=FlowRunFilter(id=FlowRunFilterId(any_=[flow_run.id])))}
        assert {f"{s}-4x2-turn-{t}" for s in ("generate", "parse", "evaluate") for t in (1, 2)} <= names
        assert {"analyse", "write-outputs", "track"} <= {n.rsplit("-", 1)[0] for n in names}
        artifact = prefect.read_artifacts()
    # Keyed by the run (8 characters of its MLflow run id): another evaluation named "base" gets another key.
    key = f"base-{result['mlflow']['run_id'][:8]}-evaluation"
    assert any(a.key == key and "Cells: perf / correct" in a.data for a in artifact)


@pytest.fixture(scope="module")
def checkpoint_dir(model_dirs, tmp_path_factory) -> Path:
    """A real training checkpoint (GRPOTrainer.save_checkpoint) of the tiny model after step 2."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from kevin.training.config import TrainConfig
    from kevin.training.trainer import GRPOTrainer

    folder = tmp_path_factory.mktemp("train") / "checkpoints"
    model = AutoModelForCausalLM.from_pretrained(model_dirs["tiny"])
    tokenizer = AutoTokenizer.from_pretrained(model_dirs["tiny"])
    GRPOTrainer(model, TrainConfig(device="cpu"), tokenizer=tokenizer).save_checkpoint(folder, 2)
    return folder


def test_an_interrupted_checkpoint_evaluation_resumes_without_generating_or_judging_again(
        base_run, model_dirs, eval_split, cache_dir, checkpoint_dir):
    from kevin.config import RunConfig
    from kevin.experiment.evaluate import EvaluationRun

    root = base_run["root"]
    params = eval_params(root / "ckpt.yaml", root, "ckpt", model_dirs["tiny"], eval_split, cache_dir)
    files = [str(PARAMS), str(params)]
    # Interrupted after turn 1 was generated and parsed, before any kernel was judged.
    run = EvaluationRun(RunConfig.from_files(files, [f"evaluate.checkpoint={checkpoint_dir}"]), project_dir=root)
    run.open()
    run.generate("4x2", 0)
    run.parse("4x2", 0)
    run.close(KeyboardInterrupt())
    assert run.calls == {"generations": 1, "evaluations": 0}

    # Not continued without --resume.
    refused = run_flow(params, root, checkpoint=str(checkpoint_dir))
    assert refused.is_failed() and "--resume" in refused.message

    state = run_flow(params, root, checkpoint=str(checkpoint_dir), resume=True)
    assert state.is_completed(), state.message
    result = state.result()
    # Turn 1 is not generated again (only turn 2 is); its 4 reference kernels are judged once, turn 2 has none.
    assert result["calls"] == {"generations": 1, "evaluations": 4}
    assert result["checkpoint"] == str(checkpoint_dir / "step_000002") and result["checkpoint_step"] == 2
    metrics = json.loads((root / "ckpt" / "metrics.json").read_text())
    assert metrics["best_at_4/correct"] == 1.0 and metrics["best_at_2/correct"] == pytest.approx(5 / 6)

    # A finished run resumed: nothing generated or judged, the same numbers; MLflow gets them once.
    again = run_flow(params, root, checkpoint=str(checkpoint_dir), resume=True).result()
    assert again["calls"] == {"generations": 0, "evaluations": 0}
    assert json.loads((root / "ckpt" / "metrics.json").read_text()) == metrics
    from mlflow.tracking import MlflowClient

    client = MlflowClient(f"sqlite:///{root / 'mlflow.db'}")
    tags = client.get_run(result["mlflow"]["run_id"]).data.tags
    assert tags["checkpoint_step"] == "2" and tags["model"] == f"checkpoint {checkpoint_dir / 'step_000002'}"
    assert len(client.get_metric_history(result["mlflow"]["run_id"], "best_at_4/correct")) == 1

    # Resuming with another model is refused: its rollouts were generated by the checkpoint.
    other = run_flow(params, root, checkpoint="none", resume=True)
    assert other.is_failed() and "model" in other.message

    # Comparison mode: base model vs checkpoint, side by side.
    from typer.testing import CliRunner

    from kevin_cli import app

    cli = CliRunner().invoke(app, ["evaluate", "--compare", str(root / "base"), "--compare", str(root / "ckpt"),
                                   "--out", str(root / "compare")])
    assert cli.exit_code == 0, cli.output
    comparison = (root / "compare" / "tables" / "comparison.md").read_text()
    header = comparison.splitlines()[0]
    assert "| base" in header and "| ckpt" in header and "ckpt - base" in header
    assert "| correct best@k" in comparison and "+0 pts" in comparison
    assert [r["run"] for r in csv.DictReader((root / "compare" / "tables" / "table1.csv").open())] == ["base", "ckpt"]
    # Task by task: both runs evaluated the same eval tasks, so each of the six rows pairs every one of them
    # (the reports a run writes now keep each task's share of correct tries).
    paired = (root / "compare" / "tables" / "paired.md").read_text().splitlines()
    tasks = json.loads((root / "base" / "report.json").read_text())["tasks"]
    assert [line.split("|")[1].strip() for line in paired[2:]] == [
        "tasks solved", "tasks faster than eager", "best perf", "tries correct (avg@k)", "tasks solved, tries redrawn",
        "tries correct, tries redrawn"]
    assert all(line.split("|")[3].strip() == str(tasks) for line in paired[2:])
    assert "Task by task" in cli.output and "tasks solved" in cli.output
    # Tasks that moved: every eval task of both runs tested, the sentence printed and kept.
    moved = (root / "compare" / "tables" / "moved.md").read_text()
    assert moved.startswith("ckpt against base: ") and f"of {tasks} tasks rose" in moved
    assert "Tasks that moved:" in cli.output and moved.splitlines()[0] in cli.output
    for name in ("best_at_k.png", "turn_curves.png", "task_speedups.png"):
        assert (root / "compare" / "plots" / name).is_file()


def test_beam_selection_branches_the_best_trajectory(base_run, model_dirs, eval_split, cache_dir):
    root = base_run["root"]
    params = eval_params(root / "beam.yaml", root, "beam", model_dirs["tiny"], eval_split, cache_dir,
                         analysis={"budget_splits": ["4x2"]}, beam={"strategy": "top_k", "keep": 1})
    state = run_flow(params, root)
    assert state.is_completed(), state.message
    rollout = root / "beam" / "rollouts" / "4x2"
    parents = json.loads((rollout / "parents_000.json").read_text())
    # keep 1: every slot of turn 2 continues the trajectory with the fastest reference kernel of turn 1.
    for task, speeds in turn_speedups(rollout).items():
        best = max(range(2), key=lambda j: (speeds[j], -j))
        assert parents[task] == [best] * 4
    metrics = json.loads((root / "beam" / "metrics.json").read_text())
    # After turn 1 half the slots are correct; after turn 2 every slot's lineage holds the best correct kernel.
    assert metrics["turn_1/avg_at_4/correct"] == 0.5 and metrics["avg_at_4/correct"] == 1.0
    assert metrics["avg_at_4/perf"] == pytest.approx(metrics["best_at_4/perf"])


def test_the_train_side_of_the_split_is_evaluated_when_asked(model_dirs, eval_split, tmp_path, cache_dir):
    from kevin.config import RunConfig
    from kevin.experiment.evaluate import EvaluationRun

    params = eval_params(tmp_path / "p.yaml", tmp_path, "sides", model_dirs["tiny"], eval_split, cache_dir,
                         tracking={"enabled": False})
    files = [str(PARAMS), str(params)]
    for side, expected in (("eval", list(EVAL_TASKS)), ("train", ["level1/02_gelu"])):
        overrides = [f"evaluate.tasks={side}", f"evaluate.output_dir={tmp_path / side}"]
        run = EvaluationRun(RunConfig.from_files(files, overrides), project_dir=tmp_path)
        run.open()
        assert [t.task_id for t in run.tasks] == expected
        run.close(None)
    with pytest.raises(ValueError, match="evaluate.tasks must be eval or train"):
        RunConfig.from_files(files, ["evaluate.tasks=both"])
