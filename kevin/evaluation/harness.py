"""The evaluation harness: the program that runs inside each candidate's own process.

``python -m kevin.evaluation.harness JOB.json`` with a secret token on stdin. Modes:
- ``compile``: import the solution with our ``load_inline`` (no GPU visible), so the library is built
  into the content-hashed cache on a CPU worker while GPUs run other candidates;
- ``run``: import (cache hit), check correctness, check which ops and kernels ran, time;
- ``references``: time the reference Models of one or more tasks with the same protocol (trusted
  task code only; no candidate runs in such a process).
The result is a JSON file signed with the token (HMAC), so a candidate that writes a result of its
own, or exits early, is caught by the parent. ``os._exit`` ends the process so no handler the
candidate may have registered runs after the verdict.

Order inside ``run`` (why): the reference model and the integrity snapshot are made before any
candidate code exists; each trial runs the candidate FIRST on fresh inputs (new seed, alternating
distributions) with the CUDA cache poisoned, snapshots its output, checks tampering, threads and
inputs, and only then runs the reference on a pristine copy; reference outputs are NaN-filled before
they are released, so no later candidate call can find a correct answer lying in memory.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import os
import secrets
import sys
import time
import traceback
import types
from contextlib import nullcontext
from dataclasses import dataclass, field
from typing import Any, Callable

HARNESS_VERSION = "1"


@dataclass
class Verdict:
    """What the harness reports; the parent turns it into an EvalResult."""

    status: str = "runtime_error"
    rule_id: str = ""
    compiled: bool = False
    correct: bool = False
    runtime_ms: float = 0.0
    runtime_stats: dict[str, float] = field(default_factory=dict)
    max_abs_error: float = 0.0
    max_rel_error: float = 0.0
    trials_passed: int = 0
    trials_run: int = 0
    message: str = ""
    error: str = ""
    warnings: list[str] = field(default_factory=list)
    times: dict[str, float] = field(default_factory=dict)
    kernels: list[str] = field(default_factory=list)
    compile_path: str = ""
    references_ms: dict[str, float] = field(default_factory=dict)
    """Mode ``references`` only: the reference's time per task id (tasks that failed are absent)."""
    reference_errors: dict[str, str] = field(default_factory=dict)


SETUP_FAILED_EXIT = 4
"""Exit code of a gated job whose set-up failed before its turn (the evaluator runs it again, ungated)."""


class Stop(Exception):
    """Ends the evaluation early with a verdict already filled in."""


def _sign(token: bytes, payload: bytes) -> str:
    return hmac.new(token, payload, hashlib.sha256).hexdigest()


def write_signed(path: str, token: bytes, data: dict[str, Any]) -> None:
    payload = json.dumps(data, sort_keys=True).encode()
    blob = json.dumps({"payload": payload.decode(), "mac": _sign(token, payload)})
    tmp = f"{path}.tmp"
    with open(tmp, "w") as handle:
        handle.write(blob)
    os.replace(tmp, path)


def read_signed(path: str, token: bytes) -> dict[str, Any] | None:
    """The harness's result, or None if missing, malformed or not signed with ``token``."""
    try:
        with open(path) as handle:
            blob = json.load(handle)
        payload = blob["payload"].encode()
        if not hmac.compare_digest(blob["mac"], _sign(token, payload)):
            return None
        return json.loads(payload)
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return None


def _exec_module(name: str, source: str, filename: str) -> types.ModuleType:
    module = types.ModuleType(name)
    module.__file__ = filename
    code = compile(source, filename, "exec")
    exec(code, module.__dict__)  # noqa: S102 - this is the harness's purpose, inside the sandbox
    return module


def _child_process_count() -> int:
    """Live child processes of this process (Linux /proc), compilers included while they run."""
    count = 0
    try:
        for task in os.listdir(f"/proc/{os.getpid()}/task"):
            with open(f"/proc/{os.getpid()}/task/{task}/children") as handle:
                count += len(handle.read().split())
    except OSError:
        return 0
    return count


def _error_text(exc: BaseException) -> str:
    from kevin.records.evaluation import trim_error

    lines = traceback.format_exception_only(type(exc), exc)
    return trim_error("".join(lines))


# ------------------------------------------------------------------------------------------ phases


class Session:
    """State of one harness run: the job, the device, the task and the candidate as they load."""

    def __init__(self, job: dict[str, Any]):
        import torch

        from kevin.evaluation.config import EvalConfig
        from kevin.evaluation.rules import load_rules

        self.job = job
        self.cfg = EvalConfig.from_dict(job["config"])
        self.rules = load_rules(self.cfg.rules)
        self.device = torch.device(job.get("device") or "cpu")
        self.verdict = Verdict()
        self.task: Any = None
        self.ref_model: Any = None
        self.new_model: Any = None
        self.compiler: Any = None
        self.integrity: Any = None
        # The correctness trial whose call is profiled for kernels on cuda: drawn before any candidate
        # code exists (nothing it patches can change the draw), so the call count does not reveal it.
        self.watched_trial = secrets.randbelow(self.cfg.correctness_trials)

    def fail(self, status: str, message: str, rule_id: str = "", error: str = "") -> None:
        self.verdict.status, self.verdict.message, self.verdict.rule_id = status, message, rule_id
        self.verdict.error = error or self.verdict.error
        raise Stop()

    # -- setup -------------------------------------------------------------------------------

    def setup(self) -> None:
        import torch

        torch.set_grad_enabled(False)
        if self.device.type == "cpu" and self.cfg.cpu_threads > 0:
            torch.set_num_threads(self.cfg.cpu_threads)
        if self.cfg.disable_tf32:
            torch.backends.cuda.matmul.allow_tf32 = False
            torch.backends.cudnn.allow_tf32 = False
        if self.device.type == "cuda":
            torch.cuda.set_device(self.device)
            torch.empty(1, device=self.device)  # create the context before any candidate code
        # Start PyTorch's lazy thread pools and the profiler once, so later thread counts are stable
        # (baseline jobs run no candidate code and skip this).
        if self.job["mode"] == "run":
            torch.randn(1 << 16).sum()
            with torch.profiler.profile(activities=self._profiler_activities()):
                torch.ones(8, device=self.device).sum()

    def _profiler_activities(self) -> list[Any]:
        from torch.profiler import ProfilerActivity

        acts = [ProfilerActivity.CPU]
        if self.device.type == "cuda":
            acts.append(ProfilerActivity.CUDA)
        return acts

    def load_task(self) -> None:
        from kevin.evaluation.inputs import seeded

        try:
            self.task = _exec_module("kevin_task", self.job["task_source"], f"<task {self.job['task_id']}>")
            self.init_inputs = seeded(self.cfg.seed, self.task.get_init_inputs)
            self.ref_model = seeded(self.cfg.seed, lambda: self.task.Model(*self.init_inputs)).to(self.device).eval()
        except Exception as exc:  # a broken task is not the candidate's fault, but it is no verdict either
            self.fail("runtime_error", "the task itself failed to load", error="task: " + _error_text(exc))

    # -- candidate ---------------------------------------------------------------------------

    def load_candidate(self) -> None:
        from torch.utils import cpp_extension

        from kevin.evaluation.checks import IntegritySnapshot, thread_count
        from kevin.evaluation.compiler import CompileFailure, InlineCompiler, RuleFailure, compile_error_lines

        self.compiler = InlineCompiler(
            cache_dir=self.cfg.resolved_cache_dir, backend=self.cfg.backend, rules=self.rules,
            use_pch=self.cfg.use_pch, max_jobs=int(self.job.get("max_jobs", 2)), fast_cuda=self.cfg.fast_cuda_compile,
        )
        self.compiler.original = cpp_extension.load_inline
        extras = [("task", self.task)] + ([("task.Model", self.task.Model)] if self.task else [])
        self.integrity = IntegritySnapshot(extras)
        import threading

        self.threads_before = thread_count()
        self.python_threads_before = threading.active_count()
        self.children_before = _child_process_count()
        cpp_extension.load_inline = self.compiler.load_inline
        start = time.perf_counter()
        try:
            self.solution = _exec_module("kevin_solution", self.job["solution_source"], "<solution>")
        except CompileFailure as exc:
            self.verdict.times["compile"] = self.compiler.compile_seconds
            self.fail("compile_error", "failed to compile", error=compile_error_lines(exc.text))
        except RuleFailure as exc:
            self.fail("rule_violation", exc.hit.message, rule_id=exc.hit.rule_id)
        except Exception as exc:
            self.fail("runtime_error", "importing the solution raised an error", error=_error_text(exc))
        finally:
            cpp_extension.load_inline = self.compiler.original
            marker = self.job.get("compiled_marker")
            if marker:  # the parent's run-phase clock starts now, whatever the compile took
                open(marker, "w").close()
        self.verdict.times["compile"] = self.compiler.compile_seconds
        self.verdict.times["load"] = time.perf_counter() - start - self.compiler.compile_seconds
        self.verdict.compiled = True
        self.verdict.kernels = list(self.compiler.kernels)
        self.verdict.compile_path = self.compiler.fast_path
        hit = self.compiler.missing_inline_kernel()
        if hit:
            self.fail("rule_violation", hit.message, rule_id=hit.rule_id)
        self.check_tampering()

    def build_candidate(self) -> None:
        import torch

        from kevin.evaluation.inputs import seeded

        model_new = getattr(self.solution, "ModelNew", None)
        if not isinstance(model_new, type) or not issubclass(model_new, torch.nn.Module):
            self.fail("parse_error", "the solution defines no ModelNew(nn.Module) class")
        if self.task is not None and issubclass(model_new, self.task.Model):
            self.fail("rule_violation", "ModelNew subclasses the reference Model", rule_id="reference_inheritance")
        try:
            model = seeded(self.cfg.seed, lambda: model_new(*self.init_inputs))
            model = model.to(self.device).eval()
        except Exception as exc:
            self.fail("runtime_error", "constructing ModelNew raised an error", error=_error_text(exc))
        ref_state = self.ref_model.state_dict()
        new_state = model.state_dict()
        if set(ref_state) == set(new_state) and all(ref_state[k].shape == new_state[k].shape for k in ref_state):
            # Same parameters under the same names: give them the reference's values, so an honest
            # kernel that creates its parameters in another order is not marked wrong.
            model.load_state_dict(ref_state)
        self.new_model = model
        self.check_tampering()

    def check_tampering(self) -> None:
        from kevin.evaluation.checks import thread_count

        changed = self.integrity.changed()
        if changed:
            self.fail("rule_violation", f"tampering: {changed}", rule_id="harness_tampering")
        import threading

        if _child_process_count() > self.children_before:
            self.fail("rule_violation", "the candidate started processes", rule_id="processes_spawned")
        if threading.active_count() > self.python_threads_before:
            self.fail("rule_violation", "the candidate started Python threads", rule_id="threads_spawned")
        if thread_count() > self.threads_before:
            if self.device.type == "cpu":
                self.fail("rule_violation", "the candidate started threads", rule_id="threads_spawned")
            # The CUDA driver may start helper threads lazily (module loading, first launches), so on
            # cuda new native threads are reported, not punished; C++ thread creation is a static rule.
            note = "native thread count grew during the candidate's calls"
            if note not in self.verdict.warnings:
                self.verdict.warnings.append(note)

    # -- correctness -------------------------------------------------------------------------

    def call_candidate(self, inputs: list[Any], watch_kernels: bool = False) -> Any:
        """One candidate forward, checked; failures become verdicts, never exceptions.

        cpu: every call is profiled for ATen ops (a profiler session costs about a millisecond there).
        cuda: a session costs about a second (CUPTI), so only the ``watch_kernels`` call is profiled, for
        CPU ops and GPU kernels both: no PyTorch compute op, at least one of the solution's own kernels,
        no foreign compute kernel. Which correctness trial that is, is drawn at random per process.
        """
        import torch

        from kevin.evaluation.checks import output_problem

        cuda = self.device.type == "cuda"
        profiled = not cuda or watch_kernels
        activities = self._profiler_activities() if cuda else self._profiler_activities()[:1]
        start = time.perf_counter()
        try:
            with torch.profiler.profile(activities=activities) if profiled else nullcontext() as prof:
                out = self.new_model(*inputs)
                if cuda:
                    torch.cuda.synchronize(self.device)
        except Exception as exc:
            self.fail("runtime_error", "the forward raised an error", error=_error_text(exc))
        self.check_tampering()
        if profiled:
            self.check_ops(prof.events())
        if cuda and watch_kernels:
            self.check_kernels(prof.events())
            self.verdict.times["profile"] = time.perf_counter() - start
        problem = output_problem(out, self.device)
        if problem:
            self.fail("rule_violation", problem, rule_id="output_type")
        return out

    def check_kernels(self, events: Any) -> None:
        """A kernel of the candidate's own extension must have run, and no other compute kernel."""
        from torch.autograd import DeviceType

        from kevin.evaluation.checks import classify_kernels

        names = [e.name for e in events if getattr(e, "device_type", None) == DeviceType.CUDA]
        own, foreign = classify_kernels(names, self.compiler.kernels)
        if not own:
            self.fail("rule_violation", "none of the solution's own CUDA kernels ran in the forward (decoy kernel)", rule_id="decoy_kernel")
        if foreign:
            self.fail("rule_violation", f"kernels not from the solution ran in the forward: {foreign[0][:120]}", rule_id="foreign_kernel")

    def check_ops(self, events: Any) -> None:
        """No PyTorch compute op may appear among a forward's profiled events."""
        from kevin.evaluation.checks import aten_ops, forbidden_ops

        bad = forbidden_ops(aten_ops(events), self.cfg.allowed_runtime_ops)
        if bad:
            self.fail("rule_violation", f"PyTorch compute ran in the forward: {', '.join(bad[:5])}", rule_id="torch_compute_runtime")

    def correctness(self) -> None:
        from kevin.evaluation.checks import all_finite, compare_outputs, nearly_constant, snapshot_output
        from kevin.evaluation.inputs import DISTRIBUTIONS, clone_all, inputs_equal, make_inputs, poison_free_cuda_memory, poison_tensors

        start = time.perf_counter()
        v = self.verdict
        for k in range(self.cfg.correctness_trials):
            seed = self.cfg.seed + 1000 + k
            dist = DISTRIBUTIONS[k % len(DISTRIBUTIONS)]
            pristine = make_inputs(self.task, seed, dist, self.device)
            cand_in = clone_all(pristine)
            if self.device.type == "cuda":
                poison_free_cuda_memory(self.device)
            calls_before = self.compiler.call_counter.get("calls", 0)
            out = self.call_candidate(cand_in, watch_kernels=k == self.watched_trial)
            got = snapshot_output(out)
            del out
            mutated = not inputs_equal(pristine, cand_in)
            ref_in = clone_all(pristine)
            ref_out = self.ref_model(*ref_in)
            if mutated and inputs_equal(pristine, ref_in):
                self.fail("rule_violation", "the forward modified its inputs in place", rule_id="input_mutation")
            if self.compiler.call_counter.get("calls", 0) == calls_before:
                self.fail("rule_violation", "the forward never called the compiled extension", rule_id="decoy_kernel")
            v.trials_run += 1
            if not all_finite(ref_out):
                v.warnings.append(f"trial {k}: reference output not finite under the {dist} distribution; trial skipped")
                poison_tensors(ref_out)
                continue
            if k == 0 and nearly_constant(ref_out):
                v.warnings.append("reference output is nearly constant: this task cannot tell a constant answer from a kernel")
            cmp = compare_outputs(got, ref_out, self.cfg.atol, self.cfg.rtol)
            v.max_abs_error = max(v.max_abs_error, cmp.max_abs_error)
            v.max_rel_error = max(v.max_rel_error, cmp.max_rel_error)
            poison_tensors(ref_out)
            poison_tensors(got)
            del ref_out, got
            if not cmp.ok:
                v.times["correctness"] = time.perf_counter() - start
                self.fail("incorrect", f"trial {k + 1} ({dist} inputs): {cmp.message}")
            v.trials_passed += 1
        v.times["correctness"] = time.perf_counter() - start
        if v.trials_passed == 0:
            self.fail("runtime_error", "no trial had a finite reference output", error="task reference is not finite")

    # -- timing ------------------------------------------------------------------------------

    def timing(self, model: Any, spot_check: bool) -> float:
        from kevin.evaluation.checks import compare_outputs, snapshot_output
        from kevin.evaluation.inputs import clone_all, make_inputs
        from kevin.evaluation.timing import time_callable

        start = time.perf_counter()
        sources = [make_inputs(self.task, self.cfg.seed + 5000 + i, "base", self.device) for i in range(2)]
        inputs = clone_all(sources[0])
        n = self.cfg.timing_trials
        spots = sorted({n - 1, n // 2}) if spot_check else []
        result = time_callable(model, inputs, sources, self.device, self.cfg.warmup_trials, n,
                               self.cfg.resolved_flush_bytes if self.cfg.flush_l2 else 0, spots, snapshot_output)
        self.verdict.times["timing"] = time.perf_counter() - start
        self.verdict.runtime_stats = {"median_ms": result.median_ms, "mean_ms": result.mean_ms,
                                      "std_ms": result.std_ms, "min_ms": result.min_ms}
        if spot_check:
            self.check_tampering()
            for i, got in result.spot_outputs.items():
                ref_out = self.ref_model(*clone_all(sources[i % len(sources)]))
                cmp = compare_outputs(got, ref_out, self.cfg.atol, self.cfg.rtol)
                if not cmp.ok:
                    self.fail("incorrect", f"timed call {i + 1} returned a wrong result (stale or cached output?): {cmp.message}")
        return result.median_ms

    def time_references(self) -> None:
        """Time several trusted task references in this one process (no candidate code runs here).

        One interpreter and CUDA context for many tasks instead of one each: baselines for a batch
        cost seconds, not a process start per task. A task that fails is reported, not fatal.
        """
        for entry in self.job["reference_tasks"]:
            self.job["task_id"], self.job["task_source"] = entry["task_id"], entry["task_source"]
            try:
                self.load_task()
                self.verdict.references_ms[entry["task_id"]] = self.timing(self.ref_model, spot_check=False)
            except Stop:
                self.verdict.reference_errors[entry["task_id"]] = self.verdict.error or self.verdict.message
            except Exception as exc:
                self.verdict.reference_errors[entry["task_id"]] = _error_text(exc)
            self.task = self.ref_model = None
        self.verdict.status, self.verdict.message, self.verdict.error = "correct", "", ""


def run_job(job: dict[str, Any], wait_for_go: Callable[[], None] | None = None) -> Verdict:
    """Run one job. ``wait_for_go`` (gated jobs) blocks after the set-up, before any candidate code."""
    session = Session(job)
    mode = job["mode"]
    try:
        began = time.perf_counter()
        try:
            session.setup()
            if mode == "run":
                session.load_task()
        except BaseException:
            if wait_for_go:
                # Set up ahead of its turn, e.g. while the candidate before it held all GPU memory: not
                # this candidate's doing. No verdict; the evaluator starts it again when it is its turn.
                os._exit(SETUP_FAILED_EXIT)
            raise
        session.verdict.times["setup"] = time.perf_counter() - began
        if wait_for_go:
            wait_for_go()
        if mode == "references":
            session.time_references()
            return session.verdict
        session.load_candidate()
        if mode == "compile":
            session.verdict.status = "correct"  # compiled; the run phase gives the real verdict
            return session.verdict
        session.build_candidate()
        session.correctness()
        session.verdict.runtime_ms = session.timing(session.new_model, spot_check=True)
        session.check_tampering()
        session.verdict.status, session.verdict.correct = "correct", True
    except Stop:
        pass
    return session.verdict


def main(argv: list[str]) -> None:
    harness_pid = os.getpid()
    token = sys.stdin.buffer.readline().strip()
    with open(argv[1]) as handle:
        job = json.load(handle)
    result_path = job.pop("result_path")
    wait_for_go = None
    if job.get("gated"):
        def wait_for_go() -> None:
            # A gated job was started ahead of its turn; it waits here, set up but before any candidate
            # code, until the parent hands it the device. Anything but "go:<token>" ends it, no verdict.
            line = sys.stdin.buffer.readline().strip()
            sys.stdin.close()
            if not hmac.compare_digest(line, b"go:" + token):  # only the parent knows the token
                os._exit(3)
    else:
        sys.stdin.close()
    from kevin.evaluation.isolation import apply_spec

    # Isolation first: no torch, no task and no candidate code has been loaded yet.
    spec = job.get("sandbox") or {}
    notes = [f"sandbox: {w}" for w in apply_spec(spec) + spec.get("parent_notes", [])]
    try:
        verdict = run_job(job, wait_for_go)
    except BaseException as exc:  # anything at all: a verdict, never a crash without one
        verdict = Verdict(status="runtime_error", message="evaluation failed", error=_error_text(exc))
    verdict.warnings = notes + verdict.warnings
    from dataclasses import asdict

    sys.stdout.flush()
    sys.stderr.flush()
    if os.getpid() == harness_pid:  # a process the candidate forked never speaks for the harness
        write_signed(result_path, token, asdict(verdict))
    os._exit(0)


if __name__ == "__main__":
    main(sys.argv)
