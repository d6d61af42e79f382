"""The program that runs inside each candidate's own process: it runs the candidate, and decides nothing.

``python -m kevin.evaluation.harness JOB.json READ_FD WRITE_FD``. The evaluator and the harness talk in
JSON lines (protocol.py). Modes:
- ``compile`` (no GPU visible): import the solution with our ``load_inline`` in compile mode, which
  builds its extensions into the job's staging folder and loads none of them;
- ``run``: open the channel to the judge (channel.py) and calibrate the protocol, then import the solution
  (its libraries come from the read-only cache) and make its calls: the correctness trials and the timed
  calls, each on inputs the judge wrote into the channel, each output put into the channel for the judge.

Native code in the candidate's library can rewrite anything in this process, so nothing here is a
verdict and nothing here decides how a call is checked: the harness only makes calls and reports raw
timings and what it saw (profiler events, tampering, threads). It holds no seed and no check plan: the
judge draws each call's inputs from a fresh secret seed just before the call may begin, copies the outputs
out when the call's end mark arrives, and decides alone which timed calls it compares. A report can make
the evaluator's verdict worse, never better.

Order inside ``run`` (why): isolation first, then torch, the CUDA context and the profiler (all before
any candidate code, and for a job started ahead of its turn, before the evaluator hands it the GPU);
then the channel and the calibration (empty calls, so the evaluator measures the protocol's own cost in
this very process before any candidate code can touch it); then the task and the candidate; each trial
runs the candidate with the CUDA cache poisoned and waits for the judge's comparison before the next.
"""

from __future__ import annotations

import hmac
import json
import os
import sys
import threading
import time
import traceback
import types
from contextlib import nullcontext
from pathlib import Path
from typing import Any, Iterator

from kevin.evaluation import protocol
from kevin.evaluation.protocol import BAD_START_EXIT, SETUP_FAILED_EXIT
from kevin.evaluation.transfer import DTYPES, ipc_probe


class Stop(Exception):
    """Ends the job early; the message saying why was sent already."""


def exec_module(name: str, source: str, filename: str) -> types.ModuleType:
    module = types.ModuleType(name)
    module.__file__ = filename
    code = compile(source, filename, "exec")
    exec(code, module.__dict__)  # noqa: S102 - this is the harness's purpose, inside the sandbox
    return module


def error_text(exc: BaseException) -> str:
    from kevin.records.evaluation import trim_error

    return trim_error("".join(traceback.format_exception_only(type(exc), exc)))


class Link:
    """The harness's end of the pipes: send a message, wait for the evaluator's answer."""

    def __init__(self, rfd: int, wfd: int):
        self._lines: Iterator[dict[str, Any]] = protocol.blocking_lines(rfd)
        self._wfd = wfd
        self._pid = os.getpid()

    def send(self, message: dict[str, Any]) -> None:
        if os.getpid() == self._pid:  # a process the candidate forked never speaks for the harness
            protocol.send(self._wfd, message)

    def receive(self) -> dict[str, Any]:
        try:
            return next(self._lines)
        except StopIteration:
            raise Stop() from None

    def fail(self, status: str, message: str, error: str = "", rule_id: str = "") -> None:
        self.send({"t": "fail", "status": status, "message": message, "error": error, "rule_id": rule_id})
        raise Stop()

    def violation(self, rule_id: str, message: str) -> None:
        self.fail("rule_violation", message, rule_id=rule_id)


# -------------------------------------------------------------------------------------------- compile


def compile_job(job: dict[str, Any], link: Link) -> None:
    """Import the solution so that its extensions are built into the staging folder."""
    from torch.utils import cpp_extension

    from kevin.evaluation.build_sources import RequestError
    from kevin.evaluation.builder import CompileFailure, compile_error_lines
    from kevin.evaluation.config import EvalConfig
    from kevin.evaluation.inline_ext import InlineLoader, RuleFailure
    from kevin.evaluation.rules import load_rules
    from kevin.evaluation.toolchain import Toolchain

    cfg = EvalConfig.from_dict(job["config"])
    loader = InlineLoader("compile", Toolchain.from_dict(job["toolchain"]), cfg.backend, load_rules(cfg.rules),
                          Path(job["staging"]), max_jobs=int(job.get("max_jobs", 2)), compile_timeout_s=cfg.compile_timeout_s,
                          on_built=lambda info: link.send({"t": "built", **info}))
    original = cpp_extension.load_inline
    cpp_extension.load_inline = loader.load_inline
    try:
        exec_module("kevin_solution", job["solution_source"], "<solution>")
    except CompileFailure as exc:
        link.send({"t": "times", "compile": loader.compile_seconds})
        link.fail("compile_error", "failed to compile", error=compile_error_lines(exc.text))
    except RuleFailure as exc:
        link.violation(exc.hit.rule_id, exc.hit.message)
    except RequestError as exc:
        link.violation("load_inline_flags", str(exc))
    except Exception as exc:
        link.fail("runtime_error", "importing the solution raised an error", error=error_text(exc))
    finally:
        cpp_extension.load_inline = original
    link.send({"t": "times", "compile": loader.compile_seconds})
    hit = loader.missing_inline_kernel()
    if hit:
        link.violation(hit.rule_id, hit.message)


# ------------------------------------------------------------------------------------------------ run


class RunJob:
    """One candidate's run: set-up, the task, the candidate, the correctness trials, the timed calls."""

    def __init__(self, job: dict[str, Any], link: Link):
        import torch

        from kevin.evaluation.config import EvalConfig

        self.job, self.link = job, link
        self.cfg = EvalConfig.from_dict(job["config"])
        self.device = torch.device(job.get("device") or "cpu")
        self.cuda = self.device.type == "cuda"
        self.times: dict[str, float] = {}
        self.warnings: list[str] = []

    # -- set-up (no candidate code yet) ------------------------------------------------------------

    def setup(self) -> None:
        import torch

        start = time.perf_counter()
        torch.set_grad_enabled(False)
        if not self.cuda and self.cfg.cpu_threads > 0:
            torch.set_num_threads(self.cfg.cpu_threads)
        if self.cfg.disable_tf32:
            torch.backends.cuda.matmul.allow_tf32 = False
            torch.backends.cudnn.allow_tf32 = False
        if self.cuda:
            torch.cuda.set_device(self.device)
            torch.empty(1, device=self.device)  # the context exists before any candidate code
        # PyTorch's lazy thread pools and the profiler start now, so later thread counts are stable.
        torch.randn(1 << 16).sum()
        with torch.profiler.profile(activities=self._activities()):
            torch.ones(8, device=self.device).sum()
        self.channel_kind = "file"
        if self.cuda and self.job.get("transport", "auto") in ("auto", "ipc"):
            why = ipc_probe(self.device)
            if not why:
                self.channel_kind = "ipc"
            elif self.job.get("transport") == "ipc":
                raise RuntimeError(f"CUDA IPC is not available: {why}")
            else:
                self.warnings.append(f"the channel to the judge is a shared file (CUDA IPC unavailable: {why[:200]})")
        self.times["setup"] = time.perf_counter() - start

    # -- the channel and the calibration (no candidate code yet) -----------------------------------

    def open_channel(self, layout: dict[str, Any]) -> None:
        """The buffer through which the judge hands over inputs and takes outputs (channel.py), announced to the
        evaluator, whose judge maps it before any candidate code runs."""
        from kevin.evaluation.channel import HarnessChannel, Layout

        self.layout = Layout.from_dict(layout)
        self.channel = HarnessChannel(self.layout, self.device, self.channel_kind, Path(os.getcwd()))
        self.link.send({"t": "channel", **self.channel.describe})
        if self.link.receive().get("t") != "attached":
            raise Stop()

    def mark(self, kind: str, i: int) -> dict[str, Any]:
        """Send a begin or end mark; a begin mark waits for its answer (the judge has written the inputs by then)."""
        self.link.send({"t": kind, "i": i})
        if kind == "e":
            return {}
        answer = self.link.receive()
        if answer.get("t") != "ack" or answer.get("i") != i:
            raise Stop()
        return answer

    def calibrate(self) -> None:
        """Timed calls of an empty forward that returns ready outputs: what the protocol itself costs on this task
        and device, measured by the evaluator's clock before any candidate code exists (verdict.Overhead)."""
        import torch

        from kevin.evaluation.timing import channel_calls

        ready = [torch.zeros(y.shape, dtype=DTYPES[y.dtype], device=self.device) for y in self.layout.outputs]
        n = int(self.job.get("calibration_calls", 30))
        self.link.send({"t": "calibrate", "trials": n})
        samples = channel_calls(lambda *args: ready, self.channel, self.device, 2, n, lambda i: self.mark("b", i),
                                lambda i: self.mark("e", i))
        self.link.send({"t": "calibrated", "samples": samples})
        if self.link.receive().get("t") != "continue":
            raise Stop()

    def _activities(self) -> list[Any]:
        from torch.profiler import ProfilerActivity

        return [ProfilerActivity.CPU, ProfilerActivity.CUDA] if self.cuda else [ProfilerActivity.CPU]

    # -- the task and the candidate ----------------------------------------------------------------

    def load_task(self) -> None:
        from kevin.evaluation.inputs import seeded

        try:
            self.task = exec_module("kevin_task", self.job["task_source"], f"<task {self.job['task_id']}>")
            self.init_inputs = seeded(self.cfg.seed, self.task.get_init_inputs)
            self.ref_model = seeded(self.cfg.seed, lambda: self.task.Model(*self.init_inputs)).to(self.device).eval()
        except Exception as exc:  # a broken task is not the candidate's doing: the evaluator says so
            self.link.fail("task_error", "the task itself failed to load", error="task: " + error_text(exc))

    def load_candidate(self) -> None:
        import torch
        from torch.utils import cpp_extension

        from kevin.evaluation.build_sources import RequestError
        from kevin.evaluation.checks import IntegritySnapshot, child_process_count, thread_count
        from kevin.evaluation.inline_ext import InlineLoader, NotBuilt, RuleFailure
        from kevin.evaluation.rules import load_rules
        from kevin.evaluation.toolchain import Toolchain

        self.loader = InlineLoader("run", Toolchain.from_dict(self.job["toolchain"]), self.cfg.backend,
                                   load_rules(self.cfg.rules), Path(self.job["ext_dir"]))
        self.integrity = IntegritySnapshot([("task", self.task), ("task.Model", self.task.Model)])
        self.threads_before, self.python_threads_before = thread_count(), threading.active_count()
        self.children_before = child_process_count()
        original = cpp_extension.load_inline
        cpp_extension.load_inline = self.loader.load_inline
        start = time.perf_counter()
        try:
            self.solution = exec_module("kevin_solution", self.job["solution_source"], "<solution>")
        except RuleFailure as exc:
            self.link.violation(exc.hit.rule_id, exc.hit.message)
        except RequestError as exc:
            self.link.violation("load_inline_flags", str(exc))
        except NotBuilt as exc:
            self.link.fail("runtime_error", "importing the solution failed", error=str(exc))
        except Exception as exc:
            self.link.fail("runtime_error", "importing the solution raised an error", error=error_text(exc))
        finally:
            cpp_extension.load_inline = original
        self.times["load"] = time.perf_counter() - start
        hit = self.loader.missing_inline_kernel()
        if hit:
            self.link.violation(hit.rule_id, hit.message)
        self.check_tampering()
        model_new = getattr(self.solution, "ModelNew", None)
        if not isinstance(model_new, type) or not issubclass(model_new, torch.nn.Module):
            self.link.fail("parse_error", "the solution defines no ModelNew(nn.Module) class")
        if issubclass(model_new, self.task.Model):
            self.link.violation("reference_inheritance", "ModelNew subclasses the reference Model")
        from kevin.evaluation.inputs import seeded

        try:
            model = seeded(self.cfg.seed, lambda: model_new(*self.init_inputs)).to(self.device).eval()
        except Exception as exc:
            self.link.fail("runtime_error", "constructing ModelNew raised an error", error=error_text(exc))
        ref_state, new_state = self.ref_model.state_dict(), model.state_dict()
        if set(ref_state) == set(new_state) and all(ref_state[k].shape == new_state[k].shape for k in ref_state):
            # Same parameters under the same names: give them the reference's values, so an honest kernel
            # that creates its parameters in another order is not marked wrong.
            model.load_state_dict(ref_state)
        self.model = model
        self.check_tampering()
        self.check_registrations()

    def check_registrations(self) -> None:
        changed = self.integrity.registrations_changed()
        if changed:
            self.link.violation("harness_tampering", f"tampering: {changed}")

    def check_tampering(self) -> None:
        from kevin.evaluation.checks import busy_after_return_ms, child_process_count, thread_count

        changed = self.integrity.changed()
        if changed:
            self.link.violation("harness_tampering", f"tampering: {changed}")
        if child_process_count() > self.children_before:
            self.link.violation("processes_spawned", "the candidate started processes")
        if threading.active_count() > self.python_threads_before:
            self.link.violation("threads_spawned", "the candidate started Python threads")
        if thread_count() > self.threads_before:
            if not self.cuda:
                # OpenMP keeps its team's threads after a parallel region, asleep: allowed. Threads that still
                # compute after the call returned are not (work the timing would not see).
                busy = busy_after_return_ms()
                if busy > 5.0:
                    self.link.violation("threads_spawned", f"threads kept computing after the call returned ({busy:.0f} ms "
                                                           "of CPU in 50 ms)")
                note = "threads stayed after the call (idle, e.g. OpenMP's team)"
            else:
                # The CUDA driver may start helper threads lazily (module loading, first launches), so on cuda new
                # native threads are reported, not punished; the library's thread calls are refused statically.
                note = "native thread count grew during the candidate's calls"
            if note not in self.warnings:
                self.warnings.append(note)

    # -- correctness -------------------------------------------------------------------------------

    def _profiler(self, profiled: bool) -> Any:
        import torch

        return torch.profiler.profile(activities=self._activities()) if profiled else nullcontext()

    def _observed(self, prof: Any) -> tuple[list[str], list[str], float]:
        """What a profiler saw: the PyTorch ops and, on cuda, the GPU kernels (raw names) and their time in ms."""
        from torch.autograd import DeviceType

        events = list(prof.events())
        ops = sorted({e.name for e in events if e.name.startswith("aten::")})
        kernels = [e for e in events if getattr(e, "device_type", None) == DeviceType.CUDA] if self.cuda else []
        kernel_ms = sum(getattr(e, "device_time", getattr(e, "cuda_time", 0.0)) for e in kernels) / 1000.0
        return ops, sorted({e.name for e in kernels})[:200], kernel_ms

    def call(self, inputs: list[Any], profiled: bool) -> tuple[Any, dict[str, Any]]:
        """One forward; with ``profiled`` the PyTorch ops and GPU kernels it ran, as raw names."""
        import torch

        calls_before = self.loader.call_counter.get("calls", 0)
        seen: dict[str, Any] = {}
        try:
            with self._profiler(profiled) as prof:
                out = self.model(*inputs)
                if self.cuda:
                    torch.cuda.synchronize(self.device)
        except Exception as exc:
            self.link.fail("runtime_error", "the forward raised an error", error=error_text(exc))
        self.check_tampering()
        if profiled:
            seen["ops"], kernels, kernel_ms = self._observed(prof)
            if self.cuda:
                seen["kernels"], seen["kernel_ms"] = kernels, kernel_ms
        seen["ext_calls"] = self.loader.call_counter.get("calls", 0) - calls_before
        return out, seen

    def hand_over(self, out: Any, seen: dict[str, Any], profiled: bool) -> None:
        """Check a trial's outputs and put them into the channel. With ``profiled``, what ran meanwhile joins ``seen``
        (``handover_ops``, on cuda ``handover_kernels``): the hand-over is the candidate's process's Python too, and
        compute moved there (the forward returning an uncomputed copy) must show where the rules look."""
        from kevin.evaluation.checks import output_problem

        with self._profiler(profiled) as prof:
            problem = output_problem(out, self.device)
            if problem:
                self.link.violation("output_type", problem)
            problem = self.channel.put(list(out) if isinstance(out, (tuple, list)) else [out])
        if problem:
            self.link.fail("incorrect", problem)
        if profiled:
            seen["handover_ops"], kernels, _ = self._observed(prof)
            if self.cuda:
                seen["handover_kernels"] = kernels

    def correctness(self) -> None:
        """Each trial: the judge writes fresh inputs (its own secret seed; distributions alternate) into the channel,
        the candidate runs on them with the CUDA cache poisoned, its outputs go into the channel, and the judge
        compares them before the next trial may start."""
        from kevin.evaluation.inputs import poison_free_cuda_memory

        start = time.perf_counter()
        for k in range(self.cfg.correctness_trials):
            if self.cuda:
                poison_free_cuda_memory(self.device)
            answer = self.mark("b", k)
            self.channel.stage_in()
            profiled = (not self.cuda) or bool(answer.get("profile"))
            out, seen = self.call(self.channel.inputs, profiled)
            self.hand_over(out, seen, profiled)
            del out
            self.link.send({"t": "e", "i": k, **seen})
            if self.link.receive().get("t") != "continue":
                raise Stop()
        self.times["correctness"] = time.perf_counter() - start

    # -- timing ------------------------------------------------------------------------------------

    def timing(self) -> None:
        from kevin.evaluation.checks import output_problem
        from kevin.evaluation.timing import channel_calls

        start = time.perf_counter()
        while True:  # the evaluator may ask for the loop again when its clock disagreed (verdict.py)
            self.link.send({"t": "timing", "trials": self.cfg.timing_trials})
            try:
                samples = channel_calls(self.model, self.channel, self.device, self.cfg.warmup_trials, self.cfg.timing_trials,
                                        lambda i: self.mark("b", i), lambda i: self.mark("e", i),
                                        check=lambda out: output_problem(out, self.device))
            except Stop:
                raise
            except ValueError as exc:
                self.link.fail("incorrect", f"a timed call: {exc}")
            except Exception as exc:
                self.link.fail("runtime_error", "a timed call raised an error", error=error_text(exc))
            self.check_tampering()
            self.check_registrations()
            self.times["timing"] = time.perf_counter() - start
            self.link.send({"t": "timed", "samples": samples})
            answer = self.link.receive()
            if answer.get("t") != "again":
                break
        if answer.get("t") != "continue":
            raise Stop()


def run_job(job: dict[str, Any], link: Link, notes: list[str], token: str) -> None:
    run = RunJob(job, link)
    run.warnings.extend(notes)
    gated = bool(job.get("gated"))
    try:
        run.setup()
    except BaseException as exc:
        if gated:
            # Set up ahead of its turn, e.g. while the candidate before it held all GPU memory: not this
            # candidate's doing. No verdict; the evaluator starts it again when it is its turn.
            os._exit(SETUP_FAILED_EXIT)
        link.fail("runtime_error", "the evaluation process could not be set up", error=error_text(exc))
    link.send({"t": "ready", "setup_s": run.times["setup"]})
    start = link.receive()
    if start.get("t") != "start" or not hmac.compare_digest(str(start.get("token", "")), token):
        os._exit(BAD_START_EXIT)  # only the evaluator knows the token
    try:
        try:
            run.open_channel(start.get("layout"))
            run.calibrate()
        except Stop:
            raise
        except Exception as exc:
            link.fail("runtime_error", "the channel to the judge could not be set up", error=error_text(exc))
        run.load_task()
        run.load_candidate()
        run.correctness()
        run.timing()
    finally:
        link.send({"t": "report", "warnings": run.warnings, "times": run.times})


def main(argv: list[str]) -> None:
    job_path, rfd, wfd = argv[1], int(argv[2]), int(argv[3])
    with open(job_path) as handle:
        job = json.load(handle)
    link = Link(rfd, wfd)
    # The job token comes down the pipe, never through a file another process could read: only the
    # evaluator can then tell a job started ahead of its turn that the device is now its.
    hello = link.receive()
    token = str(hello.get("token", ""))
    from kevin.evaluation.isolation import apply_spec

    # Isolation first: no torch, no task and no candidate code has been loaded yet.
    spec = job.get("sandbox") or {}
    notes = [f"sandbox: {w}" for w in apply_spec(spec) + spec.get("parent_notes", [])]
    try:
        if job["mode"] == "compile":
            link.send({"t": "notes", "warnings": notes})
            compile_job(job, link)
        else:
            run_job(job, link, notes, token)
        link.send({"t": "done"})
    except Stop:
        pass
    except BaseException as exc:  # anything at all ends with a message, never silently
        try:
            link.send({"t": "fail", "status": "runtime_error", "message": "evaluation failed", "error": error_text(exc),
                       "rule_id": ""})
        except OSError:
            pass
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


if __name__ == "__main__":
    main(sys.argv)

