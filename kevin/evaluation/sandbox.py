"""Running one harness job in its own process, with limits the candidate cannot lift.

This module is the parent's side: a fresh interpreter per job (``subprocess``, fork+exec, never a
fork of the evaluator's state) in its own session, a private temporary directory, a scrubbed
environment (an allow-list of variables: no tokens or credentials reach the candidate), wall-clock
deadlines that kill the whole process group, stdout/stderr kept only as bounded tails in memory (a
candidate printing gigabytes costs neither disk nor memory), a cgroup for process count and memory
where the platform allows (else polling), and two pipes for messages (protocol.py): the job's token
goes down one before any candidate code runs, and every line that comes back is stamped with the
evaluator's clock. Nothing the process says is a verdict by itself (runs.py and verdict.py decide).
The child applies the rest to itself first thing: see ``isolation.py`` for each layer, what it covers
and what it does not.
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kevin.evaluation import protocol
from kevin.evaluation.isolation import CgroupJob, SandboxConfig, make_spec
from kevin.records.target import KernelTarget

ENV_ALLOWLIST = (
    "PATH", "HOME", "LANG", "LC_ALL", "TMPDIR", "CUDA_HOME", "CUDA_PATH", "LD_LIBRARY_PATH", "CC", "CXX",
    "TORCH_CUDA_ARCH_LIST", "PYTHONPATH", "VIRTUAL_ENV", "OMP_NUM_THREADS", "MKL_NUM_THREADS",
    "NVIDIA_VISIBLE_DEVICES", "NVIDIA_DRIVER_CAPABILITIES", "OPENBLAS_CORETYPE", "OPENBLAS_L2_SIZE", "OMP_WAIT_POLICY",
)
OUTPUT_TAIL_BYTES = 8000


@dataclass
class ProcessEnd:
    """How one harness process ended."""

    exit_code: int
    """The exit status; negative: killed by that signal."""
    wall_seconds: float
    stdout_tail: str
    stderr_tail: str
    timed_out: bool = False
    memory_exceeded: bool = False
    processes_exceeded: bool = False

    def describe(self) -> str:
        """Why the process ended, in words (exit code or signal)."""
        import signal as signals

        if self.exit_code < 0:
            try:
                name = signals.Signals(-self.exit_code).name
            except ValueError:
                name = f"signal {-self.exit_code}"
            return f"killed by signal {name}"
        return f"exit code {self.exit_code}"


class Tail:
    """Reads a pipe to the end, keeping only its last ``limit`` bytes."""

    def __init__(self, stream, limit: int = OUTPUT_TAIL_BYTES):
        import threading

        self.data = b""
        self.total = 0
        self._limit = limit
        self._thread = threading.Thread(target=self._pump, args=(stream,), daemon=True)
        self._thread.start()

    def _pump(self, stream) -> None:
        while True:
            chunk = stream.read(65536)
            if not chunk:
                break
            self.total += len(chunk)
            self.data = (self.data + chunk)[-self._limit:]
        stream.close()

    def text(self) -> str:
        self._thread.join(timeout=5)
        cut = f"[{self.total - len(self.data)} earlier bytes dropped]\n" if self.total > len(self.data) else ""
        return cut + self.data.decode("utf-8", "replace")


def child_env(extra: dict[str, str]) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k in ENV_ALLOWLIST}
    repo = str(Path(__file__).resolve().parents[2])
    env["PYTHONPATH"] = os.pathsep.join(p for p in (repo, env.get("PYTHONPATH", "")) if p)
    env["PYTHONDONTWRITEBYTECODE"] = "1"
    env["PYTHONUNBUFFERED"] = "1"
    env.update(extra)
    return env


def _kill_group(proc: subprocess.Popen) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    proc.wait()


def _descendants(pid: int) -> list[Any]:
    try:
        import psutil

        proc = psutil.Process(pid)
        return [proc, *proc.children(recursive=True)]
    except Exception:  # gone between two polls
        return []


class HarnessJob:
    """One harness process and its two pipes.

    A *gated* job is started ahead of its turn: its process isolates itself, imports torch and creates
    its CUDA context and profiler, reports ``ready`` and waits, before any candidate code runs, until
    the evaluator sends ``start`` with the job's token. The set-up of the next candidate so overlaps the
    GPU work of the current one, and no two candidates ever use the device at once.
    """

    def __init__(self, job: dict[str, Any], memory_limit_mb: int, env_extra: dict[str, str] | None = None,
                 nice: int = 0, sandbox: SandboxConfig | None = None, backend: str = "cpu", read_only: list[str] | None = None,
                 writable: list[str] | None = None, cpu_seconds: int = 3600):
        self.sandbox = sandbox = sandbox or SandboxConfig()
        self.backend = backend
        self.target = KernelTarget.parse(backend)
        self.workdir = workdir = Path(tempfile.mkdtemp(prefix="kevin-job-"))
        os.chmod(workdir, 0o700)
        self.token = secrets.token_hex(32)
        self.cwd = workdir / "cwd"
        self.cwd.mkdir()
        self.staging = workdir / "stage"
        self.staging.mkdir()
        self.memory_bytes = memory_limit_mb * 1024 * 1024
        self.cgroup = CgroupJob(workdir.name, sandbox.max_processes, 0 if self.target.limits_address_space else self.memory_bytes) \
            if sandbox.cgroup != "off" else None
        spec = make_spec(sandbox, backend, str(workdir), self.memory_bytes, cpu_seconds, nice,
                         self.cgroup.procs_files if self.cgroup else [], read_only or [], writable or [])
        if self.cgroup and self.cgroup.note:
            spec["parent_notes"] = [self.cgroup.note]
        job_path = workdir / "job.json"
        job_path.write_text(json.dumps({**job, "sandbox": spec, "staging": str(self.staging)}))
        env = child_env({**(env_extra or {}), "TMPDIR": str(self.cwd), "CUDA_CACHE_PATH": str(workdir / "cuda-jit")})
        to_child_r, to_child_w = os.pipe()
        from_child_r, from_child_w = os.pipe()
        try:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "kevin.evaluation.harness", str(job_path), str(to_child_r), str(from_child_w)],
                stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE, cwd=self.cwd, env=env,
                start_new_session=True, close_fds=True, pass_fds=(to_child_r, from_child_w),
            )
        except BaseException:
            for fd in (to_child_r, to_child_w, from_child_r, from_child_w):
                os.close(fd)
            self._clean()
            raise
        os.close(to_child_r)
        os.close(from_child_w)
        self._w = to_child_w
        self.reader = protocol.LineReader(from_child_r, name="harness")
        self.out_tail, self.err_tail = Tail(self.proc.stdout), Tail(self.proc.stderr)
        self.started_at = time.monotonic()
        self.limit_hit = ""
        self.send({"t": "hello", "token": self.token})

    def send(self, message: dict[str, Any]) -> None:
        try:
            protocol.send(self._w, message)
        except (BrokenPipeError, OSError):  # the process is gone: the reader reports the end
            pass

    def start(self, extra: dict[str, Any] | None = None) -> None:
        """Hand the job its turn (gated jobs wait for this before any candidate code)."""
        self.send({**(extra or {}), "t": "start", "token": self.token})

    def next(self, deadline: float) -> protocol.Received | None:
        """The next message, or None at the deadline or when a limit was hit (``limit_hit`` says which)."""
        polled_pids = not (self.cgroup and self.cgroup.limits_pids)
        polled_memory = not self.target.limits_address_space and not (self.cgroup and self.cgroup.limits_memory)  # cpu has RLIMIT_AS
        while True:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return None
            item = self.reader.get(min(remaining, 0.05))
            if item is not None:
                return item
            if polled_pids or polled_memory:
                procs = _descendants(self.proc.pid)
                if polled_pids and len(procs) > self.sandbox.max_processes:
                    self.limit_hit = "processes"
                    return None
                if polled_memory and self.memory_bytes and sum(_safe_rss(p) for p in procs) > self.memory_bytes:
                    self.limit_hit = "memory"
                    return None

    def end(self, timed_out: bool = False, grace: float = 2.0) -> ProcessEnd:
        """Wait briefly for the process to exit by itself, then kill its group; how it ended. The job's
        folder stays until ``close``."""
        try:
            self.proc.wait(timeout=0 if (timed_out or self.limit_hit) else grace)
        except subprocess.TimeoutExpired:
            pass
        _kill_group(self.proc)  # whatever the candidate left running dies with its group
        if self.cgroup:
            self.cgroup.kill_all()
        return ProcessEnd(exit_code=self.proc.returncode if self.proc.returncode is not None else -9,
                          wall_seconds=time.monotonic() - self.started_at, stdout_tail=self.out_tail.text(),
                          stderr_tail=self.err_tail.text(), timed_out=timed_out,
                          memory_exceeded=self.limit_hit == "memory", processes_exceeded=self.limit_hit == "processes")

    def close(self) -> None:
        """Remove the job's folder (after ``end``; the evaluator may take the staging folder first)."""
        self._clean()

    def died(self) -> bool:
        return self.proc.poll() is not None

    def cancel(self) -> None:
        """End a job that will not be finished (e.g. the batch is stopping)."""
        _kill_group(self.proc)
        self._clean()

    def _clean(self) -> None:
        if self.cgroup:
            self.cgroup.kill_all()
            self.cgroup.remove()
            self.cgroup = None
        # Close our write end only once the reader has seen the end of the pipe, so a late message can never go
        # to a reused descriptor (if something outside the process group still holds the pipe, the descriptor is
        # left open rather than risk that).
        reader = getattr(self, "reader", None)
        if reader is None or reader.join(timeout=5):
            try:
                os.close(self._w)
            except (OSError, AttributeError):
                pass
        self._w = -1
        shutil.rmtree(self.workdir, ignore_errors=True)


def _safe_rss(proc: Any) -> int:
    try:
        return proc.memory_info().rss
    except Exception:  # exited meanwhile
        return 0
