"""Terminal output and summary figures of kevin/evaluation/report.py, on EvalResult records built by hand
(nothing is compiled or run here)."""

from __future__ import annotations

import io
import re
from dataclasses import replace

import pytest
from rich.console import Console

from kevin.records.evaluation import EvalResult, PhaseTimes, Status
from kevin.evaluation.report import (
    NOTE_MIN_WIDTH,
    choose_columns,
    percentile,
    print_result,
    print_summary,
    summarise,
)

LONGEST_BUNDLED_ID = "level2/30_conv2d_bias_swish_global_avgpool"


def result(task_id, status, *, compile_s=0.0, speedup=0.0, rule_id="", error="", feedback=""):
    correct = status is Status.CORRECT
    return EvalResult(task_id=task_id, candidate_id=task_id, status=status, compiled=compile_s > 0, correct=correct,
                      runtime_ms=0.5 if correct else 0.0, baseline_ms=0.75, speedup=speedup, rule_id=rule_id,
                      score=0.3 + speedup if correct else 0.0, error=error, feedback=feedback,
                      times=PhaseTimes(compile=compile_s, total=compile_s + 2.0))


def batch():
    """One result of every status, with the longest id of the bundled suite."""
    return [
        result("level1/01_relu", Status.CORRECT, compile_s=7.0, speedup=1.5, feedback="correct, 1.50x"),
        result(LONGEST_BUNDLED_ID, Status.PARSE_ERROR, error="no class ModelNew defined in the solution [bold]x[/bold]"),
        result("level1/22_matmul_transposed_a", Status.RULE_VIOLATION, rule_id="torch_compute_in_python"),
        result("level2/28_conv2d_softmax_channels_scale", Status.COMPILE_ERROR, compile_s=3.0,
               error="main.cpp:4:1: error: expected ';' before '}' token\nmore"),
        result("level1/17_layernorm", Status.RUNTIME_ERROR, compile_s=5.0, error="RuntimeError: CUDA error"),
        result("level1/09_argmax_dim", Status.INCORRECT, compile_s=6.0, error="max abs error 0.5"),
        result("level2/07_gemm_sigmoid_scaling_residual", Status.TIMEOUT, compile_s=8.0,
               error="no verdict within 180 s; the process was killed"),
    ]


def render(fn, *args, width=80):
    console = Console(width=width, record=True, file=io.StringIO(), color_system=None)
    fn(*args, console=console)
    return console.export_text()


def words(text):
    return " ".join(text.split())


# ------------------------------------------------------------------------------ percentiles


@pytest.mark.parametrize("values, p90, median", [
    ([5.0], 5.0, 5.0),
    ([2.0, 1.0], 1.9, 1.5),  # rank 0.9 between 1 and 2 (the old index arithmetic took the smaller: 1 < median)
    ([3.0, 1.0, 2.0], 2.8, 2.0),  # rank 1.8: 2 + 0.8 * (3 - 2)
    ([float(v) for v in range(10, 0, -1)], 9.1, 5.5),  # rank 8.1: 9 + 0.1 * (10 - 9)
])
def test_percentile_exact_values(values, p90, median):
    assert percentile(values, 90) == pytest.approx(p90, abs=1e-12)
    assert percentile(values, 50) == pytest.approx(median, abs=1e-12)
    assert percentile(values, 100) == max(values) and percentile(values, 0) == min(values)


def test_percentile_of_nothing_is_zero():
    assert percentile([], 90) == 0.0


def test_summary_compile_p90_is_not_below_the_median():
    two = [result("level1/01_relu", Status.CORRECT, compile_s=2.0, speedup=1.0),
           result("level1/02_x", Status.INCORRECT, compile_s=4.0),
           result("level1/03_y", Status.PARSE_ERROR)]  # not compiled: not in the compile figures
    two.append(replace(two[0], candidate_id="again", reused=True, times=PhaseTimes()))  # no compile of its own
    s = summarise(two)
    assert s["compile_s_median"] == pytest.approx(3.0) and s["compile_s_p90"] == pytest.approx(3.8)
    assert s["reused"] == 1 and s["candidates"] == 4
    assert s["status_counts"] == {"correct": 2, "incorrect": 1, "parse_error": 1}
    assert s["correct_share"] == pytest.approx(2 / 4) and s["mean_score"] == pytest.approx(2.6 / 4)


# ------------------------------------------------------------------------------ column plan (pure)

OPTIONAL = [("speedup", 7), ("compile", 7), ("note", 60), ("runtime", 10), ("baseline", 11)]


@pytest.mark.parametrize("width, expected", [
    (60, ([], False)),  # 42 + 2 + 14 = 58: only the essentials
    (67, (["speedup"], False)),  # 58 + 2 + 7 = 67 fits exactly
    (80, (["speedup", "compile"], False)),  # 76 used; 2 left: the note goes under the task id
    (102, (["speedup", "compile"], True)),  # 76 + 2 + NOTE_MIN_WIDTH = 102: the note gets its column
    (120, (["speedup", "compile", "runtime"], True)),  # 102 + 12 = 114; baseline would need 127
    (127, (["speedup", "compile", "runtime", "baseline"], True)),
])
def test_choose_columns(width, expected):
    assert NOTE_MIN_WIDTH == 24
    assert choose_columns(width, 42, 14, OPTIONAL) == expected


# ------------------------------------------------------------------------------ rendering


def test_table_at_80_columns_shows_whole_ids_statuses_and_notes():
    results = batch()
    text = render(print_summary, results)
    lines = text.splitlines()
    assert max(len(line.rstrip()) for line in lines) <= 80
    assert "…" not in text
    for r in results:
        row = next(line for line in lines if line.startswith(r.task_id + " "))  # the id whole, on its own row
        assert re.search(rf"\s{r.status.value}(\s|$)", row), row  # and its status whole, on the same row
    for note in ("torch_compute_in_python", "no class ModelNew defined in the solution [bold]x[/bold]",
                 "main.cpp:4:1: error: expected ';' before '}' token", "no verdict within 180 s; the process was killed"):
        assert note in words(text)  # wrapped maybe, never cut; markup in error text printed as it is
    assert "more" not in text.split()  # only an error's first line
    header = lines[1].split()
    assert header == ["task", "status", "speedup", "compile"]  # runtime/baseline left out when narrow
    relu = next(line for line in lines if line.startswith("level1/01_relu "))
    assert relu.split() == ["level1/01_relu", "correct", "1.50x", "7.0s"]


def test_wide_terminal_gets_every_column():
    text = render(print_summary, batch(), width=160)
    header = next(line for line in text.splitlines() if line.startswith("task"))
    # The note (it wraps) goes last.
    assert header.split() == ["task", "status", "speedup", "compile", "runtime", "ms", "baseline", "ms", "note"]
    relu = next(line for line in text.splitlines() if line.startswith("level1/01_relu "))
    assert relu.split() == ["level1/01_relu", "correct", "1.50x", "7.0s", "0.500", "0.750"]
    rule = next(line for line in text.splitlines() if line.startswith("level1/22_matmul_transposed_a "))
    assert rule.split() == ["level1/22_matmul_transposed_a", "rule_violation", "-", "-", "-", "0.750",
                            "torch_compute_in_python"]


def test_an_id_wider_than_the_terminal_is_folded_not_cut():
    long_id = "level2/99_" + "conv3d_multiply_instancenorm_clamp_multiply_max_" * 2
    text = render(print_summary, [result(long_id, Status.INCORRECT, compile_s=1.0)], width=80)
    assert "…" not in text and text.splitlines()[0].strip() == "1 candidate"
    rows = [line for line in text.splitlines()[3:] if line.strip()]
    first_column = "".join(line[:len(rows[0].split()[0])] for line in rows[:3])
    assert long_id in first_column.replace(" ", "") and "incorrect" in rows[0]


def test_summary_is_lines_not_a_dict():
    text = render(print_summary, batch())
    summary = text[text.index("\ncandidates  ") + 1:]
    assert "{" not in summary and "':" not in summary
    lines = [line.rstrip() for line in summary.splitlines()]
    assert lines[:3] == ["candidates  7", "correct     1 of 7 (14%)", "verdicts    1 compile_error"]
    assert lines[3:9] == ["            1 correct", "            1 incorrect", "            1 parse_error",
                          "            1 rule_violation", "            1 runtime_error", "            1 timeout"]
    assert lines[9:] == ["speedup     geomean 1.500x, median 1.500x", "mean score  0.257",
                         "compile     median 6.0 s, p90 7.6 s"]  # 3 5 6 7 8: rank 3.6 -> 7 + 0.6 * (8 - 7)


def test_single_result_at_80_columns():
    r = result(LONGEST_BUNDLED_ID, Status.CORRECT, compile_s=7.25, speedup=1.234, feedback="correct [red]x[/red]")
    r.trials_passed, r.trials_run, r.max_abs_error = 5, 5, 2.5e-7
    r.warnings = ["landlock unavailable: file-system layer off"]
    lines = [line.rstrip() for line in render(print_result, r).splitlines()]
    assert lines == [
        f"{LONGEST_BUNDLED_ID}  correct",
        "runtime   0.5000 ms",
        "baseline  0.7500 ms",
        "speedup   1.234x",
        "score     1.534",
        "trials    5/5 passed, max abs error 2.5e-07",
        "time      compile 7.2 s, total 9.2 s",
        "warning   landlock unavailable: file-system layer off",
        "feedback  correct [red]x[/red]",
    ]


def test_single_failed_result_shows_what_the_feedback_does_not():
    r = result("level1/01_relu", Status.TIMEOUT, error="no verdict within 5 s; the process was killed",
               feedback="Your kernel did not finish within the time limit (it hung or was far too slow).")
    lines = [line.rstrip() for line in render(print_result, r).splitlines()]
    assert lines == [
        "level1/01_relu  timeout",
        "score     0.000",
        "time      compile 0.0 s, total 2.0 s",
        # 80 - 10 = 70 characters for the value: wrapped between words
        "feedback  Your kernel did not finish within the time limit (it hung or was far",
        "          too slow).",
        "error     no verdict within 5 s; the process was killed",
    ]
    r = result("level1/01_relu", Status.RULE_VIOLATION, rule_id="torch_compute_in_python", error="torch.relu call",
               feedback="Your kernel broke a rule and scores 0 [torch_compute_in_python]: torch.relu call.")
    lines = [line.rstrip() for line in render(print_result, r).splitlines()]
    assert lines[0] == "level1/01_relu  rule_violation  rule torch_compute_in_python"
    assert not any(line.startswith("error") for line in lines)  # the feedback already says it
