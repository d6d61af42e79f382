"""Building a candidate's inline extension: our own compile of what it passes to ``load_inline``.

Why not torch's own build: torch compiles the candidate's C++ and a generated pybind11 binding into one
translation unit, so the library references the Python C API whatever the candidate wrote, and a
candidate that reaches that API (even through macros and token pasting) can rewrite the interpreter it
runs in. Here the candidate's functions are registered as PyTorch operators (``kevin_ops.h``) and called
through ``torch.ops``: the library needs no Python symbol, so any it references is the candidate's own
and the evaluator refuses it (``symbols.py``).

The build, per ``load_inline`` call (an ``ExtensionRequest``):
- ``main.cpp``: the candidate's ``cpp_sources`` plus a table of its listed functions (``registration``),
  compiled -O3 against a narrow torch header (``kevin_lite.h``: the Tensor class, allocation ops, dispatch macros, TORCH_CHECK,
  the registration API) that the evaluator precompiles once (a PCH); lines including the heavy torch
  headers are blanked, not removed, so compiler messages keep the candidate's line numbers;
- ``cuda.cu`` (cuda backend): the candidate's ``cuda_sources``, with ``torch_lite.h`` pre-included;
- the operator registration itself (``torch::Library``) is an object of ours, ``kevin_glue.o``, compiled once per
  toolchain by the evaluator into the header folder (``ensure_glue``) and linked from there: the candidate's own
  objects are the only object files in the build folder, and they have no reason to call the registration
  API or the dispatcher, so the evaluator holds them to a strict list of what they may import (``symbols.py``);
- when either does not compile against the narrow headers, the same sources are built again against the
  full torch headers, and the compiler messages a policy reads are that build's (so a narrow header never
  decides a verdict);
- compilers run from the build directory on relative file names, so messages and cache keys hold no
  machine paths.
The ``Toolchain`` (compilers, include and library paths, flags) is detected by the trusted parent and
passed to build processes as data.

This module runs the build (the compile steps side by side, the link, the fallback) and prepares, once per
toolchain, what every build links; the parts it stands on live beside it: the request and the source text it
becomes (``build_sources.py``), the compilers and their command lines (``toolchain.py``), the pre-included
headers and their precompiled forms (``headers.py``).
"""

from __future__ import annotations

import logging
import os
import re
import shutil
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

from kevin.evaluation.build_sources import ExtensionRequest, blank_heavy_includes, own_flags, registration
from kevin.evaluation.headers import (ensure_full_only, ensure_glue, ensure_headers, fallback_needed, load_full_only,
                                      precompile, write_replacing)
from kevin.evaluation.nvcc import run_nvcc
from kevin.evaluation.toolchain import GLUE_OBJECT, Toolchain, run_compiler
from kevin.records.target import KernelTarget

MAX_COMPILE_JOBS = 3
"""The most compiler processes one build runs at once: the host unit, and nvcc's host and device passes
side by side (``nvcc.run_nvcc``), which it does only when given this many."""


class CompileFailure(Exception):
    """The sources did not compile; ``text`` holds the compiler's messages."""

    def __init__(self, text: str):
        super().__init__(text)
        self.text = text


LINK_BASELINE = "link_baseline.json"
"""What every library of the toolchain imports and holds whatever its candidate wrote (``ensure_link_baseline``)."""
_BASELINE_CPP = "torch::Tensor kevin_baseline_zero(torch::Tensor x);\n"
_BASELINE_CPU = "torch::Tensor kevin_baseline_zero(torch::Tensor x) { x.data_ptr<float>()[0] = 0.f; return x; }\n"
# A trivial honest kernel that touches the runtime calls kernels commonly make, so a static part of a runtime
# library the link pulls in for them is in the baseline too.
_BASELINE_CUDA = r"""
__global__ void kevin_baseline_fill(float* y, int n) { int i = blockIdx.x * blockDim.x + threadIdx.x; if (i < n) y[i] = 0.f; }
torch::Tensor kevin_baseline_zero(torch::Tensor x) {
  int device = 0;
  cudaGetDevice(&device);
  cudaMemsetAsync(x.data_ptr<float>(), 0, 4, 0);
  kevin_baseline_fill<<<1, 32>>>(x.data_ptr<float>(), 1);
  cudaMemcpyAsync(x.data_ptr<float>(), x.data_ptr<float>(), 4, cudaMemcpyDeviceToDevice, 0);
  cudaStreamSynchronize(0);
  cudaDeviceSynchronize();
  (void)cudaGetLastError();
  return x;
}
"""


def ensure_link_baseline(toolchain: Toolchain) -> str:
    """Build a trivial candidate's library with the toolchain's own commands into the header folder and write what
    it imports and holds (``symbols.LinkBaseline``) to ``LINK_BASELINE``, once per toolchain, on the trusted side.
    Returns '' or why not (then libraries are judged without a baseline: stricter, never looser)."""
    from kevin.evaluation.rules import load_rules
    from kevin.evaluation.symbols import LinkBaseline

    folder = Path(toolchain.pch_dir)
    target = folder / LINK_BASELINE
    if target.is_file():
        return ""
    cuda = KernelTarget.parse(toolchain.backend).is_gpu
    req = ExtensionRequest(name="kevin_link_baseline", cpp_sources=(_BASELINE_CPP if cuda else _BASELINE_CPU,),
                           cuda_sources=(_BASELINE_CUDA,) if cuda else (), functions=("kevin_baseline_zero",))
    out = folder / f"link_baseline.{os.getpid()}"  # evaluators of other processes may build it at once
    shutil.rmtree(out, ignore_errors=True)
    try:
        built = build_extension(req, toolchain, out, jobs=1)
    except CompileFailure as exc:
        return f"no link baseline: {str(exc)[-800:]}"
    baseline = LinkBaseline.of_library(out / req.dir_name(toolchain) / built.library, load_rules(None)["native_symbols"])
    write_replacing(target, baseline.to_json())
    shutil.rmtree(out, ignore_errors=True)
    return ""


def load_link_baseline(toolchain: Toolchain):  # -> symbols.LinkBaseline | None (imported late: no cycle)
    """The toolchain's ``LinkBaseline``, or None when ``ensure_link_baseline`` could not build one."""
    from kevin.evaluation.symbols import LinkBaseline

    path = Path(toolchain.pch_dir) / LINK_BASELINE
    return LinkBaseline.from_json(path.read_text()) if path.is_file() else None


def prepare_link(toolchain: Toolchain) -> None:
    """What every library's link needs, precompiled headers or not: our registration object (``ensure_glue``;
    without it no library links, so its failure is an error) and the link baseline (``ensure_link_baseline``;
    without it libraries are judged stricter, so its failure is a warning: a machine without the CUDA libraries
    still compiles objects)."""
    glue = ensure_glue(toolchain)
    if glue:
        raise RuntimeError(glue)
    baseline = ensure_link_baseline(toolchain)
    if baseline:
        logging.getLogger(__name__).warning("%s (libraries are judged without it)", baseline)


def prepare_headers(toolchain: Toolchain) -> str:
    """Write and precompile both headers into ``toolchain.pch_dir``, build our registration object
    (``ensure_glue``) and list the identifiers only the full headers declare (``fallback_needed``): once per
    toolchain, on the trusted evaluator side.

    Returns a note when something could not be prepared (builds then parse headers, slower).
    """
    import fcntl

    folder = Path(toolchain.pch_dir)
    ensure_headers(folder, toolchain.include_dirs)
    notes = []
    with open(folder / "pch.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        with ThreadPoolExecutor(max_workers=2) as pool:
            notes = [n for n in pool.map(lambda lite: precompile(toolchain, lite), (True, False)) if n]
        prepare_link(toolchain)  # after the narrow header is precompiled: the glue compiles in a second with it
        ensure_full_only(toolchain)
    return "; ".join(notes)


@dataclass
class BuildResult:
    """Where a request's library was built, and how long it took."""

    library: str
    """Path of the shared library, relative to the request's own folder (``lite/NAME.so`` or ``full/NAME.so``)."""
    path: str
    """``lite`` (narrow headers) or ``full`` (the narrow headers did not suffice)."""
    seconds: float = 0.0
    kernels: list[str] = field(default_factory=list)


def compile_objects(req: ExtensionRequest, toolchain: Toolchain, folder: Path, lite: bool, jobs: int = 2,
                    timeout: float = 600.0) -> tuple[list[str], str]:
    """Write and compile the translation units of one variant in ``folder``: (object files, '' or the
    compiler's messages)."""
    folder.mkdir(parents=True, exist_ok=True)
    if not Path(toolchain.glue_object()).is_file():
        raise RuntimeError(f"the registration object {GLUE_OBJECT} is missing from {toolchain.pch_dir}: the evaluator "
                           "builds it (headers.ensure_glue, part of builder.prepare_headers) before any compile")
    namespace = req.op_namespace(toolchain)
    main = "\n".join(blank_heavy_includes(s) for s in req.cpp_sources)
    (folder / "main.cpp").write_text(main + "\n" + registration(namespace, req.functions))
    host = [toolchain.cxx, *toolchain.cxx_flags(lite), *own_flags(req.extra_cflags), "-c", "main.cpp", "-o", "main.o"]
    steps: list[Callable[[], tuple[int, str]]] = [lambda: run_compiler(host, folder, timeout)]
    objects = ["main.o"]
    if req.with_cuda:
        (folder / "cuda.cu").write_text("\n".join(blank_heavy_includes(s) for s in req.cuda_sources) + "\n")
        nvcc = toolchain.nvcc_command(lite, own_flags(req.extra_cuda_cflags))
        # nvcc's host and device chains side by side when there are cores for them beside the host unit.
        steps.append(lambda: run_nvcc(nvcc, folder, timeout, split=jobs >= MAX_COMPILE_JOBS))
        objects.append("cuda.o")
    with ThreadPoolExecutor(max_workers=max(1, min(jobs, len(steps)))) as pool:
        outcomes = list(pool.map(lambda step: step(), steps))
    return objects, "\n".join(text for rc, text in outcomes if rc != 0)


def _build_variant(req: ExtensionRequest, toolchain: Toolchain, folder: Path, lite: bool, jobs: int, timeout: float) -> str:
    """Compile and link one variant into ``folder``; '' on success, else the compiler's messages."""
    objects, errors = compile_objects(req, toolchain, folder, lite, jobs, timeout)
    if errors:
        return errors
    rc, text = run_compiler(toolchain.link_command(objects, req.name, own_flags(req.extra_ldflags)), folder, timeout)
    return "" if rc == 0 else text


def build_extension(req: ExtensionRequest, toolchain: Toolchain, out_dir: Path, jobs: int = 2,
                    timeout: float = 600.0) -> BuildResult:
    """Build ``req`` under ``out_dir/<name>_<key>/``; raise CompileFailure with the messages a policy reads."""
    start = time.perf_counter()
    root = out_dir / req.dir_name(toolchain)
    errors = _build_variant(req, toolchain, root / "lite", True, jobs, timeout)
    if not errors:
        return BuildResult(library=f"lite/{req.name}.so", path="lite", seconds=time.perf_counter() - start)
    full_only = load_full_only(toolchain)
    if full_only is not None and not fallback_needed(errors, full_only):
        raise CompileFailure(errors)
    # The narrow headers may lack something an honest kernel uses: the full headers decide.
    errors = _build_variant(req, toolchain, root / "full", False, jobs, timeout)
    if errors:
        raise CompileFailure(errors)
    return BuildResult(library=f"full/{req.name}.so", path="full", seconds=time.perf_counter() - start)


def find_library(ext_root: Path, req: ExtensionRequest, toolchain: Toolchain) -> Path | None:
    """The built library of ``req`` under ``ext_root`` (a read-only cache folder), or None."""
    root = ext_root / req.dir_name(toolchain)
    for variant in ("lite", "full"):
        path = root / variant / f"{req.name}.so"
        if path.is_file():
            return path
    return None


def compile_error_lines(text: str, limit: int = 40) -> str:
    """The lines of a build log that a person (or a policy) needs: errors and their context."""
    lines = text.splitlines()
    keep = [i for i, line in enumerate(lines) if re.search(r"\berror\b|error:|Error", line)]
    if not keep:
        return "\n".join(lines[-limit:])
    chosen: list[str] = []
    seen: set[int] = set()
    for i in keep:
        for j in range(max(0, i - 1), min(len(lines), i + 3)):
            if j not in seen:
                seen.add(j)
                chosen.append(lines[j])
        if len(chosen) >= limit:
            break
    return "\n".join(chosen[:limit])
