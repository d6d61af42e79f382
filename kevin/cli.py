"""`kevin ...`: train (the Prefect training flow), evaluate a model (the evaluation flow), evaluate kernels from the
command line, and run the suite job.

Exit codes: 0 whenever a verdict was produced (whatever it is), 2 for bad arguments or input that
is not a task/solution at all (missing file, a task without Model, ...); `validate` exits 1 when a data
check fails; `train` exits 0 when the run ends (all its steps, or stopped by a collapse alert), 1 when it fails
and 2 for a bad config; `evaluate` exits 0 when the evaluation (or comparison) is written, 1 when it fails and 2 for a
bad config or a run folder that is not a finished evaluation.
"""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path
from typing import Optional

import typer

app = typer.Typer(add_completion=False, no_args_is_help=True, help="Kevin: multi-turn RL for fast, correct GPU kernels.")

BACKEND_HELP = "cuda (inline CUDA on a GPU) or cpu (inline C++); default: params.yaml, else cpu"
TIMEOUT_HELP = "seconds one candidate may run (after compiling) before it is killed (0: params.yaml, else 180)"


def _die(message: str) -> None:
    typer.echo(f"error: {message}", err=True)
    raise typer.Exit(2)


def _config(backend: str, profile: str, timing_trials: int, correctness_trials: int, params: Optional[Path],
            timeout: float = 0.0):
    from kevin.params import eval_config_from_params

    if not math.isfinite(timeout) or timeout < 0:
        _die(f"--timeout must be a positive number of seconds (0: the configured default), got {timeout}")
    try:
        return eval_config_from_params(params, backend=backend, profile=profile, timing_trials=timing_trials,
                                       correctness_trials=correctness_trials, timeout_s=timeout)
    except (ValueError, FileNotFoundError) as exc:
        _die(str(exc))


def _read_solution(path: Path) -> str:
    """Solution text; binary or non-UTF-8 data is kept (it becomes a parse_error verdict)."""
    if not path.is_file():
        _die(f"no such solution file: {path}")
    data = path.read_bytes()
    return data.decode("utf-8", errors="replace") if b"\x00" not in data else data.decode("latin-1")


def _load_task(path: Path):
    from kevin.tasks import TaskError, load_task_file

    try:
        return load_task_file(path)
    except (TaskError, FileNotFoundError) as exc:
        _die(str(exc))


@app.command("eval")
def eval_cmd(
    task_file: Path = typer.Argument(..., help="KernelBench-format task file (defines Model, get_inputs, get_init_inputs)"),
    solution_file: Path = typer.Argument(..., help="solution file defining ModelNew"),
    backend: str = typer.Option("", help=BACKEND_HELP),
    as_json: bool = typer.Option(False, "--json", help="print the EvalResult as JSON"),
    profile: str = typer.Option("", help="task size profile (default: cpu on the cpu backend, the task's own sizes on cuda)"),
    timing_trials: int = typer.Option(0, help="timed calls (0: the configured default, 100)"),
    correctness_trials: int = typer.Option(0, help="correctness trials (0: the configured default, 5)"),
    timeout: float = typer.Option(0.0, "--timeout", metavar="SECONDS", help=TIMEOUT_HELP),
    params: Optional[Path] = typer.Option(None, help="params.yaml to read evaluation settings from"),
) -> None:
    """Evaluate one solution against one task and print the verdict."""
    from kevin.evaluation import Evaluator

    task = _load_task(task_file)
    source = _read_solution(solution_file)
    cfg = _config(backend, profile, timing_trials, correctness_trials, params, timeout)
    try:
        evaluator = Evaluator(cfg)
    except RuntimeError as exc:
        _die(str(exc))
    result = evaluator.evaluate(task, source)
    if as_json:
        typer.echo(json.dumps(result.to_dict(), indent=2))
    else:
        from kevin.evaluation.report import print_result

        print_result(result)


@app.command("eval-batch")
def eval_batch_cmd(
    candidates: Path = typer.Argument(..., help="a directory of solutions named after tasks (levelN/NAME.py or NAME.py), or a JSONL file of {task_id, source}"),
    tasks: str = typer.Option("bundled", help="'bundled' or the path of a KernelBench checkout"),
    backend: str = typer.Option("", help=BACKEND_HELP),
    out: Optional[Path] = typer.Option(None, help="write one EvalResult JSON per line here"),
    timing_trials: int = typer.Option(0, help="timed calls (0: configured default)"),
    correctness_trials: int = typer.Option(0, help="correctness trials (0: configured default)"),
    timeout: float = typer.Option(0.0, "--timeout", metavar="SECONDS", help=TIMEOUT_HELP),
    params: Optional[Path] = typer.Option(None, help="params.yaml to read evaluation settings from"),
) -> None:
    """Evaluate many candidates (compile pool + one runner per GPU) and print a summary table."""
    from kevin.evaluation import Evaluator
    from kevin.evaluation.candidates import read_candidates
    from kevin.evaluation.report import print_summary, write_jsonl
    from kevin.tasks import TaskError, load_tasks

    try:
        task_list = load_tasks(tasks)
        items = read_candidates(candidates, task_list)
    except (TaskError, FileNotFoundError, ValueError, KeyError) as exc:
        _die(str(exc))
    if not items:
        _die(f"no candidates found in {candidates}")
    cfg = _config(backend, "", timing_trials, correctness_trials, params, timeout)
    try:
        evaluator = Evaluator(cfg)
    except RuntimeError as exc:
        _die(str(exc))
    results = evaluator.evaluate_many(items, show_progress=True)
    if out:
        write_jsonl(out, results)
    print_summary(results)


@app.command("train")
def train_cmd(
    params: Optional[list[Path]] = typer.Option(
        None, "--params", help="params file (repeat to layer several, later ones win); default: params.yaml"),
    overrides: Optional[list[str]] = typer.Option(None, "--set", metavar="KEY=VALUE",
                                                  help="override a setting, e.g. --set experiment.steps=2 (repeatable)"),
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

    files = _params_files(params)
    _quiet_libraries(verbose)
    from flows.train import load_config, run_training
    from kevin.experiment.run import existing_run

    try:
        config = load_config(files, list(overrides or []))
    except (ValueError, FileNotFoundError) as exc:
        _die(str(exc))
    out_dir = config.experiment.resolved_output_dir(Path.cwd())
    if restart_if_changed:
        if not resume:
            _die("--restart-if-changed goes with --resume (it decides whether the run found is resumed)")
        from kevin.pipeline import prepare_output_dir

        if out_dir.exists() and not prepare_output_dir(out_dir, config.params_dict()):
            typer.echo(f"{out_dir}: no run with these settings to resume; starting a new one", err=True)
    if existing_run(out_dir) and not resume:
        _die(f"{out_dir} already holds a run of experiment {config.experiment.name!r}; continue it with --resume, or "
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
        from kevin.pipeline import CURVE_FIELDS, read_step_summaries, train_curve, train_metrics, write_csv, write_json

        summaries = read_step_summaries(out_dir)
        if metrics is not None:
            write_json(metrics, train_metrics(summaries))
        if curve is not None:  # the CSV, and the same curve drawn beside it (a PNG shows without network)
            from kevin.analysis.learning import learning_rows, plot_learning

            write_csv(curve, train_curve(summaries), CURVE_FIELDS)
            plot_learning(learning_rows(summaries), curve.with_suffix(".png"),
                          title=f"{config.experiment.name}: {len(summaries)} steps")


@app.command("evaluate")
def evaluate_cmd(
    params: Optional[list[Path]] = typer.Option(
        None, "--params", help="params file (repeat to layer several, later ones win); default: params.yaml"),
    overrides: Optional[list[str]] = typer.Option(None, "--set", metavar="KEY=VALUE",
                                                  help="override a setting, e.g. --set analysis.budget_splits=[4x2]"),
    checkpoint: Optional[str] = typer.Option(
        None, "--checkpoint", help="a training checkpoint (a checkpoints folder: its newest; or a step_N folder); "
                                   "'none': the policy section's model (sets evaluate.checkpoint)"),
    model: Optional[str] = typer.Option(None, "--model", help="the model to evaluate: an HF folder or hub id "
                                                              "in-process, or a served name with policy.backend=openai"),
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
        from kevin.experiment.evaluate import compare_runs

        try:
            paths = compare_runs([str(p) for p in compare], out or Path("outputs/compare"))
        except (ValueError, FileNotFoundError) as exc:
            _die(str(exc))
        typer.echo(Path(paths["tables/comparison.md"]).read_text(encoding="utf-8"))
        typer.echo(f"tables, curves and plots in {Path(paths['runs']).parent}")
        return
    files = _params_files(params)
    _quiet_libraries(verbose)
    from flows.evaluate import load_config, run_evaluation

    try:
        config = load_config(files, list(overrides or []), checkpoint, model)
    except (ValueError, FileNotFoundError) as exc:
        _die(str(exc))
    rollouts = config.evaluate.resolved_output_dir(Path.cwd()) / "rollouts"
    if not resume and rollouts.is_dir() and any(rollouts.iterdir()):
        _die(f"{rollouts.parent} already holds an evaluation; continue it with --resume, or evaluate into another "
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


def _params_files(params: Optional[list[Path]]) -> list[str]:
    """The --params files in order (params.yaml when none), each checked to exist."""
    files = [str(p) for p in params] if params else ["params.yaml"]
    for path in files:
        if not Path(path).is_file():
            _die(f"no such params file: {path}")
    return files


def _quiet_libraries(verbose: bool) -> None:
    """Keep the terminal to the run's progress lines: Prefect, MLflow, transformers and DeepSpeed report at
    INFO, or draw bars, for things a user of `kevin train` does not need to see (``--verbose`` shows them).
    Also the Prefect settings a run without a server needs, set before Prefect is imported."""
    import os

    # Prefect reads its settings when it is imported, so these come first. The temporary server a run starts
    # for itself has nobody to report usage to (and on a machine without network it logs an error trying).
    os.environ.setdefault("PREFECT_LOGGING_LEVEL", "INFO" if verbose else "WARNING")
    os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
    # Prefect gives that temporary server 20 s to create its database and answer; on a busy 2-core machine it
    # took longer and the run died before its first step. Waiting costs nothing when it starts at once.
    os.environ.setdefault("PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS", "180")
    if verbose:
        return
    os.environ.setdefault("MLFLOW_LOGGING_LEVEL", "WARNING")  # MLflow, too, sets its level when imported
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    import torch

    if not torch.cuda.is_available():
        # DeepSpeed (imported by transformers when saving a checkpoint) warns that it found no GPU unless told.
        os.environ.setdefault("DS_ACCELERATOR", "cpu")


@app.command("suite")
def suite_cmd(
    backend: str = typer.Option("", help=BACKEND_HELP),
    levels: str = typer.Option("1,2", help="comma-separated levels of the bundled suite"),
    limit: int = typer.Option(0, help="evaluate only the first N tasks (0: all)"),
    out: Path = typer.Option(Path("outputs/suite"), help="folder for results.jsonl and summary.json"),
    timing_trials: int = typer.Option(0, help="timed calls (0: configured default)"),
    timeout: float = typer.Option(0.0, "--timeout", metavar="SECONDS", help=TIMEOUT_HELP),
    params: Optional[Path] = typer.Option(None, help="params.yaml to read evaluation settings from"),
) -> None:
    """Evaluate the bundled suite's reference solutions (a check of the evaluator on this machine)."""
    from kevin.evaluation import Evaluator
    from kevin.evaluation.candidates import reference_candidates
    from kevin.evaluation.report import print_summary, write_summary
    from kevin.tasks import load_bundled_suite

    try:
        level_tuple = tuple(int(x) for x in levels.split(",") if x.strip())
    except ValueError:
        _die(f"--levels must be comma-separated integers, got {levels!r}")
    task_list = load_bundled_suite(level_tuple)
    if limit:
        task_list = task_list[:limit]
    cfg = _config(backend, "", timing_trials, 0, params, timeout)
    items = reference_candidates(task_list, cfg.backend)
    try:
        evaluator = Evaluator(cfg)
    except RuntimeError as exc:
        _die(str(exc))
    results = evaluator.evaluate_many(items, show_progress=True)
    write_summary(out, results)
    print_summary(results)
    typer.echo(f"results: {out / 'results.jsonl'}  summary: {out / 'summary.json'}")


@app.command("baseline")
def baseline_cmd(
    split: Path = typer.Option(..., help="a split file written by `split`: its train and eval tasks are timed"),
    out: Path = typer.Option(..., help="the baselines file (JSON keyed by hardware; other machines' entries are kept)"),
    params: Optional[list[Path]] = typer.Option(
        None, "--params", help="params files with the evaluation settings (repeat to layer; default: params.yaml)"),
) -> None:
    """Time the PyTorch eager reference of every task of a split on this machine (the speedups' denominators).
    The timings also land in the evaluator's cache, so the training run does not time them again."""
    import importlib.metadata as md

    from kevin.evaluation import Evaluator
    from kevin.pipeline import baseline_entry, merge_baselines, write_json
    from kevin.tasks import TaskError, load_tasks, read_split

    try:
        chosen = read_split(split)
        wanted = {e.task_id for e in (*chosen.train, *chosen.eval)}
        task_list = [t for t in load_tasks(chosen.config.source, chosen.config.levels) if t.task_id in wanted]
    except (TaskError, FileNotFoundError, ValueError) as exc:
        _die(str(exc))
    from kevin.config import RunConfig

    try:
        cfg = RunConfig.from_files(_params_files(params)).evaluation
        evaluator = Evaluator(cfg)
    except (ValueError, FileNotFoundError, RuntimeError) as exc:
        _die(str(exc))
    with evaluator:
        evaluator.prefetch_baselines(task_list)
        times, failed = {}, []
        for task in task_list:
            try:
                times[task.task_id] = evaluator.baseline_ms(task)
            except RuntimeError as exc:
                failed.append(f"{task.task_id}: {exc}")
    if failed:
        typer.echo("error: the reference of these tasks could not be timed:\n  " + "\n  ".join(failed), err=True)
        raise typer.Exit(1)
    entry = baseline_entry(times, backend=cfg.backend, profile=cfg.resolved_profile, torch_version=md.version("torch"),
                           threads=cfg.cpu_threads, timing_trials=cfg.timing_trials)
    previous = json.loads(out.read_text(encoding="utf-8")) if out.is_file() else {}
    write_json(out, merge_baselines(previous, evaluator.hardware, entry))
    typer.echo(f"{len(times)} reference timings on {evaluator.hardware} ({cfg.backend}) written to {out}")


@app.command("sft")
def sft_cmd(
    split: Path = typer.Option(..., help="a split file written by `split`: the warm start learns its train tasks"),
    out: Path = typer.Option(..., help="folder for sft.json and, when sft.enabled, the fine-tuned model (OUT/model)"),
    params: Optional[list[Path]] = typer.Option(
        None, "--params", help="params files (repeat to layer; default: params.yaml)"),
    overrides: Optional[list[str]] = typer.Option(None, "--set", metavar="KEY=VALUE", help="override a setting"),
) -> None:
    """The optional warm start (the `sft` section): fine-tune the policy on the train split's reference solutions,
    in the answer format the prompts ask for. With sft.enabled false it only records that it did nothing."""
    import dataclasses
    import time

    from kevin.config import RunConfig
    from kevin.pipeline import write_json

    try:
        config = RunConfig.from_files(_params_files(params), list(overrides or []))
    except (ValueError, FileNotFoundError) as exc:
        _die(str(exc))
    out.mkdir(parents=True, exist_ok=True)
    if not config.sft.enabled:
        write_json(out / "sft.json", {"enabled": False})
        typer.echo("sft.enabled is false: no warm start (training starts from the policy's own weights)")
        return
    from kevin.experiment.policies import load_model, model_identity
    from kevin.tasks import TaskError, load_tasks, read_split
    from kevin.training.sft import reuse_prebuilt, run_sft, warm_start_examples, warm_start_fingerprint

    try:
        chosen = read_split(split)
        train_ids = {e.task_id for e in chosen.train}
        tasks = [t for t in load_tasks(chosen.config.source, chosen.config.levels) if t.task_id in train_ids]
        if config.experiment.torch_threads:  # as the training run: two threads on two busy cores are much slower
            import torch

            torch.set_num_threads(config.experiment.torch_threads)
        base = dataclasses.replace(config, sft=dataclasses.replace(config.sft, enabled=False))
        model, tokenizer = load_model(base)
        examples, dropped = warm_start_examples(config, tasks, tokenizer)
        if dropped:
            typer.echo(f"left out {len(dropped)} answers longer than max_response_tokens "
                       f"({config.max_response_tokens}): {dropped}")
        if not examples:
            raise ValueError(f"no warm-start answer fits in max_response_tokens ({config.max_response_tokens}): "
                             "raise it, set sft.data to shorter answers (data/warmstart), or set "
                             "sft.fit_response_limit false")
        fingerprint = warm_start_fingerprint(config.sft, examples, model_identity(base))
        reused, why = reuse_prebuilt(config.sft, fingerprint, out)
        if reused is not None:
            typer.echo(f"reusing the warm start built earlier in {config.sft.prebuilt} (same examples, base model and "
                       "settings)")
            metrics = reused
        else:
            if config.sft.prebuilt:
                typer.echo(f"training the warm start: {why}")
            started = time.monotonic()
            metrics = run_sft(config.sft, model, tokenizer, examples, out)
            metrics["seconds"] = round(time.monotonic() - started, 1)
            metrics["tasks"] = [e["task_id"] for e in examples]
            metrics["left_out"] = dropped
            metrics["fingerprint"] = fingerprint
    except (TaskError, FileNotFoundError, ValueError) as exc:
        _die(str(exc))
    write_json(out / "sft.json", {"enabled": True, **metrics})
    typer.echo(f"warm start: {metrics['examples']} examples, {metrics['steps']} steps, loss {metrics['train_loss']:.4f}; "
               f"model in {out / 'model'}")


@app.command("report")
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
        _die(f"no such metrics file: {train_metrics}")
    train = json.loads(train_metrics.read_text(encoding="utf-8"))
    found = json.loads(evaluation.read_text(encoding="utf-8")) if evaluation and evaluation.is_file() else None
    settings = None
    if params:
        from kevin.config import RunConfig
        from kevin.experiment.policies import model_label

        try:
            config = RunConfig.from_files(_params_files(params))
        except (ValueError, FileNotFoundError) as exc:
            _die(str(exc))
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


@app.command("learning")
def learning_cmd(
    run_dir: Path = typer.Argument(..., help="a training run's folder (outputs/<experiment.name>)"),
    out: Optional[Path] = typer.Option(None, help="folder for learning.csv, learning.json and learning.png "
                                                  "(default: RUN_DIR/plots)"),
    window: int = typer.Option(5, help="steps in each of the first and the last window compared"),
) -> None:
    """Did the policy learn? Per step: mean kernel score and correct share, overall and per turn (a table, a CSV and
    a plot); the last WINDOW steps' mean score against the first WINDOW steps' with a 90% bootstrap interval; and,
    task by task, each train task's correct share and score at its last draw against its first."""
    from kevin.analysis.learning import LEARNING_FIELDS, learning_rows, plot_learning, task_gain, window_gain
    from kevin.pipeline import read_step_summaries, write_csv, write_json

    summaries = read_step_summaries(run_dir)
    rows = learning_rows(summaries)
    if not rows:
        _die(f"{run_dir} holds no finished training step (steps/step_N/summary.json)")
    out = out or run_dir / "plots"
    extra = sorted({k for r in rows for k in r} - set(LEARNING_FIELDS))
    write_csv(out / "learning.csv", rows, [*LEARNING_FIELDS, *extra])
    for row in rows:
        turns = "  ".join(f"t{k.rsplit('_', 1)[1]} {row[k]:.3f}" for k in extra if k.startswith("score_mean_turn_"))
        moved = (f"  lr {row['lr']:.1e}  kl {row['policy_kl']:.1e}  entropy {row['entropy']:.3f}"
                 + (f"  skipped {row['skipped_steps']}" if row["skipped_steps"] else "")) if "lr" in row else ""
        typer.echo(f"step {row['step']:3d}  kernels {row['kernels']:3d}  correct {row['correct_share']:.3f}  "
                   f"score {row['score_mean']:.3f}  ({turns}){moved}")
    gain = None
    try:
        gain = window_gain([r["score_mean"] for r in rows], window)
    except ValueError as exc:
        typer.echo(f"no comparison of first and last steps: {exc}")
    if gain is not None:
        typer.echo(f"mean score, first {window} steps {gain.first:.4f} -> last {window} {gain.last:.4f}: gain "
                   f"{gain.gain:+.4f}, 90% bootstrap interval [{gain.low:+.4f}, {gain.high:+.4f}]: "
                   + ("above the noise" if gain.learned else "not above the noise"))
    paired = {}
    for metric in ("correct_share", "score_mean"):
        try:
            paired[metric] = task_gain(summaries, metric)
        except ValueError as exc:
            typer.echo(f"no task-by-task comparison of {metric}: {exc}")
            continue
        p = paired[metric]
        typer.echo(f"{metric}, the same {p.tasks} tasks at their first and last draw: {p.first:.4f} -> {p.last:.4f}: "
                   f"gain {p.gain:+.4f}, 90% bootstrap interval [{p.low:+.4f}, {p.high:+.4f}]: "
                   + ("above the noise" if p.learned else "not above the noise"))
    write_json(out / "learning.json", {"steps": len(rows), "gain": gain.to_dict() if gain else None,
                                       "per_task": {k: v.to_dict() for k, v in paired.items()}})
    plot = plot_learning(rows, out / "learning.png", title=f"{run_dir.name}: {len(rows)} steps", gain=gain)
    typer.echo(f"plot: {plot}")


@app.command("tasks")
def tasks_cmd(source: str = typer.Option("bundled", help="'bundled' or the path of a KernelBench checkout")) -> None:
    """List the tasks of the bundled suite or of a KernelBench checkout."""
    from kevin.tasks import TaskError, load_tasks

    try:
        found = load_tasks(source)
    except (TaskError, FileNotFoundError) as exc:
        _die(str(exc))
    for task in found:
        profiles = ",".join(sorted(task.profiles)) or "-"
        typer.echo(f"{task.task_id}\tprofiles={profiles}")
    typer.echo(f"{len(found)} tasks", err=True)


@app.command("split")
def split_cmd(
    out: Path = typer.Option(..., help="where to write the split (JSON), e.g. data/splits/bundled.json"),
    source: str = typer.Option("", help="'bundled' or the path of a KernelBench checkout (default: params.yaml, else bundled)"),
    params: Optional[Path] = typer.Option(None, help="params.yaml to read the splits section from"),
) -> None:
    """Split a task suite into train and eval tasks (seeded, stratified by level, stable across re-runs)."""
    from kevin.config import read_params
    from kevin.tasks import SplitConfig, TaskError, make_split, write_split

    try:
        section = dict(read_params(params).get("splits", {}) or {})
        if source:
            section["source"] = source
        config = SplitConfig.from_dict(section)
        split = make_split(config)
    except (TaskError, FileNotFoundError, ValueError) as exc:
        _die(str(exc))
    write_split(out, split)
    counts = split.counts()
    for name in ("train", "eval"):
        per_level = ", ".join(f"level {level}: {n}" for level, n in counts[name].items())
        typer.echo(f"{name}: {sum(counts[name].values())} tasks ({per_level})")
    typer.echo(f"split of {config.source!r} (seed {config.seed}) written to {out}")


@app.command("validate")
def validate_cmd(
    splits: Optional[Path] = typer.Option(None, help="a split file written by `split`"),
    rollouts: Optional[list[Path]] = typer.Option(
        None, help="a JSONL file of rollout turns, or a folder: each folder below it holding turn_*.jsonl files (a "
                   "step's rollout/, an evaluation's rollouts/<split>/) is checked as one batch (repeatable)"),
    source: str = typer.Option("", help="load the split's tasks from here instead of the source it records"),
    report: Optional[Path] = typer.Option(None, help="also write the reports here as JSON"),
    max_rows: int = typer.Option(20, help="failing rows shown per expectation"),
) -> None:
    """Run the data checks; exit 1 with a report of every failed expectation and its rows."""
    from kevin.datachecks import check_rollout_batch, check_split, render_reports, rollout_batches
    from kevin.tasks import TaskError, read_split

    if splits is None and not rollouts:
        _die("give --splits FILE and/or --rollouts FILE.jsonl|FOLDER")
    reports = []
    try:
        if splits is not None:
            reports.append(check_split(read_split(splits), source or None))
        for path in rollouts or []:
            reports += [check_rollout_batch(name, files) for name, files in rollout_batches(path)]
    except (TaskError, FileNotFoundError, ValueError) as exc:
        _die(str(exc))
    if report is not None:
        report.parent.mkdir(parents=True, exist_ok=True)
        report.write_text(json.dumps([r.to_dict() for r in reports], indent=1) + "\n")
    failed = [r for r in reports if not r.success]
    if len(reports) > 3:  # many batches (a run's steps): the failures in full, the rest counted
        typer.echo(render_reports(failed, max_rows) if failed else "")
        typer.echo(f"{len(reports) - len(failed)} of {len(reports)} batches passed")
    else:
        typer.echo(render_reports(reports, max_rows))
    if failed:
        raise typer.Exit(1)


def main() -> None:
    app()


if __name__ == "__main__":
    sys.exit(main())
