"""Rollouts: prompts, response parsing (reasoning / kernel / summary), and the multi-turn loop."""

from kevin.rollout.config import RolloutConfig
from kevin.rollout.loop import GenerationOut, RolloutStore, load_rollout, run_rollouts, run_turn
from kevin.rollout.parsing import ParsedResponse, parse_response
from kevin.rollout.prompts import Attempt, PromptBuilder, PromptContext, approx_tokens, tokenizer_counter
from kevin.rollout.records import (
    TrainingSample,
    Trajectory,
    Turn,
    group_trajectories,
    load_records,
    load_turns,
    save_records,
    save_turns,
)

__all__ = [
    "Attempt",
    "GenerationOut",
    "ParsedResponse",
    "PromptBuilder",
    "PromptContext",
    "RolloutConfig",
    "RolloutStore",
    "TrainingSample",
    "Trajectory",
    "Turn",
    "approx_tokens",
    "group_trajectories",
    "load_records",
    "load_rollout",
    "load_turns",
    "parse_response",
    "run_rollouts",
    "run_turn",
    "save_records",
    "save_turns",
    "tokenizer_counter",
]
