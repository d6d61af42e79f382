"""The records layer: the typed data every stage passes on, below every module that uses it.

    tasks -> records -> evaluation, policy -> rollout -> rewards -> training -> flows

- ``evaluation``: ``Candidate`` (a kernel to judge), ``EvalResult`` (the verdict), ``Status``, ``Fault``, ``PhaseTimes``,
  ``TimingFigures``, ``kernel_score``, ``trim_error``;
- ``verdicts``: the feedback line of a verdict and the parse-error verdict (one wording for every producer);
- ``generation``: ``Prompt`` (messages and their rendering) and ``GenerationOut`` (a policy's response);
- ``rollout``: ``Turn``, ``Trajectory``, ``TrainingSample`` and their JSONL files (``jsonl``).
- ``target``: ``KernelTarget``, the kernel target (``cuda`` or ``cpu``) a config's ``backend`` names.

Only the standard library is imported here (the evaluator's sandboxed harness imports these records too).
"""

from kevin.records.evaluation import (
    Candidate,
    EvalResult,
    Fault,
    PhaseTimes,
    Status,
    TimingFigures,
    kernel_score,
    trim_error,
)
from kevin.records.generation import GenerationOut, Messages, Prompt
from kevin.records.jsonl import atomic_write_text, read_jsonl, write_jsonl
from kevin.records.rollout import (
    TrainingSample,
    Trajectory,
    Turn,
    group_trajectories,
    load_records,
    load_turns,
    save_records,
    save_turns,
)
from kevin.records.target import KernelTarget
from kevin.records.verdicts import feedback_line, parse_error_verdict

__all__ = [
    "Candidate",
    "EvalResult",
    "Fault",
    "GenerationOut",
    "KernelTarget",
    "Messages",
    "PhaseTimes",
    "Prompt",
    "Status",
    "TimingFigures",
    "TrainingSample",
    "Trajectory",
    "Turn",
    "atomic_write_text",
    "feedback_line",
    "group_trajectories",
    "kernel_score",
    "load_records",
    "load_turns",
    "parse_error_verdict",
    "read_jsonl",
    "save_records",
    "save_turns",
    "trim_error",
    "write_jsonl",
]
