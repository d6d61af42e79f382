"""What the DVC stages write besides the library's own outputs: the train stage's metrics and curves, the baseline
stage's reference timings keyed by hardware, the report stage's summary, and whether a train stage re-run may
resume the run it finds (``dvc.yaml``; docs/pipeline.md).

The metric functions are pure: they read the per-step ``summary.json`` records a training run writes
(``kevin.experiment.run``) and return plain data, so ``dvc metrics diff`` and ``dvc exp show`` compare runs.
"""

from __future__ import annotations

import csv
import json
import shutil
from pathlib import Path
from typing import Any, Iterable, Mapping, Sequence

__all__ = ["KERNELS_FILE", "STEPS_DIR", "baseline_entry", "headline_metrics", "kernel_rows", "merge_baselines",
           "prepare_output_dir", "read_run_config", "read_step_summaries", "read_step_verdicts", "report_markdown",
           "run_settings", "step_dirs", "step_index", "step_totals", "train_curve", "train_metrics", "write_csv",
           "write_json"]

STEPS_DIR = "steps"
"""A training run's step folders, ``<out_dir>/steps/step_NNNNNN`` (the run writes them: kevin.experiment.files)."""

CURVE_FIELDS = ("step", "kernels", "correct", "correct_share", "score_mean", "return_mean")
"""Columns of the train stage's per-step curve (``outputs/train/plots/steps.csv``)."""


def _weighted_mean(rows: Sequence[Mapping[str, Any]], key: str) -> float:
    """Mean of ``key`` over the kernels the rows stand for (each row is a turn: ``kernels`` of them)."""
    kernels = sum(int(r["kernels"]) for r in rows)
    return sum(float(r[key]) * int(r["kernels"]) for r in rows) / kernels if kernels else 0.0


def train_metrics(summaries: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """The run's metrics from its steps' summaries (in step order): steps done, kernels, correct kernels and their
    share, the mean kernel score over the whole run, per turn (``score_mean_turn_N``, 1-based) and at the last
    step, and the kernels per verdict."""
    turns = [row for s in summaries for row in s["turns"]]
    kernels = sum(int(r["kernels"]) for r in turns)
    correct = sum(int(r["correct"]) for r in turns)
    metrics: dict[str, Any] = {
        "steps_done": len(summaries), "kernels": kernels, "correct": correct,
        "correct_share": correct / kernels if kernels else 0.0,
        "score_mean": _weighted_mean(turns, "score_mean"),
        "score_mean_last_step": _weighted_mean(summaries[-1]["turns"], "score_mean") if summaries else 0.0,
    }
    for index in sorted({int(r["turn"]) for r in turns}):
        metrics[f"score_mean_turn_{index + 1}"] = _weighted_mean([r for r in turns if int(r["turn"]) == index],
                                                                 "score_mean")
    verdicts: dict[str, int] = {}
    for s in summaries:
        for status, count in s["verdicts"].items():
            verdicts[status] = verdicts.get(status, 0) + int(count)
    metrics["verdicts"] = verdicts
    return metrics


HEADLINE_TRAIN = ("steps_done", "correct_share", "score_mean", "score_mean_last_step")
"""The train figures of the headline (``headline_metrics``)."""
HEADLINE_EVAL = ("correct", "perf", "fast_1")
"""The evaluation's best@k figures of the headline, at the largest k of the evaluation."""


def headline_metrics(train: Mapping[str, Any], evaluation: Mapping[str, Any] | None) -> dict[str, Any]:
    """The few figures an ablation is compared by (``dvc exp show``, ``dvc metrics diff``): the training run's
    steps, correct share and mean kernel score (overall and at its last step), and the evaluation's tasks and its
    best@k and avg@k correct share, perf and fast_1 at the largest k it measured. Everything else stays in the
    stages' own metrics files, which DVC does not print by default."""
    out: dict[str, Any] = {"train": {k: train[k] for k in HEADLINE_TRAIN if k in train}}
    if evaluation:
        ks = [int(key.split("/")[0][len("best_at_"):]) for key in evaluation
              if key.startswith("best_at_") and key.endswith("/correct")]
        found: dict[str, Any] = {"tasks": evaluation.get("tasks", 0)}
        if ks:
            k = max(ks)
            found["k"] = k
            for kind in ("best", "avg"):
                for figure in HEADLINE_EVAL:
                    key = f"{kind}_at_{k}/{figure}"
                    if key in evaluation:
                        found[f"{kind}_{figure}"] = evaluation[key]
        out["evaluation"] = found
    return out


def step_totals(turns: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """A step's figures over its turns (a summary's ``turns`` rows): kernels, correct kernels, their share and the
    mean kernel score. Here, below ``kevin.analysis``, so the train stage's curve and the learning rows share it."""
    kernels = sum(int(t["kernels"]) for t in turns)
    correct = sum(int(t["correct"]) for t in turns)
    return {"kernels": kernels, "correct": correct, "correct_share": correct / kernels if kernels else 0.0,
            "score_mean": _weighted_mean(turns, "score_mean")}


def train_curve(summaries: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """One row per step (``CURVE_FIELDS``): kernels, correct kernels and share, mean kernel score, mean turn return."""
    return [{"step": int(s["step"]), **step_totals(s["turns"]),
             "return_mean": _weighted_mean(s["turns"], "return_mean")} for s in summaries]


def step_index(folder: str | Path) -> int:
    """The 0-based step of a ``step_NNNNNN`` folder: a step's (``steps/step_N``) or a checkpoint's."""
    return int(Path(folder).name.split("_")[1])


def step_dirs(out_dir: str | Path) -> list[Path]:
    """The run's step folders (``<out_dir>/steps/step_NNNNNN``, as the training run writes them), in step order;
    anything else there (a half-written ``step_N.tmp``) is left out."""
    found = [d for d in (Path(out_dir) / STEPS_DIR).glob("step_*") if d.name.split("_", 1)[1].isdigit()]
    return sorted(found, key=step_index)


def read_step_summaries(out_dir: str | Path) -> list[dict[str, Any]]:
    """Every finished step's ``summary.json`` of the run in ``out_dir``, in step order."""
    found = [d / "summary.json" for d in step_dirs(out_dir) if (d / "summary.json").is_file()]
    return [json.loads(p.read_text(encoding="utf-8")) for p in found]


KERNELS_FILE = "kernels.jsonl"
"""A finished step's judged kernels, one line each (``steps/step_N/kernels.jsonl``): the verdict with the turn, the
trajectory and whether the answer was cut off. Small, so it travels where the step's rollout does not."""


def kernel_rows(trajectories: Iterable[Any]) -> list[dict[str, Any]]:
    """The rows of ``KERNELS_FILE`` from a step's trajectories (``Trajectory`` records), in their order."""
    return [{**turn.result.to_dict(), "trajectory": traj.index, "turn": turn.turn, "truncated": bool(turn.truncated)}
            for traj in trajectories for turn in sorted(traj.turns, key=lambda t: t.turn) if turn.result is not None]


def read_step_verdicts(out_dir: str | Path) -> list[dict[str, Any]]:
    """Every judged kernel of the run's steps, each verdict with its 0-based ``step`` and ``turn`` added (and its
    ``trajectory`` where the step's files say it: its turn records or ``kernels.jsonl``).
    From a step's rollout where the run folder holds it: a finished turn's records (``rollout/**/turn_TTT.jsonl``)
    also say whether the answer was cut off at the length limit (``truncated``); a turn whose records were never
    written (a step killed while it was judged) gives its verdicts alone (``verdicts_TTT.jsonl``); a line cut off by
    a kill is skipped, as the rollout's own resume does. A step whose rollout is gone (a run moved without it) gives
    its ``kernels.jsonl``, or nothing if it has none."""
    found = []
    for step_dir in step_dirs(out_dir):
        step = step_index(step_dir)
        verdict_files = sorted(step_dir.glob("rollout/**/verdicts_*.jsonl"))
        if not verdict_files and (step_dir / KERNELS_FILE).is_file():
            found.extend({**row, "step": step} for row in _json_lines(step_dir / KERNELS_FILE))
        for path in verdict_files:
            turn = int(path.stem.split("_")[1])
            records = path.with_name(f"turn_{turn:03d}.jsonl")
            if records.is_file():
                found.extend({**row["result"], "truncated": bool(row.get("truncated")), "step": step, "turn": turn,
                              "trajectory": row.get("trajectory")}
                             for row in _json_lines(records) if isinstance(row.get("result"), dict))
            else:
                found.extend({**row, "step": step, "turn": turn} for row in _json_lines(path))
    return found


def read_eval_verdicts(eval_dir: str | Path, turn: int = 0) -> list[dict[str, Any]]:
    """Every kernel an evaluation run (``kevin evaluate``) judged at 0-based ``turn``, over all its budget splits
    (``rollouts/<split>/verdicts_TTT.jsonl``), each verdict with ``turn`` added. ValueError when there are none."""
    paths = sorted(Path(eval_dir).glob(f"rollouts/*/verdicts_{turn:03d}.jsonl"))
    found = [{**row, "turn": turn} for path in paths for row in _json_lines(path)]
    if not found:
        raise ValueError(f"{eval_dir} holds no judged kernel of turn {turn + 1} (rollouts/*/verdicts_{turn:03d}.jsonl): "
                         "is it the folder of a finished `kevin evaluate`?")
    return found


def _json_lines(path: Path) -> list[dict[str, Any]]:
    """The JSON objects of a JSON-lines file, less a line cut off by a kill."""
    rows = []
    for line in path.read_text(encoding="utf-8").splitlines():
        try:
            rows.append(json.loads(line))
        except json.JSONDecodeError:
            continue
    return rows


def write_json(path: str | Path, data: Any) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data, indent=1, sort_keys=True) + "\n", encoding="utf-8")
    return path


def write_csv(path: str | Path, rows: Sequence[Mapping[str, Any]], fields: Sequence[str]) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", newline="", encoding="utf-8") as handle:
        writer = csv.DictWriter(handle, fieldnames=list(fields))
        writer.writeheader()
        writer.writerows(rows)
    return path


def prepare_output_dir(out_dir: str | Path, params: Mapping[str, Any]) -> bool:
    """Before a train stage (re-)run: True when ``out_dir`` holds a run started with exactly ``params`` (the run's
    ``params_dict()``), which the stage then resumes (``persist: true`` keeps it across ``dvc repro``). A run
    started with other settings (DVC re-runs the stage because a parameter changed) is removed first: resuming
    it would mix two experiments in one run. False when there is nothing to resume."""
    started = read_run_config(out_dir)
    if started is None:
        return False
    # The same normalisation the run applies when it writes config.yaml (JSON round trip: tuples become lists).
    wanted = json.loads(json.dumps(dict(params), default=str))
    if started == wanted:
        return True
    shutil.rmtree(out_dir)
    return False


def read_run_config(out_dir: str | Path) -> dict[str, Any] | None:
    """The settings a run started with (its ``config.yaml``, as the run wrote it), or None when it has none."""
    import yaml

    config_file = Path(out_dir) / "config.yaml"
    return yaml.safe_load(config_file.read_text(encoding="utf-8")) if config_file.is_file() else None


def baseline_entry(times_ms: Mapping[str, float], *, backend: str, profile: str, torch_version: str,
                   threads: int, timing_trials: int) -> dict[str, Any]:
    """One hardware's PyTorch eager timings of the split's tasks, with what they depend on."""
    return {"backend": backend, "profile": profile, "torch": torch_version, "threads": threads,
            "timing_trials": timing_trials, "ms": {k: float(times_ms[k]) for k in sorted(times_ms)}}


def merge_baselines(previous: Mapping[str, Any], hardware: str, entry: Mapping[str, Any]) -> dict[str, Any]:
    """The baselines file keyed by hardware: ``previous`` with this hardware's entry replaced (the timings of other
    machines are kept: one file compares them)."""
    merged = {k: v for k, v in previous.items() if k != hardware}
    merged[hardware] = dict(entry)
    return dict(sorted(merged.items()))


def what_happened(train: Mapping[str, Any], evaluation: Mapping[str, Any] | None, *,
                  sft: Mapping[str, Any] | None = None, steps: Sequence[Mapping[str, Any]] = ()) -> list[str]:
    """The report's first lines, in words: the warm start (``sft``: the sft stage's record), what training did
    step by step (``steps``: the train curve's rows) and what the evaluation found; and the reason when a run
    could not learn (no correct kernel: every advantage 0)."""
    lines = []
    if sft is not None:
        if not sft.get("enabled"):
            lines.append("- Warm start: off (training starts from the policy's own weights).")
        else:
            how = (f"reused the one built earlier in `{sft['prebuilt']}`" if sft.get("prebuilt")
                   else f"trained in {float(sft.get('seconds', 0.0)):.0f} s")
            lines.append(f"- Warm start: {sft.get('examples', 0)} answers learned ({sft.get('steps', 0)} steps, loss "
                         f"{float(sft.get('train_loss', 0.0)):.3g}); {how}.")
    kernels, correct = int(train.get("kernels", 0)), int(train.get("correct", 0))
    line = (f"- Training: {train.get('steps_done', 0)} steps, {kernels} kernels judged, {correct} correct"
            + (f" ({correct / kernels:.0%})" if kernels else "") + ".")
    if steps:
        scores = [float(r["score_mean"]) for r in steps]
        line += " Mean kernel score per step: " + ", ".join(f"{v:.3f}" for v in scores)
        line += f" (last - first: {scores[-1] - scores[0]:+.3f})." if len(scores) > 1 else "."
    lines.append(line)
    if kernels and not correct:
        lines.append("- No training kernel was correct: every score was 0, so every advantage was 0 and no update "
                     "changed the policy.")
    if evaluation:
        judged, good = int(evaluation.get("kernels", 0)), int(evaluation.get("correct_kernels", 0))
        lines.append(f"- Evaluation: {judged} kernels judged, {good} correct"
                     + (f" ({good / judged:.0%})" if judged else "")
                     + f", geomean speedup of the correct ones {float(evaluation.get('geomean_speedup', 0.0)):.2f}x.")
    return lines


def run_settings(config: Any, model: str) -> dict[str, str]:
    """The settings that tell one run of the pipeline from another, as the report's first table shows them: the
    model (as ``model`` names it), the kernel backend, the rollout's size, the reward and the update."""
    r, t = config.rollout, config.train
    return {
        "model": model, "kernel backend": config.backend,
        "training": f"{config.experiment.steps} steps x {config.experiment.tasks_per_batch} tasks x "
                    f"{r.trajectories} trajectories x {r.turns} turns, {config.max_response_tokens} response tokens, "
                    f"T {config.temperature}",
        "reward": f"gamma {config.rewards.gamma}, {config.rewards.aggregation} of the turn scores",
        "update": f"lr {t.lr:g}" + (f", LoRA r {t.lora_r}" if t.lora else ", all weights") + f", clip {t.max_grad_norm:g}",
        "warm start": (f"{config.sft.epochs:g} epochs on {config.sft.data or 'the reference solutions'}"
                       if config.sft.enabled else "none"),
    }


def report_markdown(train: Mapping[str, Any], evaluation: Mapping[str, Any] | None, experiment: str, *,
                    sft: Mapping[str, Any] | None = None, steps: Sequence[Mapping[str, Any]] = (),
                    settings: Mapping[str, str] | None = None) -> str:
    """The report stage's page: the run's settings (when given), what happened in words (``what_happened``), then
    the train metrics, and the evaluation's when the evaluate stage wrote them."""
    lines = [f"# {experiment}", ""]
    if settings:
        lines += ["| setting | value |", "|---|---|", *(f"| {k} | {v} |" for k, v in settings.items()), ""]
    lines += ["## What happened", "", *what_happened(train, evaluation, sft=sft, steps=steps),
              "", "## Training", "", "| metric | value |", "|---|---|"]
    lines += [f"| {k} | {_fmt(v)} |" for k, v in train.items() if k != "verdicts"]
    if train.get("verdicts"):
        lines += ["", "verdicts: " + ", ".join(f"{k} {v}" for k, v in train["verdicts"].items())]
    lines += ["", "## Evaluation", ""]
    if evaluation:
        lines += ["| metric | value |", "|---|---|"]
        lines += [f"| {k} | {_fmt(v)} |" for k, v in _flatten(evaluation).items()]
    else:
        lines.append("(no evaluation metrics: the evaluate stage has not run)")
    return "\n".join(lines) + "\n"


def _fmt(value: Any) -> str:
    return f"{value:.4g}" if isinstance(value, float) else str(value)


def _flatten(data: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in data.items():
        name = f"{prefix}{key}"
        if isinstance(value, Mapping):
            out.update(_flatten(value, name + "."))
        else:
            out[name] = value
    return out
