"""Why honest kernels are flagged ``timing_mismatch`` on the H200 during training: the same kernels, judged under
different neighbours.

In the H200 learning runs about 2% of the timed warm-start kernels were flagged (docs/judge.md): every timed loop
of a flagged kernel disagreed with the evaluator's clock, by about the call's own length. The switch interval (the
cpu cause) did not change that rate. This script judges our concise CUDA answers of level-1 tasks
(data/warmstart/cuda) ``--rounds`` times under each neighbour, with the training run's evaluation settings:

- ``quiet``: nothing else on the machine;
- ``gpu_process``: another process keeps the same GPU busy with matrix products (a policy generating in its own
  process, or any other tenant of the GPU);
- ``gpu_thread``: a thread of this process does the same (a policy generating in the training process, beside the
  evaluator, as `kevin train` runs it);
- ``host``: every core busy with processes at nice 0, and two Python threads spinning in this process.

It prints, per neighbour, the kernels judged, those flagged, those whose first timed loop disagreed (timed again),
those flagged in their first process and judged again in a fresh one (fresh), those scored slower than they
reported because the evaluator's clock did not vouch for the rest or its own figure of a call was longer (raised),
by how much (the median and the largest raise, as a share of the reported median: what the score's floor,
verdict.clock_ms, costs honest kernels), and the correct share. Run on the device machine from the repo root (one call, ~5 minutes with a cold compile cache):

    python3 scripts/gpu_timing_contention.py --rounds 3
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import statistics
import sys
import threading
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

NEIGHBOURS = ("quiet", "gpu_process", "gpu_thread", "host")


def _matmuls(stop, size: int = 4096) -> None:
    """Back-to-back matrix products on the GPU until ``stop`` is set (a generating policy's footprint, roughly)."""
    import torch

    a = torch.randn(size, size, device="cuda", dtype=torch.bfloat16)
    while not stop.is_set():
        for _ in range(8):
            a = torch.tanh(a @ a.T * (1.0 / size))
        torch.cuda.synchronize()


def _spin(stop) -> None:
    while not stop.is_set():
        pass


@contextmanager
def neighbour(name: str) -> Iterator[None]:
    """Runs ``name``'s extra load for the duration of the block."""
    ctx = multiprocessing.get_context("spawn")
    stop_proc, stop_thread = ctx.Event(), threading.Event()
    procs: list = []
    threads: list[threading.Thread] = []
    if name == "gpu_process":
        procs = [ctx.Process(target=_matmuls, args=(stop_proc,), daemon=True)]
    elif name == "gpu_thread":
        threads = [threading.Thread(target=_matmuls, args=(stop_thread,), daemon=True)]
    elif name == "host":
        procs = [ctx.Process(target=_spin, args=(stop_proc,), daemon=True) for _ in range(os.cpu_count() or 2)]
        threads = [threading.Thread(target=_spin, args=(stop_thread,), daemon=True) for _ in range(2)]
    for worker in (*procs, *threads):
        worker.start()
    time.sleep(3.0 if procs or threads else 0.0)  # a process's CUDA context and first products are under way
    try:
        yield
    finally:
        stop_proc.set()
        stop_thread.set()
        for worker in (*procs, *threads):
            worker.join(timeout=30)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=3, help="times each kernel is judged under each neighbour")
    ap.add_argument("--neighbours", default=",".join(NEIGHBOURS), help="comma-separated, from " + ", ".join(NEIGHBOURS))
    ap.add_argument("--backend", default="cuda", choices=("cuda", "cpu"),
                    help="cpu: our C++ answers, to try the script on a machine without a GPU (quiet and host only)")
    args = ap.parse_args()
    names = args.neighbours.split(",")
    unknown = [n for n in names if n not in NEIGHBOURS or (args.backend == "cpu" and n.startswith("gpu"))]
    if unknown:
        ap.error(f"unknown neighbour(s) for {args.backend}: {', '.join(unknown)}")
    from benchmarks.common import raise_share
    from kevin.evaluation import EvalConfig, Evaluator
    from kevin.records.evaluation import Candidate
    from kevin.tasks.loader import find_task, load_tasks

    tasks = load_tasks("bundled")
    folder = ROOT / "data" / "warmstart" / args.backend / "level1"
    items = [(find_task(tasks, f"level1/{p.stem}"), p.read_text()) for p in sorted(folder.glob("*.py"))]
    # The training run's evaluation settings (configs/h200_learn.yaml).
    config = EvalConfig(backend=args.backend, timing_trials=10, warmup_trials=2, timeout_s=60,
                        cache_dir=os.environ.get("KEVIN_CACHE_DIR", ""))
    with Evaluator(config) as ev:
        batch = [(task, Candidate(task_id=task.task_id, source=src, candidate_id=task.task_id)) for task, src in items]
        t0 = time.perf_counter()
        ev.evaluate_many(batch)  # compiles every kernel once; the rounds below judge from the compile cache
        print(f"{len(batch)} kernels compiled and judged once in {time.perf_counter() - t0:.0f} s", flush=True)
        for name in names:
            flagged, retried, fresh, raised, correct, judged, excess, shares = 0, 0, 0, 0, 0, 0, [], []
            t0 = time.perf_counter()
            with neighbour(name):
                for _ in range(args.rounds):
                    for result in ev.evaluate_many(batch):
                        judged += 1
                        correct += result.status.value == "correct"
                        retried += any("disagreed with the evaluator's clock" in w for w in result.warnings)
                        fresh += any(w.startswith("judged again in a fresh process") for w in result.warnings)
                        raised += any(w.startswith("scored at ") for w in result.warnings)
                        if result.status.value == "correct":
                            shares.append(raise_share(result.warnings))
                        if result.rule_id == "timing_mismatch":
                            flagged += 1
                            excess.append(f"{result.task_id.split('/')[1]}: {result.error[-110:]}")
            print(f"{name:12s} judged {judged:3d}  flagged {flagged:3d}  timed again {retried:3d}  fresh {fresh:3d}  "
                  f"raised {raised:3d} (median {statistics.median(shares or [0.0]):.1%}, max {max(shares or [0.0]):.1%})  "
                  f"correct {correct / max(judged, 1):.2f}  ({time.perf_counter() - t0:.0f} s)", flush=True)
            for line in excess[:6]:
                print("    ", line)


if __name__ == "__main__":
    main()
