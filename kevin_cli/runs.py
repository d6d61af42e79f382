"""The run commands: `train` and `evaluate` run their Prefect flows in this process; `sft` builds the optional warm
start the training run starts from."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

from kevin_cli.common import die, params_files, quiet_libraries


def train_cmd(
    params: Optional[list[Path]] = typer.Option(
        None, "--params", help="params file (repeat to layer several, later ones win); default: params.yaml"),
    overrides: Optional[list[str]] = typer.Option(
        None, "--set", metavar="KEY=VALUE", help="override a setting, e.g. --set experiment.steps=2 (repeatable)"),
    resume: bool = typer.Option(False, "--resume", help="continue the experiment's run from its newest checkpoint"),
    restart_if_changed: bool = typer.Option(
        False, "--restart-if-changed",
        help="with --resume: a run in the output folder started with other settings is removed and a new one starts "
             "(the DVC train stage: a changed parameter means a new run, the same ones a resume)"),
    metrics: Optional[Path] = typer.Option(None, help="write the run's metrics here (JSON) when it ends"),
    curve: Optional[Path] = typer.Option(None, help="write the run's per-step curve here (CSV) when it ends, and its "
                                                    "plot beside it (the same name, .png)"),
    verbose: bool = typer.Option(False, "--verbose", help="show Prefect's and the library's INFO logs too"),
) -> None:
    """Train: run the Prefect training flow in this process (no server needed) and print its results."""

    files = params_files(params)
    quiet_libraries(verbose)
    from flows.train import load_config, run_training
    from kevin.experiment.files import existing_run

    try:
        config = load_config(files, list(overrides or []))
    except (ValueError, FileNotFoundError) as exc:
        die(str(exc))
    out_dir = config.experiment.resolved_output_dir(Path.cwd())
    if restart_if_changed:
        if not resume:
            die("--restart-if-changed goes with --resume (it decides whether the run found is resumed)")
        from kevin.pipeline import prepare_output_dir

        if out_dir.exists() and not prepare_output_dir(out_dir, config.params_dict()):
            typer.echo(f"{out_dir}: no run with these settings to resume; starting a new one", err=True)
    if existing_run(out_dir) and not resume:
        die(f"{out_dir} already holds a run of experiment {config.experiment.name!r}; continue it with --resume, or "
             "name this one differently (--set experiment.name=...)")
    from kevin.experiment.progress import RichProgress

    progress = RichProgress()
    state = run_training(files, list(overrides or []), resume=resume, project_dir=str(Path.cwd()), progress=progress)
    if state.is_failed() or state.is_crashed():
        typer.echo(f"error: training failed: {state.message}", err=True)
        raise typer.Exit(1)
    from kevin.experiment.report import print_results

    print_results(state.result(), progress.console, stopped=state.name == "Stopped")
    if metrics is not None or curve is not None:
        _write_train_outputs(out_dir, config.experiment.name, metrics, curve)


def _write_train_outputs(out_dir: Path, name: str, metrics: Optional[Path], curve: Optional[Path]) -> None:
    """The train stage's metrics (JSON) and per-step curve (CSV, and its plot beside it) from the finished steps."""
    from kevin.pipeline import CURVE_FIELDS, read_step_summaries, train_curve, train_metrics, write_csv, write_json

    summaries = read_step_summaries(out_dir)
    if metrics is not None:
        write_json(metrics, train_metrics(summaries))
    if curve is not None:  # the CSV, and the same curve drawn beside it (a PNG shows without network)
        from kevin.analysis.learning import learning_rows, plot_learning

        write_csv(curve, train_curve(summaries), CURVE_FIELDS)
        plot_learning(learning_rows(summaries), curve.with_suffix(".png"), title=f"{name}: {len(summaries)} steps")


def evaluate_cmd(
    params: Optional[list[Path]] = typer.Option(
        None, "--params", help="params file (repeat to layer several, later ones win); default: params.yaml"),
    overrides: Optional[list[str]] = typer.Option(None, "--set", metavar="KEY=VALUE",
                                                  help="override a setting, e.g. --set analysis.budget_splits=[4x2]"),
    checkpoint: Optional[str] = typer.Option(
        None, "--checkpoint", help="a training checkpoint (a checkpoints folder: its newest; or a step_N folder); "
                                   "'none': the policy section's model (sets evaluate.checkpoint)"),
    model: Optional[str] = typer.Option(None, "--model", help="the model to evaluate: an HF folder or hub id "
                                                              "in-process, or a served name with "
                                                              "policy.backend=openai"),
    resume: bool = typer.Option(False, "--resume", help="continue the evaluation in evaluate.output_dir"),
    compare: Optional[list[Path]] = typer.Option(
        None, "--compare", metavar="RUN_DIR", help="compare finished evaluation runs side by side instead of "
                                                   "evaluating (repeat: base model first, then the checkpoints)"),
    out: Optional[Path] = typer.Option(None, "--out", help="--compare: where the comparison goes (default "
                                                           "outputs/compare)"),
    verbose: bool = typer.Option(False, "--verbose", help="show Prefect's and the library's INFO logs too"),
) -> None:
    """Evaluate a model or a checkpoint on the eval split at fixed budget splits (trajectories x turns): metrics,
    Table 1 / Table 2, curves and plots, tracked in MLflow. Or, with --compare, put finished runs side by side."""
    if compare:
        from kevin.experiment.outputs import compare_runs

        try:
            paths = compare_runs([str(p) for p in compare], out or Path("outputs/compare"))
        except (ValueError, FileNotFoundError) as exc:
            die(str(exc))
        typer.echo(Path(paths["tables/comparison.md"]).read_text(encoding="utf-8"))
        typer.echo("Task by task, on the tasks both runs evaluated:")
        typer.echo(Path(paths["tables/paired.md"]).read_text(encoding="utf-8"))
        typer.echo("Tasks that moved:")
        typer.echo(Path(paths["tables/moved.md"]).read_text(encoding="utf-8"))
        typer.echo(f"tables, curves and plots in {Path(paths['runs']).parent}")
        return
    files = params_files(params)
    quiet_libraries(verbose)
    from flows.evaluate import load_config, run_evaluation

    try:
        config = load_config(files, list(overrides or []), checkpoint, model)
    except (ValueError, FileNotFoundError) as exc:
        die(str(exc))
    rollouts = config.evaluate.resolved_output_dir(Path.cwd()) / "rollouts"
    if not resume and rollouts.is_dir() and any(rollouts.iterdir()):
        die(f"{rollouts.parent} already holds an evaluation; continue it with --resume, or evaluate into another "
             "folder (--set evaluate.output_dir=...)")
    from kevin.experiment.progress import RichProgress

    progress = RichProgress()
    state = run_evaluation(files, list(overrides or []), resume=resume, checkpoint=checkpoint, model=model,
                           project_dir=str(Path.cwd()), progress=progress)
    if state.is_failed() or state.is_crashed():
        typer.echo(f"error: evaluation failed: {state.message}", err=True)
        raise typer.Exit(1)
    result = state.result()
    for table in ("table1", "table2"):  # a wrapped table row is unreadable: let long rows run past the edge
        progress.console.print(result[table], markup=False, soft_wrap=True)
    progress.line(f"outputs in {result['out_dir']} (metrics.json, tables/, curves/, plots/)")
    if result["mlflow"]:
        progress.line(f"MLflow run {result['mlflow']['run_id']}: {result['mlflow']['ui']}")


def sft_cmd(
    split: Path = typer.Option(..., help="a split file written by `split`: the warm start learns its train tasks"),
    out: Path = typer.Option(..., help="folder for sft.json and, when sft.enabled, the fine-tuned model (OUT/model)"),
    params: Optional[list[Path]] = typer.Option(
        None, "--params", help="params files (repeat to layer; default: params.yaml)"),
    overrides: Optional[list[str]] = typer.Option(None, "--set", metavar="KEY=VALUE", help="override a setting"),
) -> None:
    """The optional warm start (the `sft` section): fine-tune the policy on the train split's reference solutions,
    in the answer format the prompts ask for. With sft.enabled false it only records that it did nothing."""
    from kevin.config import RunConfig
    from kevin.pipeline import write_json

    try:
        config = RunConfig.from_files(params_files(params), list(overrides or []))
    except (ValueError, FileNotFoundError) as exc:
        die(str(exc))
    out.mkdir(parents=True, exist_ok=True)
    if not config.sft.enabled:
        write_json(out / "sft.json", {"enabled": False})
        typer.echo("sft.enabled is false: no warm start (training starts from the policy's own weights)")
        return
    from kevin.experiment.warm_start import build_warm_start
    from kevin.tasks import TaskError

    try:
        metrics = build_warm_start(config, split, out, typer.echo)
    except (TaskError, FileNotFoundError, ValueError) as exc:
        die(str(exc))
    write_json(out / "sft.json", {"enabled": True, **metrics})
    typer.echo(f"warm start: {metrics['examples']} examples, {metrics['steps']} steps, "
               f"loss {metrics['train_loss']:.4f}; model in {out / 'model'}")
    for row in metrics.get("per_epoch", []):
        typer.echo(f"  epoch {row['epoch']}: " + ", ".join(f"{k} {v:g}" for k, v in row.items() if k != "epoch"))
