"""The kernel commands: evaluate one solution (`eval`) or many (`eval-batch`), check the evaluator on the bundled
suite's references (`suite`) and time every reference of a split on this machine (`baseline`)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Optional

import typer

from kevin_cli.common import BACKEND_HELP, TIMEOUT_HELP, die, eval_config, load_task, params_files, read_solution


def eval_cmd(
    task_file: Path = typer.Argument(..., help="KernelBench-format task file (defines Model, get_inputs, "
                                               "get_init_inputs)"),
    solution_file: Path = typer.Argument(..., help="solution file defining ModelNew"),
    backend: str = typer.Option("", help=BACKEND_HELP),
    as_json: bool = typer.Option(False, "--json", help="print the EvalResult as JSON"),
    profile: str = typer.Option("", help="task size profile (default: cpu on the cpu backend, the task's own sizes "
                                         "on cuda)"),
    timing_trials: int = typer.Option(0, help="timed calls (0: the configured default, 100)"),
    correctness_trials: int = typer.Option(0, help="correctness trials (0: the configured default, 5)"),
    timeout: float = typer.Option(0.0, "--timeout", metavar="SECONDS", help=TIMEOUT_HELP),
    params: Optional[Path] = typer.Option(None, help="params.yaml to read evaluation settings from"),
) -> None:
    """Evaluate one solution against one task and print the verdict."""
    from kevin.evaluation import Evaluator

    task = load_task(task_file)
    source = read_solution(solution_file)
    cfg = eval_config(backend, profile, timing_trials, correctness_trials, params, timeout)
    try:
        evaluator = Evaluator(cfg)
    except RuntimeError as exc:
        die(str(exc))
    result = evaluator.evaluate(task, source)
    if as_json:
        typer.echo(json.dumps(result.to_dict(), indent=2))
    else:
        from kevin.evaluation.report import print_result

        print_result(result)


def eval_batch_cmd(
    candidates: Path = typer.Argument(..., help="a directory of solutions named after tasks (levelN/NAME.py or "
                                                "NAME.py), or a JSONL file of {task_id, source}"),
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
        die(str(exc))
    if not items:
        die(f"no candidates found in {candidates}")
    cfg = eval_config(backend, "", timing_trials, correctness_trials, params, timeout)
    try:
        evaluator = Evaluator(cfg)
    except RuntimeError as exc:
        die(str(exc))
    results = evaluator.evaluate_many(items, show_progress=True)
    if out:
        write_jsonl(out, results)
    print_summary(results)


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
        die(f"--levels must be comma-separated integers, got {levels!r}")
    task_list = load_bundled_suite(level_tuple)
    if limit:
        task_list = task_list[:limit]
    cfg = eval_config(backend, "", timing_trials, 0, params, timeout)
    items = reference_candidates(task_list, cfg.backend)
    try:
        evaluator = Evaluator(cfg)
    except RuntimeError as exc:
        die(str(exc))
    results = evaluator.evaluate_many(items, show_progress=True)
    write_summary(out, results)
    print_summary(results)
    typer.echo(f"results: {out / 'results.jsonl'}  summary: {out / 'summary.json'}")


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
        die(str(exc))
    from kevin.config import RunConfig

    try:
        cfg = RunConfig.from_files(params_files(params)).evaluation
        evaluator = Evaluator(cfg)
    except (ValueError, FileNotFoundError, RuntimeError) as exc:
        die(str(exc))
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
