"""One training step over N processes (one per GPU): per phase seconds, per-GPU peak memory, tokens/s, GPU busy share.

    python3 -m torch.distributed.run --standalone --nproc_per_node N scripts/gpu_train_multi.py --preset 0.5b --zero 3
    python3 scripts/gpu_train_multi.py --report results.jsonl table.md        # the markdown table of every run
    bash scripts/gpu_train_multi.sh N                                          # both presets, on 1 GPU and on N

Each process builds the same model in-process (``kevin.policy.builders``: rank 0 trains the tokenizer and saves it,
then every process seeds and initialises the preset's random Qwen2 on its own GPU), takes a DeepSpeed ZeRO-3
(``--zero 3``) or replicated (``--zero 0``) trainer, a policy that samples from the trainer's model, and an
evaluator on its own GPU, and runs ``kevin.training.dp_step.DistributedStep`` once: rank 0 draws the tasks, every
process rolls out its share of each task's trajectories, the verdicts are gathered per turn, then the update and a
checkpoint. A random model writes no kernel, so half of each process's trajectories (of every task) replay the
task's bundled reference solution (``ReferenceReplay``) and the others sample from the model.

Rank 0 appends one JSON line per run to ``--results``: the settings and, per process, its seconds per phase, peak
GPU memory, generated tokens and GPU busy share (NVML utilisation sampled every 50 ms, over the step and per phase).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import threading
import time
from pathlib import Path
from typing import Any, Self

REPO = Path(__file__).resolve().parents[1]


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--report", nargs=2, metavar=("RESULTS_JSONL", "TABLE_MD"),
                    help="write the markdown table of the runs in RESULTS_JSONL and exit")
    ap.add_argument("--preset", choices=["0.5b", "1.5b", "tiny"], default="0.5b")
    ap.add_argument("--zero", type=int, choices=[0, 3], default=3, help="3: DeepSpeed ZeRO-3; 0: replicated")
    ap.add_argument("--backend", choices=["cuda", "cpu"], default="cuda", help="evaluator backend and train device")
    ap.add_argument("--tasks", type=int, default=2, help="tasks in the step (the paper: 8)")
    ap.add_argument("--trajectories", type=int, default=8, help="trajectories per task (the paper: 16)")
    ap.add_argument("--turns", type=int, default=2, help="turns per trajectory (the paper: 4)")
    ap.add_argument("--max-response-tokens", type=int, default=256, help="sampled response length limit")
    ap.add_argument("--micro-batch", type=int, default=4, help="sequences per forward/backward pass")
    ap.add_argument("--vocab-size", type=int, default=16384)
    ap.add_argument("--work", default="/tmp/gpu_train_multi", help="tokenizer and checkpoints")
    ap.add_argument("--results", default="gpu_train_multi.jsonl", help="rank 0 appends the run's figures here")
    return ap.parse_args(argv)


class BusySampler:
    """NVML's utilisation of one GPU (the share of time a kernel ran), sampled every ``period`` seconds."""

    def __init__(self, index: int, period: float = 0.05, enabled: bool = True):
        self.index, self.period, self.enabled = index, period, enabled
        self.samples: list[tuple[float, int]] = []
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def __enter__(self) -> Self:
        if not self.enabled:
            return self
        try:
            import pynvml
        except ImportError as exc:  # nvidia-ml-py missing: no busy share, the rest of the figures still come
            print(f"no GPU busy share: {exc}", file=sys.stderr)
            return self
        try:
            pynvml.nvmlInit()
        except pynvml.NVMLError as exc:
            print(f"no GPU busy share: {exc}", file=sys.stderr)
            return self
        handle = pynvml.nvmlDeviceGetHandleByIndex(self.index)

        def loop() -> None:
            while not self._stop.is_set():
                util = pynvml.nvmlDeviceGetUtilizationRates(handle).gpu
                self.samples.append((time.perf_counter(), int(util)))
                self._stop.wait(self.period)

        self._thread = threading.Thread(target=loop, daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()

    def share(self, start: float, end: float) -> float | None:
        """Mean utilisation (0..1) of the samples taken in [start, end]; None without samples."""
        inside = [u for t, u in self.samples if start <= t <= end]
        return sum(inside) / len(inside) / 100.0 if inside else None


def busy_by_phase(sampler: BusySampler, intervals: list[tuple[str, float, float]]) -> dict[str, float]:
    """Busy share per phase (turns merged, weighted by their length) and over the whole step."""
    out: dict[str, float] = {}
    weights: dict[str, float] = {}
    for key, start, end in intervals:
        share = sampler.share(start, end)
        if share is None:
            continue
        phase = key.split("/")[0]
        out[phase] = out.get(phase, 0.0) + share * (end - start)
        weights[phase] = weights.get(phase, 0.0) + (end - start)
    result = {k: out[k] / weights[k] for k in out if weights[k] > 0}
    if intervals:
        step = sampler.share(min(i[1] for i in intervals), max(i[2] for i in intervals))
        if step is not None:
            result["step"] = step
    return result


def build(args: argparse.Namespace, rank: int, device: str) -> tuple[Any, Any, int, float]:
    """(trainer, tokenizer, parameters, seconds): the same random model on every process."""
    import torch
    from transformers import AutoTokenizer

    from kevin.distributed import barrier
    from kevin.policy.builders import build_model, build_tokenizer, model_config
    from kevin.rollout.replay import longest_response_tokens, reference_responses, tokenizer_corpus
    from kevin.tasks import load_bundled_suite
    from kevin.training.config import TrainConfig
    from kevin.training.loss import LossConfig
    from kevin.training.rng import seed_everything
    from kevin.training.trainer import GRPOTrainer

    start = time.perf_counter()
    folder = Path(args.work) / f"tokenizer_{args.vocab_size}"
    if rank == 0 and not (folder / "tokenizer.json").is_file():
        suite = load_bundled_suite()
        tok = build_tokenizer(tokenizer_corpus(suite, "cuda") + tokenizer_corpus(suite, "cpu"), args.vocab_size)
        tok.save_pretrained(folder)
    barrier()
    tok = AutoTokenizer.from_pretrained(folder)
    seed_everything(0)  # the same initial weights on every process (and for every process count)
    model = build_model(model_config(args.preset, len(tok), tok), device)
    model.generation_config.do_sample = True
    longest = longest_response_tokens(tok, reference_responses(load_bundled_suite(), args.backend))
    config = TrainConfig(device=device, zero_stage=args.zero, grad_steps=1, micro_batch_size=args.micro_batch,
                         warmup_ratio=0.0, max_response_tokens=max(longest, args.max_response_tokens),
                         loss=LossConfig(max_completion_length=args.max_response_tokens))
    params = sum(p.numel() for p in model.parameters())  # before ZeRO-3 partitions them (numel 0 here after)
    trainer = GRPOTrainer(model, config, tokenizer=tok)
    if device == "cuda":
        torch.cuda.synchronize()
    return trainer, tok, params, time.perf_counter() - start


def draw_tasks(args: argparse.Namespace) -> list[Any]:
    """Rank 0's draw: ``--tasks`` tasks of the bundled suite with a reference for the backend, balanced by level."""
    from kevin.tasks import bundled_solution_path, load_bundled_suite
    from kevin.tasks.sampler import TaskSampler

    suite = {t.task_id: t for t in load_bundled_suite() if bundled_solution_path(t, args.backend).is_file()}
    by_level: dict[int, list[str]] = {}
    for task in suite.values():
        by_level.setdefault(task.level, []).append(task.task_id)
    return [suite[i] for i in TaskSampler(by_level, args.tasks, seed=0).next_batch()]


def run(args: argparse.Namespace) -> int:
    import torch

    from kevin.distributed import init_from_env
    from kevin.evaluation import EvalConfig, Evaluator
    from kevin.policy.config import SamplingConfig
    from kevin.policy.hf import HFPolicy
    from kevin.rewards import RewardConfig
    from kevin.rollout.config import RolloutConfig
    from kevin.rollout.replay import ReferenceReplay
    from kevin.tasks import load_bundled_suite
    from kevin.training.dp_step import DistributedStep, all_gather_objects

    rank, size = init_from_env()
    local = int(os.environ.get("LOCAL_RANK", "0"))
    device = "cuda" if args.backend == "cuda" else "cpu"
    if device == "cuda":
        torch.cuda.reset_peak_memory_stats()
    trainer, tok, params, build_s = build(args, rank, device)
    built_gb = torch.cuda.max_memory_allocated() / 2**30 if device == "cuda" else 0.0
    policy = HFPolicy(trainer.model, tok, SamplingConfig(temperature=trainer.config.temperature,
                                                         max_new_tokens=args.max_response_tokens, seed=rank))
    # Trajectories 0 .. m/2 - 1 of every task replay (rounded down). The shares are strided, so each process replays
    # about half of its own and samples the rest: a ZeRO-3 policy needs every process in each generation pass.
    replay = ReferenceReplay(policy, load_bundled_suite(), trajectories=args.trajectories,
                             replayed=args.trajectories // 2, backend=args.backend)
    evaluator = Evaluator(EvalConfig(backend=args.backend, gpus=[local] if device == "cuda" else []))
    rollout = RolloutConfig(trajectories=args.trajectories, turns=args.turns, backend=args.backend,
                            max_prompt_tokens=8192)
    step = DistributedStep(trainer, replay, evaluator.evaluate_many, rollout, RewardConfig(), tokenizer=tok)
    try:
        with BusySampler(local, enabled=device == "cuda") as busy:
            result = step.run(draw_tasks(args) if rank == 0 else None,
                              checkpoint_dir=Path(args.work) / f"ckpt_{args.preset}_z{args.zero}_n{size}")
    finally:
        evaluator.close()
    update = result.update_metrics[0] if result.update_metrics else {}
    mine_figures = {
        "rank": rank, "seconds": {k: round(v, 3) for k, v in result.seconds.items()},
        "peak_gb": round(torch.cuda.max_memory_allocated() / 2**30, 2) if device == "cuda" else 0.0,
        "peak_reserved_gb": round(torch.cuda.max_memory_reserved() / 2**30, 2) if device == "cuda" else 0.0,
        "after_build_gb": round(built_gb, 2), "busy": {k: round(v, 3) for k, v in busy_by_phase(busy, result.intervals).items()},
        **{k: v for k, v in result.local.items()},
    }
    everyone = all_gather_objects(mine_figures)
    if rank == 0:
        verdicts: dict[str, int] = {}
        for traj in result.trajectories:
            for turn in traj.turns:
                verdicts[turn.result.status.value] = verdicts.get(turn.result.status.value, 0) + 1
        record = {"preset": args.preset, "zero": args.zero, "gpus": size, "parameters": params,
                  "device": torch.cuda.get_device_name() if device == "cuda" else "cpu", "torch": torch.__version__,
                  "tasks": result.tasks, "trajectories": args.trajectories, "turns": args.turns,
                  "max_response_tokens": args.max_response_tokens, "samples": len(result.samples),
                  "build_s": round(build_s, 1), "update_tokens_per_s": round(update.get("tokens_per_s", 0.0), 1),
                  "update_tokens": update.get("tokens", 0.0), "verdicts": verdicts,
                  "nonzero_advantages": sum(s.advantage != 0.0 for s in result.samples), "ranks": everyone}
        with open(args.results, "a", encoding="utf-8") as fh:
            fh.write(json.dumps(record) + "\n")
        print(json.dumps(record, indent=1))
    import torch.distributed as dist

    if dist.is_initialized():
        dist.destroy_process_group()
    return 0


PHASES = ("generate", "evaluate", "gather", "aggregate", "update", "checkpoint", "step")


def phase_seconds(record: dict[str, Any], phase: str) -> float:
    """A phase's seconds in a run: the slowest process's (the others wait for it at the next collective)."""
    return max(sum(v for k, v in r["seconds"].items() if k.split("/")[0] == phase) for r in record["ranks"])


def report(records: list[dict[str, Any]]) -> str:
    """Markdown: one row per run, then per preset and ZeRO setting how each phase scales from 1 GPU to N."""
    lines = ["| preset | ZeRO | GPUs | " + " | ".join(f"{p} s" for p in PHASES)
             + " | gen tok/s | update tok/s | peak GB per GPU | busy per GPU (step) |",
             "|" + "---|" * (len(PHASES) + 7)]
    for r in records:
        gen_s = phase_seconds(r, "generate")
        gen_tokens = sum(x.get("generated_tokens", 0.0) for x in r["ranks"])
        busy = " / ".join(f"{x['busy'].get('step', 0.0):.0%}" for x in r["ranks"])
        peak = " / ".join(f"{x['peak_gb']:.1f}" for x in r["ranks"])
        lines.append(f"| {r['preset']} | {r['zero']} | {r['gpus']} | "
                     + " | ".join(f"{phase_seconds(r, p):.1f}" for p in PHASES)
                     + f" | {gen_tokens / gen_s if gen_s else 0:.0f} | {r['update_tokens_per_s']:.0f} | {peak} | {busy} |")
    by_setting: dict[tuple[str, int], dict[int, dict[str, Any]]] = {}
    for r in records:
        by_setting.setdefault((r["preset"], r["zero"]), {})[r["gpus"]] = r
    scaling = []
    for (preset, zero), runs in by_setting.items():
        if 1 not in runs:
            continue
        for n in sorted(k for k in runs if k > 1):
            ratios = []
            for p in PHASES:
                one, many = phase_seconds(runs[1], p), phase_seconds(runs[n], p)
                ratios.append(f"{one / many:.2f}x" if many else "-")
            scaling.append(f"| {preset} | {zero} | 1 -> {n} | " + " | ".join(ratios) + " |")
    if scaling:
        lines += ["", "Speed-up of each phase from 1 GPU to N (seconds on 1 / seconds on N):", "",
                  "| preset | ZeRO | GPUs | " + " | ".join(PHASES) + " |", "|" + "---|" * (len(PHASES) + 3), *scaling]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    if str(REPO) not in sys.path:
        sys.path.insert(0, str(REPO))
    args = parse_args(argv)
    if args.report:
        src, dst = args.report
        records = [json.loads(line) for line in Path(src).read_text().splitlines() if line.strip()]
        Path(dst).write_text(report(records))
        print(Path(dst).read_text())
        return 0
    return run(args)


if __name__ == "__main__":
    sys.exit(main())
