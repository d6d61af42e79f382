"""Rollouts: prompts, response parsing (reasoning / kernel / summary), and the multi-turn loop.

The records a rollout produces (``Turn``, ``Trajectory``, ``TrainingSample``, ``GenerationOut``) live in
``kevin.records``; they are re-exported here for convenience.
"""

from kevin.records.generation import GenerationOut, Prompt
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
from kevin.rollout.config import RolloutConfig
from kevin.rollout.loop import RolloutStore, load_rollout, run_rollouts
from kevin.rollout.parsing import ParsedResponse, opens_reasoning, parse_response, template_opens_reasoning
from kevin.rollout.stages import TurnStages
from kevin.rollout.prompts import Attempt, PromptBuilder, PromptContext, approx_tokens, tokenizer_counter

__all__ = [
    "Attempt",
    "GenerationOut",
    "ParsedResponse",
    "Prompt",
    "PromptBuilder",
    "PromptContext",
    "RolloutConfig",
    "RolloutStore",
    "TrainingSample",
    "TurnStages",
    "Trajectory",
    "Turn",
    "approx_tokens",
    "group_trajectories",
    "load_records",
    "load_rollout",
    "load_turns",
    "opens_reasoning",
    "parse_response",
    "run_rollouts",
    "save_records",
    "save_turns",
    "template_opens_reasoning",
    "tokenizer_counter",
]
