"""Where the time of a cuda batch goes: per-phase log lines of the evaluator for a few suite references.

Run on the device machine: ``python3 scripts/gpu_diag.py --n 12`` (cold cache under $KEVIN_CACHE_DIR).
"""

from __future__ import annotations

import argparse
import logging
import os
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--n", type=int, default=12)
    args = ap.parse_args()
    logging.basicConfig(level=logging.DEBUG, format="%(relativeCreated)8.0f ms %(name)s %(message)s")
    for noisy in ("urllib3", "filelock"):
        logging.getLogger(noisy).setLevel(logging.WARNING)
    probe = "import time; t=time.time(); import torch; a=time.time(); torch.zeros(1, device='cuda'); b=time.time(); " \
            "p=torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU, torch.profiler.ProfilerActivity.CUDA]); " \
            "p.__enter__(); torch.ones(8, device='cuda').sum(); p.__exit__(None, None, None); c=time.time(); " \
            "print(f'import torch {a-t:.2f} s, cuda init {b-a:.2f} s, first profiler session {c-b:.2f} s')"
    subprocess.run([sys.executable, "-c", probe], check=False)
    from kevin.evaluation import EvalConfig, Evaluator
    from kevin.evaluation.candidates import reference_candidates
    from kevin.tasks import load_bundled_suite

    ev = Evaluator(EvalConfig(backend="cuda", cache_dir=os.environ.get("KEVIN_CACHE_DIR", "")))
    print("compile workers", ev.compile_slots.workers, "jobs each", ev.compile_slots.jobs(), flush=True)
    items = reference_candidates(load_bundled_suite(), "cuda")[: args.n]
    start = time.perf_counter()
    results = ev.evaluate_many(items)
    wall = time.perf_counter() - start
    for r in results:
        print(r.task_id, r.status.value, r.compile_path, {k: round(v, 2) for k, v in vars(r.times).items() if v}, r.error[:200])
    print(f"{len(results)} candidates in {wall:.1f} s")


if __name__ == "__main__":
    main()
