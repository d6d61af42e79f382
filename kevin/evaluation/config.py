"""Evaluation settings: one dataclass, every field documented and validated."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kevin.evaluation.isolation import SandboxConfig
from kevin.records.target import TARGETS, KernelTarget
from kevin.settings import Settings


def default_cache_dir() -> Path:
    """Where compiled extensions and cached baselines live (KEVIN_CACHE_DIR overrides)."""
    return Path(os.environ.get("KEVIN_CACHE_DIR", Path.home() / ".cache" / "kevin"))


@dataclass
class EvalConfig(Settings):
    """How candidates are compiled, checked and timed."""

    section = "evaluation"

    backend: str = "cpu"
    """`cuda` (the paper's setting: inline CUDA on a GPU) or `cpu` (inline C++; runs without a GPU)."""

    profile: str = ""
    """Task size profile to render; empty means `cpu` on the cpu backend and the task's own sizes on cuda."""

    correctness_trials: int = 5
    """Correctness trials, each with a fresh seed; distributions alternate between trials (>= 5)."""

    warmup_trials: int = 5
    """Untimed calls before timing (compilation caches, lazy initialisation)."""

    timing_trials: int = 100
    """Timed calls; the reported runtime is their median (>= 100 for published numbers)."""

    baseline_rounds: int = 2
    """Rounds of timing over every task's PyTorch reference; the baseline is the fastest round's median. One
    slow round (a GPU that has not reached its clocks, a burst of other work) would otherwise inflate every
    speedup of that task until the cache is cleared: seen once on the H200 as a reference 1.33x faster than
    its own baseline. Rounds go over all tasks before the next starts, so a transient touches one round."""

    confirm_baselines: bool = True
    """Time a task's baseline a second time, in the device's judge after the run, when a correct kernel first leans on
    it, and keep the faster of the two timings (for this and every later candidate of the task). The rounds above
    are back to back: work that lasts longer than both (the policy generating on the same GPU while a wave is
    judged) slowed five H200 baselines by 2.3-2.8 ms each, and a softplus kernel at about 0.6x of PyTorch's speed
    scored 5.76x. A second timing at another moment catches that; the cost is one baseline timing per task per
    cache."""

    flush_l2: bool = True
    """Overwrite a buffer larger than the last-level cache before every timed call."""

    flush_bytes: int = 0
    """Size of that buffer; 0 means 256 MiB on cuda (H200 L2 is 60 MB) and 32 MiB on cpu."""

    atol: dict[str, float] = field(default_factory=lambda: {"float32": 1e-4, "float16": 1e-2, "bfloat16": 1e-2, "float64": 1e-7})
    """Absolute tolerance per output dtype (KernelBench's newer settings)."""

    rtol: dict[str, float] = field(default_factory=lambda: {"float32": 1e-4, "float16": 1e-2, "bfloat16": 1e-2, "float64": 1e-7})
    """Relative tolerance per output dtype."""

    timed_checks: int = 4
    """Timed calls whose outputs the judge compares with the reference, drawn by reservoir sampling in the judge
    (no process of the candidate's knows which). A kernel that computes only a share f of its calls passes with
    chance about f ** timed_checks; from 2 on, computing every call earns more."""

    calibration_calls: int = 30
    """Empty timed calls each candidate's process makes before its code is loaded: the protocol's own cost per
    call, by the evaluator's clock, on that task, device and moment (verdict.Overhead)."""

    seed: int = 42
    """Seed of the models' initial weights (reference and candidate alike). The inputs of every trial and timed
    call come from fresh secret seeds drawn by the judge, so no candidate can know them ahead."""

    timeout_s: float = 180.0
    """Wall-clock limit for one candidate's run phase (KernelBench uses 180 s)."""

    compile_timeout_s: float = 600.0
    """Wall-clock limit for one candidate's compile phase."""

    memory_limit_mb: int = 16384
    """Host memory limit of a candidate process (address space on cpu; resident set on cuda)."""

    prestart_runs: int = 4
    """cuda: run processes started ahead of their turn per GPU. They isolate themselves, import torch and
    create their CUDA context and profiler while the GPU runs the current candidate, then wait, before
    any candidate code runs, for their turn (one candidate on a GPU at a time). 0: start each in turn."""

    speedup_flag_threshold: float = 10.0
    """Speedups above this are flagged for re-verification rather than trusted."""

    reuse_verdicts: bool = False
    """Judge identical candidates (same task, same source) once per evaluator: the repeats get the first verdict,
    marked ``reused`` (kevin/evaluation/verdict_memo.py says what is never reused). A rollout repeats itself a lot
    (its trajectories agree, a second turn keeps its first): a run's settings (``RunConfig``, params.yaml) turn it
    on for training and ``kevin evaluate``. Off here, so a library caller judging one kernel again (a timing study,
    a test that the next candidate is unharmed) gets a fresh judgement."""

    clock_slack_ms: float = 0.0
    """How much longer (ms) a timed call may have taken by the evaluator's clock than the candidate's process
    reports, on top of ``clock_tolerance`` (verdict.corroborate); 0 means 0.1 ms on cuda and 1 ms on cpu."""

    clock_tolerance: float = 0.2
    """The same as a share of the reported call time (0.2: a call may be 20% longer than reported)."""

    switch_interval_s: float = 0.0002
    """Python's thread switch interval (``sys.setswitchinterval``) while the evaluator's judges run; 0 leaves it
    alone. The timing marks of every call pass through Python threads of the process that holds the evaluator: a
    busy thread there (a training run generating the next wave) kept each mark waiting up to the default 5 ms for
    the interpreter lock, which the evaluator's clock counted against the call, and identical honest kernels were
    flagged ``timing_mismatch`` (3 of 8 on cpu with two busy threads, 0 of 8 at 0.2 ms). It does not remove the
    H200's flags, which have another cause (docs/judge.md)."""

    transport: str = "auto"
    """How candidates hand their outputs to the judge: `file`, `ipc` (CUDA IPC, cuda only) or `auto` (IPC where
    it works, else files)."""

    disable_tf32: bool = True
    """Run the reference and baseline in true fp32 (TF32 off), so honest fp32 kernels meet 1e-4."""

    cpu_threads: int = 1
    """PyTorch intra-op threads in the harness on the cpu backend (candidates may not start threads, so
    the baseline is measured single-threaded too; timings also stay stable on a busy machine)."""

    compile_workers: int = 0
    """Parallel compile processes; 0 means the cores minus two per device (see ``cpu_cores``)."""

    compile_jobs: int = 0
    """Compiler processes one candidate's build may run at once (its host unit beside nvcc; nvcc's host and device
    passes side by side from 3). 0: the cores divided among the compiles waiting, at most 3, so a lone compile
    (the tail of a batch, a serial benchmark) uses the idle cores and a full queue runs one process each."""

    cpu_cores: int = 0
    """Cores this evaluator may use for compiling (0: all of the machine's). Set it when several evaluators share
    a machine (e.g. one per GPU in a Ray cluster), so their compiles do not oversubscribe the cores."""

    gpus: list[int] = field(default_factory=list)
    """GPU indices for the batch evaluator; empty means every visible GPU."""

    cache_dir: str = ""
    """Compiled-extension and baseline cache root; empty means KEVIN_CACHE_DIR or ~/.cache/kevin."""

    fast_cuda_compile: bool = True
    """Parse CUDA sources against a narrow torch header first (falling back to the full header when
    that does not compile, so verdicts and compiler errors are the stock ones)."""

    use_pch: bool = True
    """Use a precompiled torch header for C++ sources (cpu backend and host code)."""

    sandbox: SandboxConfig = field(default_factory=SandboxConfig)
    """Isolation layers of candidate processes (kevin/evaluation/isolation.py)."""

    rules: dict[str, Any] = field(default_factory=dict)
    """Overrides of the static rule data ({rule_id: {key: value}}), see default_rules.yaml."""

    allowed_runtime_ops: list[str] = field(
        default_factory=lambda: [
            "aten::empty", "aten::empty_like", "aten::empty_strided", "aten::zeros", "aten::zeros_like",
            "aten::ones", "aten::ones_like", "aten::full", "aten::full_like", "aten::fill_", "aten::zero_",
            "aten::contiguous", "aten::clone", "aten::copy_", "aten::view", "aten::reshape", "aten::_reshape_alias",
            "aten::as_strided", "aten::detach", "aten::alias", "aten::lift_fresh", "aten::resize_", "aten::to",
            "aten::_to_copy", "aten::expand", "aten::unsqueeze", "aten::squeeze", "aten::select", "aten::slice",
            "aten::item", "aten::_local_scalar_dense", "aten::size", "aten::stride", "aten::is_nonzero",
            "aten::set_", "aten::_unsafe_view", "aten::flatten", "aten::result_type", "aten::scalar_tensor",
            "aten::empty_like", "aten::new_empty", "aten::new_empty_strided", "aten::new_zeros",
        ]
    )
    """PyTorch ops a candidate's forward may run (allocation, layout, copies); any other op seen by the
    profiler during the forward is PyTorch compute and scores 0."""

    def __post_init__(self) -> None:
        if isinstance(self.sandbox, dict):
            self.sandbox = SandboxConfig.from_dict(self.sandbox)
        if self.backend not in TARGETS:
            raise ValueError(f"backend must be one of {TARGETS}, got {self.backend!r}")
        if self.correctness_trials < 1:
            raise ValueError("correctness_trials must be >= 1 (5 or more for reported numbers)")
        if self.baseline_rounds < 1:
            raise ValueError("baseline_rounds must be >= 1")
        if self.timing_trials < 1 or self.warmup_trials < 0:
            raise ValueError("timing_trials must be >= 1 and warmup_trials >= 0")
        if self.timed_checks < 1:
            raise ValueError("timed_checks must be >= 1 (4 is the default; more than timing_trials checks every call)")
        if self.calibration_calls < 5:
            raise ValueError("calibration_calls must be >= 5 (a low quantile of fewer calls is noise)")
        import math

        if not (0 < self.timeout_s < math.inf) or not (0 < self.compile_timeout_s < math.inf):
            raise ValueError("timeouts must be positive, finite seconds")
        if self.clock_slack_ms < 0 or not (0 <= self.clock_tolerance < 10):
            raise ValueError("clock_slack_ms must be >= 0 and clock_tolerance in [0, 10)")
        if not (0 <= self.switch_interval_s <= 0.1):
            raise ValueError("switch_interval_s must be between 0 (leave Python's alone) and 0.1 seconds")
        if self.transport not in ("auto", "file", "ipc"):
            raise ValueError(f"transport must be auto, file or ipc, got {self.transport!r}")
        if self.compile_jobs < 0:
            raise ValueError("compile_jobs must be >= 0 (0: from the cores and the compiles waiting)")
        if self.cpu_cores < 0:
            raise ValueError("cpu_cores must be >= 0 (0: all cores)")
        if self.cpu_threads < 1:
            raise ValueError("cpu_threads must be >= 1")
        if self.prestart_runs < 0:
            raise ValueError("prestart_runs must be >= 0")
        if self.speedup_flag_threshold <= 1:
            raise ValueError("speedup_flag_threshold must be > 1")
        for table in (self.atol, self.rtol):
            for dtype, value in table.items():
                if value < 0:
                    raise ValueError(f"tolerance for {dtype} must be >= 0")

    @property
    def target(self) -> KernelTarget:
        """The kernel target ``backend`` names (validated in ``__post_init__``)."""
        return KernelTarget.parse(self.backend)

    @property
    def resolved_profile(self) -> str:
        return self.profile or self.target.default_profile

    @property
    def resolved_flush_bytes(self) -> int:
        if self.flush_bytes:
            return self.flush_bytes
        return self.target.default_flush_bytes

    @property
    def resolved_clock_slack_ms(self) -> float:
        return self.clock_slack_ms or self.target.default_clock_slack_ms

    @property
    def resolved_cache_dir(self) -> Path:
        return Path(self.cache_dir) if self.cache_dir else default_cache_dir()


