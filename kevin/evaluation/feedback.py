"""The one-line feedback a policy reads about its previous kernel (RECIPE.md section 1)."""

from __future__ import annotations

from kevin.evaluation.records import EvalResult, Status


def _first_lines(text: str, n: int = 12) -> str:
    lines = [line for line in text.strip().splitlines() if line.strip()]
    return "\n".join(lines[:n])


def feedback_line(result: EvalResult) -> str:
    """What the next turn's context says about this kernel."""
    s = result.status
    if s is Status.PARSE_ERROR:
        return f"Your response could not be parsed: {result.error or 'no ModelNew class was found'}."
    if s is Status.RULE_VIOLATION:
        return f"Your kernel broke a rule and scores 0 [{result.rule_id}]: {result.error}."
    if s is Status.COMPILE_ERROR:
        return f"Your kernel failed to compile:\n{_first_lines(result.error)}"
    if s is Status.TIMEOUT:
        return "Your kernel did not finish within the time limit (it hung or was far too slow)."
    if s is Status.RUNTIME_ERROR:
        return f"Your kernel compiled but failed at run time:\n{_first_lines(result.error, 6)}"
    if s is Status.INCORRECT:
        return f"Your kernel compiled and ran but its output is incorrect: {result.error}"
    return f"Your kernel is correct and runs at {result.speedup:.2f}x the speed of the PyTorch eager baseline; it can be made faster."
