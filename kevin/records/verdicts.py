"""The one place that words verdicts for the policy: feedback lines and parse-error verdicts.

A later turn's context shows every earlier attempt with one feedback line (docs/recipe.md §2): could not
be parsed; broke a rule; failed to compile (with the compiler's first errors); compiled but failed at run
time; incorrect; correct (with the speedup, and that it can be made faster).
The evaluator, the response parser and the rollout loop all build their verdict text here, so the policy
reads one wording whatever produced the verdict.
"""

from __future__ import annotations

from kevin.records.evaluation import EvalResult, Status


def _first_lines(text: str, n: int = 12) -> str:
    lines = [line for line in text.strip().splitlines() if line.strip()]
    return "\n".join(lines[:n])


def feedback_line(result: EvalResult) -> str:
    """What the next turn's context says about this kernel."""
    s = result.status
    if s is Status.PARSE_ERROR:
        return f"Your response could not be parsed: {result.error or 'no ModelNew class was found'}."
    if s is Status.RULE_VIOLATION:
        # The rule's hit words its error with its id in front (``RuleHit.describe``); said once is enough.
        error = result.error.removeprefix(f"[{result.rule_id}] ") if result.rule_id else result.error
        return f"Your kernel broke a rule and scores 0 [{result.rule_id}]: {error}."
    if s is Status.COMPILE_ERROR:
        return f"Your kernel failed to compile:\n{_first_lines(result.error)}"
    if s is Status.TIMEOUT:
        return "Your kernel did not finish within the time limit (it hung or was far too slow)."
    if s is Status.RUNTIME_ERROR:
        return f"Your kernel compiled but failed at run time:\n{_first_lines(result.error, 6)}"
    if s is Status.INCORRECT:
        return f"Your kernel compiled and ran but its output is incorrect: {result.error}"
    return f"Your kernel is correct and runs at {result.speedup:.2f}x the speed of the PyTorch eager baseline; it can be made faster."


def parse_error_verdict(task_id: str, candidate_id: str, error: str, backend: str = "cpu") -> EvalResult:
    """The verdict on a response or solution that is not a solution file at all (score 0), feedback included.

    ``error`` is a phrase the policy reads after "Your response could not be parsed: ", e.g. "the solution is
    empty" or "the reasoning was never closed with </think>"."""
    result = EvalResult(task_id=task_id, candidate_id=candidate_id, status=Status.PARSE_ERROR, backend=backend,
                        error=error)
    result.feedback = feedback_line(result)
    return result


def rule_violation_verdict(task_id: str, candidate_id: str, rule_id: str, error: str, backend: str = "cpu") -> EvalResult:
    """The verdict on a solution a static rule refused (score 0), feedback included: ``rule_id`` and ``error`` as
    the rule's hit words them (``RuleHit.rule_id``, ``RuleHit.describe()``)."""
    result = EvalResult(task_id=task_id, candidate_id=candidate_id, status=Status.RULE_VIOLATION, backend=backend,
                        rule_id=rule_id, error=error)
    result.feedback = feedback_line(result)
    return result
