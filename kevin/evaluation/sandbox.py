"""Running one harness job in its own process, with limits the candidate cannot lift.

This module is the parent's side: a fresh interpreter per job (``subprocess``, fork+exec, never a
fork of the evaluator's state) in its own session, a private temporary directory, a scrubbed
environment (an allow-list of variables: no tokens or credentials reach the candidate), a wall-clock
timeout that kills the whole process group, stdout/stderr kept only as bounded tails in memory (a
candidate printing gigabytes costs neither disk nor memory), a cgroup for process count and memory
where the platform allows (else polling), and a verdict read from a file signed with a per-job token
that the harness takes from stdin before any candidate code runs (a missing or forged verdict is a
runtime error). The child applies the rest to itself first thing: see ``isolation.py`` for each
layer, what it covers and what it does not.
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

from kevin.evaluation.harness import read_signed
from kevin.evaluation.isolation import CgroupJob, SandboxConfig, make_spec

ENV_ALLOWLIST = (
    "PATH", "HOME", "LANG", "LC_ALL", "TMPDIR", "CUDA_HOME", "CUDA_PATH", "LD_LIBRARY_PATH", "CC", "CXX",
    "TORCH_CUDA_ARCH_LIST", "KEVIN_CACHE_DIR", "PYTHONPATH", "VIRTUAL_ENV", "OMP_NUM_THREADS", "MKL_NUM_THREADS",
    "NVIDIA_VISIBLE_DEVICES", "NVIDIA_DRIVER_CAPABILITIES", "OPENBLAS_CORETYPE", "OPENBLAS_L2_SIZE",
)
OUTPUT_TAIL_BYTES = 8000


@dataclass
class JobOutcome:
    """What came back from one harness process."""

    verdict: dict[str, Any] | None
    timed_out: bool
    exit_code: int
    wall_seconds: float
    stdout_tail: str
    stderr_tail: str
    memory_exceeded: bool = False
    processes_exceeded: bool = False


class _Tail:
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


def _child_env(extra: dict[str, str]) -> dict[str, str]:
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
    """One harness process, started; ``finish`` waits for (and judges) its end.

    A *gated* job is started ahead of its turn: its process isolates itself, imports torch and
    creates its CUDA context and profiler, then waits, before any candidate code runs, until
    ``finish`` hands it the device. The set-up of the next candidate so overlaps the GPU work of the
    current one, and no two candidates ever use the device at once. Its clocks start at the hand-over.
    """

    def __init__(self, job: dict[str, Any], timeout_s: float, memory_limit_mb: int, env_extra: dict[str, str] | None = None,
                 compile_timeout_s: float = 0.0, nice: int = 0, sandbox: SandboxConfig | None = None,
                 backend: str = "cpu", cache_dir: str = "", gated: bool = False):
        self.sandbox = sandbox = sandbox or SandboxConfig()
        self.timeout_s, self.compile_timeout_s, self.backend, self.gated = timeout_s, compile_timeout_s, backend, gated
        self.workdir = workdir = Path(tempfile.mkdtemp(prefix="kevin-job-"))
        os.chmod(workdir, 0o700)
        self.token = secrets.token_hex(32)
        self.result_path, job_path, self.marker = workdir / "result.json", workdir / "job.json", workdir / "compiled"
        run_dir = workdir / "cwd"
        run_dir.mkdir()
        self.memory_bytes = memory_limit_mb * 1024 * 1024
        self.cgroup = CgroupJob(workdir.name, sandbox.max_processes, self.memory_bytes if backend == "cuda" else 0) \
            if sandbox.cgroup != "off" else None
        cpu_seconds = int(3 * (timeout_s + compile_timeout_s)) + 60
        spec = make_spec(sandbox, backend, str(workdir), cache_dir or str(run_dir), self.memory_bytes, cpu_seconds, nice,
                         self.cgroup.procs_files if self.cgroup else [])
        if self.cgroup and self.cgroup.note:
            spec["parent_notes"] = [self.cgroup.note]
        job_path.write_text(json.dumps({**job, "result_path": str(self.result_path), "compiled_marker": str(self.marker),
                                        "sandbox": spec, "gated": gated}))
        env = _child_env({**(env_extra or {}), "TMPDIR": str(run_dir),
                          "CUDA_CACHE_PATH": str(Path(cache_dir or run_dir) / "cuda-jit")})
        try:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "kevin.evaluation.harness", str(job_path)],
                stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, cwd=run_dir, env=env,
                start_new_session=True, close_fds=True,
            )
        except BaseException:
            self._clean()
            raise
        self.died_before_go = False
        self.out_tail, self.err_tail = _Tail(self.proc.stdout), _Tail(self.proc.stderr)
        self._send(self.token.encode() + b"\n", close=not gated)

    def _send(self, data: bytes, close: bool) -> None:
        try:
            self.proc.stdin.write(data)
            self.proc.stdin.flush()
            if close:
                self.proc.stdin.close()
        except (BrokenPipeError, ValueError):  # the process is gone already: finish() reports it
            pass

    def finish(self) -> JobOutcome:
        """(Gated jobs: hand over the device now.) Wait for the end, within the limits; the outcome."""
        proc, sandbox, cgroup = self.proc, self.sandbox, self.cgroup
        if self.gated:
            # Ended before its turn (its set-up failed, or something killed it): the caller may retry.
            self.died_before_go = proc.poll() is not None
            self._send(b"go:" + self.token.encode() + b"\n", close=True)
        start = time.monotonic()  # a gated job's clocks start at the hand-over
        timed_out = memory_exceeded = too_many_processes = False
        polled_pids = not (cgroup and cgroup.limits_pids)
        polled_memory = self.backend == "cuda" and not (cgroup and cgroup.limits_memory)  # cpu has RLIMIT_AS
        try:
            deadline = start + (self.compile_timeout_s or self.timeout_s)
            run_clock_started = not self.compile_timeout_s
            while proc.poll() is None:
                if not run_clock_started and self.marker.exists():
                    run_clock_started = True
                    deadline = time.monotonic() + self.timeout_s
                if time.monotonic() > deadline:
                    timed_out = True
                    break
                if polled_pids or polled_memory:
                    procs = _descendants(proc.pid)
                    if polled_pids and len(procs) > sandbox.max_processes:
                        too_many_processes = True
                        break
                    if polled_memory and self.memory_bytes and sum(_safe_rss(p) for p in procs) > self.memory_bytes:
                        memory_exceeded = True
                        break
                time.sleep(0.05)
            _kill_group(proc)  # whatever the candidate left running dies with its group
            if cgroup:
                cgroup.kill_all()
            killed = timed_out or memory_exceeded or too_many_processes
            verdict = None if killed else read_signed(str(self.result_path), self.token.encode())
            return JobOutcome(
                verdict=verdict, timed_out=timed_out, exit_code=proc.returncode if proc.returncode is not None else -9,
                wall_seconds=time.monotonic() - start, stdout_tail=self.out_tail.text(), stderr_tail=self.err_tail.text(),
                memory_exceeded=memory_exceeded, processes_exceeded=too_many_processes,
            )
        finally:
            self._clean()

    def cancel(self) -> None:
        """End a job that will not be finished (e.g. the batch is stopping)."""
        _kill_group(self.proc)
        self._clean()

    def _clean(self) -> None:
        if self.cgroup:
            self.cgroup.kill_all()
            self.cgroup.remove()
            self.cgroup = None
        shutil.rmtree(self.workdir, ignore_errors=True)


def run_harness_job(
    job: dict[str, Any],
    timeout_s: float,
    memory_limit_mb: int,
    env_extra: dict[str, str] | None = None,
    compile_timeout_s: float = 0.0,
    nice: int = 0,
    sandbox: SandboxConfig | None = None,
    backend: str = "cpu",
    cache_dir: str = "",
) -> JobOutcome:
    """Run ``kevin.evaluation.harness`` on ``job`` in a fresh, limited, isolated process.

    With ``compile_timeout_s`` the job first gets that long to compile; the harness touches a marker
    file when compilation is over and ``timeout_s`` counts from then.
    """
    return HarnessJob(job, timeout_s, memory_limit_mb, env_extra, compile_timeout_s, nice, sandbox, backend, cache_dir).finish()


def _safe_rss(proc: Any) -> int:
    try:
        return proc.memory_info().rss
    except Exception:  # exited meanwhile
        return 0
