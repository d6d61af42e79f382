"""What this machine offers the evaluator: its GPUs, its CPU, and how many compile workers its cores hold.

Probed without touching CUDA in this process (nvidia-smi, /proc/cpuinfo): the evaluator itself never loads
CUDA, only its candidates' and judges' processes do.
"""

from __future__ import annotations

import os
import platform
import subprocess
from pathlib import Path

from kevin.records.target import KernelTarget


def gpu_info() -> tuple[list[str], str]:
    """(names of visible GPUs, compute capability like '9.0') without touching CUDA in this process."""
    try:
        out = subprocess.run(
            ["nvidia-smi", "--query-gpu=name,compute_cap", "--format=csv,noheader"],
            capture_output=True, text=True, timeout=30, check=True,
        ).stdout
    except (OSError, subprocess.SubprocessError):
        return [], ""
    rows = [[c.strip() for c in line.split(",")] for line in out.strip().splitlines() if line.strip()]
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible:
        ids = [int(x) for x in visible.split(",") if x.strip().isdigit()]
        rows = [rows[i] for i in ids if i < len(rows)]
    return [r[0] for r in rows], (rows[0][1] if rows and len(rows[0]) > 1 else "")


def cpu_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def machine(backend: str) -> tuple[list[str], str, str]:
    """(visible GPU names, CUDA arch, hardware name) of ``backend`` on this machine.

    The hardware name is part of every baseline key, so timings from another GPU or CPU are never reused.
    """
    if not KernelTarget.parse(backend).is_gpu:
        return [], "", cpu_name()
    names, arch = gpu_info()
    if not names:
        raise RuntimeError("backend 'cuda' needs a visible NVIDIA GPU (nvidia-smi found none); use --backend cpu")
    return names, os.environ.get("TORCH_CUDA_ARCH_LIST") or arch, names[0]


def default_compile_workers(n_devices: int, cores: int = 0) -> int:
    """Cores minus two per run worker (its Python process and the candidate's host code), at least one.

    Measured on the 16-core H200 box: 16 compile workers starved the run phase (about 40 s per
    candidate instead of about 10 s), so run workers keep cores of their own.
    """
    return max(1, (cores or os.cpu_count() or 2) - 2 * max(1, n_devices))


__all__ = ["cpu_name", "default_compile_workers", "gpu_info", "machine"]
