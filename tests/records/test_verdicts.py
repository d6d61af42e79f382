"""The verdicts built without running a kernel, and the feedback line the next turn reads."""

from __future__ import annotations

from kevin.evaluation.rules import RuleHit
from kevin.records.verdicts import parse_error_verdict, rule_violation_verdict


def test_a_rule_violation_names_its_rule_once():
    """The hit's own wording carries the rule id in front; the feedback says it once, then the message and line."""
    hit = RuleHit(rule_id="reference_inheritance", message="ModelNew inherits the reference Model", line=7)
    verdict = rule_violation_verdict("level1/02_gelu", "c0", hit.rule_id, hit.describe(), backend="cuda")
    assert verdict.feedback == ("Your kernel broke a rule and scores 0 [reference_inheritance]: ModelNew inherits the "
                                "reference Model (line 7).")
    assert verdict.error == "[reference_inheritance] ModelNew inherits the reference Model (line 7)"  # reports keep it
    assert verdict.score == 0.0 and verdict.rule_id == "reference_inheritance" and verdict.backend == "cuda"
    # An error worded without the id (or with another rule's) is left as it is.
    other = rule_violation_verdict("t", "c", "try_except", "[pass_statement] a pass", backend="cpu")
    assert other.feedback == "Your kernel broke a rule and scores 0 [try_except]: [pass_statement] a pass."


def test_a_parse_error_says_why():
    verdict = parse_error_verdict("t", "c", "the solution is empty")
    assert verdict.feedback == "Your response could not be parsed: the solution is empty."
    assert verdict.score == 0.0
