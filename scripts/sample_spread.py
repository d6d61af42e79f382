"""What a run's policy writes when sampled again, on the CPU: how many distinct answers, and how many of them build.

For each task and temperature it samples N answers to the task's first-turn prompt (as the run recorded it in a
step's samples) from the run's policy (its warm start, and an RL checkpoint's adapter on top when given), parses
them as the rollout does, and compiles each kernel's translation units for the cuda backend with nvcc (the narrow
header path, as the evaluator's first try; no GPU needed, none run). It prints one JSON line per task and
temperature, and writes every answer to --out for a look at what differs.

    python scripts/sample_spread.py outputs/h200-learn-rest --tasks level1/02_gelu,level1/25_maxpool2d \\
        --temperatures 1.0,0.7 --params params.yaml --params configs/h200_learn.yaml \\
        --params configs/h200_learn_rest.yaml --checkpoint outputs/h200-learn-rest/checkpoints/step_000014

~1 minute per task and temperature at 4 answers of up to 512 tokens on 2 cores.

It runs each answer's Python in this process to capture what it passes to load_inline, outside the evaluator's
sandbox (whose compile step also links against CUDA libraries a CPU machine lacks): use it on your own checkpoints,
not on answers you would not run yourself.
"""
from __future__ import annotations

import argparse
import hashlib
import json
import os
import tempfile
import types
from pathlib import Path


def first_turn_prompts(run_dir: Path, tasks: list[str]) -> dict[str, list[int]]:
    """Each task's first-turn prompt ids, from the newest step that drew it."""
    prompts: dict[str, list[int]] = {}
    for path in sorted(run_dir.glob("steps/step_*/samples.jsonl")):
        with open(path) as f:
            for line in f:
                sample = json.loads(line)
                if sample["turn"] == 0 and sample["task_id"] in tasks:
                    prompts[sample["task_id"]] = sample["prompt_token_ids"]
    missing = sorted(set(tasks) - set(prompts))
    if missing:
        raise SystemExit(f"no first-turn samples of {missing} under {run_dir / 'steps'}")
    return prompts


def load_inline_arguments(kernel: str) -> dict | None:
    """The keyword arguments the kernel's code passes to load_inline (its sources), or None if it does not run."""
    from torch.utils import cpp_extension

    captured: list[dict] = []
    real = cpp_extension.load_inline
    cpp_extension.load_inline = lambda *a, **k: (captured.append(k), types.SimpleNamespace())[1]
    try:
        exec(compile(kernel, "answer", "exec"), {"__name__": "answer"})
    except Exception:  # noqa: BLE001 - a policy's broken Python is a finding here, not an error
        return None
    finally:
        cpp_extension.load_inline = real
    return captured[0] if captured else None


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("run_dir", type=Path)
    ap.add_argument("--tasks", required=True, help="comma-separated task ids (levelN/NAME)")
    ap.add_argument("--temperatures", default="1.0,0.7")
    ap.add_argument("--answers", type=int, default=4)
    ap.add_argument("--max-tokens", type=int, default=512)
    ap.add_argument("--params", action="append", required=True, help="the run's params files, to load its policy")
    ap.add_argument("--project-dir", default=".", help="where the run's sft.output_dir lies")
    ap.add_argument("--checkpoint", type=Path,
                    help="an RL checkpoint (checkpoints/step_N) merged into the run's starting model")
    ap.add_argument("--out", type=Path, default=Path("outputs/sample_spread.jsonl"))
    args = ap.parse_args()
    os.environ.setdefault("TORCH_CUDA_ARCH_LIST", "9.0")

    from kevin.config import RunConfig
    from kevin.evaluation.build_sources import ExtensionRequest
    from kevin.evaluation.builder import compile_objects, prepare_headers
    from kevin.evaluation.toolchain import Toolchain
    from kevin.experiment.policies import load_checkpoint_model
    from kevin.policy.config import SamplingConfig
    from kevin.policy.hf import HFPolicy
    from kevin.rollout.parsing import parse_response

    tasks = args.tasks.split(",")
    prompts = first_turn_prompts(args.run_dir, tasks)
    model, tokenizer = load_checkpoint_model(RunConfig.from_files(args.params), args.checkpoint, args.project_dir)
    work = Path(tempfile.mkdtemp(prefix="kevin-spread-"))
    toolchain = Toolchain.detect("cuda", str(work / "headers"))
    problem = prepare_headers(toolchain)
    if problem:
        print(f"note: {problem.strip()[:200]}")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    with open(args.out, "w") as out:
        for temperature in (float(t) for t in args.temperatures.split(",")):
            for task in tasks:
                policy = HFPolicy(model, tokenizer, SamplingConfig(temperature=temperature,
                                                                   max_new_tokens=args.max_tokens, seed=1))
                answers = policy.generate_ids([prompts[task]] * args.answers)
                kernels = [p.kernel for p in (parse_response(a.text, truncated=a.truncated) for a in answers)
                           if not p.parse_error]
                built = 0
                for kernel in kernels:
                    call = load_inline_arguments(kernel)
                    if call is None:
                        continue
                    folder = work / "builds" / hashlib.sha1(kernel.encode()).hexdigest()[:12]
                    try:
                        _, errors = compile_objects(ExtensionRequest.from_call(call), toolchain, folder, lite=True)
                    except ValueError:  # the request itself is malformed (e.g. no sources)
                        continue
                    built += not errors
                for a in answers:
                    out.write(json.dumps({"temperature": temperature, "task": task, "text": a.text}) + "\n")
                print(json.dumps({"temperature": temperature, "task": task, "answers": len(answers),
                                  "distinct": len({a.text for a in answers}), "parsed": len(kernels),
                                  "distinct_kernels": len(set(kernels)), "built": built}), flush=True)


if __name__ == "__main__":
    main()
