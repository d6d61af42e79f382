"""Running one harness job in its own process, with limits the candidate cannot lift.

What this layer covers:
- a fresh interpreter per job (``subprocess`` fork+exec, never a fork of the evaluator's state), in
  its own session (process group) so a timeout kills everything it started;
- a private temporary working directory, removed afterwards;
- a wall-clock timeout; a host-memory limit (``RLIMIT_AS`` on cpu, where address space is honest;
  resident-set polling on cuda, whose driver reserves huge address ranges); core dumps off;
- an environment without the evaluator's secrets: only an allow-list of variables is passed on;
- stdout/stderr captured to files and only their tails read back (a candidate printing megabytes
  costs disk, not memory);
- the verdict is read from a result file signed with a per-job token that the harness reads from
  stdin before any candidate code runs; a missing or forged result is a runtime error.
What it does not cover (see issue "Contain hostile candidates"): network and file-system isolation,
seccomp, a separate user. A candidate can still read files the evaluator's user can read.
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


def _tail(path: Path) -> str:
    try:
        size = path.stat().st_size
        with open(path, "rb") as handle:
            handle.seek(max(0, size - OUTPUT_TAIL_BYTES))
            return handle.read().decode("utf-8", "replace")
    except OSError:
        return ""


def _child_env(extra: dict[str, str]) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k in ENV_ALLOWLIST}
    repo = str(Path(__file__).resolve().parents[2])
    env["PYTHONPATH"] = os.pathsep.join(p for p in (repo, env.get("PYTHONPATH", "")) if p)
    env["PYTHONDONTWRITEBYTECODE"] = "1"
    env["PYTHONUNBUFFERED"] = "1"
    env.update(extra)
    return env


def _limits(memory_bytes: int, limit_address_space: bool, nice: int = 0):
    def apply() -> None:
        import resource

        if nice:
            os.nice(nice)
        resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
        if limit_address_space and memory_bytes > 0:
            resource.setrlimit(resource.RLIMIT_AS, (memory_bytes, memory_bytes))

    return apply


def _rss_bytes(pid: int) -> int:
    """Resident memory of a process group leader and its children (Linux /proc), best effort."""
    total = 0
    try:
        import psutil

        proc = psutil.Process(pid)
        for p in [proc, *proc.children(recursive=True)]:
            total += p.memory_info().rss
    except Exception:  # the process may be gone between the poll and the read
        return 0
    return total


def _kill_group(proc: subprocess.Popen) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    proc.wait()


def run_harness_job(
    job: dict[str, Any],
    timeout_s: float,
    memory_limit_mb: int,
    env_extra: dict[str, str] | None = None,
    limit_address_space: bool = True,
    compile_timeout_s: float = 0.0,
    nice: int = 0,
) -> JobOutcome:
    """Run ``kevin.evaluation.harness`` on ``job`` in a fresh, limited process.

    With ``compile_timeout_s`` the job first gets that long to compile; the harness touches a marker
    file when compilation is over and ``timeout_s`` counts from then.
    """
    workdir = Path(tempfile.mkdtemp(prefix="kevin-job-"))
    token = secrets.token_hex(32)
    result_path = workdir / "result.json"
    job_path = workdir / "job.json"
    marker = workdir / "compiled"
    job_path.write_text(json.dumps({**job, "result_path": str(result_path), "compiled_marker": str(marker)}))
    out_path, err_path = workdir / "stdout.txt", workdir / "stderr.txt"
    memory_bytes = memory_limit_mb * 1024 * 1024
    start = time.monotonic()
    timed_out = memory_exceeded = False
    run_dir = workdir / "cwd"
    run_dir.mkdir()
    try:
        with open(out_path, "wb") as out, open(err_path, "wb") as err:
            proc = subprocess.Popen(
                [sys.executable, "-m", "kevin.evaluation.harness", str(job_path)],
                stdin=subprocess.PIPE, stdout=out, stderr=err, cwd=run_dir,
                env=_child_env({**(env_extra or {}), "TMPDIR": str(run_dir)}),
                start_new_session=True, preexec_fn=_limits(memory_bytes, limit_address_space, nice), close_fds=True,
            )
            try:
                proc.stdin.write(token.encode() + b"\n")
                proc.stdin.close()
            except BrokenPipeError:
                pass
            deadline = start + (compile_timeout_s or timeout_s)
            run_clock_started = not compile_timeout_s
            while proc.poll() is None:
                if not run_clock_started and marker.exists():
                    run_clock_started = True
                    deadline = time.monotonic() + timeout_s
                if time.monotonic() > deadline:
                    timed_out = True
                    _kill_group(proc)
                    break
                if not limit_address_space and memory_bytes and _rss_bytes(proc.pid) > memory_bytes:
                    memory_exceeded = True
                    _kill_group(proc)
                    break
                time.sleep(0.05)
            # Children the candidate left behind die with the group.
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
        verdict = None if (timed_out or memory_exceeded) else read_signed(str(result_path), token.encode())
        return JobOutcome(
            verdict=verdict, timed_out=timed_out, exit_code=proc.returncode if proc.returncode is not None else -9,
            wall_seconds=time.monotonic() - start, stdout_tail=_tail(out_path), stderr_tail=_tail(err_path),
            memory_exceeded=memory_exceeded,
        )
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
