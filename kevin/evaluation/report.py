"""Showing verdicts: one result, a summary table, JSONL and summary files."""

from __future__ import annotations

import json
import statistics
from collections import Counter
from pathlib import Path

from kevin.records.evaluation import EvalResult, Status


def write_jsonl(path: Path, results: list[EvalResult]) -> None:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w") as handle:
        for r in results:
            handle.write(json.dumps(r.to_dict()) + "\n")


def summarise(results: list[EvalResult]) -> dict:
    """Counts per status, correctness share, speedups of correct kernels, compile-time percentiles."""
    counts = Counter(r.status.value for r in results)
    speedups = [r.speedup for r in results if r.correct]
    compile_s = sorted(r.times.compile for r in results if r.compiled and r.times.compile > 0)
    return {
        "candidates": len(results),
        "status_counts": dict(sorted(counts.items())),
        "correct_share": (counts.get("correct", 0) / len(results)) if results else 0.0,
        "speedup_geomean": statistics.geometric_mean(speedups) if speedups and min(speedups) > 0 else 0.0,
        "speedup_median": statistics.median(speedups) if speedups else 0.0,
        "mean_score": statistics.fmean(r.score for r in results) if results else 0.0,
        "compile_s_median": statistics.median(compile_s) if compile_s else 0.0,
        "compile_s_p90": compile_s[int(0.9 * (len(compile_s) - 1))] if compile_s else 0.0,
    }


def write_summary(folder: Path, results: list[EvalResult]) -> dict:
    folder = Path(folder)
    write_jsonl(folder / "results.jsonl", results)
    summary = summarise(results)
    (folder / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    return summary


def print_result(r: EvalResult) -> None:
    from rich.console import Console

    console = Console()
    colour = "green" if r.status is Status.CORRECT else "red"
    console.print(f"[bold]{r.task_id}[/bold]  status: [{colour}]{r.status.value}[/{colour}]"
                  + (f"  rule: {r.rule_id}" if r.rule_id else ""))
    if r.correct:
        console.print(f"runtime {r.runtime_ms:.4f} ms  baseline {r.baseline_ms:.4f} ms  speedup {r.speedup:.3f}x  score {r.score:.3f}"
                      + ("  [yellow](flagged: re-verified)[/yellow]" if r.flagged_speedup else ""))
    console.print(f"max abs error {r.max_abs_error:.3g}  trials {r.trials_passed}/{r.trials_run}  "
                  f"compile {r.times.compile:.1f}s  total {r.times.total:.1f}s")
    for w in r.warnings:
        console.print(f"[yellow]warning:[/yellow] {w}")
    console.print(f"feedback: {r.feedback}", markup=False, highlight=False)


def print_summary(results: list[EvalResult]) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table(title=f"{len(results)} candidates")
    for col in ("task", "status", "speedup", "runtime ms", "baseline ms", "compile s", "note"):
        table.add_column(col)
    for r in results:
        note = r.rule_id or (r.error.splitlines()[0][:60] if r.error else "")
        table.add_row(r.task_id, r.status.value, f"{r.speedup:.2f}" if r.correct else "-",
                      f"{r.runtime_ms:.3f}" if r.correct else "-", f"{r.baseline_ms:.3f}" if r.baseline_ms else "-",
                      f"{r.times.compile:.1f}", note)
    console = Console()
    console.print(table)
    s = summarise(results)
    console.print(f"status: {s['status_counts']}  correct: {s['correct_share']:.0%}  "
                  f"speedup geomean {s['speedup_geomean']:.3f}  compile median {s['compile_s_median']:.1f}s p90 {s['compile_s_p90']:.1f}s")
