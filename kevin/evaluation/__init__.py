"""Kernel evaluation: static rules, sandboxed compile/run, correctness, timing, batch evaluator."""

from kevin.evaluation.config import EvalConfig
from kevin.evaluation.evaluator import Evaluator
from kevin.records.verdicts import feedback_line
from kevin.records.evaluation import Candidate, EvalResult, PhaseTimes, Status, kernel_score

__all__ = ["Candidate", "EvalConfig", "EvalResult", "Evaluator", "PhaseTimes", "Status", "feedback_line", "kernel_score"]
