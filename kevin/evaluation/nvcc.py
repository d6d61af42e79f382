"""nvcc's passes of one CUDA translation unit, run as two chains side by side instead of one after another.

nvcc compiles ``cuda.cu`` in passes it runs one at a time (``nvcc --dryrun`` lists them):
host chain   gcc -E (host) -> cudafe++ (front end: host code, the kernel stubs, the module id file)
device chain gcc -E (device) -> cicc (front end and optimiser: PTX) -> ptxas -> fatbinary
last         gcc -c on the host code, which includes the stub and the fatbinary
Each front end parses the whole translation unit with its pre-included torch header, so the two chains cost
about the same, and the only thing the device chain needs from the host chain is the module id: a name
unique to the translation unit that both front ends build symbol names from (anonymous namespaces, kernel
registration). cudafe++ writes it when told ``--gen_module_id_file``; without that flag it reads the file,
as cicc does. So we write the id ourselves (same form as nvcc's: ``_<hash>_<length of the file name>_<file
name>_<hash>``, here from the source's content), drop the flag, and run both chains at once; the last pass
waits for both. The object is nvcc's except for the id inside symbol names (tests/evaluation/test_nvcc_split.py
compares them, and that the kernels the host registers are the ones the device code defines).

Anything unexpected in the listing (another nvcc, other options, several translation units) means plain nvcc:
this is an optimisation, never a second compiler. Messages are nvcc's own: nvcc prints the failing pass's
output and stops, and the host chain runs first in nvcc, so a failure of the host chain is reported as it
is; a failure of the device chain only when the host chain succeeded.
"""

from __future__ import annotations

import hashlib
import os
import re
import shlex
import shutil
import subprocess
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

__all__ = ["NvccPasses", "module_id", "plan_passes", "run_nvcc"]

PASS_DIR = "nvcc-passes"
"""Folder (inside the build folder) for the passes' intermediate files; removed once the object is built."""

_ASSIGNMENT = re.compile(r"^([A-Za-z_][A-Za-z0-9_]*)=(.*)$")
_VARIABLE = re.compile(r"\$(?:\{([A-Za-z_][A-Za-z0-9_]*)\}|([A-Za-z_][A-Za-z0-9_]*))")
_SHELL = {"|", "||", "&&", ";", "&", ">", ">>", "<", "2>", "2>&1"}
_DEVICE_TOOLS = {"cicc", "ptxas", "fatbinary"}


@dataclass
class NvccPasses:
    """One nvcc command split into its passes (``plan_passes``)."""

    env: dict[str, str]
    """nvcc's environment for its passes (PATH with its own tools, CICC_PATH, ...) over ours."""
    host: list[list[str]]
    """Host preprocessing, then cudafe++ (reading the module id instead of writing it)."""
    device: list[list[str]]
    """Device preprocessing, cicc, ptxas, fatbinary (one of each per target architecture)."""
    last: list[str]
    """The host compile of cudafe++'s output into the object."""
    module_id_file: Path
    """Where both front ends read the module id."""


def module_id(file_name: str, text: str) -> str:
    """The module id of a translation unit, in nvcc's form, from its content (same source, same id)."""
    digest = hashlib.sha256(text.encode()).hexdigest()
    return f"_{digest[:8]}_{len(file_name)}_{re.sub(r'[^A-Za-z0-9]', '_', file_name)}_{digest[8:16]}"


def _tool(cmd: list[str]) -> str:
    return os.path.basename(cmd[0]) if cmd else ""


def _is_host_compiler(cmd: list[str]) -> bool:
    return bool(cmd) and re.fullmatch(r"(?:[\w.+-]*-)?(?:gcc|g\+\+|c\+\+|cc|clang|clang\+\+)(?:-\d+)?", _tool(cmd)) is not None


def _words(line: str, env: dict[str, str]) -> list[str] | None:
    """One listed command as argv ($VAR expanded from nvcc's environment), or None if it needs a shell."""
    expanded = _VARIABLE.sub(lambda m: env.get(m.group(1) or m.group(2), m.group(0)), line)
    try:
        words = shlex.split(expanded)
    except ValueError:
        return None
    if not words or any("$" in w or w in _SHELL for w in words):
        return None
    return words


def plan_passes(nvcc_cmd: list[str], folder: Path, timeout: float = 60.0) -> NvccPasses | None:
    """The passes of ``nvcc_cmd`` (one ``-c`` compile, run in ``folder``), or None when its listing is not the
    two-chain shape this module knows (then plain nvcc is run)."""
    keep = folder / PASS_DIR
    keep.mkdir(exist_ok=True)
    try:
        listing = subprocess.run([nvcc_cmd[0], "--dryrun", "--keep", "--keep-dir", PASS_DIR, *nvcc_cmd[1:]], cwd=folder,
                                 capture_output=True, text=True, timeout=timeout, errors="replace")
    except (OSError, subprocess.TimeoutExpired):
        return None
    if listing.returncode != 0:
        return None
    env = dict(os.environ)
    commands: list[list[str]] = []
    for line in (listing.stdout + listing.stderr).splitlines():
        if not line.startswith("#$ "):
            continue
        body = line[3:].strip()
        assignment = _ASSIGNMENT.match(body)
        if assignment and not commands:  # nvcc's settings come before its first pass
            try:
                env[assignment.group(1)] = " ".join(shlex.split(assignment.group(2)))
            except ValueError:
                return None
            continue
        words = _words(body, env)
        if words is None:
            return None
        if _tool(words) != "rm":  # --keep lists none; the pass folder is removed as a whole anyway
            commands.append(words)
    fronts = [i for i, c in enumerate(commands) if _tool(c) == "cudafe++"]
    if len(fronts) != 1 or len(commands) < 4:
        return None
    front = fronts[0]
    host, device, last = commands[:front + 1], commands[front + 1:-1], commands[-1]
    cudafe = host[-1]
    if "--gen_module_id_file" not in cudafe or "--module_id_file_name" not in cudafe:
        return None
    id_file = cudafe[cudafe.index("--module_id_file_name") + 1]
    if not (_is_host_compiler(last) and "-c" in last):
        return None
    if not all(_is_host_compiler(c) and "-E" in c for c in host[:-1]):
        return None
    if not device or not all(_tool(c) in _DEVICE_TOOLS or (_is_host_compiler(c) and "-E" in c) for c in device):
        return None
    if not any(_tool(c) == "cicc" and id_file in c for c in device):
        return None
    host[-1] = [w for w in cudafe if w != "--gen_module_id_file"]
    path = Path(id_file)
    return NvccPasses(env=env, host=host, device=device, last=last,
                      module_id_file=path if path.is_absolute() else folder / path)


def _chain(commands: list[list[str]], folder: Path, env: dict[str, str], deadline: float) -> tuple[int, str]:
    """Run commands one after another until one fails: (its return code, its output) or (0, '')."""
    for cmd in commands:
        try:
            proc = subprocess.run(cmd, cwd=folder, env=env, capture_output=True, text=True, errors="replace",
                                  timeout=max(1.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            return 1, f"the compiler did not finish in time: {os.path.basename(cmd[0])}"
        except OSError as exc:
            return 1, f"could not run {cmd[0]}: {exc}"
        if proc.returncode != 0:
            return proc.returncode, proc.stdout + proc.stderr
    return 0, ""


def run_nvcc(nvcc_cmd: list[str], folder: Path, timeout: float, split: bool = True,
             keep_passes: bool = False) -> tuple[int, str]:
    """Compile with ``nvcc_cmd`` in ``folder``: (return code, messages), as nvcc itself would give them.

    ``split``: run the host and device chains side by side (two processes at once) when the listing allows;
    ``keep_passes``: leave the intermediate files in ``folder/nvcc-passes`` (tests read them)."""
    deadline = time.monotonic() + timeout
    passes = plan_passes(nvcc_cmd, folder) if split else None
    if passes is None:
        shutil.rmtree(folder / PASS_DIR, ignore_errors=True)
        return _chain([nvcc_cmd], folder, dict(os.environ), deadline)
    try:
        source = folder / next((w for w in nvcc_cmd if w.endswith(".cu")), "cuda.cu")
        passes.module_id_file.write_text(module_id(source.name, source.read_text(errors="replace")))
        with ThreadPoolExecutor(max_workers=1) as pool:
            device = pool.submit(_chain, passes.device, folder, passes.env, deadline)
            host = _chain(passes.host, folder, passes.env, deadline)
            outcomes = (host, device.result())
        for outcome in outcomes:  # nvcc runs the host chain first and stops at the first failure
            if outcome[0] != 0:
                return outcome
        return _chain([passes.last], folder, passes.env, deadline)
    finally:
        if not keep_passes:
            shutil.rmtree(folder / PASS_DIR, ignore_errors=True)
