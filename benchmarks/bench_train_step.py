"""Throughput of ONE full multi-turn GRPO training step: rollout (generate + evaluate), then the update.

    python3 benchmarks/bench_train_step.py --device cuda --backend cuda --out $OUT/train_step.md
    python3 benchmarks/bench_train_step.py --preset tiny --device cpu --backend cpu      # a CPU smoke run

Everything is built in-process, with no hub and no network, by the library:
- a byte-level BPE tokenizer trained on the repository's own texts and the rendered prompts
  (``kevin.policy.builders.build_tokenizer`` on ``kevin.rollout.replay.tokenizer_corpus``);
- a randomly initialised Qwen2-architecture model (``kevin.policy.builders``: ``--preset 0.5b``,
  Qwen2.5-0.5B's widths with more layers to make up for the smaller vocabulary, about 0.5B parameters;
  ``--preset tiny``: a few M);
- the real pieces of training: ``HFPolicy`` samples, the real ``Evaluator`` compiles and times the
  kernels (inline CUDA on ``--backend cuda``, inline C++ on ``--backend cpu``), ``train_step`` builds
  the samples and ``GRPOTrainer.update`` makes ``--grad-steps`` optimiser steps.

THE ORACLE (``kevin.rollout.replay.ReplayPolicy``). A random model never writes a parseable kernel, so every
reward and advantage would be 0. With ``--oracle-share s`` (default 0.5) the first round(s x m) trajectories
of every task replay the task's bundled reference solution every turn; the real evaluator judges those real
kernels and the trainer computes their log-probs itself. Generation figures count only the model's own
samples. ``--oracle-share 0`` is the pure model run. This script only parses arguments, times the phases and
writes the report.

Figures: seconds per phase (generation, evaluation, update, total), generated tokens/s, update tokens/s,
peak GPU memory allocated per phase (CUDA; torch's peak counter reset at each phase) and resident-memory
growth per phase, rewards per turn, verdict counts and each optimiser step's metrics; printed, and with
``--out X.md`` written to X.md and X.json.
"""

from __future__ import annotations

import argparse
import json
import logging
import math
import platform
import shlex
import shutil
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:  # run as a script from anywhere: `kevin` is the checkout's package
    sys.path.insert(0, str(REPO))

from kevin.policy.protocol import PolicyWrapper  # noqa: E402  (after the checkout is on the path)

DEFAULT_TASKS = "level1/01_relu,level2/01_linear_relu_add_bias"


log = logging.getLogger("bench_train_step")


# ------------------------------------------------------------------------------ arguments


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    from kevin.policy.builders import PRESETS

    ap.add_argument("--preset", choices=sorted(PRESETS), default="0.5b", help="model size (default 0.5b)")
    ap.add_argument("--layers", type=int, default=0, help="override the preset's layer count")
    ap.add_argument("--vocab-size", type=int, default=16384, help="tokenizer + embedding size (default 16384)")
    ap.add_argument("--device", default="cuda", help="where the model samples and trains: cuda, cuda:N or cpu")
    ap.add_argument("--backend", choices=["cuda", "cpu"], default="cuda", help="evaluator backend (kernel language)")
    ap.add_argument("--profile", default="", help="task size profile (default: cpu on the cpu backend, the task's own on cuda)")
    ap.add_argument("--tasks", default=DEFAULT_TASKS, help=f"comma-separated task ids or names (default {DEFAULT_TASKS})")
    ap.add_argument("--trajectories", "-m", type=int, default=4, help="m: trajectories per task (default 4)")
    ap.add_argument("--turns", "-n", type=int, default=2, help="n: turns per trajectory (default 2)")
    ap.add_argument("--oracle-share", type=float, default=0.5,
                    help="share of each task's trajectories that replay the reference solution (default 0.5; 0 = pure model)")
    ap.add_argument("--max-new-tokens", type=int, default=0, help="sampling limit (default: 512 for 0.5b, 32 for tiny)")
    ap.add_argument("--max-prompt-tokens", type=int, default=8192, help="prompt budget of a turn (default 8192)")
    ap.add_argument("--temperature", type=float, default=0.9, help="sampling = training temperature (default 0.9)")
    ap.add_argument("--gen-batch", type=int, default=0,
                    help="most prompts per generation batch (default 0: every prompt of a turn in one batch)")
    ap.add_argument("--stop-check-every", type=int, default=16,
                    help="tokens between the sampler's host reads of 'every response ended' (default 16)")
    ap.add_argument("--reference-decoding", action="store_true",
                    help="sample with the reference loop (growing cache, a sync per token) instead of the static path")
    ap.add_argument("--compile", action="store_true", help="torch.compile the decode step (sampling.compile)")
    ap.add_argument("--lr", type=float, default=2e-6)
    ap.add_argument("--grad-steps", type=int, default=2, help="optimiser steps on the batch (default 2)")
    ap.add_argument("--micro-batch", type=int, default=4, help="sequences per forward/backward (default 4)")
    ap.add_argument("--lora", action="store_true", help="train LoRA adapters instead of every weight")
    ap.add_argument("--lora-r", type=int, default=16)
    ap.add_argument("--gradient-checkpointing", action="store_true")
    ap.add_argument("--train-zero-advantage", action="store_true",
                    help="also run samples with advantage 0 through forward/backward (the trainer skips them by default)")
    ap.add_argument("--no-prewarm", action="store_true",
                    help="do not measure the task baselines (and build the precompiled header) before the step")
    ap.add_argument("--cache", default="", help="evaluator compile/baseline cache (default: a fresh temporary folder)")
    ap.add_argument("--workdir", default="", help="where the step writes its rollout and samples (default: temporary)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", default="", help="markdown report path; a .json of the same figures goes next to it")
    ap.add_argument("--verbose", action="store_true", help="log the rollout's turns")
    args = ap.parse_args(argv)
    _check_args(ap, args)
    return args


def _check_args(ap: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """Refuse bad values with a message that says what to do (argparse exits with status 2)."""
    import torch

    if not (args.device == "cpu" or args.device == "cuda" or args.device.startswith("cuda:")):
        ap.error(f"--device must be cpu, cuda or cuda:N, got {args.device!r}")
    if args.device.startswith("cuda") and not torch.cuda.is_available():
        ap.error(f"--device {args.device} but torch sees no CUDA GPU; on a CPU machine use "
                 "--preset tiny --device cpu --backend cpu")
    if args.backend == "cuda" and not torch.cuda.is_available():
        ap.error("--backend cuda needs a CUDA GPU to run the kernels; use --backend cpu")
    if not 0.0 <= args.oracle_share <= 1.0:
        ap.error(f"--oracle-share must be in [0, 1], got {args.oracle_share}")
    if args.gen_batch < 0:
        ap.error(f"--gen-batch must be >= 0 (0 = one batch per turn), got {args.gen_batch}")
    for name in ("trajectories", "turns", "vocab_size", "stop_check_every", "grad_steps", "micro_batch", "lora_r"):
        if getattr(args, name) < 1:
            ap.error(f"--{name.replace('_', '-')} must be a positive integer, got {getattr(args, name)}")
    if args.layers < 0 or args.max_new_tokens < 0:
        ap.error("--layers and --max-new-tokens must be >= 0 (0 = the preset's value)")
    if args.vocab_size < 512:
        ap.error(f"--vocab-size {args.vocab_size} cannot even hold the byte alphabet and special tokens; use >= 512")
    if args.temperature <= 0:
        ap.error("--temperature must be > 0 (greedy decoding is not a policy to train)")
    try:
        args.task_list = select_tasks(args.tasks)
    except KeyError as exc:
        ap.error(str(exc.args[0]))
    if args.oracle_share > 0:
        from kevin.tasks import bundled_solution_path

        missing = [t.task_id for t in args.task_list if not bundled_solution_path(t, args.backend).is_file()]
        if missing:
            ap.error(f"no bundled {args.backend} reference solution for {missing} (needed by the oracle); "
                     "pick other --tasks or use --oracle-share 0")
    if args.workdir and Path(args.workdir).is_dir() and any(Path(args.workdir).iterdir()):
        ap.error(f"--workdir {args.workdir} is not empty: train_step would resume the rollout found there instead "
                 "of generating one; give an empty or new folder")
    if args.max_new_tokens == 0:
        from kevin.policy.builders import PRESETS

        args.max_new_tokens = PRESETS[args.preset]["max_new_tokens"]


def select_tasks(spec: str) -> list[Any]:
    """Bundled tasks by id (``level1/01_relu``) or name (``01_relu``); KeyError naming the known ones."""
    from kevin.tasks import find_task, load_bundled_suite

    suite = load_bundled_suite()
    names = [s.strip() for s in spec.split(",") if s.strip()]
    if not names:
        raise KeyError("--tasks is empty; name at least one bundled task")
    chosen = []
    for name in names:
        try:
            chosen.append(find_task(suite, name))
        except KeyError:
            known = ", ".join(t.task_id for t in suite)
            raise KeyError(f"unknown task {name!r}; bundled tasks: {known}") from None
    ids = [t.task_id for t in chosen]
    if len(set(ids)) != len(ids):
        raise KeyError(f"--tasks names a task twice: {ids}")
    return chosen


# ------------------------------------------------------------------------------ timed wrappers


def _sync(device: str) -> None:
    """Wait for queued GPU work, so a wall clock read after it covers that work."""
    import torch

    if device.startswith("cuda"):
        torch.cuda.synchronize(torch.device(device))


def rss_gb() -> float:
    """This process's resident memory now, in GiB (psutil where installed, else /proc; 0 where neither is)."""
    try:
        import psutil

        return psutil.Process().memory_info().rss / 2**30
    except ImportError:
        pass
    try:
        import os

        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**30
    except (OSError, ValueError, IndexError):
        return 0.0


@dataclass
class PhaseMemory:
    """One phase's memory over its calls: peak GPU memory allocated (CUDA) and resident-memory growth."""

    memory: "PeakMemory"
    peak_gb: float = 0.0
    """Highest ``torch.cuda.max_memory_allocated`` of any call (the counter is reset at each call's start)."""
    rss_growth_gb: float = 0.0
    """Sum over calls of (RSS after - RSS before): what the phase added to the process (CPU runs)."""

    def __enter__(self) -> "PhaseMemory":
        _sync(self.memory.device)
        self.memory.reset()
        self._rss = rss_gb()
        return self

    def __exit__(self, *exc: Any) -> None:
        _sync(self.memory.device)
        self.peak_gb = max(self.peak_gb, self.memory.read())
        self.rss_growth_gb += rss_gb() - self._rss


@dataclass
class PeakMemory:
    """Peak GPU memory allocated per phase, and over the whole step (0 on the CPU).

    Each phase resets torch's peak counter to measure its own peak; the counter is folded into
    ``overall`` first, so the step's peak survives the resets.
    """

    device: str
    overall_gb: float = 0.0

    def reset(self) -> None:
        import torch

        if self.device.startswith("cuda"):
            self.read()
            torch.cuda.reset_peak_memory_stats(torch.device(self.device))

    def read(self) -> float:
        """Peak since the last reset, in GiB."""
        import torch

        if not self.device.startswith("cuda"):
            return 0.0
        gb = torch.cuda.max_memory_allocated(torch.device(self.device)) / 2**30
        self.overall_gb = max(self.overall_gb, gb)
        return gb


@dataclass
class TimedGenerate(PolicyWrapper):
    """The model's sampler, timed per call with its peak GPU memory (the replayed responses cost nothing)."""

    policy: Any
    memory: PeakMemory
    seconds: list[float] = field(default_factory=list)
    phase: PhaseMemory | None = None
    paths: list[Any] = field(default_factory=list)
    """The policy's ``last_call`` of each call that sampled (path, batches, CUDA-graph batches)."""

    def __post_init__(self) -> None:
        self.phase = PhaseMemory(self.memory)

    @property
    def peak_gb(self) -> float:
        return self.phase.peak_gb

    def __call__(self, prompts: list[Any]) -> list[Any]:
        with self.phase:
            start = time.perf_counter()
            outs = self.policy(prompts)
            _sync(self.memory.device)
            self.seconds.append(time.perf_counter() - start)
        if prompts:
            self.paths.append(self.policy.last_call)
        return outs

    def path_summary(self) -> str:
        """How the sampling calls decoded, e.g. ``static, CUDA graph in 2 of 2 batches``."""
        if not self.paths:
            return "no model samples"
        kinds = ", ".join(sorted({p.path for p in self.paths}))
        graphs, batches = sum(p.graph_batches for p in self.paths), sum(p.batches for p in self.paths)
        return f"{kinds} decoding, CUDA graph in {graphs} of {batches} batches"


@dataclass
class GenerationFigures:
    """Per generation call of the step: prompts, sampled, tokens, seconds; and the generation's memory."""

    calls: list[dict[str, float]]
    peak_gb: float
    rss_growth_gb: float = 0.0


def generation_calls(replay: Any, sampler: TimedGenerate) -> GenerationFigures:
    """The replay's per-call counts with the sampler's seconds (a call that sampled nothing took none)."""
    timings = iter(sampler.seconds)
    calls = [dict(c, seconds=next(timings) if c["sampled"] else 0.0) for c in replay.calls]
    return GenerationFigures(calls, sampler.peak_gb, sampler.phase.rss_growth_gb)


@dataclass
class TimedEvaluate:
    """The real evaluator's ``evaluate_many`` as the rollout's ``Evaluate``, timed per call."""

    evaluator: Any
    memory: PeakMemory
    calls: list[dict[str, Any]] = field(default_factory=list)
    verdicts: Counter = field(default_factory=Counter)
    phase: PhaseMemory | None = None
    """This process's memory during evaluation (candidates run in processes of their own, not counted)."""

    def __post_init__(self) -> None:
        self.phase = PhaseMemory(self.memory)

    def __call__(self, items: list[tuple[Any, Any]]) -> list[Any]:
        with self.phase:
            start = time.perf_counter()
            results = self.evaluator.evaluate_many(items)
            seconds = time.perf_counter() - start
        turns = sorted({cand.turn for _, cand in items})
        self.calls.append({"turns": turns, "candidates": len(items), "seconds": seconds})
        self.verdicts.update(r.status.value for r in results)
        return results


@dataclass
class TimedTrainer:
    """``GRPOTrainer`` for train_step, with the update timed (tokens are counted from the samples later)."""

    trainer: Any
    memory: PeakMemory
    seconds: float = 0.0
    metrics: list[dict[str, float]] = field(default_factory=list)
    phase: PhaseMemory | None = None

    def __post_init__(self) -> None:
        self.phase = PhaseMemory(self.memory)

    @property
    def peak_gb(self) -> float:
        return self.phase.peak_gb

    @property
    def config(self) -> Any:  # train_step reads the training temperature from it
        return self.trainer.config

    def update(self, samples: Sequence[Any]) -> list[dict[str, float]]:
        with self.phase:
            start = time.perf_counter()
            self.metrics = self.trainer.update(samples)
            _sync(self.memory.device)
            self.seconds = time.perf_counter() - start
        return self.metrics


# ------------------------------------------------------------------------------ the step


def build_evaluator(args: argparse.Namespace, cache: Path) -> Any:
    from kevin.evaluation import EvalConfig, Evaluator

    return Evaluator(EvalConfig(backend=args.backend, profile=args.profile, cache_dir=str(cache), seed=args.seed))


def prewarm(evaluator: Any, tasks: Sequence[Any]) -> float:
    """Measure each task's PyTorch baseline (and build the precompiled header) before the step: a fixed
    cost of a run's first step, cached afterwards, which would otherwise land in the step's evaluation."""
    start = time.perf_counter()
    evaluator.toolchain()  # the compile headers: prepared once per machine (about 30 s on the H200 box)
    for task in tasks:
        evaluator.baseline_ms(task)
    return time.perf_counter() - start


def run_benchmark(args: argparse.Namespace, scratch: Path) -> dict[str, Any]:
    """Build everything, run one train_step, and return the figures (see ``summarise``)."""
    from kevin.policy.builders import build_model, build_tokenizer, learned_tokens, model_config
    from kevin.policy.hf import HFPolicy, SamplingConfig
    from kevin.rewards import RewardConfig
    from kevin.rollout.config import RolloutConfig
    from kevin.rollout.prompts import resolved_profile
    from kevin.rollout.replay import ReplayPolicy, longest_response_tokens, reference_responses, tokenizer_corpus
    from kevin.training.config import TrainConfig
    from kevin.training.loss import LossConfig
    from kevin.training.rng import seed_everything
    from kevin.training.step import train_step
    from kevin.training.trainer import GRPOTrainer

    tasks = args.task_list
    setup: dict[str, float] = {}
    seed_everything(args.seed)  # the entry point seeds: the model's initial weights (and LoRA factors) repeat

    t = time.perf_counter()
    tokenizer = build_tokenizer(tokenizer_corpus(tasks, args.backend, args.profile), args.vocab_size)
    setup["tokenizer"] = time.perf_counter() - t
    log.info("tokenizer: %d tokens (%d learned) in %.1f s", len(tokenizer), learned_tokens(tokenizer),
             setup["tokenizer"])

    t = time.perf_counter()
    config = model_config(args.preset, len(tokenizer), tokenizer, args.layers)
    model = build_model(config, args.device)
    setup["model"] = time.perf_counter() - t
    n_params = sum(p.numel() for p in model.parameters())
    log.info("model: Qwen2 %d layers, %s parameters, built in %.1f s", config.num_hidden_layers,
             f"{n_params:,}", setup["model"])

    profile = resolved_profile(args.backend, args.profile)
    oracle_per_task = math.floor(args.oracle_share * args.trajectories + 0.5)  # half rounds up, not to even
    replayed = reference_responses(tasks, args.backend) if oracle_per_task else {}
    # The Dr-GRPO constant is the longest response of the step: the generation limit, or a longer replayed one.
    max_completion = max(args.max_new_tokens, longest_response_tokens(tokenizer, replayed))

    train_cfg = TrainConfig(
        lr=args.lr, warmup_ratio=0.0, total_steps=1, grad_steps=args.grad_steps, micro_batch_size=args.micro_batch,
        temperature=args.temperature, skip_zero_advantage=not args.train_zero_advantage,
        loss=LossConfig(max_completion_length=max_completion), lora=args.lora, lora_r=args.lora_r,
        lora_alpha=2 * args.lora_r, gradient_checkpointing=args.gradient_checkpointing, seed=args.seed,
        device=args.device,
    )
    trainer = GRPOTrainer(model, train_cfg, tokenizer=tokenizer)
    trainable = sum(p.numel() for p in trainer.params)
    memory = PeakMemory(args.device)
    sampler = TimedGenerate(HFPolicy(trainer.model, tokenizer, SamplingConfig(
        temperature=args.temperature, max_new_tokens=args.max_new_tokens, batch_size=args.gen_batch, seed=args.seed,
        stop_check_every=args.stop_check_every, static_cache=not args.reference_decoding, compile=args.compile)),
        memory)
    generate = ReplayPolicy(sampler, tasks, args.trajectories, oracle_per_task, replayed,
                            {t.task_id: t.render(profile) for t in tasks})

    cache = Path(args.cache) if args.cache else scratch / "cache"
    evaluator = build_evaluator(args, cache)
    setup["eval_prewarm"] = 0.0 if args.no_prewarm else prewarm(evaluator, tasks)
    evaluate = TimedEvaluate(evaluator, memory)
    timed_trainer = TimedTrainer(trainer, memory)

    rollout_cfg = RolloutConfig(trajectories=args.trajectories, turns=args.turns, backend=args.backend,
                                profile=args.profile, max_prompt_tokens=args.max_prompt_tokens,
                                early_stop_speedup=None)  # no early stop: the replay maps prompts by position
    workdir = Path(args.workdir) if args.workdir else scratch / "step"
    _sync(args.device)
    memory.reset()
    memory.overall_gb = 0.0  # the step's peak, not the model build's
    start = time.perf_counter()
    result = train_step(tasks, generate, evaluate, RewardConfig(), rollout_cfg, timed_trainer, out_dir=workdir,
                        tokenizer=tokenizer)
    _sync(args.device)
    total = time.perf_counter() - start
    memory.read()

    return summarise(
        args=args, tokenizer=tokenizer, config=config, n_params=n_params, trainable=trainable,
        max_completion=max_completion, oracle_per_task=oracle_per_task, profile=profile, setup=setup,
        generate=generation_calls(generate, sampler), evaluate=evaluate, trainer=timed_trainer, result=result,
        total=total, peak_gb=memory.overall_gb, device_label=device_name(args.device), hardware=evaluator.hardware,
        sampler_path=sampler.path_summary(),
    )


# ------------------------------------------------------------------------------ figures


def device_name(device: str) -> str:
    import torch

    if device.startswith("cuda"):
        return torch.cuda.get_device_name(torch.device(device))
    from kevin.evaluation.hardware import cpu_name

    return cpu_name()


def _versions() -> dict[str, str]:
    import importlib.metadata as md

    out = {"python": platform.python_version()}
    for pkg in ("torch", "transformers", "tokenizers", "peft"):
        try:
            out[pkg] = md.version(pkg)
        except md.PackageNotFoundError:
            out[pkg] = "not installed"
    return out


def _mean(xs: Sequence[float]) -> float:
    return sum(xs) / len(xs) if xs else 0.0


def reward_table(result: Any, oracle_per_task: int, turns: int) -> list[dict[str, float]]:
    """Per turn: mean kernel score (all / oracle / model trajectories), mean return, mean |advantage|."""
    rows = []
    for t in range(turns):
        turns_t = [x for traj in result.trajectories for x in traj.turns if x.turn == t]
        samples_t = [s for s in result.samples if s.turn == t]
        rows.append({
            "turn": t,
            "score_mean": _mean([x.score for x in turns_t]),
            "score_oracle": _mean([x.score for x in turns_t if x.trajectory < oracle_per_task]),
            "score_model": _mean([x.score for x in turns_t if x.trajectory >= oracle_per_task]),
            "return_mean": _mean([s.reward for s in samples_t]),
            "abs_advantage_mean": _mean([abs(s.advantage) for s in samples_t]),
        })
    return rows


def task_table(result: Any, oracle_per_task: int) -> list[dict[str, Any]]:
    """Per task: mean kernel score and speedup of the oracle and of the model trajectories."""
    rows = []
    for task_id in dict.fromkeys(traj.task_id for traj in result.trajectories):
        turns = [x for traj in result.trajectories if traj.task_id == task_id for x in traj.turns]
        oracle = [x for x in turns if x.trajectory < oracle_per_task]
        model = [x for x in turns if x.trajectory >= oracle_per_task]
        rows.append({"task": task_id, "score_oracle": _mean([x.score for x in oracle]),
                     "speedup_oracle": _mean([x.speedup for x in oracle]),
                     "score_model": _mean([x.score for x in model]),
                     "correct_model": sum(x.correct for x in model), "turns_model": len(model)})
    return rows


def summarise(*, args: argparse.Namespace, tokenizer: Any, config: Any, n_params: int, trainable: int,
              max_completion: int, oracle_per_task: int, profile: str, setup: dict[str, float],
              generate: GenerationFigures, evaluate: TimedEvaluate, trainer: TimedTrainer, result: Any,
              total: float, peak_gb: float, device_label: str, hardware: str, sampler_path: str = "") -> dict[str, Any]:
    """Every figure of the run as one JSON-able dict (the markdown report is rendered from it)."""
    from kevin.policy.builders import learned_tokens

    gen_s = sum(c["seconds"] for c in generate.calls)
    gen_tokens = int(sum(c["tokens"] for c in generate.calls))
    eval_s = sum(c["seconds"] for c in evaluate.calls)
    samples = result.samples
    grad_steps = len(trainer.metrics)
    prompt_tokens = sum(len(s.prompt_token_ids) for s in samples)
    completion_tokens = sum(len(s.completion_token_ids) for s in samples)
    # Samples with advantage 0 are skipped by the trainer's passes unless told otherwise (beta is 0 here).
    trained = [s for s in samples if s.advantage != 0.0 or args.train_zero_advantage]
    trained_tokens = sum(len(s.prompt_token_ids) + len(s.completion_token_ids) for s in trained)
    update_tokens = (prompt_tokens + completion_tokens) * grad_steps
    statuses = Counter(x.status.value for traj in result.trajectories for x in traj.turns)
    return {
        "date": time.strftime("%Y-%m-%d %H:%M:%S %Z"),
        "command": args.command,
        "device": {"train": args.device, "name": device_label, "evaluator_hardware": hardware},
        "versions": _versions(),
        "model": {
            "preset": args.preset, "architecture": "Qwen2ForCausalLM (random init)", "parameters": n_params,
            "trainable_parameters": trainable, "hidden": config.hidden_size, "layers": config.num_hidden_layers,
            "heads": config.num_attention_heads, "kv_heads": config.num_key_value_heads,
            "intermediate": config.intermediate_size, "vocab_size": config.vocab_size,
            "tokenizer_learned_tokens": learned_tokens(tokenizer),
            "tokenizer_reserved_tokens": len(tokenizer) - learned_tokens(tokenizer),
        },
        "rollout": {
            "tasks": [t.task_id for t in args.task_list], "trajectories": args.trajectories, "turns": args.turns,
            "oracle_share": args.oracle_share, "oracle_trajectories_per_task": oracle_per_task,
            "backend": args.backend, "profile": profile, "max_new_tokens": args.max_new_tokens,
            "temperature": args.temperature, "gen_batch": args.gen_batch,
        },
        "train": {
            "lora": args.lora, "grad_steps": args.grad_steps, "micro_batch_size": args.micro_batch, "lr": args.lr,
            "max_completion_length": max_completion, "skip_zero_advantage": not args.train_zero_advantage,
            "gradient_checkpointing": args.gradient_checkpointing,
        },
        "seconds": {
            "setup_tokenizer": setup["tokenizer"], "setup_model": setup["model"],
            "eval_prewarm": setup["eval_prewarm"], "generation": gen_s, "evaluation": eval_s,
            "update": trainer.seconds, "other": total - gen_s - eval_s - trainer.seconds, "step_total": total,
        },
        "throughput": {
            "generated_tokens": gen_tokens, "generation_tokens_per_s": gen_tokens / gen_s if gen_s else 0.0,
            "samples": len(samples), "trained_samples": len(trained),
            "update_prompt_tokens": prompt_tokens, "update_completion_tokens": completion_tokens,
            "update_tokens": update_tokens,
            "update_tokens_per_s": update_tokens / trainer.seconds if trainer.seconds else 0.0,
            "update_trained_tokens": trained_tokens * grad_steps,
            "update_trained_tokens_per_s": trained_tokens * grad_steps / trainer.seconds if trainer.seconds else 0.0,
        },
        "memory_gb": {"peak_step": peak_gb, "peak_generation": generate.peak_gb,
                      "peak_evaluation": evaluate.phase.peak_gb, "peak_update": trainer.peak_gb,
                      "rss_growth_generation": generate.rss_growth_gb, "rss_growth_evaluation": evaluate.phase.rss_growth_gb,
                      "rss_growth_update": trainer.phase.rss_growth_gb, "rss_end": rss_gb()},
        "generation_path": sampler_path,
        "rewards": {
            "per_turn": reward_table(result, oracle_per_task, args.turns),
            "per_task": task_table(result, oracle_per_task),
            "nonzero_advantages": sum(s.advantage != 0.0 for s in samples),
        },
        "verdicts": {"all_turns": dict(statuses), "evaluator": dict(evaluate.verdicts)},
        "generation_calls": generate.calls,
        "evaluation_calls": evaluate.calls,
        "update_steps": trainer.metrics,
        "rollout_metrics": result.rollout_metrics,
    }


UPDATE_COLUMNS = ("loss", "pg_loss", "grad_norm", "grad_norm_clipped", "clip_fraction", "ratio_mean", "approx_kl",
                  "entropy", "trained_sequences", "tokens_per_s", "skipped")


def render_markdown(f: dict[str, Any]) -> str:
    """The report: context, a figures table, rewards per turn, verdicts and the optimiser steps."""
    m, r, s, tp, mem = f["model"], f["rollout"], f["seconds"], f["throughput"], f["memory_gb"]
    oracle_note = (
        f"**Oracle:** {r['oracle_trajectories_per_task']} of {r['trajectories']} trajectories per task "
        f"(share {r['oracle_share']:g}) did not sample from the model: their response, every turn, is the task's "
        "bundled reference solution replayed as text (a ```python block and a one-line summary). The real "
        "evaluator judged those kernels, so rewards and advantages are non-zero; the trainer tokenized the "
        "replayed text and computed its log-probs itself. Generation figures count only model samples."
        if r["oracle_trajectories_per_task"] else
        "**No oracle:** every response was sampled from the (random) model; when none scores, every advantage "
        "is 0 and the trainer skips every sample (use --train-zero-advantage to time the passes anyway)."
    )
    lines = [
        f"# One multi-turn GRPO training step ({f['date']})",
        "",
        f"command: `{f['command']}`",
        "",
        (f"device: {f['device']['name']} (training on `{f['device']['train']}`); evaluator hardware: "
         f"{f['device']['evaluator_hardware']}"),
        "versions: " + ", ".join(f"{k} {v}" for k, v in f["versions"].items()),
        "",
        (f"model: {m['architecture']}, preset `{m['preset']}`, **{m['parameters']:,} parameters** "
         f"({m['trainable_parameters']:,} trainable), hidden {m['hidden']}, {m['layers']} layers, {m['heads']} heads / "
         f"{m['kv_heads']} KV heads, MLP {m['intermediate']}, vocabulary {m['vocab_size']} "
         f"({m['tokenizer_learned_tokens']} learned BPE tokens + {m['tokenizer_reserved_tokens']} reserved)"),
        "",
        (f"rollout: tasks {', '.join(r['tasks'])}; m = {r['trajectories']} trajectories x n = {r['turns']} turns; "
         f"backend {r['backend']}, profile {r['profile']}; max new tokens {r['max_new_tokens']}, temperature "
         f"{r['temperature']}"),
        "",
        oracle_note,
        "",
        "| figure | value |",
        "| --- | --- |",
        (f"| setup: tokenizer / model / evaluator prewarm (not in the step) | {s['setup_tokenizer']:.1f} / "
         f"{s['setup_model']:.1f} / {s['eval_prewarm']:.1f} s |"),
        f"| generation | {s['generation']:.2f} s |",
        f"| evaluation | {s['evaluation']:.2f} s |",
        f"| update ({len(f['update_steps'])} optimiser steps) | {s['update']:.2f} s |",
        f"| other (prompts, parsing, samples, files) | {s['other']:.2f} s |",
        f"| **step total** | **{s['step_total']:.2f} s** |",
        f"| generated tokens (model samples only) | {tp['generated_tokens']} |",
        f"| generation tokens/s | {tp['generation_tokens_per_s']:.1f} |",
        (f"| update tokens through forward + backward (prompt + completion of the {tp['trained_samples']} trained "
         f"samples x {len(f['update_steps'])} grad steps) | {tp['update_trained_tokens']} |"),
        f"| **update tokens/s** | **{tp['update_trained_tokens_per_s']:.1f}** |",
        (f"| all {tp['samples']} samples: prompt + completion tokens x grad steps (tokens/s) | {tp['update_tokens']} "
         f"({tp['update_tokens_per_s']:.1f}/s) |"),
        f"| completion tokens of all samples (one pass) | {tp['update_completion_tokens']} |",
        (f"| **peak GPU memory allocated: generation / evaluation / update** (step) | **{mem['peak_generation']:.2f} / "
         f"{mem['peak_evaluation']:.2f} / {mem['peak_update']:.2f} GiB** ({mem['peak_step']:.2f} GiB) |"
         if f["device"]["train"].startswith("cuda") else "| peak GPU memory | n/a (trained on the CPU) |"),
        (f"| resident memory growth: generation / evaluation / update (RSS at the end) | "
         f"{mem['rss_growth_generation']:+.2f} / {mem['rss_growth_evaluation']:+.2f} / {mem['rss_growth_update']:+.2f} GiB "
         f"({mem['rss_end']:.2f} GiB) |"),
        f"| generation path | {f['generation_path']} |",
        f"| non-zero advantages | {f['rewards']['nonzero_advantages']} of {tp['samples']} |",
        "",
        "## Rewards per turn",
        "",
        "| turn | score mean | score oracle traj. | score model traj. | return mean | mean abs advantage |",
        "| --- | --- | --- | --- | --- | --- |",
    ]
    for row in f["rewards"]["per_turn"]:
        lines.append(f"| {row['turn']} | {row['score_mean']:.3f} | {row['score_oracle']:.3f} | {row['score_model']:.3f} "
                     f"| {row['return_mean']:.3f} | {row['abs_advantage_mean']:.3f} |")
    lines += ["", "| task | score oracle traj. | speedup oracle traj. | score model traj. | correct model turns |",
              "| --- | --- | --- | --- | --- |"]
    for row in f["rewards"]["per_task"]:
        lines.append(f"| {row['task']} | {row['score_oracle']:.3f} | {row['speedup_oracle']:.3f} | "
                     f"{row['score_model']:.3f} | {row['correct_model']} of {row['turns_model']} |")
    lines += ["", "## Verdicts", "",
              "all turns: " + _counts(f["verdicts"]["all_turns"]),
              "",
              "judged by the evaluator (parse errors never reach it): " + _counts(f["verdicts"]["evaluator"]),
              "", "evaluator calls: " + ("; ".join(f"turn {c['turns']}: {c['candidates']} candidates in "
                                                   f"{c['seconds']:.1f} s" for c in f["evaluation_calls"]) or "none"),
              "", "## Optimiser steps", "",
              "| step | " + " | ".join(UPDATE_COLUMNS) + " |",
              "| --- | " + " | ".join("---" for _ in UPDATE_COLUMNS) + " |"]
    for i, step in enumerate(f["update_steps"]):
        lines.append(f"| {i} | " + " | ".join(_fmt(step.get(c)) for c in UPDATE_COLUMNS) + " |")
    return "\n".join(lines) + "\n"


def _counts(counts: dict[str, int]) -> str:
    return ", ".join(f"{k} {v}" for k, v in sorted(counts.items())) or "none"


def _fmt(x: Any) -> str:
    if x is None:
        return "-"
    if isinstance(x, float) and (abs(x) >= 1000 or x == int(x)):
        return f"{x:.0f}"
    return f"{x:.4g}" if isinstance(x, float) else str(x)


def write_report(figures: dict[str, Any], out: Path) -> tuple[Path, Path]:
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(render_markdown(figures), encoding="utf-8")
    js = out.with_suffix(".json")
    js.write_text(json.dumps(figures, indent=1, default=str) + "\n", encoding="utf-8")
    return out, js


# ------------------------------------------------------------------------------ entry point


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
    args = parse_args(argv)
    args.command = shlex.join(["python3", *sys.argv] if argv is None
                              else ["python3", "benchmarks/bench_train_step.py", *argv])
    logging.basicConfig(level=logging.INFO if args.verbose else logging.WARNING, format="%(message)s")
    log.setLevel(logging.INFO)
    scratch = Path(tempfile.mkdtemp(prefix="kevin-bench-step-"))
    try:
        figures = run_benchmark(args, scratch)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    print(render_markdown(figures))
    if args.out:
        md, js = write_report(figures, Path(args.out))
        print(f"wrote {md} and {js}")
    return figures


if __name__ == "__main__":
    main()
