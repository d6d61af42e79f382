"""The report commands: the pipeline's report page and headline figures (`report`), and whether a training run's
policy learned (`learning`)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Optional

import typer

from kevin_cli.common import die, params_files

FORECAST_TRAJECTORIES = (4, 8, 16)
"""Group sizes `learning` forecasts the mixed share for (``mixed_share_at``): the H200 runs' 4, and 8 and the
paper's 16, so a run's own figure sits beside what more trajectories a task would buy."""


def report_cmd(
    train_metrics: Path = typer.Option(..., "--train", help="the train stage's metrics (JSON)"),
    evaluation: Optional[Path] = typer.Option(None, "--evaluation", help="the evaluate stage's metrics (JSON), if any"),
    out: Path = typer.Option(..., help="folder for report.md"),
    params: Optional[list[Path]] = typer.Option(
        None, "--params", help="the run's params files (repeat to layer): the report's title is the experiment's "
                               "name and its first table the run's settings"),
    name: Optional[str] = typer.Option(None, help="the report's title (default: the experiment's name, else 'kevin')"),
    headline: Optional[Path] = typer.Option(None, help="write the few figures an ablation is compared by here "
                                                       "(JSON; the pipeline's `dvc metrics`)"),
    sft: Optional[Path] = typer.Option(None, help="the sft stage's record (sft.json): the report says how the warm "
                                                  "start went"),
    curve: Optional[Path] = typer.Option(None, help="the train stage's per-step curve (CSV): the report lists the "
                                                    "mean score of every step"),
) -> None:
    """The pipeline's report: the settings, what happened in words, then the train and evaluation metrics, in one
    markdown page; and the headline figures in one small JSON."""
    from kevin.pipeline import headline_metrics, report_markdown, run_settings, write_json

    if not train_metrics.is_file():
        die(f"no such metrics file: {train_metrics}")
    train = json.loads(train_metrics.read_text(encoding="utf-8"))
    found = json.loads(evaluation.read_text(encoding="utf-8")) if evaluation and evaluation.is_file() else None
    settings = None
    if params:
        from kevin.config import RunConfig
        from kevin.experiment.policies import model_label

        try:
            config = RunConfig.from_files(params_files(params))
        except (ValueError, FileNotFoundError) as exc:
            die(str(exc))
        settings = run_settings(config, model_label(config))
        name = name or config.experiment.name
    if headline is not None:  # under one key: `dvc exp show` names its columns headline.train... apart from the params
        write_json(headline, {"headline": headline_metrics(train, found)})
    record = json.loads(sft.read_text(encoding="utf-8")) if sft and sft.is_file() else None
    steps = []
    if curve and curve.is_file():
        import csv

        with curve.open(encoding="utf-8", newline="") as handle:
            steps = list(csv.DictReader(handle))
    out.mkdir(parents=True, exist_ok=True)
    (out / "report.md").write_text(report_markdown(train, found, name or "kevin", sft=record, steps=steps,
                                                   settings=settings), encoding="utf-8")
    typer.echo(f"report: {out / 'report.md'}" + (f"  headline: {headline}" if headline is not None else ""))


def learning_cmd(
    run_dir: Path = typer.Argument(..., help="a training run's folder (outputs/<experiment.name>)"),
    out: Optional[Path] = typer.Option(None, help="folder for learning.csv, learning.json and learning.png "
                                                  "(default: RUN_DIR/plots)"),
    window: int = typer.Option(5, help="steps in each of the first and the last window compared"),
    start: Optional[list[Path]] = typer.Option(None, help="a `kevin evaluate` folder of the model the run started "
                                                          "from on its train split: each task's first-turn kernels "
                                                          "at its first and its last draw, and every draw by windows "
                                                          "of --start-window steps, are also compared with it; give "
                                                          "it again for a repeat at another seed (pooled)"),
    start_window: int = typer.Option(10, min=1, help="steps in each window compared with --start"),
) -> None:
    """Did the policy learn? Per step: mean kernel score and correct share, overall and per turn (a table, a CSV and
    a plot); the last WINDOW steps' mean score against the first WINDOW steps' with a 90% bootstrap interval; and,
    task by task, each train task's correct share and score at its last draw against its first, and at each draw
    against its first (and, with --start, against the model the run started from)."""
    from kevin.analysis.learning import LEARNING_FIELDS, learning_rows, plot_learning, turn_step_rows
    from kevin.pipeline import read_step_summaries, read_step_verdicts, write_csv, write_json

    summaries = read_step_summaries(run_dir)
    rows = learning_rows(summaries)
    if not rows:
        die(f"{run_dir} holds no finished training step (steps/step_N/summary.json)")
    verdicts = read_step_verdicts(run_dir)
    answers = {r["step"]: r for r in turn_step_rows(verdicts)}
    for row in rows:  # what each turn's answers did, for the steps whose rollouts are here
        row.update({k: v for k, v in answers.get(row["step"], {}).items() if k != "step"})
    out = out or run_dir / "plots"
    extra = sorted({k for r in rows for k in r} - set(LEARNING_FIELDS))
    write_csv(out / "learning.csv", rows, [*LEARNING_FIELDS, *extra])
    _say_steps(rows)
    gain = _window(summaries, rows, window)
    _say_rest(run_dir)
    paired = _task_gains(summaries)
    by_draw = _draw_gains(summaries)
    per_turn = _turn_gains(verdicts, {int(r["step"]) for r in rows})
    groups = _say_groups(verdicts)
    followups = _say_followups(verdicts)
    against, windows = _start_gains(start, verdicts, start_window) if start else ({}, [])
    floor = _say_floor(verdicts)
    write_json(out / "learning.json", {"steps": len(rows), "gain": gain.to_dict() if gain else None,
                                       "per_task": {k: v.to_dict() for k, v in paired.items()},
                                       "per_task_by_draw": {metric: [g.to_dict() for g in gains]
                                                            for metric, gains in by_draw.items()},
                                       "per_task_turn": per_turn, "groups": groups, "followups": followups,
                                       "against_start": against, "floor": floor})
    plot = plot_learning(rows, out / "learning.png", title=f"{run_dir.name}: {len(rows)} steps", gain=gain,
                         by_draw=by_draw["correct_share"], against_start=windows)
    typer.echo(f"plot: {plot}")


def _say_steps(rows: list[dict[str, Any]]) -> None:
    """The per-step table: scores and how far the update moved; then, where the rollouts are here, each turn's
    shares of answers cut off at the length limit and of parse errors."""
    for row in rows:
        turns = "  ".join(f"t{k.rsplit('_', 1)[1]} {row[k]:.3f}" for k in sorted(row)
                          if k.startswith("score_mean_turn_"))
        moved = (f"  lr {row['lr']:.1e}  kl {row['policy_kl']:.1e}  entropy {row['entropy']:.3f}"
                 + (f"  skipped {row['skipped_steps']}" if row["skipped_steps"] else "")) if "lr" in row else ""
        typer.echo(f"step {row['step']:3d}  kernels {row['kernels']:3d}  correct {row['correct_share']:.3f}  "
                   f"score {row['score_mean']:.3f}  ({turns}){moved}")
    held = [r for r in rows if any(k.startswith("parse_error_share_turn_") for k in r)]
    if held:
        typer.echo("answers per turn (share cut off at the length limit / share of parse errors):")
    for row in held:
        turns = sorted(int(k.rsplit("_", 1)[1]) for k in row if k.startswith("parse_error_share_turn_"))
        cells = "  ".join(f"t{n} {_share(row.get(f'truncated_share_turn_{n}'))}/"
                          f"{row[f'parse_error_share_turn_{n}']:.2f}" for n in turns)
        typer.echo(f"step {row['step']:3d}  {cells}")


def _share(value: float | None) -> str:
    return "  ? " if value is None else f"{value:.2f}"


def _window(summaries: list[dict[str, Any]], rows: list[dict[str, Any]], window: int) -> Any:
    """The first and last windows' mean scores with their interval, and whether the windows drew the same tasks."""
    from kevin.analysis.learning import window_gain, window_tasks

    try:
        gain = window_gain([r["score_mean"] for r in rows], window)
    except ValueError as exc:
        typer.echo(f"no comparison of first and last steps: {exc}")
        return None
    typer.echo(f"mean score, first {window} steps {gain.first:.4f} -> last {window} {gain.last:.4f}: "
               f"{_gain_text(gain)}")
    first, last, both = window_tasks(summaries, window)
    if both < max(first, last):
        typer.echo(f"  the windows drew different tasks (first {first}, last {last}, {both} in both): this gain "
                   "mixes which tasks were drawn with what the policy learned; the task-by-task figures pair them")
    return gain


def _say_rest(run_dir: Path) -> None:
    """A run whose barren tasks rest draws fewer of the tasks it cannot solve as it goes: say so beside the gain."""
    from kevin.pipeline import read_run_config

    rest = ((read_run_config(run_dir) or {}).get("experiment") or {}).get("rest_barren_epochs", 0)
    if rest:
        typer.echo(f"  this run rests barren tasks (experiment.rest_barren_epochs={rest}): its later steps draw fewer "
                   "tasks it cannot solve, so the mean score rises with the mix alone; the task-by-task figures "
                   "compare like with like")


def _task_gains(summaries: list[dict[str, Any]]) -> dict[str, Any]:
    from kevin.analysis.learning import task_gain

    paired = {}
    for metric in ("correct_share", "score_mean"):
        try:
            paired[metric] = task_gain(summaries, metric)
        except ValueError as exc:
            typer.echo(f"no task-by-task comparison of {metric}: {exc}")
            continue
        _say_paired(metric, paired[metric])
    return paired


def _draw_gains(summaries: list[dict[str, Any]]) -> dict[str, list[Any]]:
    """Each task's correct share at its k-th draw against its first, for every k the run reached (``draw_gains``):
    said only where some task was drawn three times or more, since at two the last draw is the second."""
    from kevin.analysis.learning import draw_gains

    found = {metric: draw_gains(summaries, metric) for metric in ("correct_share", "score_mean")}
    if len(found["correct_share"]) > 1:
        for g in found["correct_share"]:
            typer.echo(f"correct_share, the {g.tasks} tasks drawn {g.draw} times or more, first -> draw {g.draw}: "
                       f"{g.first:.4f} -> {g.last:.4f}: {_gain_text(g)}")
    return found


def _start_gains(starts: list[Path], verdicts: list[dict[str, Any]], window: int) -> tuple[dict[str, Any], list[Any]]:
    """Each task's first-turn kernels at its first and last draw against the start's evaluations, pooled
    (``start_gain``), and every draw by windows of ``window`` steps (``start_windows``): the figures for
    learning.json, and the windows for the plot."""
    from kevin.analysis.learning import start_gain, start_windows, turn_task_visits
    from kevin.pipeline import read_eval_verdicts

    reference = []
    for start in starts:
        try:
            reference.extend(read_eval_verdicts(start))
        except ValueError as exc:
            die(str(exc))
    names = " + ".join(start.name for start in starts)
    # Before any task is drawn twice its last draw is its first: say it once.
    draws = ("first", "last") if any(len(v) > 1 for v in turn_task_visits(verdicts, 1, "correct_share").values()) \
        else ("first",)
    found: dict[str, Any] = {}
    for metric in ("correct_share", "score_mean"):
        for at in draws:
            try:
                g = start_gain(reference, verdicts, metric, at)
            except ValueError as exc:
                typer.echo(f"no comparison with {names}: {exc}")
                return found, []
            found[f"{metric}_{at}"] = g.to_dict()
            typer.echo(f"{metric}, first turn, the start ({names}) -> the run at each task's {at} draw, "
                       f"{g.tasks} tasks: {g.first:.4f} -> {g.last:.4f}: {_gain_text(g)}")
    try:
        windows = start_windows(reference, verdicts, "correct_share", window)
    except ValueError as exc:
        die(str(exc))
    found["correct_share_windows"] = [w.to_dict() for w in windows]
    typer.echo(f"correct_share, first turn, every draw against the start on the same task, by {window} steps:")
    for w in windows:
        typer.echo(f"  steps {w.first_step}-{w.last_step}, {w.pairs} draws: {w.first:.4f} -> {w.last:.4f}: "
                   f"{_gain_text(w)}")
    return found, windows


def _say_floor(verdicts: list[dict[str, Any]]) -> dict[str, float] | None:
    """What the score's floor cost the correct kernels the run judged (docs/judge.md)."""
    from kevin.analysis.learning import floor_raises

    floor = floor_raises(verdicts)
    if floor is not None:
        typer.echo(f"the score's floor: {floor['raised']} of {floor['kernels']} correct kernels judged here were scored "
                   f"slower than they reported, median {floor['median_raise']:.1%}, at most {floor['max_raise']:.1%}")
    return floor


def _say_paired(label: str, p: Any) -> None:
    typer.echo(f"{label}, the same {p.tasks} tasks at their first and last draw: {p.first:.4f} -> {p.last:.4f}: "
               f"{_gain_text(p)}")


def _gain_text(g: Any) -> str:
    """A ``Gain`` in the words every line of ``kevin learning`` uses: the gain, its interval, the verdict."""
    return f"gain {g.gain:+.4f}, 90% bootstrap interval [{g.low:+.4f}, {g.high:+.4f}]: {g.verdict}"


def _say_groups(verdicts: list[dict[str, Any]]) -> dict[int, dict[str, Any]]:
    """What the updates had to learn from: per turn, how the groups of one task's kernels came out."""
    from kevin.analysis.learning import mixed_share_at, turn_groups

    groups: dict[int, dict[str, Any]] = dict(turn_groups(verdicts))
    if groups:
        typer.echo("groups (one task's kernels at one turn of a step): none correct / correct beside failing (what an "
                   "update learns correctness from) / all correct")
    for turn, c in groups.items():
        c["mixed_share_at"] = {n: mixed_share_at(verdicts, turn, n) for n in FORECAST_TRAJECTORIES}
        forecast = " / ".join(f"{share:.2f}" for share in c["mixed_share_at"].values())
        typer.echo(f"turn {turn}: {c['groups']} groups: {c['none_correct']} / {c['mixed']} "
                   f"({c['mixed'] / c['groups']:.2f}) / {c['all_correct']}; at its tasks' correct rates, groups of "
                   f"{' / '.join(map(str, FORECAST_TRAJECTORIES))} would be mixed in {forecast}")
    return groups


def _say_followups(verdicts: list[dict[str, Any]]) -> dict[int, dict[str, int]]:
    """Whether the refinement turns refine: what each trajectory wrote after its previous turn's verdict."""
    from kevin.analysis.learning import turn_followups

    followups = turn_followups(verdicts)
    for turn, c in followups.items():
        failed, kept = c["after_failure"], c["after_correct"]
        typer.echo(f"turn {turn} after a failing turn {turn - 1}: {failed} kernels, {c['repeated_after_failure']} "
                   f"({c['repeated_after_failure'] / max(failed, 1):.2f}) a kernel already judged, byte for byte; "
                   f"{c['fixed']} ({c['fixed'] / max(failed, 1):.2f}) correct. After a correct turn {turn - 1}: "
                   f"{kept} kernels, {c['repeated_after_correct']} already judged, {c['lost']} failing")
    return followups


def _turn_gains(verdicts: list[dict[str, Any]], finished: set[int]) -> dict[str, Any]:
    """Task by task per turn, from the judged kernels of the steps the run folder holds (rollouts or kernels.jsonl);
    ``finished``: the 1-based numbers of the steps with a summary."""
    from kevin.analysis.learning import TURN_METRICS, turn_task_gain

    held = {int(v["step"]) + 1 for v in verdicts}
    if finished - held:
        typer.echo(f"per turn: the judged kernels of {len(finished & held)} of {len(finished)} steps are here (the "
                   "others travelled without their rollouts, from before steps kept kernels.jsonl)")
    if held - finished:
        # A step stopped mid-way (a call's time limit) leaves the kernels it judged, sampled from the checkpoint
        # before it: real draws of the policy, so they count, and the reader is told which step they come from.
        typer.echo(f"per turn, groups, follow-ups and against the start: with the judged kernels of unfinished step "
                   f"{', '.join(map(str, sorted(held - finished)))} (a resume redoes it from them)")
    gains: dict[str, Any] = {}
    for turn in sorted({int(v["turn"]) + 1 for v in verdicts}):
        for metric in TURN_METRICS:
            try:
                g = turn_task_gain(verdicts, turn, metric)
            except ValueError:
                continue
            gains[f"turn_{turn}/{metric}"] = g.to_dict()
            _say_paired(f"turn {turn} {metric}", g)
    return gains
