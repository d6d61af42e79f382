"""Rollout settings: one dataclass, every field documented and validated.

Sampling settings (temperature, top_p, max response tokens) belong to the policy backend, not here:
the loop only decides what is asked and when a trajectory ends. ``backend`` and ``profile`` are shared
with the evaluator: the run's root config (``kevin.config.RunConfig``) sets them once for both.
"""

from __future__ import annotations

from dataclasses import dataclass
from kevin.records.target import TARGETS
from kevin.settings import Settings


@dataclass
class RolloutConfig(Settings):
    """How many trajectories and turns to roll out per task, and how their prompts are built."""

    section = "rollout"

    trajectories: int = 16
    """m: parallel trajectories per task (the paper trains with 16)."""

    turns: int = 4
    """n: turns per trajectory (the paper trains with 4 and evaluates with 8)."""

    backend: str = "cpu"
    """`cuda` (inline CUDA kernels, the paper's setting) or `cpu` (inline C++); must match the evaluator's."""

    profile: str = ""
    """Task size profile shown in the prompt; empty means the evaluator's default (`cpu` on cpu, the task's own sizes on cuda)."""

    max_prompt_tokens: int = 8192
    """Token budget of a turn's prompt (chat template included); the oldest attempts are dropped to fit."""

    early_stop_speedup: float | None = None
    """Stop a trajectory after a correct kernel with at least this speedup (0.0: after any correct kernel;
    None: never stop early, as in training, where every turn is a sample)."""

    include_example: bool = True
    """Show the one-shot example (an inline elementwise add) in the first turn's prompt."""

    system_prompt: str = ""
    """Optional system message; empty sends the task as a single user message."""

    prompt_style: str = "full"
    """``full``: the recipe's prompt (rules and a one-shot example on the first turn); ``compact``: a short task
    statement without the example, a few hundred tokens, for small models (``kevin.rollout.prompts``)."""

    prompt_opens_reasoning: bool | None = None
    """Whether the model's chat template opens the ``<think>`` block in the prompt (QwQ, the DeepSeek-R1
    distills and Qwen's thinking releases do), so a response starts inside its reasoning. null: read it off
    each prompt rendered with the tokenizer's template (without a tokenizer: no). Set true for such a model
    served through a chat endpoint without a local tokenizer, or a response cut off mid-reasoning would be
    read as a plain answer (its drafts as the kernel, its reasoning as the summary)."""

    show_progress: bool = False
    """Show a tqdm progress bar over turns."""

    def __post_init__(self) -> None:
        for name in ("trajectories", "turns", "max_prompt_tokens"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be a positive integer, got {value!r}")
        if self.backend not in TARGETS:
            raise ValueError(f"backend must be one of {TARGETS}, got {self.backend!r} (use the evaluator's backend)")
        if self.max_prompt_tokens < 256:
            raise ValueError(f"max_prompt_tokens={self.max_prompt_tokens} cannot hold even the base prompt; "
                             "use at least 256 (the paper uses 8192)")
        if self.prompt_opens_reasoning is not None and not isinstance(self.prompt_opens_reasoning, bool):
            raise ValueError(f"prompt_opens_reasoning must be true, false or null (read it from the chat template), "
                             f"got {self.prompt_opens_reasoning!r}")
        from kevin.rollout.prompts import PROMPT_STYLES

        if self.prompt_style not in PROMPT_STYLES:
            raise ValueError(f"rollout.prompt_style must be one of {list(PROMPT_STYLES)}, got {self.prompt_style!r}")
        if not isinstance(self.include_example, bool) or not isinstance(self.show_progress, bool):
            raise ValueError("include_example and show_progress must be true or false")
        if self.early_stop_speedup is not None:
            if isinstance(self.early_stop_speedup, bool) or not isinstance(self.early_stop_speedup, (int, float)):
                raise ValueError(f"early_stop_speedup must be a number or None, got {self.early_stop_speedup!r}")
            if not self.early_stop_speedup >= 0:  # also rejects NaN
                raise ValueError(f"early_stop_speedup must be >= 0 (0 = stop at the first correct kernel) or None "
                                 f"(never stop early), got {self.early_stop_speedup!r}")

    @property
    def samples_per_task(self) -> int:
        """m x n: the group over which advantages are normalised (fewer if trajectories stop early)."""
        return self.trajectories * self.turns


