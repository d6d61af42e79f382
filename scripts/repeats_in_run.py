"""How many of a training run's judged kernels were repeats: what judging identical candidates once saves a step.

    python scripts/repeats_in_run.py outputs/h200-learn-turn-groups

Per step (`steps/step_*/kernels.jsonl`, the verdicts, and `samples.jsonl`, the answers' token ids) it prints the
kernels judged, those that were built and so went through the run phase (on cuda one at a time on the GPU, about
3 s each on the H200), how many distinct answers those were (two answers with the same token ids are the same
source; two different ones may still be, so this counts repeats from below), and how many verdicts the run itself
reused (`reused`, from runs with `evaluation.reuse_verdicts`).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from kevin.pipeline import step_dirs, step_index


def read_jsonl(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()] if path.is_file() else []


def step_repeats(step_dir: Path) -> dict[str, int]:
    """One step's counts: kernels, built (run phase), distinct built answers, reused verdicts."""
    kernels = read_jsonl(step_dir / "kernels.jsonl")
    answers = {(s["task_id"], s["trajectory"], s["turn"]): tuple(s["completion_token_ids"])
               for s in read_jsonl(step_dir / "samples.jsonl")}
    built = [k for k in kernels if k.get("compiled")]
    distinct = {(k["task_id"], answers.get((k["task_id"], k["trajectory"], k["turn"]), k["candidate_id"])) for k in built}
    return {"kernels": len(kernels), "built": len(built), "distinct built": len(distinct),
            "reused": sum(bool(k.get("reused")) for k in kernels)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("run", type=Path, help="a training run's folder (outputs/<name>)")
    args = ap.parse_args()
    steps = step_dirs(args.run)
    if not steps:
        raise SystemExit(f"{args.run}: no steps/step_* folders")
    total = {"kernels": 0, "built": 0, "distinct built": 0, "reused": 0}
    print(f"{'step':>5} " + " ".join(f"{k:>15}" for k in total))
    for step in steps:
        row = step_repeats(step)
        total = {k: total[k] + row[k] for k in total}
        print(f"{step_index(step):>5} " + " ".join(f"{row[k]:>15}" for k in total))
    print(f"{'all':>5} " + " ".join(f"{total[k]:>15}" for k in total))
    if total["built"]:
        print(f"run phases a step needs when repeats are judged once: {total['distinct built'] / total['built']:.2f} of "
              f"those it had (at most)")


if __name__ == "__main__":
    main()
