"""Replay a recorded run's GRPO updates on the CPU under other settings: does a change keep the kernels it had?

A GPU step is mostly rollout and judging; its update is a few seconds. So a question about the update alone (would a
KL anchor, a smaller step, another optimiser setting have kept the kernels the fifth run forgot?) can be asked here:
build the run's starting policy (warm start merged, the RL adapter seeded as the run seeded it), feed it the run's
recorded batches (`steps/step_*/samples.jsonl`: prompts, answers, advantages, the log-probs they were sampled with) in
order, one `GRPOTrainer.update` each, and after every step that trained a sequence score the run's known-correct
first-turn answers (`policy_drift.correct_answers`) as `policy_drift.py` does: the probability that one sample is one
of them, per task (a step that trained none leaves the weights, and so the figures, as they were).
With the run's own settings the replay retraces the run (the first step exactly: its batch was sampled by the warm
start; later ones off the replayed policy, as far as it has moved from the run's); with `--set` overrides it shows
what the same data would have done under them.

    python scripts/replay_updates.py .carry/full/outputs/h200-learn-turn-groups --project-dir .carry/full \
        --params params.yaml --params configs/h200_learn.yaml --params configs/h200_learn_turn_groups.yaml \
        --steps 4 --set train.micro_batch_size=1 --set train.adam_eps=1.0e-5 --out docs/replay/adam_eps_1e-5.json

It costs a forward and backward pass over each recorded batch's trained samples on the CPU plus one scoring pass a
step: 140-210 s a step for the 135M model on 2 cores (400-520 s with a KL penalty, which trains every sample and adds
a reference pass). Micro-batches of 1 keep it within 24 GiB (the run's 8 of ~900 tokens do not fit in float32); the
gradients of an optimiser step are the same sum either way.
"""
from __future__ import annotations

import argparse
import json
import math
import time
from pathlib import Path

from answer_forks import read_samples, rescore
from kevin.experiment.files import step_dir
from policy_drift import by_task, correct_answers, flatten, mean_of, probe_log_p, split_by_update


def task_probabilities(answers: dict[str, list[dict]], model, tokenizer, temperature: float) -> dict[str, float]:
    """Per task, log P(one sample is one of its known-correct answers) under ``model``."""
    lps = rescore(flatten(answers), model, tokenizer, [temperature])[temperature]
    return probe_log_p(by_task(answers, lps))


def trained_any(metrics: list[dict[str, float]]) -> bool:
    """Whether an update moved the weights. With no sequence trained no parameter has a gradient, and AdamW
    leaves a parameter without one untouched (no momentum or weight decay either)."""
    return any(m.get("trained_sequences", 0.0) > 0 and not m.get("skipped", 0.0) for m in metrics)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("run_dir", type=Path, help="a training run's folder (outputs/<experiment.name>)")
    ap.add_argument("--params", action="append", required=True, help="the run's params files")
    ap.add_argument("--set", action="append", default=[], dest="overrides", help="key=value over the run's settings")
    ap.add_argument("--project-dir", default=".", help="where the run's sft.output_dir lies")
    ap.add_argument("--steps", type=int, default=4, help="recorded steps to replay, from the first")
    ap.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's default)")
    ap.add_argument("--out", type=Path, help="write the figures as JSON here")
    args = ap.parse_args()

    import dataclasses

    import torch

    from kevin.config import RunConfig
    from kevin.experiment.policies import load_model
    from kevin.records.rollout import TrainingSample
    from kevin.training.rng import seed_everything
    from kevin.training.trainer import GRPOTrainer

    if args.threads:
        torch.set_num_threads(args.threads)
    cfg = RunConfig.from_files(args.params, args.overrides)
    seed_everything(cfg.train.seed)  # as the run: the same RL adapter factors
    model, tokenizer = load_model(cfg, args.project_dir)
    trainer = GRPOTrainer(model, dataclasses.replace(cfg.train, device="cpu"), tokenizer=tokenizer)
    answers, _, updated = correct_answers(args.run_dir)
    print(f"replaying {args.steps} steps with {args.overrides or 'the run settings'}; probe: "
          f"{sum(map(len, answers.values()))} correct first-turn answers of {len(answers)} tasks, T={cfg.temperature}")
    trainer.model.eval()
    with torch.no_grad():
        history = [{"step": 0, "log_p": task_probabilities(answers, trainer.model, tokenizer, cfg.temperature)}]
    for step in range(args.steps):
        samples = [TrainingSample.from_dict(s) for s in read_samples(step_dir(args.run_dir, step))]
        began = time.monotonic()
        trainer.model.train()
        metrics = trainer.update(samples)
        trainer.model.eval()
        if trained_any(metrics):
            with torch.no_grad():
                log_p = task_probabilities(answers, trainer.model, tokenizer, cfg.temperature)
        else:  # the weights did not move: rescoring every answer would take minutes to repeat the last figures
            log_p = history[-1]["log_p"]
        history.append({"step": step + 1, "log_p": log_p, "update": metrics, "seconds": time.monotonic() - began})
        kl = max((m.get("approx_kl", 0.0) for m in metrics), default=0.0)
        moved = {t: log_p[t] - history[0]["log_p"][t] for t in log_p}
        fell = sorted(moved, key=moved.get)[:3]
        print(f"step {step + 1}: {time.monotonic() - began:.0f} s, kl {kl:.1e}, mean change of log P since the start "
              f"{sum(moved.values()) / len(moved):+.2f}; most fallen: "
              + ", ".join(f"{t.split('/')[1]} {moved[t]:+.1f}" for t in fell), flush=True)
    print("\nP(one sample is a known-correct answer), start -> end, per task (updated at: steps of the recorded run)")
    for task in sorted(answers):
        print(f"  {task:34s} {math.exp(history[0]['log_p'][task]):10.3g} -> {math.exp(history[-1]['log_p'][task]):10.3g}"
              f"   {[u + 1 for u in updated.get(task, [])]}")
    # What the replayed steps did to their own tasks against the rest: an update that learns raises the first more.
    mine, others = split_by_update({t: history[-1]["log_p"][t] - history[0]["log_p"][t] for t in answers}, updated,
                                   -1, args.steps - 1)
    print(f"mean change of log P, tasks the replayed steps updated / the others: {mean_of(mine)} / {mean_of(others)}")
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps({"overrides": args.overrides, "temperature": cfg.temperature,
                                        "history": history}, indent=1))


if __name__ == "__main__":
    main()
