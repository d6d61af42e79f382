"""What the GRPO updates did to the kernels a run had already written correctly: a learning run's forgetting, measured.

A run that collapses into broken code (docs/learning.md: the fourth and fifth H200 runs) stops sampling the kernels it
once wrote. This asks why, from the run's own files and checkpoints, on the CPU: every distinct first-turn answer the
run judged correct (`steps/step_*/kernels.jsonl` joined to `samples.jsonl`) is teacher-forced through the policy of
each checkpoint (the warm start, then `checkpoints/step_N`), at the run's sampling temperature. Per task it prints
the probability that one sample is one of those known-correct answers (the sum over them of exp(log-prob)), at
every checkpoint, beside the steps whose update had the task in it (a non-zero advantage) and the ones that did not:
a probability that falls over intervals in which the task was never updated is the other tasks' updates at work
(interference), one that falls only where it was updated is its own. For the answer most likely at the first
checkpoint, the tokens whose probability fell most by the last are printed with their context: where the kernel
breaks.

    python scripts/policy_drift.py .carry/full/outputs/h200-learn-turn-groups --project-dir .carry/full \
        --params params.yaml --params configs/h200_learn.yaml --params configs/h200_learn_turn_groups.yaml
"""
from __future__ import annotations

import argparse
import json
import math
from collections import defaultdict
from pathlib import Path

from answer_forks import load_policy, read_samples, rescore
from kevin.pipeline import step_dirs, step_index


def correct_answers(run_dir: Path) -> tuple[dict[str, list[dict]], dict[str, list[int]], dict[str, list[int]]]:
    """Per task: its distinct correct first-turn samples (first seen first), the 0-based steps that drew it, and the
    steps whose update had one of its samples with a non-zero advantage."""
    answers: dict[str, list[dict]] = defaultdict(list)
    seen: set[tuple] = set()
    drawn: dict[str, list[int]] = defaultdict(list)
    updated: dict[str, list[int]] = defaultdict(list)
    for step_dir in step_dirs(run_dir):
        if not (step_dir / "samples.jsonl").is_file():
            continue
        step = step_index(step_dir)
        with open(step_dir / "kernels.jsonl") as f:
            verdicts = {(r["task_id"], r["trajectory"], r["turn"]): r["correct"] for r in map(json.loads, f)}
        for s in read_samples(step_dir):
            task = s["task_id"]
            if step not in drawn[task]:
                drawn[task].append(step)
            if s["advantage"] != 0.0 and step not in updated[task]:
                updated[task].append(step)
            key = (task, tuple(s["prompt_token_ids"]), tuple(s["completion_token_ids"]))
            if s["turn"] == 0 and verdicts.get((task, s["trajectory"], 0)) and key not in seen:
                seen.add(key)
                answers[task].append({**s, "step": step})
    return dict(answers), dict(drawn), dict(updated)


def log_sum_exp(values: list[float]) -> float:
    top = max(values)
    return top + math.log(sum(math.exp(v - top) for v in values))


def flatten(answers: dict[str, list[dict]]) -> list[dict]:
    """The answers in one list, tasks sorted, each task's answers in order: the order `by_task` undoes."""
    return [s for task in sorted(answers) for s in answers[task]]


def by_task(answers: dict[str, list[dict]], per_answer: list) -> dict[str, list]:
    """A list aligned with `flatten(answers)` split back per task."""
    out, start = {}, 0
    for task in sorted(answers):
        out[task] = per_answer[start:start + len(answers[task])]
        start += len(answers[task])
    return out


def probe_log_p(token_log_probs: dict[str, list[list[float]]]) -> dict[str, float]:
    """Per task, log P(one sample is one of its known-correct answers), from each answer's per-token log-probs."""
    return {task: log_sum_exp([sum(lp) for lp in lps]) for task, lps in token_log_probs.items()}


def split_by_update(changes: dict[str, float], updated: dict[str, list[int]], after: int, upto: int
                    ) -> tuple[list[float], list[float]]:
    """The per-task ``changes`` of the tasks an update touched at a 0-based step in (``after``, ``upto``], and of
    the others: a policy that learns moves the first more than the second."""
    inside, outside = [], []
    for task, change in changes.items():
        (inside if any(after < u <= upto for u in updated.get(task, [])) else outside).append(change)
    return inside, outside


def mean_of(changes: list[float]) -> str:
    return f"{sum(changes) / len(changes):+8.2f} ({len(changes)})" if changes else "       - (0)"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("run_dir", type=Path, help="a training run's folder (outputs/<experiment.name>) with its checkpoints")
    ap.add_argument("--params", action="append", required=True, help="the run's params files, to load its policy")
    ap.add_argument("--project-dir", default=".", help="where the run's sft.output_dir lies")
    ap.add_argument("--temperature", type=float, help="default: the run's sampling temperature")
    ap.add_argument("--tokens", type=int, default=4, help="tokens shown where the likeliest answer broke")
    ap.add_argument("--out", type=Path, help="also write the figures as JSON here")
    args = ap.parse_args()

    from kevin.config import RunConfig

    temperature = args.temperature or RunConfig.from_files(args.params).temperature
    answers, drawn, updated = correct_answers(args.run_dir)
    if not answers:
        raise SystemExit(f"no correct first-turn answer in {args.run_dir / 'steps'}")
    checkpoints: list[tuple[str, Path | None, int]] = [("warm start", None, -1)]
    for c in sorted((args.run_dir / "checkpoints").glob("step_*"), key=step_index):
        checkpoints.append((f"after step {step_index(c) + 1}", c, step_index(c)))
    flat = flatten(answers)
    print(f"{len(flat)} distinct correct first-turn answers of {len(answers)} tasks, scored at T={temperature} under "
          f"{len(checkpoints)} policies")
    scores: dict[str, list[list[float]]] = {}  # checkpoint label -> per answer, per token log-prob
    for label, path, _ in checkpoints:
        model, tokenizer = load_policy(args.params, args.project_dir, str(path) if path else None)
        scores[label] = rescore(flat, model, tokenizer, [temperature])[temperature]
        del model
    per_task = {label: by_task(answers, lps) for label, lps in scores.items()}
    log_p = {label: probe_log_p(lps) for label, lps in per_task.items()}
    labels = [c[0] for c in checkpoints]

    # The check that the policies load as they sampled: an answer's log-probs under the policy that sampled it.
    # (bf16 on the GPU against float32 here: close, not equal; the policy after step N sampled step N + 1).
    for label, _, after in checkpoints:
        own = [i for i, s in enumerate(flat) if s["step"] == after + 1]
        if own:
            diff = [abs(a - b) for i in own for a, b in zip(scores[label][i], flat[i]["old_logprobs"])]
            print(f"check, {label}: {len(own)} answers it sampled, mean |log-prob - as recorded| "
                  f"{sum(diff) / len(diff):.4f} a token")

    print("\nP(one sample is a known-correct answer) per task and policy; steps 1-based")
    print(f"{'task':34s} " + " ".join(f"{lab:>15s}" for lab in labels) + "   drawn at / updated at")
    rows = []
    for task in sorted(answers):
        per_policy = [log_p[lab][task] for lab in labels]
        rows.append({"task": task, "answers": len(answers[task]), "log_p": dict(zip(labels, per_policy)),
                     "drawn": [d + 1 for d in drawn[task]], "updated": [u + 1 for u in updated.get(task, [])]})
        print(f"{task:34s} " + " ".join(f"{math.exp(v):15.3g}" for v in per_policy)
              + f"   {rows[-1]['drawn']} / {rows[-1]['updated']}")

    # Interference: between two checkpoints, the change of log P for tasks updated in that interval and for the rest.
    print("\nmean change of log P between policies, tasks updated in the interval / not updated in it (tasks)")
    for (a, _, sa), (b, _, sb) in zip(checkpoints, checkpoints[1:]):
        inside, outside = split_by_update({t: log_p[b][t] - log_p[a][t] for t in answers}, updated, sa, sb)
        print(f"{a:>15s} -> {b:15s}  {mean_of(inside)}  /  {mean_of(outside)}")

    # Where the likeliest answer breaks: its tokens whose probability fell most from the first policy to the last.
    print(f"\nwhere each task's likeliest answer (at the {labels[0]}) lost most, {labels[0]} -> {labels[-1]}")
    for task in sorted(answers):
        first = per_task[labels[0]][task]
        best = max(range(len(first)), key=lambda i: sum(first[i]))
        before, after = first[best], per_task[labels[-1]][task][best]
        ids = answers[task][best]["completion_token_ids"]
        drops = sorted(range(len(ids)), key=lambda t: after[t] - before[t])[:args.tokens]
        shown = []
        for t in sorted(drops):
            context = tokenizer.decode(ids[max(0, t - 8):t]).replace("\n", "\\n")
            token = tokenizer.decode([ids[t]]).replace("\n", "\\n")
            shown.append(f"...{context[-40:]}[{token}] p {math.exp(before[t]):.2f}->{math.exp(after[t]):.2f}")
        print(f"{task}: token {', '.join(str(t) for t in sorted(drops))} of {len(ids)}")
        for line in shown:
            print(f"    {line}")
    if args.out:
        args.out.write_text(json.dumps({"temperature": temperature, "policies": labels, "tasks": rows}, indent=1))


if __name__ == "__main__":
    main()
