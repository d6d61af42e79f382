"""Cost of the sandbox layers per candidate: the same warm-cache evaluations with isolation on and off.

    python benchmarks/bench_sandbox.py --backend cpu --repeats 6 --out docs/bench_sandbox_cpu.md

Compilation is excluded (the compile cache is warmed first), so what is left is the per-candidate
process start, isolation setup, correctness, profiling and timing: the part the sandbox could slow.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from benchmarks.common import print_and_save, scratch_dir  # noqa: E402
from kevin.evaluation import Candidate, EvalConfig, Evaluator  # noqa: E402
from kevin.evaluation.isolation import SandboxConfig  # noqa: E402
from kevin.evaluation.kernel_filters import landlock_abi  # noqa: E402
from kevin.tasks import bundled_solutions_dir, load_bundled_suite  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--backend", default="cpu")
    ap.add_argument("--repeats", type=int, default=6)
    ap.add_argument("--task", default="01_relu")
    ap.add_argument("--out", default="")
    args = ap.parse_args()
    task = [t for t in load_bundled_suite((1,)) if t.name == args.task][0]
    source = (bundled_solutions_dir(args.backend) / "level1" / f"{task.name}.py").read_text()
    cache = scratch_dir("kevin-sbx-")
    modes = {"on": SandboxConfig(network="on", filesystem="on", seccomp="on", cgroup="on"),
             "off": SandboxConfig(network="off", filesystem="off", seccomp="off", cgroup="off")}
    walls: dict[str, list[float]] = {}
    for mode in ("on", "off", "on", "off"):  # interleaved, so drift affects both alike
        ev = Evaluator(EvalConfig(backend=args.backend, cache_dir=cache, sandbox=modes[mode]))
        ev.evaluate(task, source)  # warm: compile cache and baseline
        for _ in range(args.repeats // 2):
            t = time.perf_counter()
            r = ev.evaluate(task, Candidate(task.task_id, source))
            walls.setdefault(mode, []).append(time.perf_counter() - t)
            assert r.correct, r.error
    on, off = statistics.median(walls["on"]), statistics.median(walls["off"])
    text = "\n".join([
        f"# Sandbox cost ({time.strftime('%Y-%m-%d %H:%M')} UTC, backend {args.backend}, task {task.task_id})",
        "",
        f"command: `python benchmarks/bench_sandbox.py --backend {args.backend} --repeats {args.repeats}`",
        f"Landlock ABI {landlock_abi()}; warm compile cache; wall seconds per candidate evaluation (median of {len(walls['on'])})",
        "",
        "| sandbox | median s | all |",
        "| --- | --- | --- |",
        f"| on (netns, Landlock, seccomp, cgroup, rlimits) | {on:.2f} | {[round(w, 2) for w in walls['on']]} |",
        f"| off | {off:.2f} | {[round(w, 2) for w in walls['off']]} |",
        f"| ratio on/off | {on / off:.3f} | |",
        "",
    ])
    print_and_save(text, args.out)


if __name__ == "__main__":
    main()
