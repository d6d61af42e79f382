"""How many tokens of a run's answers were choices: the policy's exploration, read from a training run's samples.

GRPO can only move probability between answers the policy samples. An answer whose every token had probability
near 1 is one the policy would write again token for token; its gradient is near 0 and its group teaches nothing new.
For each step's samples (`outputs/<run>/steps/step_*/samples.jsonl`: prompt and completion ids, the log-probs
recorded while sampling) this prints the tokens per answer, the "forks" per answer (tokens sampled with probability
below 0.9 and below 0.5) and the answer's negative log-likelihood, at the temperature the run sampled with.

With --model it also scores the same answers again under a policy loaded here on the CPU (the run's warm start, or
a checkpoint's adapter on top of it) at other temperatures, teacher-forced: what the same policy's distribution would
look like if sampled hotter. Its first temperature should be the run's own, as a check that the recorded log-probs are
reproduced (bf16 on the GPU against float32 here: close, not equal).

With --warm-start it reads no samples: it teacher-forces the run's warm-start examples (the answers the sft stage
trained on, as it built them) through the warm-started policy and prints the mean entropy of its distribution over
the answers' tokens at T 1 and the answer tokens below p 0.9: the figures TRL logs while training the warm start
(`kevin sft` prints them per epoch), for a warm start built earlier.

    python scripts/answer_forks.py outputs/h200-learn-rest
    python scripts/answer_forks.py outputs/h200-learn-rest --steps 14 --limit 8 \
        --params params.yaml --params configs/h200_learn.yaml --params configs/h200_learn_rest.yaml \
        --project-dir . --temperature 0.7 --temperature 1.0
"""
from __future__ import annotations

import argparse
import json
import math
from pathlib import Path
from typing import Any

from kevin.pipeline import step_dirs, step_index


def fork_figures(logprobs: list[list[float]]) -> dict[str, float]:
    """Per answer: mean tokens, tokens below p 0.9 and 0.5, and negative log-likelihood (nats)."""
    n = max(1, len(logprobs))
    return {
        "tokens": sum(len(lp) for lp in logprobs) / n,
        "p<0.9": sum(sum(1 for x in lp if x < math.log(0.9)) for lp in logprobs) / n,
        "p<0.5": sum(sum(1 for x in lp if x < math.log(0.5)) for lp in logprobs) / n,
        "nll": -sum(sum(lp) for lp in logprobs) / n,
    }


def read_samples(step_dir: Path) -> list[dict]:
    with open(step_dir / "samples.jsonl") as f:
        return [json.loads(line) for line in f]


def load_policy(params: list[str], project_dir: str, checkpoint: str | None) -> tuple[Any, Any]:
    """The run's policy on the CPU: its starting model, with the RL checkpoint merged in when given."""
    from kevin.config import RunConfig
    from kevin.experiment.policies import load_checkpoint_model

    return load_checkpoint_model(RunConfig.from_files(params), Path(checkpoint) if checkpoint else None, project_dir)


def rescore(samples: list[dict], model: Any, tokenizer: Any, temperatures: list[float]) -> dict[float, list[list[float]]]:
    """The samples' completion log-probs under ``model`` (``load_policy``), at each temperature."""
    import torch

    from kevin.training.logprobs import sequence_logprobs

    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
    out: dict[float, list[list[float]]] = {t: [] for t in temperatures}
    with torch.no_grad():
        for sample in samples:
            for t in temperatures:
                res = sequence_logprobs(model, [sample["prompt_token_ids"]], [sample["completion_token_ids"]],
                                        temperature=t, pad_token_id=pad)
                n = len(sample["completion_token_ids"])
                out[t].append(res.logprobs[0, :n].tolist())
    return out


def warm_start_figures(params: list[str], project_dir: str, split: Path) -> dict[str, float]:
    """The warm-started policy on its own training examples, teacher-forced at T 1: examples, answer tokens, mean
    entropy per answer token (nats), answer tokens below p 0.9 per answer."""
    import torch

    from kevin.config import RunConfig
    from kevin.experiment.policies import load_checkpoint_model
    from kevin.experiment.warm_start import train_tasks
    from kevin.training.logprobs import sequence_logprobs
    from kevin.training.sft import warm_start_examples

    config = RunConfig.from_files(params)
    model, tokenizer = load_checkpoint_model(config, None, project_dir)
    examples, _ = warm_start_examples(config, train_tasks(split), tokenizer)
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
    tokens = entropy = below = 0.0
    with torch.no_grad():
        for e in examples:
            prompt = tokenizer.apply_chat_template(e["prompt"], add_generation_prompt=True, tokenize=False)
            whole = tokenizer.apply_chat_template(e["prompt"] + e["completion"], tokenize=False)
            prompt_ids = tokenizer(prompt, add_special_tokens=False)["input_ids"]
            answer_ids = tokenizer(whole, add_special_tokens=False)["input_ids"][len(prompt_ids):]
            res = sequence_logprobs(model, [prompt_ids], [answer_ids], temperature=1.0, pad_token_id=pad,
                                    with_entropy=True)
            n = len(answer_ids)
            tokens += n
            entropy += float(res.entropy[0, :n].sum())
            below += float((res.logprobs[0, :n] < math.log(0.9)).sum())
    count = max(1, len(examples))
    return {"examples": len(examples), "tokens": tokens / count, "entropy": entropy / max(1.0, tokens),
            "p<0.9": below / count}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("run_dir", type=Path, help="a training run's folder (outputs/<experiment.name>)")
    ap.add_argument("--steps", type=int, nargs="*", help="0-based step folders to read (default: all)")
    ap.add_argument("--limit", type=int, default=0, help="with --model: answers per step to score again (0: all)")
    ap.add_argument("--params", action="append", default=[], help="the run's params files, to load its policy")
    ap.add_argument("--project-dir", default=".", help="where the run's sft.output_dir lies")
    ap.add_argument("--checkpoint", help="an RL checkpoint (checkpoints/step_N) merged into the run's starting model")
    ap.add_argument("--temperature", type=float, action="append", default=[], help="temperatures to score at")
    ap.add_argument("--warm-start", action="store_true", help="the warm start's own examples instead of the samples")
    ap.add_argument("--split", type=Path, default=Path("data/splits/split.json"), help="with --warm-start")
    args = ap.parse_args()
    if args.warm_start:
        if not args.params:
            raise SystemExit("--warm-start needs the run's --params")
        w = warm_start_figures(args.params, args.project_dir, args.split)
        print(f"warm start: {w['examples']} examples, {w['tokens']:.0f} answer tokens each, entropy {w['entropy']:.4f} "
              f"nats a token (T 1), {w['p<0.9']:.1f} answer tokens below p 0.9 an example")
        return
    steps = step_dirs(args.run_dir)
    if args.steps:
        steps = [s for s in steps if step_index(s) in set(args.steps)]
    if not steps:
        raise SystemExit(f"no step folders under {args.run_dir / 'steps'}")
    policy = load_policy(args.params, args.project_dir, args.checkpoint) if args.params and args.temperature else None
    print("step  answers  tokens  forks p<0.9  forks p<0.5  nll (as sampled)")
    for step_dir in steps:
        samples = read_samples(step_dir)
        f = fork_figures([s["old_logprobs"] for s in samples])
        print(f"{step_index(step_dir) + 1:4d}  {len(samples):7d}  {f['tokens']:6.0f}  {f['p<0.9']:11.1f}  "
              f"{f['p<0.5']:11.1f}  {f['nll']:6.2f}")
        if policy is not None:
            chosen = samples[:args.limit] if args.limit else samples
            recorded = fork_figures([s["old_logprobs"] for s in chosen])
            print(f"      {len(chosen)} answers scored again; as recorded: forks {recorded['p<0.9']:.1f} / "
                  f"{recorded['p<0.5']:.1f}, nll {recorded['nll']:.2f}")
            for t, lps in rescore(chosen, *policy, args.temperature).items():
                g = fork_figures(lps)
                print(f"      T={t:<4}  forks {g['p<0.9']:.1f} / {g['p<0.5']:.1f}, nll {g['nll']:.2f}")


if __name__ == "__main__":
    main()
