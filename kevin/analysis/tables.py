"""Tables of run reports: Table-1 style (per run, best@k / avg@k), Table-2 style (per budget split),
a side-by-side comparison, long-form CSVs of the curves, and a flat dict of metrics with stable names.

Markdown is for people (percentages, "1.10x"); CSV is for tools (raw numbers, 6 decimals, "" when a
value does not exist). Flat metric names use only characters MLflow accepts in a metric name
(letters, digits, ``_ - . / :`` and space), so ``best@16`` is written ``best_at_16``.
"""

from __future__ import annotations

import csv
import io
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from kevin.analysis.estimators import Metrics
from kevin.analysis.metrics import BudgetSplit, RunReport
from kevin.analysis.outcomes import fast_name

__all__ = [
    "best_at_k_csv",
    "comparison_csv",
    "comparison_markdown",
    "flat_metrics",
    "markdown_table",
    "moved_markdown",
    "paired_markdown",
    "table1_csv",
    "table1_markdown",
    "table2_csv",
    "table2_markdown",
    "turn_curves_csv",
]

NA = "n/a"


# ------------------------------------------------------------------------------------------ formatting


def pct(value: float | None) -> str:
    """A share as a whole percentage, as the paper prints it: 0.8235 -> '82%'."""
    return NA if value is None else f"{100 * value:.0f}%"


def times(value: float | None) -> str:
    """A speedup: 1.1 -> '1.10x'."""
    return NA if value is None else f"{value:.2f}x"


def num(value: float | None) -> str:
    """A raw number for CSV: 6 decimals, '' when missing."""
    return "" if value is None else f"{value:.6f}"


def markdown_table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    """A pipe table with columns padded to equal width (readable as plain text too)."""
    widths = [max(len(str(cell)) for cell in column) for column in zip(header, *rows)]

    def line(cells: Sequence[str]) -> str:
        return "| " + " | ".join(str(c).ljust(w) for c, w in zip(cells, widths)) + " |"

    return "\n".join([line(header), "|" + "|".join("-" * (w + 2) for w in widths) + "|", *map(line, rows)]) + "\n"


def csv_text(header: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    """A CSV file's text: the header, then the rows (any values csv writes)."""
    buffer = io.StringIO()
    writer = csv.writer(buffer, lineterminator="\n")
    writer.writerow(header)
    writer.writerows(rows)
    return buffer.getvalue()


def _table_fast_ps(reports: Sequence[RunReport]) -> tuple[float, ...]:
    if not reports:
        raise ValueError("no runs to tabulate")
    first = reports[0].table_fast_ps
    if any(r.table_fast_ps != first for r in reports):
        raise ValueError(f"runs report different table_fast_ps {[list(r.table_fast_ps) for r in reports]}; "
                         "analyse them with the same analysis config")
    return first


# ------------------------------------------------------------------------------------------- Table 1


def _table1_metrics(reports: Sequence[RunReport]) -> list[str]:
    return ["correct", "perf", *(fast_name(p) for p in _table_fast_ps(reports))]


def _fmt(metric: str, value: float | None) -> str:
    return times(value) if metric == "perf" else pct(value)


def table1_markdown(reports: Sequence[RunReport]) -> str:
    """Rows = runs; per metric "best@k / avg@k" with k = the run's trajectories, after its last turn."""
    metrics = _table1_metrics(reports)
    rows = []
    for r in reports:
        f = r.final
        rows.append([r.name, f"{r.trajectories}x{r.turns}",
                     *(f"{_fmt(m, f.best[m])} / {_fmt(m, f.avg[m])}" for m in metrics)])
    caption = "\nCells: best@k / avg@k over k = all trajectories of a task, after the last turn; mean over tasks.\n"
    return markdown_table(["run", "k x turns", *metrics], rows) + caption


def table1_csv(reports: Sequence[RunReport]) -> str:
    """Table 1 as raw numbers: one row per run, ``<metric>_best`` and ``<metric>_avg`` columns."""
    metrics = _table1_metrics(reports)
    header = ["run", "trajectories", "turns", "tasks", *(f"{m}_{which}" for m in metrics for which in ("best", "avg"))]
    rows = [[r.name, str(r.trajectories), str(r.turns), str(r.tasks),
             *(num(getattr(r.final, which)[m]) for m in metrics for which in ("best", "avg"))] for r in reports]
    return csv_text(header, rows)


# ------------------------------------------------------------------------------------------- Table 2


def _split_names(reports: Sequence[RunReport], splits: Sequence[str] | None) -> list[str]:
    if splits is not None:
        return [BudgetSplit.parse(s).name for s in splits]
    names: list[str] = []
    for r in reports:
        names.extend(s for s in r.splits if s not in names)
    return names


def table2_markdown(reports: Sequence[RunReport], splits: Sequence[str] | None = None) -> str:
    """Rows = runs, columns = budget splits (default: every split some run holds), cells "perf / correct"."""
    if not reports:
        raise ValueError("no runs to tabulate")
    names = _split_names(reports, splits)
    rows = []
    for r in reports:
        cells = []
        for s in names:
            m = r.split(s)
            cells.append(NA if m is None else f"{times(m.best['perf'])} / {pct(m.best['correct'])}")
        rows.append([r.name, *cells])
    caption = ("\nCells: perf / correct as best@k with k = the split's trajectories, after its last turn; "
               f"{NA}: the rollouts hold fewer trajectories or turns.\n")
    return markdown_table(["run", *names], rows) + caption


def table2_csv(reports: Sequence[RunReport], splits: Sequence[str] | None = None) -> str:
    """Table 2 in long form: one row per run and split it holds (run, split, trajectories, turns, perf, correct)."""
    if not reports:
        raise ValueError("no runs to tabulate")
    rows = []
    for r in reports:
        for s in _split_names(reports, splits):
            m = r.split(s)
            if m is not None:
                split = BudgetSplit.parse(s)
                rows.append([r.name, s, str(split.trajectories), str(split.turns), num(m.best["perf"]), num(m.best["correct"])])
    return csv_text(["run", "split", "trajectories", "turns", "perf", "correct"], rows)


# ---------------------------------------------------------------------------------------- comparison


@dataclass(frozen=True)
class _Row:
    label: str
    kind: str  # "share" (0..1, printed in %) or "speedup" (printed as 1.23x)
    get: Callable[[RunReport], float | None]


def _comparison_rows(reports: Sequence[RunReport]) -> list[_Row]:
    rows = []
    for metric in _table1_metrics(reports):
        kind = "speedup" if metric == "perf" else "share"
        rows.append(_Row(f"{metric} best@k", kind, lambda r, m=metric: r.final.best[m]))
        rows.append(_Row(f"{metric} avg@k", kind, lambda r, m=metric: r.final.avg[m]))
    rows.append(_Row("geomean speedup (correct kernels)", "speedup", lambda r: r.final.geomean_speedup))
    pass_ks = sorted({k for r in reports for k in r.final.pass_kernels})
    rows += [_Row(f"pass@{k} kernels", "share", lambda r, k=k: r.final.pass_kernels.get(k)) for k in pass_ks]
    for s in _split_names(reports, None):
        rows.append(_Row(f"{s} perf", "speedup", lambda r, s=s: r.split(s).best["perf"] if r.split(s) else None))
        rows.append(_Row(f"{s} correct", "share", lambda r, s=s: r.split(s).best["correct"] if r.split(s) else None))
    return rows


def _delta(kind: str, value: float | None, base: float | None) -> str:
    if value is None or base is None:
        return NA
    d = value - base
    return f"{100 * d:+.0f} pts" if kind == "share" else f"{d:+.2f}x"


def _baseline_index(reports: Sequence[RunReport], baseline: str | None) -> int:
    if not reports:
        raise ValueError("no runs to compare")
    names = [r.name for r in reports]
    if len(set(names)) != len(names):
        raise ValueError(f"run names must differ to be compared side by side, got {names}")
    if baseline is None:
        return 0
    if baseline not in names:
        raise ValueError(f"baseline run {baseline!r} is not among the runs {names}")
    return names.index(baseline)


def comparison_markdown(reports: Sequence[RunReport], baseline: str | None = None) -> str:
    """Runs side by side (e.g. base model vs checkpoint): one row per metric, one column per run, then the
    difference of each other run from the baseline (default: the first run). k = each run's trajectories."""
    b = _baseline_index(reports, baseline)
    others = [r for i, r in enumerate(reports) if i != b]
    header = ["metric", *(r.name for r in reports), *(f"{r.name} - {reports[b].name}" for r in others)]
    rows = []
    for row in _comparison_rows(reports):
        fmt = times if row.kind == "speedup" else pct
        base = row.get(reports[b])
        rows.append([row.label, *(fmt(row.get(r)) for r in reports), *(_delta(row.kind, row.get(r), base) for r in others)])
    return markdown_table(header, rows)


def comparison_csv(reports: Sequence[RunReport], baseline: str | None = None) -> str:
    """The comparison as raw numbers (differences as plain differences, not percentage points)."""
    b = _baseline_index(reports, baseline)
    others = [r for i, r in enumerate(reports) if i != b]
    header = ["metric", *(r.name for r in reports), *(f"{r.name} - {reports[b].name}" for r in others)]
    rows = []
    for row in _comparison_rows(reports):
        base = row.get(reports[b])
        deltas = [None if row.get(r) is None or base is None else row.get(r) - base for r in others]
        rows.append([row.label, *(num(row.get(r)) for r in reports), *map(num, deltas)])
    return csv_text(header, rows)


# ------------------------------------------------------------------------------------- task by task

PAIRED_FIGURES: tuple[tuple[str, str, Callable[[float], float]], ...] = (
    ("tasks solved", "share", lambda perf: 1.0 if perf > 0 else 0.0),
    ("tasks faster than eager", "share", lambda perf: 1.0 if perf > 1.0 else 0.0),
    ("best perf", "speedup", lambda perf: perf),
)
"""The figures ``paired_markdown`` pairs, from each task's best perf (0 when no kernel of the task was correct):
label, kind (as in the comparison) and the figure of one task."""


def paired_markdown(reports: Sequence[RunReport], baseline: str | None = None, *, level: float = 0.9,
                    draws: int = 2000, seed: int = 0) -> str:
    """Each other run against the baseline task by task, on the tasks both evaluated: per figure of
    ``PAIRED_FIGURES`` (and the share of each task's tries that were correct, where both reports keep it), both
    means, the gain, and a ``level`` percentile-bootstrap interval of the mean per-task difference from ``draws``
    seeded redraws of the tasks, with its verdict.

    The comparison's rows are means over tasks that differ far more than two checkpoints do; pairing each task with
    itself removes that spread, and the interval says whether a gain of a few tasks is more than which tasks happened
    to be drawn. With one try per task it still carries the sampling noise of that one try. Where both reports keep
    each task's share of correct tries, two more rows redraw each task's tries as well (``count_gain``): the
    interval a gain must clear for a repeat of both evaluations at other seeds to agree with it."""
    from kevin.analysis.learning import Gain, paired_gain
    from kevin.analysis.moves import count_gain

    b = _baseline_index(reports, baseline)
    base = reports[b]
    header = ["figure", "run", "tasks", f"{base.name} (baseline)", "run", "gain", f"{100 * level:.0f}% interval",
              "verdict"]
    rows = []

    def gain_row(label: str, kind: str, run: RunReport, tasks: int, first: float, last: float, low: float,
                 high: float) -> list[str]:
        fmt = times if kind == "speedup" else pct
        return [label, run.name, str(tasks), fmt(first), fmt(last), _delta(kind, last, first),
                f"[{_delta(kind, low, 0.0)}, {_delta(kind, high, 0.0)}]",
                Gain(first=first, last=last, low=low, high=high).verdict]

    def row(label: str, kind: str, run: RunReport, visits: dict[str, list[float]]) -> list[str]:
        first, last, low, high, _ = paired_gain(visits, level=level, draws=draws, seed=seed)
        return gain_row(label, kind, run, len(visits), first, last, low, high)

    for i, run in enumerate(reports):
        common = sorted(set(base.task_best_speedup) & set(run.task_best_speedup))
        if i == b or not common:
            continue
        for label, kind, figure in PAIRED_FIGURES:
            rows.append(row(label, kind, run, {t: [figure(base.task_best_speedup[t]), figure(run.task_best_speedup[t])]
                                               for t in common}))
        # best@k asks whether any try solved a task; the share of tries that did (avg@k) is what a policy update
        # moves first, and it can rise while best@k falls (a policy that narrows onto the answers it knows).
        shared = sorted(set(base.task_correct_share) & set(run.task_correct_share))
        if shared:
            rows.append(row("tries correct (avg@k)", "share", run,
                            {t: [base.task_correct_share[t], run.task_correct_share[t]] for t in shared}))
            # The rows above redraw the tasks only, as if each task's share of k tries were exact; these redraw
            # each task's tries too, so a gain must also beat what a second evaluation at another seed would vary.
            for label, figure in (("tasks solved, tries redrawn", "solved"), ("tries correct, tries redrawn", "share")):
                rows.append(gain_row(label, "share", run, len(shared), *count_gain(
                    base.task_correct_counts(), run.task_correct_counts(), figure, level=level, draws=draws,
                    seed=seed)))
    if not rows:
        return f"No run shares a task with {base.name}: there is nothing to pair.\n"
    return markdown_table(header, rows)


def moved_markdown(reports: Sequence[RunReport], baseline: str | None = None, *, alpha: float = 0.05) -> str:
    """Each other run against the baseline, the tasks whose count of correct tries changed beyond chance
    (``kevin.analysis.moves.task_moves``: Fisher's exact test, p < ``alpha``): the counts, the p-value, rose or
    fell; then how many rose and fell of the tasks both evaluated, and how many unchanged tasks chance alone
    would list. A tie of the means can hide a task learned and another forgotten; this shows them."""
    from kevin.analysis.moves import task_moves

    b = _baseline_index(reports, baseline)
    base = reports[b]
    lines = []
    for i, run in enumerate(reports):
        shared = set(base.task_correct_share) & set(run.task_correct_share)
        if i == b or not shared:
            continue
        moves = task_moves(base.task_correct_counts(), run.task_correct_counts(), alpha)
        rose = sum(m.rose for m in moves)
        lines.append(f"{run.name} against {base.name}: {rose} of {len(shared)} tasks rose and {len(moves) - rose} "
                     f"fell beyond chance (Fisher's exact test, p < {alpha:g}; chance alone lists at most about "
                     f"{alpha * len(shared):.2g} of unchanged tasks).")
        if moves:
            lines.append(markdown_table(
                ["task", f"{base.name} (baseline)", run.name, "p", "change"],
                [[m.task, f"{m.before} of {m.before_tries}", f"{m.after} of {m.after_tries}", f"{m.p:.2g}",
                  "rose" if m.rose else "fell"] for m in moves]).rstrip("\n"))
    if not lines:
        return f"No run shares a task's tries with {base.name}: there is nothing to test.\n"
    return "\n".join(lines) + "\n"


# ---------------------------------------------------------------------------- curves in long form (DVC)


def turn_curves_csv(reports: Sequence[RunReport]) -> str:
    """Every turn curve, one row per run x split x turn x metric: run, split, k, turn, metric, best, avg.

    The split ``MxN`` of a run's own size is always included (k = all trajectories, every turn).
    """
    rows = []
    for r in reports:
        curves = {f"{r.trajectories}x{r.turns}": r.by_turn, **r.splits}
        for split, curve in curves.items():
            for m in curve:
                rows += [[r.name, split, str(m.k), str(m.turn), name, num(m.best[name]), num(m.avg[name])]
                         for name in r.metric_names]
    return csv_text(["run", "split", "k", "turn", "metric", "best", "avg"], rows)


def best_at_k_csv(reports: Sequence[RunReport]) -> str:
    """The best@k curves after the last turn: run, k, metric, best."""
    rows = [[r.name, str(m.k), name, num(m.best[name])] for r in reports for m in r.by_k for name in r.metric_names]
    return csv_text(["run", "k", "metric", "best"], rows)


# ----------------------------------------------------------------------------------------- flat dict


def _flat(metrics: Metrics, prefix: str) -> dict[str, float]:
    out = {}
    for name, value in metrics.best.items():
        out[f"{prefix}best_at_{metrics.k}/{name}"] = value
    for name, value in metrics.avg.items():
        out[f"{prefix}avg_at_{metrics.k}/{name}"] = value
    for k, value in metrics.pass_kernels.items():
        out[f"{prefix}pass_at_{k}/kernels"] = value
    if metrics.geomean_speedup is not None:  # undefined without a correct kernel: left out, not faked as 0
        out[f"{prefix}geomean_speedup"] = metrics.geomean_speedup
    out[f"{prefix}kernels"] = float(metrics.kernels)
    out[f"{prefix}correct_kernels"] = float(metrics.correct_kernels)
    return out


def flat_metrics(report: RunReport) -> dict[str, float]:
    """One run's metrics under stable names, for MLflow ``log_metrics`` and a DVC metrics JSON.

    - after the last turn, k = m: ``best_at_16/correct``, ``avg_at_16/fast_1.5``, ``pass_at_1/kernels``,
      ``geomean_speedup``, ``kernels``, ``correct_kernels``; ``pass_at_4/trajectories`` (= best_at_4/correct);
    - the best@k curve: ``best_at_1/perf`` ... ``best_at_15/perf``;
    - the turn curves: ``turn_3/best_at_16/perf`` (after turn 3; turn n repeats the unprefixed values);
    - each budget split the rollouts hold: ``split_32x4/best_at_32/perf`` and ``split_32x4/turn_2/...``.
    Undefined values (a geometric mean without a correct kernel, pass@k with k above a task's kernels)
    are left out rather than written as NaN.
    """
    out = {"tasks": float(report.tasks)}
    out.update(_flat(report.final, ""))
    for m in report.by_k:
        for name, value in m.best.items():
            out[f"best_at_{m.k}/{name}"] = value
        out[f"pass_at_{m.k}/trajectories"] = m.best["correct"]
    for m in report.by_turn:
        out.update(_flat(m, f"turn_{m.turn}/"))  # 1-based: "after turn 1", as MLflow names it
    for split, curve in report.splits.items():
        out.update(_flat(curve[-1], f"split_{split}/"))
        for m in curve:
            out.update(_flat(m, f"split_{split}/turn_{m.turn}/"))
    return out
