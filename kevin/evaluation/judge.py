"""The judge: a trusted process, one per device, where the verdict is decided and no candidate code runs.

It rebuilds each trial's inputs from the seed the evaluator chose, runs the task's reference on them,
and compares the candidate's raw outputs (handed over by ``transfer.py``) with the result: shapes,
dtypes, finiteness, tolerances, and whether the reference is nearly constant. It also times the
PyTorch eager baselines and calibrates the evaluator's clock (verdict.py). Candidates never see the
reference outputs: they are computed after the candidate's outputs exist, in this process's memory
only, and this process is not dumpable, so a candidate without CAP_SYS_PTRACE cannot read it.

``python -m kevin.evaluation.judge READ_FD WRITE_FD`` reads commands and writes answers as JSON lines
(protocol.py). ``JudgeClient`` is the evaluator's handle on one such process.
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
import traceback
from collections import OrderedDict
from pathlib import Path
from typing import TYPE_CHECKING, Any

from kevin.evaluation import protocol

if TYPE_CHECKING:
    from kevin.evaluation.verdict import Overhead

_CACHED_TASKS = 4


# ------------------------------------------------------------------------------- the judge process


class _Judge:
    def __init__(self, config: dict[str, Any], device: str, wfd: int):
        import torch

        from kevin.evaluation.config import EvalConfig

        self.cfg = EvalConfig.from_dict(config)
        self.device = torch.device(device)
        self.wfd = wfd
        self.tasks: OrderedDict[str, tuple[Any, Any]] = OrderedDict()
        torch.set_grad_enabled(False)
        if self.device.type == "cpu" and self.cfg.cpu_threads > 0:
            torch.set_num_threads(self.cfg.cpu_threads)
        if self.cfg.disable_tf32:
            torch.backends.cuda.matmul.allow_tf32 = False
            torch.backends.cudnn.allow_tf32 = False
        if self.device.type == "cuda":
            torch.cuda.set_device(self.device)
            torch.empty(1, device=self.device)

    def answer(self, message: dict[str, Any]) -> None:
        protocol.send(self.wfd, message)

    def task(self, spec: dict[str, Any]) -> tuple[Any, Any]:
        """(module, reference model) of a task, built with the evaluator's seed (a few kept)."""
        from kevin.evaluation.harness import exec_module
        from kevin.evaluation.inputs import seeded

        key = f"{spec['task_id']}\0{spec['source']}"
        if key not in self.tasks:
            module = exec_module("kevin_task", spec["source"], f"<task {spec['task_id']}>")
            init = seeded(self.cfg.seed, module.get_init_inputs)
            model = seeded(self.cfg.seed, lambda: module.Model(*init)).to(self.device).eval()
            self.tasks[key] = (module, model)
            while len(self.tasks) > _CACHED_TASKS:
                self.tasks.popitem(last=False)
        self.tasks.move_to_end(key)
        return self.tasks[key]

    def check(self, msg: dict[str, Any]) -> dict[str, Any]:
        """Compare one call's outputs with the reference on the same seed and distribution."""
        import torch

        from kevin.evaluation.checks import _flatten_output, all_finite, compare_outputs, nearly_constant
        from kevin.evaluation.inputs import make_inputs
        from kevin.evaluation.transfer import Importer

        module, model = self.task(msg["task"])
        inputs = make_inputs(module, int(msg["seed"]), msg["dist"], self.device)
        reference = _flatten_output(model(*inputs))
        refs = msg.get("refs")
        answer: dict[str, Any] = {"t": "checked", "ok": False, "message": "", "max_abs": 0.0, "max_rel": 0.0,
                                  "ref_finite": all_finite(reference), "nearly_constant": bool(msg.get("constant_check")) and nearly_constant(reference)}
        if not answer["ref_finite"]:
            answer["ok"] = True  # the trial is skipped: the reference itself is not finite under these inputs
            return answer
        if not isinstance(refs, list) or len(refs) != len(reference):
            answer["message"] = f"returned {len(refs) if isinstance(refs, list) else 'no'} outputs, expected {len(reference)}"
            return answer
        importer = Importer(Path(msg["folder"]), self.device)
        try:
            got = []
            for j, (ref, want) in enumerate(zip(refs, reference)):
                if not isinstance(want, torch.Tensor):
                    answer["message"] = f"the reference's output {j} is not a tensor"
                    return answer
                value = importer.read(ref, want.dtype, tuple(want.shape))
                if isinstance(value, str):
                    answer["message"] = f"output {j} {value}"
                    return answer
                got.append(value)
            cmp = compare_outputs(got, reference, self.cfg.atol, self.cfg.rtol)
            answer.update(ok=cmp.ok, message=cmp.message, max_abs=cmp.max_abs_error, max_rel=cmp.max_rel_error)
            del got
        finally:
            importer.close()
        return answer

    def baselines(self, msg: dict[str, Any]) -> dict[str, Any]:
        """The PyTorch eager time of each task's reference, with the protocol candidates are timed with: the
        fastest of ``baseline_rounds`` medians, the rounds going over all tasks in turn (config.py says why)."""
        rounds: dict[str, list[float]] = {}
        errors: dict[str, str] = {}
        warm_up(self.device)
        for _ in range(self.cfg.baseline_rounds):
            for spec in msg["tasks"]:
                if spec["task_id"] not in errors:
                    try:
                        rounds.setdefault(spec["task_id"], []).append(self.time_reference(spec))
                    except Exception as exc:  # a broken task is reported, and the others are still timed
                        errors[spec["task_id"]] = _error_text(exc)
                        rounds.pop(spec["task_id"], None)
                self.answer({"t": "progress", "task_id": spec["task_id"]})
        return {"t": "baselines", "ms": {k: min(v) for k, v in rounds.items()}, "errors": errors}

    def time_reference(self, spec: dict[str, Any]) -> float:
        """One median over the timed calls of a task's reference."""
        from kevin.evaluation.inputs import clone_all, make_inputs
        from kevin.evaluation.timing import time_callable

        module, model = self.task(spec)
        sources = [make_inputs(module, self.cfg.seed + 5000 + i, "base", self.device) for i in range(2)]
        result = time_callable(model, clone_all(sources[0]), sources, self.device, self.cfg.warmup_trials,
                               self.cfg.timing_trials, self.cfg.resolved_flush_bytes if self.cfg.flush_l2 else 0)
        return result.median_ms

    def overhead(self, msg: dict[str, Any], read_ack) -> dict[str, Any]:
        """Run a task's timing protocol with an empty call: the evaluator's stamps of it show what a cycle
        costs besides the call (refreshing inputs, flushing the cache, the marks), on this task and device."""
        from kevin.evaluation.inputs import clone_all, make_inputs
        from kevin.evaluation.timing import time_callable

        module, _ = self.task(msg["task"])
        sources = [make_inputs(module, self.cfg.seed + 5000 + i, "base", self.device) for i in range(2)]

        def mark(kind: str, i: int) -> None:
            self.answer({"t": kind, "i": i})
            read_ack(kind, i)

        result = time_callable(lambda *args: None, clone_all(sources[0]), sources, self.device, max(5, self.cfg.warmup_trials),
                               max(50, self.cfg.timing_trials), self.cfg.resolved_flush_bytes if self.cfg.flush_l2 else 0, mark=mark)
        return {"t": "overhead", "samples": result.samples_ms}


def warm_up(device: Any, seconds: float = 1.0) -> None:
    """Keep the GPU busy for a moment before timing: an idle GPU runs at low clocks for a while, and baselines
    timed there come out slower than candidates timed on a GPU that a batch keeps busy (seen on an H200:
    the same references 10-20% slower at the start of a session)."""
    import torch

    if device.type != "cuda":
        return
    a = torch.randn(4096, 4096, device=device)
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        for _ in range(8):
            a = torch.tanh(a @ a * 1e-3)
        torch.cuda.synchronize(device)


def _error_text(exc: BaseException) -> str:
    from kevin.records.evaluation import trim_error

    return trim_error("".join(traceback.format_exception_only(type(exc), exc)))


def main(argv: list[str]) -> None:
    rfd, wfd = int(argv[1]), int(argv[2])
    lines = protocol.blocking_lines(rfd)
    setup = next(lines)
    from kevin.evaluation.isolation import apply_spec, protect_process

    protect_process()
    notes = apply_spec(setup.get("sandbox") or {})
    judge = _Judge(setup["config"], setup["device"], wfd)
    judge.answer({"t": "ready", "notes": notes})

    def read_ack(kind: str, i: int) -> None:
        ack = next(lines)
        if ack.get("t") != "ack" or ack.get("k") != kind or ack.get("i") != i:
            raise protocol.ProtocolError("expected the evaluator's stamp of a timing mark")

    for msg in lines:
        kind = msg.get("t")
        try:
            if kind == "check":
                judge.answer(judge.check(msg))
            elif kind == "baselines":
                judge.answer(judge.baselines(msg))
            elif kind == "overhead":
                judge.answer(judge.overhead(msg, read_ack))
            elif kind == "exit":
                break
            else:
                judge.answer({"t": "error", "error": f"unknown command {kind!r}"})
        except Exception as exc:
            judge.answer({"t": "error", "error": _error_text(exc)})
    os._exit(0)


# ------------------------------------------------------------------------------ the evaluator's side


class JudgeError(RuntimeError):
    """The judge process failed or answered out of turn."""


class JudgeClient:
    """One judge process for one device; thread-safe (one command at a time)."""

    def __init__(self, config: dict[str, Any], device: str, sandbox: dict[str, Any], env: dict[str, str],
                 timeout_s: float = 600.0):
        self.device, self.timeout_s = device, timeout_s
        self._lock = threading.Lock()
        to_judge_r, to_judge_w = os.pipe()
        from_judge_r, from_judge_w = os.pipe()
        repo = str(Path(__file__).resolve().parents[2])
        env = {**env, "PYTHONPATH": os.pathsep.join(p for p in (repo, env.get("PYTHONPATH", "")) if p)}
        self.proc = subprocess.Popen([sys.executable, "-m", "kevin.evaluation.judge", str(to_judge_r), str(from_judge_w)],
                                     pass_fds=(to_judge_r, from_judge_w), stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                     stderr=subprocess.PIPE, env=env, start_new_session=True, close_fds=True)
        os.close(to_judge_r)
        os.close(from_judge_w)
        self._w = to_judge_w
        self.reader = protocol.LineReader(from_judge_r, name=f"judge-{device}", ack_fd=to_judge_w)
        from kevin.evaluation.sandbox import Tail

        self.stderr = Tail(self.proc.stderr)
        protocol.send(self._w, {"t": "setup", "config": config, "device": device, "sandbox": sandbox})
        self.notes: list[str] = []
        self._started = False

    def _await(self, kinds: tuple[str, ...], timeout: float, on_progress=None) -> tuple[int, dict[str, Any]]:
        deadline = time.monotonic() + timeout
        while True:
            item = self.reader.get(deadline - time.monotonic())
            if item is None:
                raise JudgeError(f"the judge on {self.device} did not answer within {timeout:.0f} s")
            if item.message is None:
                raise JudgeError(f"the judge on {self.device} ended ({item.error}): {self.stderr.text()[-1500:]}")
            if item.message["t"] == "error":
                raise JudgeError(f"the judge on {self.device} failed: {item.message.get('error', '')}")
            if item.message["t"] in kinds:
                return item.at_ns, item.message
            if item.message["t"] == "progress" and on_progress is not None:
                on_progress(item.message)

    def start(self) -> None:
        if not self._started:
            _, ready = self._await(("ready",), self.timeout_s)
            self.notes = list(ready.get("notes", []))
            self._started = True

    def request(self, message: dict[str, Any], answer: str, timeout: float | None = None, on_progress=None) -> dict[str, Any]:
        """Send a command and wait for its answer (``on_progress`` sees the judge's progress messages meanwhile)."""
        with self._lock:
            self.start()
            protocol.send(self._w, message)
            return self._await((answer,), timeout or self.timeout_s, on_progress)[1]

    def overhead(self, task: dict[str, str]) -> "Overhead":
        """The timing protocol's own cost per call on ``task``, by the evaluator's clock (verdict.Overhead)."""
        from kevin.evaluation.verdict import Overhead, TimingEvidence, measure_overhead  # noqa: F401

        with self._lock:
            self.start()
            protocol.send(self._w, {"t": "overhead", "task": task})
            begin: dict[int, int] = {}
            end: dict[int, int] = {}
            while True:
                at, msg = self._await(("b", "e", "overhead"), self.timeout_s)
                if msg["t"] == "overhead":
                    break
                (begin if msg["t"] == "b" else end)[int(msg["i"])] = at
            samples = [float(x) for x in msg["samples"]]
            evidence = TimingEvidence(samples, [begin[i] for i in range(len(samples))], [end[i] for i in range(len(samples))])
            return measure_overhead(evidence)

    def alive(self) -> bool:
        return self.proc.poll() is None

    def close(self) -> None:
        try:
            protocol.send(self._w, {"t": "exit"})
        except OSError:
            pass
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        try:
            os.close(self._w)
        except OSError:
            pass


if __name__ == "__main__":
    main(sys.argv)
