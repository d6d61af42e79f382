"""The optional warm start of a run (the ``sft`` section) from its split file: the train tasks' answers as
examples, a prebuilt warm start reused when it was built from the same examples, base model and settings, else a
fine-tune of the policy's model. Here, not in the command line, so the steps the ``sft`` stage takes are library
code; the command only prints and writes the record. transformers and torch are imported inside the functions."""

from __future__ import annotations

import dataclasses
import time
from pathlib import Path
from typing import Any, Callable

from kevin.config import RunConfig

__all__ = ["build_warm_start", "train_tasks"]


def train_tasks(split: Path) -> list[Any]:
    """The train tasks of the split file ``split``, loaded from the source it records."""
    from kevin.tasks import load_tasks, read_split

    chosen = read_split(split)
    train_ids = {e.task_id for e in chosen.train}
    return [t for t in load_tasks(chosen.config.source, chosen.config.levels) if t.task_id in train_ids]


def build_warm_start(config: RunConfig, split: Path, out: Path, say: Callable[[str], None]) -> dict[str, Any]:
    """Build the warm start of ``config`` (``sft.enabled``) into ``out``/model and return its metrics (the record
    ``sft.json`` holds, less ``enabled``). ``say`` gets the lines worth telling the user (answers left out, a
    reused or rebuilt prebuilt warm start). Raises TaskError, FileNotFoundError or ValueError on bad input."""
    from kevin.experiment.policies import load_model, model_identity
    from kevin.training.sft import reuse_prebuilt, run_sft, warm_start_examples, warm_start_fingerprint

    tasks = train_tasks(split)
    if config.experiment.torch_threads:  # as the training run: two threads on two busy cores are much slower
        import torch

        torch.set_num_threads(config.experiment.torch_threads)
    base = dataclasses.replace(config, sft=dataclasses.replace(config.sft, enabled=False))
    model, tokenizer = load_model(base)
    examples, dropped = warm_start_examples(config, tasks, tokenizer)
    if dropped:
        turns = f" or second turns longer than sft.max_length ({config.sft.max_length})" if config.sft.second_turn else ""
        say(f"left out {len(dropped)} answers longer than max_response_tokens ({config.max_response_tokens}){turns}: "
            f"{dropped}")
    if not examples:
        raise ValueError(f"no warm-start answer fits in max_response_tokens ({config.max_response_tokens}): "
                         "raise it, set sft.data to shorter answers (data/warmstart), or set "
                         "sft.fit_response_limit false")
    fingerprint = warm_start_fingerprint(config.sft, examples, model_identity(base))
    reused, why = reuse_prebuilt(config.sft, fingerprint, out)
    if reused is not None:
        say(f"reusing the warm start built earlier in {config.sft.prebuilt} (same examples, base model and settings)")
        return reused
    if config.sft.prebuilt:
        say(f"training the warm start: {why}")
    started = time.monotonic()
    metrics = run_sft(config.sft, model, tokenizer, examples, out)
    metrics["seconds"] = round(time.monotonic() - started, 1)
    metrics["tasks"] = [e["task_id"] for e in examples]
    metrics["left_out"] = dropped
    metrics["fingerprint"] = fingerprint
    return metrics
