"""End-to-end evaluation throughput: KernelBench's own harness against ours, same candidates, one run.

    python benchmarks/bench_vs_kernelbench.py --kernelbench external/KernelBench --n 32 --out docs/bench_vs_kernelbench.md

KernelBench is run the way its `scripts/eval_from_generations.py` runs it: a parallel CPU pre-build
of every candidate (`build_compile_cache`, one spawned process per CPU worker), then one spawned
process per candidate on the GPU calling `eval_kernel_against_ref` (5 correctness trials, 100
timed trials, 180 s timeout). Ours is `Evaluator.evaluate_many` with the same trial counts. The
mix is the bundled tasks' CUDA reference solutions plus four that fail to compile. Printed side by
side: wall time, candidates per minute, the ratio, compile seconds per candidate, and whether the
two harnesses agree on every verdict (compiled / correct).

The KernelBench checkout comes from the search tool's `fetch` into the git-ignored `external/`
folder and is never committed. Its package `__init__` pulls LLM clients (openai, litellm); only its
evaluation modules are loaded here, with `kernelbench.utils` replaced by the two functions
`eval.py` uses. It needs pydantic (carry wheels to the device machine, see its README).
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import statistics
import sys
import time
import types
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
from benchmarks.common import print_and_save, scratch_dir  # noqa: E402


def load_kernelbench(root: str) -> types.ModuleType:
    """``kernelbench.eval`` from a checkout, without the package's LLM-client imports."""
    import importlib

    src = Path(root).resolve() / "src" / "kernelbench"
    if not (src / "eval.py").exists():
        raise SystemExit(f"{root}: not a KernelBench checkout (no src/kernelbench/eval.py)")
    package = types.ModuleType("kernelbench")
    package.__path__ = [str(src)]
    sys.modules["kernelbench"] = package
    utils = types.ModuleType("kernelbench.utils")
    utils.get_gpu_vendor = lambda device=None: "nvidia"
    utils.set_gpu_arch = lambda arch_list: os.environ.__setitem__("TORCH_CUDA_ARCH_LIST", ";".join(arch_list))
    sys.modules["kernelbench.utils"] = utils
    return importlib.import_module("kernelbench.eval")


def _kb_build(args: tuple[str, str, str]) -> tuple[bool, float]:
    root, source, build_dir = args
    kb = load_kernelbench(root)
    start = time.perf_counter()
    ok, _, _ = kb.build_compile_cache(source, verbose=False, build_dir=build_dir)
    return bool(ok), time.perf_counter() - start


def _kb_eval(root: str, ref_src: str, source: str, build_dir: str, queue) -> None:
    import torch

    kb = load_kernelbench(root)
    result = kb.eval_kernel_against_ref(
        original_model_src=ref_src, custom_model_src=source, seed_num=42, num_correct_trials=5, num_perf_trials=100,
        measure_performance=True, build_dir=build_dir, device=torch.device("cuda:0"), backend="cuda", precision=torch.float32,
    )
    queue.put(None if result is None else {"compiled": bool(result.compiled), "correct": bool(result.correctness)})


def run_kernelbench(root: str, items: list, workers: int, timeout: float) -> tuple[list[dict], float, list[float]]:
    ctx = mp.get_context("spawn")
    build_root = scratch_dir("kb-build-")
    dirs = [os.path.join(build_root, str(i)) for i in range(len(items))]
    start = time.perf_counter()
    with ctx.Pool(workers) as pool:
        builds = pool.map(_kb_build, [(root, cand.source, d) for (task, cand), d in zip(items, dirs)])
    verdicts = []
    for (task, cand), d in zip(items, dirs):
        queue = ctx.Queue()
        proc = ctx.Process(target=_kb_eval, args=(root, task.render(), cand.source, d, queue))
        proc.start()
        proc.join(timeout)
        if proc.is_alive():
            proc.kill()
            verdicts.append({"compiled": True, "correct": False, "timeout": True})
            continue
        verdicts.append(queue.get() if not queue.empty() else {"compiled": False, "correct": False})
    return verdicts, time.perf_counter() - start, [s for ok, s in builds]


def main() -> None:
    from benchmarks.bench_eval import mix
    from kevin.evaluation import EvalConfig, Evaluator, Status

    ap = argparse.ArgumentParser()
    ap.add_argument("--kernelbench", required=True, help="path of a KernelBench checkout (git-ignored external/ folder)")
    ap.add_argument("--n", type=int, default=32)
    ap.add_argument("--workers", type=int, default=0, help="CPU build workers for both harnesses (0: cores)")
    ap.add_argument("--out", default="")
    args = ap.parse_args()
    workers = args.workers or (os.cpu_count() or 2)
    items = mix("cuda", args.n)

    kb_verdicts, kb_wall, kb_compile = run_kernelbench(args.kernelbench, items, workers, 180.0)

    ev = Evaluator(EvalConfig(backend="cuda", cache_dir=scratch_dir("kevin-vs-kb-")))
    start = time.perf_counter()
    ours = ev.evaluate_many(items, show_progress=True)
    our_wall = time.perf_counter() - start

    agree = 0
    rows = []
    for (task, cand), kb, r in zip(items, kb_verdicts, ours):
        same = kb["correct"] == (r.status is Status.CORRECT) and kb["compiled"] == r.compiled
        agree += same
        rows.append(f"| {cand.candidate_id} | {kb} | {r.status.value} | {'yes' if same else 'NO'} |")
    our_compile = [r.times.compile for r in ours if r.times.compile > 0]
    n = len(items)
    text = "\n".join([
        f"# KernelBench harness vs ours ({time.strftime('%Y-%m-%d %H:%M')} UTC)",
        "",
        f"command: `python benchmarks/bench_vs_kernelbench.py --kernelbench {args.kernelbench} --n {args.n}`",
        f"hardware: {ev.hardware}; CPU workers {workers}; {n} candidates; 5 correctness + 100 timed trials each",
        "",
        "| figure | KernelBench | ours |",
        "| --- | --- | --- |",
        f"| wall s | {kb_wall:.1f} | {our_wall:.1f} |",
        f"| candidates per minute | {n / kb_wall * 60:.2f} | {n / our_wall * 60:.2f} |",
        f"| throughput ratio ours/KernelBench | | {kb_wall / our_wall:.2f}x |",
        f"| compile s per candidate (median) | {statistics.median(kb_compile) if kb_compile else 0:.1f} | {statistics.median(our_compile) if our_compile else 0:.1f} |",
        f"| verdicts that agree | {agree}/{n} | |",
        "",
        "| candidate | KernelBench | ours | agree |",
        "| --- | --- | --- | --- |",
        *rows,
        "",
    ])
    print_and_save(text, args.out)


if __name__ == "__main__":
    main()
