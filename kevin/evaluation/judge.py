"""The judge: a trusted process, one per device, where the verdict is decided and no candidate code runs.

For every call of a candidate (correctness trials and timed calls alike) it draws the inputs from a fresh
secret seed and writes them into the job's channel (channel.py) just before the call may begin, and copies
the outputs out of the channel as soon as the call's end mark arrives. Trials are compared at once; of the
timed calls, ``evaluation.timed_checks`` are drawn by reservoir sampling inside this process and compared
after the loop. Comparisons: shapes, dtypes, finiteness, tolerances, and whether the reference is nearly
constant. It also times the PyTorch eager baselines. Candidates never see a seed, a draw or a reference
output: they exist only in this process's memory, and this process is not dumpable, so a candidate without
CAP_SYS_PTRACE cannot read it.

``python -m kevin.evaluation.judge READ_FD WRITE_FD`` reads commands and writes answers as JSON lines
(protocol.py). ``JudgeClient`` is the evaluator's handle on one such process.
"""

from __future__ import annotations

import os
import secrets
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
    from kevin.evaluation.channel import JudgeChannel

_CACHED_TASKS = 4


class _Session:
    """One job's calls as the judge sees them: its channel, the current call's inputs, the sampled timed calls."""

    def __init__(self, module: Any, model: Any, channel: "JudgeChannel", checks: int):
        import torch

        self.module, self.model, self.channel, self.checks = module, model, channel, max(0, checks)
        self.current: tuple[int, str, list[Any]] | None = None
        """(seed, distribution, inputs) of the call whose inputs are in the channel now."""
        self.seen = 0
        self.kept: list[tuple[int, int, str, list[Any]]] = []
        """(call number, seed, distribution, outputs) of the timed calls drawn so far."""
        # checks + 1 sets of output tensors, allocated once: a capture copies into ``incoming``, and keeping a call
        # swaps buffers, so a kept call costs no more time than one let go.
        self.incoming = self._outputs(torch)
        self.spare = [self._outputs(torch) for _ in range(self.checks)]

    def _outputs(self, torch: Any) -> list[Any]:
        return [torch.empty(y.shape, dtype=y.dtype, device=self.channel.device) for y in self.channel.outputs]

    def sample(self, seed: int, dist: str) -> None:
        """Reservoir sampling: after n captures every one of them is among the kept ``checks`` with the same chance."""
        self.seen += 1
        call = self.seen - 1
        if len(self.kept) < self.checks:
            self.kept.append((call, seed, dist, self.incoming))
            self.incoming = self.spare.pop()
        else:
            j = secrets.randbelow(self.seen)
            if j < self.checks:
                self.kept[j], self.incoming = (call, seed, dist, self.incoming), self.kept[j][3]


# ------------------------------------------------------------------------------- the judge process


class _Judge:
    def __init__(self, config: dict[str, Any], device: str, wfd: int):
        import torch

        from kevin.evaluation.config import EvalConfig

        self.cfg = EvalConfig.from_dict(config)
        self.device = torch.device(device)
        self.wfd = wfd
        self.tasks: OrderedDict[str, tuple[Any, Any]] = OrderedDict()
        self.session: _Session | None = None
        self._flush: Any = None
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

    # -- one job's calls through its channel (channel.py) ------------------------------------------

    def layout(self, msg: dict[str, Any]) -> dict[str, Any]:
        """The channel layout of a task: its inputs' and its reference's outputs' shapes (from a seed of our own)."""
        from kevin.evaluation.channel import Layout
        from kevin.evaluation.checks import _flatten_output
        from kevin.evaluation.inputs import make_inputs

        module, model = self.task(msg["task"])
        inputs = make_inputs(module, secrets.randbits(31), "base", self.device)
        layout = Layout.of(inputs, _flatten_output(model(*inputs)))
        return {"t": "layout", "layout": layout.to_dict()}

    def attach(self, msg: dict[str, Any]) -> dict[str, Any]:
        """Map a job's channel and start its session (one at a time: the evaluator runs one job per device)."""
        from kevin.evaluation.channel import JudgeChannel, Layout

        self.detach()
        module, model = self.task(msg["task"])
        layout = Layout.from_dict(msg["layout"])
        channel = JudgeChannel(msg["channel"], Path(msg["folder"]), layout, self.device)
        self.session = _Session(module, model, channel, int(msg.get("checks", 0)))
        return {"t": "attached"}

    def detach(self) -> dict[str, Any]:
        if self.session is not None:
            self.session.channel.close()
            self.session = None
        return {"t": "detached"}

    def prepare(self, msg: dict[str, Any]) -> dict[str, Any]:
        """Write one call's inputs, from a fresh secret seed, into the channel; then flush the cache. Until this
        returns the candidate's process cannot know them, and its begin mark is answered only after it."""
        from kevin.evaluation.inputs import make_inputs

        s = self._session()
        dist = str(msg.get("dist", "base"))
        seed = secrets.randbits(31)
        inputs = make_inputs(s.module, seed, dist, self.device)
        s.channel.write_inputs(inputs)
        s.current = (seed, dist, inputs)
        self.flush()
        return {"t": "prepared"}

    def flush(self) -> None:
        """Evict the last-level cache (the inputs just written too), as the baselines' protocol does before a call."""
        import torch

        if self.cfg.flush_l2:
            if self._flush is None:
                self._flush = torch.empty(max(self.cfg.resolved_flush_bytes // 4, 1), dtype=torch.float32, device=self.device)
            self._flush.fill_(float(secrets.randbits(8)))
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)

    def capture(self, msg: dict[str, Any]) -> dict[str, Any]:
        """Copy a call's outputs out of the channel now (its end mark arrived), then: ``check`` compares them with
        the reference at once (correctness trials); ``sample`` keeps them or not by reservoir sampling, in this
        process only, for ``verify``; ``none`` only copies (the calibration). Every mode copies the same bytes
        first, so how long a capture takes tells the candidate nothing about whether its call is checked."""
        s = self._session()
        mode = msg.get("mode")
        s.channel.copy_outputs(s.incoming)
        if mode == "none":
            s.current = None
            return {"t": "captured"}
        if s.current is None:
            raise ValueError("a capture without prepared inputs")
        seed, dist, inputs = s.current
        s.current = None
        if mode == "sample":
            s.sample(seed, dist)
            return {"t": "captured"}
        answer = self.compare(s, s.incoming, inputs, bool(msg.get("constant_check")))
        if msg.get("input_check") and not s.channel.inputs_equal(inputs):
            answer.update(ok=False, message="the forward modified its inputs in place", input_mutation=True)
        return answer

    def verify(self, msg: dict[str, Any]) -> dict[str, Any]:
        """Compare the sampled timed calls with the reference on their own inputs, rebuilt from their seeds."""
        from kevin.evaluation.inputs import make_inputs

        s = self._session()
        kept, s.kept, s.seen = s.kept, [], 0
        s.spare.extend(k[3] for k in kept)  # free for the next timed loop once compared (nothing captures meanwhile)
        for n, (call, seed, dist, outputs) in enumerate(sorted(kept, key=lambda k: k[0])):
            answer = self.compare(s, outputs, make_inputs(s.module, seed, dist, self.device), False)
            if answer["ok"] is not True or not answer["ref_finite"]:
                answer.update(call=call, checked=n + 1)
                return answer
        return {"t": "checked", "ok": True, "message": "", "checked": len(kept), "ref_finite": True}

    def compare(self, s: "_Session", got: list[Any], inputs: list[Any], constant_check: bool) -> dict[str, Any]:
        from kevin.evaluation.checks import _flatten_output, all_finite, compare_outputs, nearly_constant

        reference = _flatten_output(s.model(*inputs))
        answer: dict[str, Any] = {"t": "checked", "ok": False, "message": "", "max_abs": 0.0, "max_rel": 0.0,
                                  "ref_finite": all_finite(reference), "nearly_constant": constant_check and nearly_constant(reference)}
        if not answer["ref_finite"]:
            answer["ok"] = True  # the trial is skipped: the reference itself is not finite under these inputs
            return answer
        cmp = compare_outputs(list(got), reference, self.cfg.atol, self.cfg.rtol)
        answer.update(ok=cmp.ok, message=cmp.message, max_abs=cmp.max_abs_error, max_rel=cmp.max_rel_error)
        return answer

    def _session(self) -> "_Session":
        if self.session is None:
            raise ValueError("no job is attached")
        return self.session

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

    handlers = {"layout": judge.layout, "attach": judge.attach, "prepare": judge.prepare, "capture": judge.capture,
                "verify": judge.verify, "detach": lambda msg: judge.detach(), "baselines": judge.baselines}
    for msg in lines:
        kind = msg.get("t")
        if kind == "exit":
            break
        try:
            handler = handlers.get(kind)
            judge.answer(handler(msg) if handler else {"t": "error", "error": f"unknown command {kind!r}"})
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
        self.reader = protocol.LineReader(from_judge_r, name=f"judge-{device}")
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

    def call(self, message: dict[str, Any], answer: str) -> tuple[int, dict[str, Any]]:
        """``request`` for the calls of a timed loop: also the evaluator's clock when the answer arrived (ns)."""
        with self._lock:
            self.start()
            protocol.send(self._w, message)
            return self._await((answer,), self.timeout_s)

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
