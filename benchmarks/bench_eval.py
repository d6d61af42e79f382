"""Evaluation throughput on the device machine: our batch evaluator against stock load_inline.

    python benchmarks/bench_eval.py --backend cuda --n 32 --stock 3 --out docs/bench_eval_latest.md
    python benchmarks/bench_eval.py --backend cuda --n 32 --compare-dir .baseline/d0218c5   # an older checkout too

With ``--compare-dir`` the same benchmark of another checkout of this repository (e.g. the evaluator before
the judge moved out of the candidate's process) runs first, in its own process on the same candidates, and
its candidates per minute are printed beside ours.
Prints, for a fixed mix of candidates (bundled reference solutions alternating level 1 and 2, plus
four that fail to compile): compile seconds per candidate (median, p90) from a cold cache, end-to-end
candidates per minute, GPU busy share (union of run phases over wall time), and the same sources
compiled serially by stock ``load_inline`` in fresh processes (a subset, --stock) as the ratio baseline.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from benchmarks.common import print_and_save, scratch_dir  # noqa: E402
from kevin.evaluation import Candidate, EvalConfig, Evaluator  # noqa: E402
from kevin.evaluation.candidates import reference_candidates  # noqa: E402
from kevin.evaluation.report import summarise  # noqa: E402
from kevin.tasks import load_bundled_suite  # noqa: E402

STOCK_SNIPPET = r"""
import sys, time, tempfile, types
from torch.utils import cpp_extension
real = cpp_extension.load_inline
def stock(*a, **k):
    k["build_directory"] = tempfile.mkdtemp(prefix="stock-")
    k["verbose"] = False
    return real(*a, **k)
cpp_extension.load_inline = stock
src = open(sys.argv[1]).read()
t = time.perf_counter()
exec(compile(src, "<solution>", "exec"), types.ModuleType("m").__dict__)
print(time.perf_counter() - t)
"""


def mix(backend: str, n: int) -> list:
    tasks = load_bundled_suite()
    l1 = [t for t in tasks if t.level == 1]
    l2 = [t for t in tasks if t.level == 2]
    ordered = [t for pair in zip(l1, l2) for t in pair][:n]
    items = reference_candidates(ordered, backend)
    broken = []
    for task, cand in items[:4]:
        src = cand.source.replace("return ", "return undeclared_symbol_xyz + ", 1) if backend == "cpu" else cand.source.replace("__global__ void", "__global__ void broken(", 1)
        broken.append((task, Candidate(task.task_id, src, candidate_id=f"broken:{task.task_id}")))
    return items + broken


def busy_share(intervals: list[tuple[str, float, float]], wall: float) -> float:
    """Share of wall time during which at least one device ran a candidate (mean over devices)."""
    by_device: dict[str, list[tuple[float, float]]] = {}
    for dev, a, b in intervals:
        by_device.setdefault(dev, []).append((a, b))
    shares = []
    for spans in by_device.values():
        spans.sort()
        total, cur_a, cur_b = 0.0, None, None
        for a, b in spans:
            if cur_b is None or a > cur_b:
                if cur_b is not None:
                    total += cur_b - cur_a
                cur_a, cur_b = a, b
            else:
                cur_b = max(cur_b, b)
        if cur_b is not None:
            total += cur_b - cur_a
        shares.append(total / wall if wall else 0.0)
    return statistics.fmean(shares) if shares else 0.0


def idle_breakdown(runs: list[tuple[str, float, float]], compiles: list[tuple[float, float]], start: float,
                   end: float) -> dict[str, float]:
    """Where the GPU (the first device) waited, in seconds: for the first compile, later while compiles were
    still going on, and after the last compile ended (then only the run workers' own gaps are left)."""
    first = runs[0][0] if runs else None
    spans = sorted((a, b) for dev, a, b in runs if dev == first)
    last_compile = max((b for _, b in compiles), default=start)
    out = {"before the first run": (spans[0][0] - start) if spans else end - start,
           "while compiles went on": 0.0, "after the last compile": 0.0}
    cursor = spans[0][1] if spans else end
    for a, b in [*spans[1:], (end, end)]:
        if a > cursor:  # a gap from cursor to a, split at the end of the last compile
            out["while compiles went on"] += max(0.0, min(a, last_compile) - cursor)
            out["after the last compile"] += max(0.0, a - max(cursor, last_compile))
        cursor = max(cursor, b)
    return out


def stock_compile_seconds(items: list, k: int) -> list[float]:
    out = []
    for task, cand in items[:k]:
        with tempfile.NamedTemporaryFile("w", suffix=".py", delete=False) as f:
            f.write(cand.source)
        env = {**os.environ, "CUDA_VISIBLE_DEVICES": ""}
        proc = subprocess.run([sys.executable, "-c", STOCK_SNIPPET, f.name], capture_output=True, text=True, env=env, timeout=900)
        if proc.returncode == 0:
            out.append(float(proc.stdout.strip().splitlines()[-1]))
        else:
            print(f"stock compile of {task.task_id} failed: {proc.stderr[-500:]}", file=sys.stderr)
    return out


def ours_serial_compile_seconds(backend: str, items: list, k: int, headers_from: str) -> list[float]:
    """Our compile path on the first ``k`` candidates, one at a time, each into an empty build cache (the
    precompiled headers, made once per machine, are shared with the batch run). One at a time, a compile has
    the machine's cores as stock's ninja has them (``compile_jobs`` 0: a lone compile runs its host unit and
    nvcc's two chains at once)."""
    out = []
    for task, cand in items[:k]:
        cache = scratch_dir("kevin-bench-serial-")
        if headers_from:
            os.symlink(os.path.join(headers_from, "headers"), os.path.join(cache, "headers"))
        ev = Evaluator(EvalConfig(backend=backend, cache_dir=cache, compile_workers=1))
        compiled = ev.compile(cand)
        if compiled.failure is None:
            out.append(compiled.compile_s)
        else:
            print(f"our serial compile of {task.task_id} failed: {compiled.failure}", file=sys.stderr)
        ev.close()
    return out


def other_checkout_per_minute(folder: str, backend: str, n: int) -> tuple[float, str]:
    """Candidates per minute of the same benchmark in another checkout (its own process and cold cache)."""
    folder = os.path.abspath(folder)  # the other benchmark runs in that folder: a relative path would count twice
    cmd = [sys.executable, os.path.join(folder, "benchmarks", "bench_eval.py"), "--backend", backend, "--n", str(n),
           "--stock", "0", "--cache", scratch_dir("kevin-bench-other-")]
    env = {**os.environ, "PYTHONPATH": folder}
    proc = subprocess.run(cmd, capture_output=True, text=True, cwd=folder, env=env, timeout=3000)
    for line in proc.stdout.splitlines():
        if line.startswith("| candidates per minute, ours |"):
            return float(line.split("|")[2]), ""
    return 0.0, (proc.stdout + proc.stderr)[-1500:]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--backend", default="cuda")
    ap.add_argument("--n", type=int, default=32)
    ap.add_argument("--stock", type=int, default=3, help="candidates compiled serially with stock load_inline")
    ap.add_argument("--workers", type=int, default=0)
    ap.add_argument("--out", default="")
    ap.add_argument("--cache", default="", help="compile/baseline cache (default: a fresh temporary folder)")
    ap.add_argument("--stock-only", action="store_true", help="only compile --stock candidates with stock load_inline")
    ap.add_argument("--compare-dir", default="", help="another checkout of this repository to benchmark first, for the ratio")
    args = ap.parse_args()
    other_per_min, other_error = other_checkout_per_minute(args.compare_dir, args.backend, args.n) if args.compare_dir else (0.0, "")
    items = mix(args.backend, args.n)
    if args.stock_only:
        stock = stock_compile_seconds([it for it in items if not it[1].candidate_id.startswith("broken")], args.stock)
        print(json.dumps({"stock_load_inline_compile_s": stock, "tasks": [t.task_id for t, _ in items[: len(stock)]]}))
        return
    cache = args.cache or scratch_dir("kevin-bench-cache-")
    cfg = EvalConfig(backend=args.backend, cache_dir=cache, compile_workers=args.workers)
    ev = Evaluator(cfg)
    # Baselines are cached per task x hardware, and the compile headers per machine; make both first so the
    # figures below are the steady state of training, where they are long cached.
    t = time.perf_counter()
    ev.toolchain()
    headers_s = time.perf_counter() - t
    t = time.perf_counter()
    ev.prefetch_baselines([task for task, _ in items])
    baseline_s = time.perf_counter() - t
    t, start = time.perf_counter(), time.monotonic()
    results = ev.evaluate_many(items, show_progress=True)
    wall = time.perf_counter() - t
    idle = idle_breakdown(ev.run_intervals, ev.compile_intervals, start, time.monotonic())
    s = summarise(results)
    compiled = sorted(r.times.compile for r in results if r.times.compile > 0)
    honest = [it for it in items if not it[1].candidate_id.startswith("broken")]
    stock = stock_compile_seconds(honest, args.stock)
    serial = ours_serial_compile_seconds(args.backend, honest, args.stock, cache)
    ours_med = statistics.median(compiled) if compiled else 0.0
    stock_med = statistics.median(stock) if stock else 0.0
    serial_med = statistics.median(serial) if serial else 0.0
    phases = {name: statistics.median([getattr(r.times, name) for r in results if r.times.timing > 0] or [0.0])
              for name in ("setup", "load", "correctness", "profile", "timing")}
    lines = [
        f"# Evaluation benchmark ({time.strftime('%Y-%m-%d %H:%M')} UTC, backend {args.backend})",
        "",
        f"command: `python benchmarks/bench_eval.py --backend {args.backend} --n {args.n} --stock {args.stock}`",
        f"hardware: {ev.hardware}; cores: {os.cpu_count()}; compile workers: {ev.compile_slots.workers}",
        "",
        "| figure | value |",
        "| --- | --- |",
        f"| candidates | {len(items)} ({s['status_counts']}) |",
        f"| compile headers prepared first (once per machine) | {headers_s:.1f} s |",
        f"| baselines measured first | {baseline_s:.1f} s |",
        f"| compile s per candidate, ours (median / p90) | {ours_med:.1f} / {compiled[int(0.9 * (len(compiled) - 1))] if compiled else 0:.1f} |",
        f"| compile s per candidate, stock load_inline serial (median of {len(stock)}) | {stock_med:.1f} |",
        f"| compile s per candidate, ours serial (one at a time, all cores), same candidates as stock (median of {len(serial)}) | {serial_med:.1f} |",
        f"| compile speed ratio stock/ours, both serial (median) | {stock_med / serial_med if serial_med else 0:.2f}x |",
        f"| compile speed ratio stock serial / ours in the parallel batch (median) | {stock_med / ours_med if ours_med else 0:.2f}x |",
        "| run phase medians, correct candidates (s) | " + ", ".join(f"{k} {v:.2f}" for k, v in phases.items()) + " |",
        f"| end-to-end wall | {wall:.1f} s |",
        f"| candidates per minute, ours | {len(items) / wall * 60:.1f} |",
        f"| candidates per minute, stock serial compile alone (estimate: median x n) | {60 / stock_med if stock_med else 0:.2f} |",
        f"| GPU busy share | {busy_share(ev.run_intervals, wall):.0%} |",
        "| GPU idle (s): " + ", ".join(idle) + " | " + " / ".join(f"{v:.1f}" for v in idle.values()) + " |",
        *([f"| candidates per minute, {args.compare_dir} (same candidates, own process) | {other_per_min:.1f} |",
           f"| throughput ours / {args.compare_dir} | {len(items) / wall * 60 / other_per_min if other_per_min else 0:.2f}x |"]
          if args.compare_dir else []),
        "",
        "per candidate: " + json.dumps([[r.task_id, r.status.value, round(r.times.compile, 1), round(r.speedup, 3)] for r in results]),
    ]
    if other_error:
        lines += ["", f"the other checkout's benchmark gave no figure: {other_error}"]
    text = "\n".join(lines) + "\n"
    print_and_save(text, args.out)
    ev.close()


if __name__ == "__main__":
    main()
