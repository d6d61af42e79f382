"""One training step of the pipeline: roll out, score, turn returns, group advantages, persist, update.

    trajectories = rollout(tasks, policy, evaluate)            m x n turns per task, on disk per turn
    R_t          = turn_returns(scores of the trajectory)      e.g. discounted sum, gamma 0.4
    A            = group_advantages(R, group = task)           over ALL m x n samples of a task
    samples.jsonl                                              written BEFORE the update reads them
    metrics      = trainer.update(samples)                     grad_steps optimiser steps

Orchestration (Prefect flows, checkpoints every step, MLflow logging) wraps this; it does none of that.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Protocol, Sequence

import torch

from kevin.policy.protocol import LengthLimited, Sampling, Tokenizing

from kevin.records.rollout import TrainingSample, Trajectory, Turn, save_records
from kevin.rewards import RewardConfig
from kevin.rollout.config import RolloutConfig
from kevin.rollout.loop import Evaluate, Generate, run_rollouts

if TYPE_CHECKING:
    from kevin.training.config import TrainConfig

__all__ = ["StepResult", "StepTrainer", "apply_response_limit", "build_samples", "check_policy", "rollout_metrics",
           "grpo_update", "save_samples", "train_step"]

log = logging.getLogger(__name__)

SAMPLES_FILE = "samples.jsonl"
ROLLOUT_DIR = "rollout"


def _token_ids(turn: Turn, tokenizer: Any | None,
               max_tokens: int | None = None) -> tuple[list[int], list[int], list[float] | None]:
    """The turn's prompt / response token ids and log-probs, tokenizing the text where the backend gave no ids.

    Text tokenized here can come out longer than what the server generated (its tokens decoded and encoded again
    need not round-trip), so such a response is cut to ``max_tokens`` (the most the update accepts) with a warning:
    otherwise a turn at the server's length limit could stop the run at its update.

    The prompt scored is the prompt sampled: the backend's own prompt ids when it returned them, else the
    locally rendered prompt text, which is what an in-process model or a completions endpoint sampled from.
    A chat endpoint's server rendered the prompt with ITS template; without its ids that prompt is unknown
    here, so such a turn is refused rather than scored on a prompt the model never saw."""
    prompt, response, logprobs = list(turn.prompt_token_ids), list(turn.response_token_ids), turn.logprobs
    if not prompt and turn.server_template:
        raise ValueError(f"{turn.task_id} traj {turn.trajectory} turn {turn.turn}: sampled through a chat endpoint, "
                         "whose server applied its own chat template, and the server returned no prompt token ids, so "
                         "the tokens the model saw are unknown here. Use the completions endpoint (the prompt is "
                         "rendered here, with the model's template) or a server that returns token ids (vLLM: "
                         "openai.return_token_ids: true)")
    if (not prompt or not response) and tokenizer is None:
        raise ValueError(f"{turn.task_id} traj {turn.trajectory} turn {turn.turn}: the backend returned no token ids "
                         "and no tokenizer was given to tokenize its text; pass tokenizer=")
    if not prompt:
        prompt = tokenizer.encode(turn.prompt, add_special_tokens=False)
    if not response:
        response = tokenizer.encode(turn.response, add_special_tokens=False)
        eos = tokenizer.eos_token_id
        if not turn.truncated and eos is not None:
            response.append(int(eos))  # the response ended by choice: train the model to stop there too
        if max_tokens is not None and len(response) > max_tokens:
            log.warning("%s traj %d turn %d: its text tokenizes to %d tokens, more than the %d the update accepts; "
                        "scoring the first %d (a server that returns token ids avoids this: vLLM's return_token_ids)",
                        turn.task_id, turn.trajectory, turn.turn, len(response), max_tokens, max_tokens)
            response = response[:max_tokens]
        logprobs = None  # server log-probs would not line up with our own tokenization
    return prompt, response, logprobs


def build_samples(trajectories: Sequence[Trajectory], reward_cfg: RewardConfig, tokenizer: Any | None = None,
                  max_tokens: int | None = None) -> list[TrainingSample]:
    """Every turn of every trajectory as a TrainingSample (trajectory order, then turn order); ``max_tokens`` (the
    trainer's ``config.response_limit``) bounds a response tokenized here from the backend's text.

    reward = the turn's return under ``reward_cfg`` (from the scores of its own trajectory, a cut-off answer's as
    ``rewards.truncation`` says);
    advantage = that return normalised over all samples of the same task (m trajectories x n turns), or of the same
    task and turn (``rewards.group: turn``).
    """
    turns: list[Turn] = []
    returns: list[float] = []
    groups: list[int] = []
    group_index: dict[tuple[str, int], int] = {}
    for traj in trajectories:
        ordered = sorted(traj.turns, key=lambda t: t.turn)
        turns.extend(ordered)
        returns.extend(reward_cfg.returns([reward_cfg.turn_score(t.score, t.truncated) for t in ordered]))
        groups.extend(group_index.setdefault(reward_cfg.group_key(traj.task_id, t.turn), len(group_index))
                      for t in ordered)
    if not turns:
        return []
    adv = reward_cfg.advantages(torch.tensor(returns, dtype=torch.float64), groups).tolist()
    samples = []
    for turn, ret, a in zip(turns, returns, adv):
        prompt, response, logprobs = _token_ids(turn, tokenizer, max_tokens)
        sample = turn.training_sample(reward=float(ret), advantage=float(a))
        sample.prompt_token_ids, sample.completion_token_ids, sample.old_logprobs = prompt, response, logprobs
        samples.append(sample)
    return samples


def taught_tasks(task_ids: Sequence[str], samples: Sequence[TrainingSample]) -> dict[str, bool]:
    """Whether each task gave the update anything to learn: some sample of it has a non-zero advantage. A task whose
    returns were all equal (every kernel wrong, or none drawn) moved nothing, whatever its score."""
    moving = {s.task_id for s in samples if s.advantage != 0.0}
    return {task_id: task_id in moving for task_id in task_ids}


def save_samples(step_dir: str | Path, samples: Sequence[TrainingSample]) -> Path:
    """The step's samples in ``samples.jsonl``, written before the update reads them (a redone step trains on them)."""
    return save_records(Path(step_dir) / SAMPLES_FILE, samples)


def grpo_update(trainer: StepTrainer, samples: Sequence[TrainingSample]) -> list[dict[str, float]]:
    """The GRPO update of a step; a step without samples makes no optimiser step (no metrics)."""
    return trainer.update(samples) if samples else []


def rollout_metrics(trajectories: Sequence[Trajectory]) -> dict[str, float]:
    """Means over all turns: score, correct, parse errors, truncation, response tokens; best score per trajectory."""
    turns = [t for traj in trajectories for t in traj.turns]
    if not turns:
        return {"turns": 0.0}
    n = float(len(turns))
    return {
        "turns": n,
        "score_mean": sum(t.score for t in turns) / n,
        "correct_share": sum(t.correct for t in turns) / n,
        "parse_error_share": sum(t.parse_error for t in turns) / n,
        "truncated_share": sum(t.truncated for t in turns) / n,
        "response_tokens_mean": sum(t.response_tokens for t in turns) / n,
        "best_score_mean": sum(traj.best_score for traj in trajectories) / max(1, len(trajectories)),
    }


class StepTrainer(Protocol):
    """What a training step calls on its trainer (``GRPOTrainer``, or a benchmark's timing wrapper of one): the
    config its checks read (temperature, loss, response limit) and the update."""

    @property
    def config(self) -> TrainConfig: ...

    def update(self, samples: Sequence[TrainingSample]) -> list[dict[str, float]]: ...


@dataclass
class StepResult:
    """What one training step produced."""

    trajectories: list[Trajectory]
    samples: list[TrainingSample]
    update_metrics: list[dict[str, float]] = field(default_factory=list)
    """One dict per optimiser step (see ``GRPOTrainer.update``)."""
    rollout_metrics: dict[str, float] = field(default_factory=dict)
    samples_path: Path | None = None


def train_step(tasks: Sequence[Any], policy: Generate, evaluate: Evaluate, reward_cfg: RewardConfig,
               rollout_cfg: RolloutConfig, trainer: StepTrainer, *, out_dir: str | Path | None = None,
               tokenizer: Any | None = None, rollout_fn: Callable[..., list[Trajectory]] = run_rollouts,
               max_response_tokens: int | None = None) -> StepResult:
    """Roll out ``tasks`` with ``policy``, score with ``evaluate``, and make one ``trainer.update``.

    ``out_dir`` (one directory per step): the rollout goes to ``out_dir/rollout`` turn by turn and the
    samples to ``out_dir/samples.jsonl`` before the update. A step re-run on the same directory resumes
    its rollout (a finished one is reused as is), so a killed step replays on the same data.
    ``tokenizer`` (default: ``policy.tokenizer``) renders prompts with the chat template and tokenizes
    responses of backends that return no token ids. ``rollout_fn`` replaces ``run_rollouts`` (same
    signature), e.g. a synthetic environment in the tests. ``max_response_tokens``: the response length limit of
    this step (``RunConfig.response_tokens_at(step)``, which a length schedule raises); it is set on the policy
    (``set_max_response_tokens``) before the rollout. Either way the policy's limit is checked against the
    trainer's: at least the loss's Dr-GRPO constant, at most the longest completion the trainer accepts.
    """
    if tokenizer is None and isinstance(policy, Tokenizing):
        tokenizer = policy.tokenizer
    apply_response_limit(policy, trainer, max_response_tokens)
    out = Path(out_dir) if out_dir is not None else None
    trajectories = rollout_fn(tasks, policy, evaluate, rollout_cfg, tokenizer=tokenizer,
                              out_dir=out / ROLLOUT_DIR if out is not None else None, resume=out is not None)
    samples = build_samples(trajectories, reward_cfg, tokenizer, trainer.config.response_limit)
    path = save_samples(out, samples) if out is not None else None
    metrics = grpo_update(trainer, samples)
    return StepResult(trajectories=trajectories, samples=samples, update_metrics=metrics,
                      rollout_metrics=rollout_metrics(trajectories), samples_path=path)


def apply_response_limit(policy: Generate, trainer: StepTrainer, tokens: int | None) -> None:
    """The one place a step's response length limit (``RunConfig.response_tokens_at(step)``, which a length schedule
    raises) reaches the policy: set it (None: keep the policy's own), then check the policy against the trainer."""
    _check_temperatures(policy, trainer)
    if tokens is not None:
        if not isinstance(policy, LengthLimited):
            raise TypeError(f"{type(policy).__name__} has no set_max_response_tokens: it cannot follow a length "
                            "schedule; build it with the step's limit and leave max_response_tokens unset")
        policy.set_max_response_tokens(tokens)
    _check_lengths(policy, trainer)


def check_policy(policy: Generate, trainer: StepTrainer) -> None:
    """Refuse a policy whose samples the trainer would score wrongly: another temperature, or a response length
    limit that does not fit the loss's Dr-GRPO constant and the trainer's longest completion."""
    apply_response_limit(policy, trainer, None)


def _check_temperatures(policy: Generate, trainer: StepTrainer) -> None:
    """The trainer's log-probs must be those of the distribution the policy sampled from."""
    sampling = policy.config.temperature if isinstance(policy, Sampling) and policy.config is not None else None
    training = trainer.config.temperature
    if sampling and training and abs(float(sampling) - float(training)) > 1e-9:
        raise ValueError(f"the policy samples at temperature {sampling} but the trainer computes log-probs at "
                         f"{training}; set train.temperature to the sampling temperature")


def _check_lengths(policy: Generate, trainer: StepTrainer) -> None:
    """The Dr-GRPO loss divides every sequence's token sum by a constant that must be the response length limit:
    a constant 16x the limit makes the loss (and how often the gradient clip bites) 16x off."""
    if not isinstance(policy, LengthLimited):
        return
    limit, loss = policy.max_response_tokens, trainer.config.loss
    constant, accepted = loss.max_completion_length, trainer.config.response_limit
    if loss.aggregation == "dr_grpo" and limit < constant:
        raise ValueError(f"the policy stops responses at {limit} tokens but the loss divides by "
                         f"loss.max_completion_length = {constant} (Dr-GRPO's constant), which would make the loss "
                         f"{constant / limit:.3g}x too small; set max_response_tokens once (kevin.config.RunConfig hands "
                         "it to both)")
    if limit > accepted:
        raise ValueError(f"the policy may write {limit}-token responses but the trainer accepts at most {accepted} "
                         "(train.max_response_tokens); raise the limit through response_length_schedule, which sets both")
