"""Building a candidate's inline extension: our own compile of what it passes to ``load_inline``.

Why not torch's own build: torch compiles the candidate's C++ and a generated pybind11 binding into one
translation unit, so the library references the Python C API whatever the candidate wrote, and a
candidate that reaches that API (even through macros and token pasting) can rewrite the interpreter it
runs in. Here the candidate's functions are registered as PyTorch operators (``kevin_ops.h``) and called
through ``torch.ops``: the library needs no Python symbol, so any it references is the candidate's own
and the evaluator refuses it (``symbols.py``).

The build, per ``load_inline`` call (an ``ExtensionRequest``):
- ``main.cpp``: the candidate's ``cpp_sources`` plus the operator registration, compiled -O2 against a
  narrow torch header (``kevin_lite.h``: the Tensor class, allocation ops, dispatch macros, TORCH_CHECK,
  the registration API) that the evaluator precompiles once (a PCH); lines including the heavy torch
  headers are blanked, not removed, so compiler messages keep the candidate's line numbers;
- ``cuda.cu`` (cuda backend): the candidate's ``cuda_sources``, with ``torch_lite.h`` pre-included;
- when either does not compile against the narrow headers, the same sources are built again against the
  full torch headers, and the compiler messages a policy reads are that build's (so a narrow header never
  decides a verdict);
- compilers run from the build directory on relative file names, so messages and cache keys hold no
  machine paths.
The ``Toolchain`` (compilers, include and library paths, flags) is detected by the trusted parent and
passed to build processes as data.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kevin.evaluation.nvcc import run_nvcc

BUILDER_VERSION = "kevin-build-3"
MAX_COMPILE_JOBS = 3
"""The most compiler processes one build runs at once: the host unit, and nvcc's host and device passes
side by side (``nvcc.run_nvcc``), which it does only when given this many."""
OPT_FLAGS = ("-O3", "-fopenmp")
"""Code generation of the host translation unit: optimised (torch's own JIT build passes no -O, i.e. -O0,
which made every honest C++ kernel look far slower than PyTorch eager), and OpenMP available, the natural way
to write a parallel CPU kernel (its thread count is the evaluator's, OMP_NUM_THREADS = EvalConfig.cpu_threads,
the same as PyTorch eager's in the baseline)."""
HERE = Path(__file__).resolve().parent
OPS_HEADER = HERE / "kevin_ops.h"
LITE_HEADER = HERE / "torch_lite.h"
CUDA_LITE = "kevin_cuda_lite.h"
"""The narrow header as nvcc pre-includes it: ``torch_lite.h`` with its op headers slimmed (``lite_torch_text``),
written next to the precompiled headers (nvcc cannot use a gcc precompiled header)."""

# Lines that include the heavy torch headers; blanked in favour of the pre-included ones.
HEAVY_INCLUDE = re.compile(r'^[ \t]*#[ \t]*include[ \t]*[<"](?:torch/extension\.h|torch/types\.h|torch/torch\.h|torch/all\.h|'
                           r'ATen/ATen\.h)[>"][^\n]*$', re.M)
# Kernel attributes that take parentheses and may stand anywhere between ``__global__`` and the name
# (``__global__ void __launch_bounds__(256) k(...)`` is as common as the other order).
_KERNEL_ATTRIBUTE = re.compile(
    r"\b(?:__launch_bounds__|__cluster_dims__|__maxnreg__|__attribute__|__declspec|alignas)\s*\((?:[^()]|\((?:[^()]|\([^()]*\))*\))*\)"
    r"|\[\[.*?\]\]"
)
_COMMENT = re.compile(r"//[^\n]*|/\*.*?\*/", re.S)
_GLOBAL_KERNEL = re.compile(r"__global__\s+(?:[\w:<>,\s\*&]+?\s+)?(\w+)\s*\(")
_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,99}$")
_FUNCTION = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*(?:::[A-Za-z_][A-Za-z0-9_]*)*$")


class RequestError(ValueError):
    """What a candidate passed to ``load_inline`` is not something the evaluator builds."""


class CompileFailure(Exception):
    """The sources did not compile; ``text`` holds the compiler's messages."""

    def __init__(self, text: str):
        super().__init__(text)
        self.text = text


def _strings(value: Any, what: str) -> list[str]:
    if value is None:
        return []
    if isinstance(value, str):
        return [value]
    if isinstance(value, (list, tuple)) and all(isinstance(v, str) for v in value):
        return list(value)
    raise RequestError(f"load_inline: {what} must be a string or a list of strings")


@dataclass(frozen=True)
class ExtensionRequest:
    """One ``load_inline`` call as plain data: what to build, nothing about where."""

    name: str
    cpp_sources: tuple[str, ...] = ()
    cuda_sources: tuple[str, ...] = ()
    functions: tuple[str, ...] = ()
    extra_cflags: tuple[str, ...] = ()
    extra_cuda_cflags: tuple[str, ...] = ()
    extra_ldflags: tuple[str, ...] = ()

    @classmethod
    def from_call(cls, params: dict[str, Any]) -> "ExtensionRequest":
        """Validate the keyword arguments of a ``load_inline`` call (all of them bound by name)."""
        name = params.get("name")
        if not isinstance(name, str) or not _NAME.match(name):
            raise RequestError("load_inline: name must be a plain identifier (letters, digits, _)")
        functions = params.get("functions")
        if isinstance(functions, dict):
            functions = list(functions)
        functions = _strings(functions, "functions")
        if not functions:
            raise RequestError("load_inline: list the C++ functions to call from Python in functions=[...]")
        bad = [f for f in functions if not _FUNCTION.match(f)]
        if bad:
            raise RequestError(f"load_inline: {bad[0]!r} is not a C++ function name")
        for unsupported in ("sycl_sources", "extra_include_paths", "extra_sycl_cflags"):
            if params.get(unsupported):
                raise RequestError(f"load_inline: {unsupported} is not supported")
        return cls(name=name, cpp_sources=tuple(_strings(params.get("cpp_sources"), "cpp_sources")),
                   cuda_sources=tuple(_strings(params.get("cuda_sources"), "cuda_sources")), functions=tuple(functions),
                   extra_cflags=tuple(_strings(params.get("extra_cflags"), "extra_cflags")),
                   extra_cuda_cflags=tuple(_strings(params.get("extra_cuda_cflags"), "extra_cuda_cflags")),
                   extra_ldflags=tuple(_strings(params.get("extra_ldflags"), "extra_ldflags")))

    @property
    def with_cuda(self) -> bool:
        return bool(self.cuda_sources)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "ExtensionRequest":
        return cls(**{k: tuple(v) if isinstance(v, list) else v for k, v in data.items()})

    def digest(self, toolchain: "Toolchain") -> str:
        """Content key: the request and everything of the toolchain that shapes the library."""
        payload = json.dumps({"request": self.to_dict(), "toolchain": toolchain.key}, sort_keys=True)
        return hashlib.sha256(payload.encode()).hexdigest()[:24]

    def dir_name(self, toolchain: "Toolchain") -> str:
        return f"{self.name}_{self.digest(toolchain)}"

    def op_namespace(self, toolchain: "Toolchain") -> str:
        """The torch.ops namespace the library registers its functions under."""
        return f"kevin_{self.digest(toolchain)}"


# ----------------------------------------------------------------------------------------- toolchain


def _cxx_standard() -> str:
    """The C++ standard this torch builds extensions with (c++20 from 2.10 on, c++17 before)."""
    from torch.utils import cpp_extension

    try:
        import inspect

        text = inspect.getsource(cpp_extension._write_ninja_file_to_build_library)
    except (OSError, TypeError, AttributeError):
        return "c++17"
    return "c++20" if "-std=c++20" in text else "c++17"


def _paths(fn: Any, device: str) -> list[str]:
    try:
        return list(fn(device))
    except TypeError:  # older torch: include_paths(cuda: bool)
        return list(fn(device == "cuda"))


@dataclass(frozen=True)
class Toolchain:
    """The compilers, paths and flags builds use on this machine (detected by the trusted evaluator)."""

    backend: str
    cxx: str
    nvcc: str
    std: str
    include_dirs: tuple[str, ...]
    lib_dirs: tuple[str, ...]
    define_flags: tuple[str, ...]
    nvcc_flags: tuple[str, ...]
    arch_flags: tuple[str, ...]
    torch_version: str
    pch_dir: str = ""
    """Folder holding ``kevin_lite.h`` (with its precompiled form), ``kevin_full.h`` and ``kevin_cuda_lite.h``
    (``ensure_headers``)."""

    @classmethod
    def detect(cls, backend: str, pch_dir: str) -> "Toolchain":
        import torch
        from torch.utils import cpp_extension

        device = "cuda" if backend == "cuda" else "cpu"
        try:
            includes = _paths(cpp_extension.include_paths, device)
            libs = _paths(cpp_extension.library_paths, device)
        except OSError:
            # torch's "cuda" variants insist on CUDA_HOME even where nvcc is on PATH (e.g. a CPU build of torch
            # compiling CUDA sources for checks): torch's own folders, and the toolkit's added below.
            includes = _paths(cpp_extension.include_paths, "cpu")
            libs = _paths(cpp_extension.library_paths, "cpu")
        defines = []
        if hasattr(torch._C, "_GLIBCXX_USE_CXX11_ABI"):
            defines.append(f"-D_GLIBCXX_USE_CXX11_ABI={int(torch._C._GLIBCXX_USE_CXX11_ABI)}")
        nvcc, nvcc_flags, arch = "", (), ()
        if backend == "cuda":
            cuda_home = getattr(cpp_extension, "CUDA_HOME", None) or os.environ.get("CUDA_HOME") or "/usr/local/cuda"
            nvcc = os.path.join(cuda_home, "bin", "nvcc")
            if not os.path.exists(nvcc):
                nvcc = shutil.which("nvcc") or nvcc
                cuda_home = str(Path(nvcc).resolve().parents[1])
            includes.append(os.path.join(cuda_home, "include"))
            lib64 = os.path.join(cuda_home, "lib64")
            libs.append(lib64 if os.path.isdir(lib64) else os.path.join(cuda_home, "lib"))
            nvcc_flags = tuple(cpp_extension.COMMON_NVCC_FLAGS)
            arch = tuple(cpp_extension._get_cuda_arch_flags([]))
        cxx = os.environ.get("CXX") or "c++"
        return cls(backend=backend, cxx=cxx, nvcc=nvcc, std=_cxx_standard(),
                   include_dirs=tuple(dict.fromkeys(p for p in includes if p)), lib_dirs=tuple(dict.fromkeys(libs)),
                   define_flags=tuple(defines), nvcc_flags=nvcc_flags, arch_flags=arch,
                   torch_version=torch.__version__, pch_dir=pch_dir)

    @property
    def key(self) -> str:
        """What of the toolchain shapes a library (paths excluded: a copied cache stays valid)."""
        fields = {"v": BUILDER_VERSION, "opt": OPT_FLAGS, "backend": self.backend, "std": self.std, "defines": self.define_flags,
                  "nvcc_flags": self.nvcc_flags, "arch": self.arch_flags, "torch": self.torch_version,
                  "headers": _headers_digest(), "py": sys.version_info[:2]}
        return hashlib.sha256(json.dumps(fields, sort_keys=True, default=str).encode()).hexdigest()[:16]

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "Toolchain":
        return cls(**{k: tuple(v) if isinstance(v, list) else v for k, v in data.items()})

    def cxx_flags(self, lite: bool) -> list[str]:
        """Flags of the host translation unit (without the candidate's own)."""
        flags = [*self.define_flags, *(f"-isystem{d}" for d in self.include_dirs), "-fPIC", f"-std={self.std}", *OPT_FLAGS]
        header = "kevin_lite.h" if lite else "kevin_full.h"
        return flags + [f"-I{self.header_dir(lite)}", "-include", header]

    def header_dir(self, lite: bool) -> str:
        """Where the evaluator wrote ``kevin_lite.h`` (and its precompiled form) and ``kevin_full.h``."""
        return self.pch_dir

    def nvcc_command(self, lite: bool, extra: list[str]) -> list[str]:
        slim = Path(self.pch_dir) / CUDA_LITE if self.pch_dir else None
        narrow = str(slim) if slim is not None and slim.is_file() else str(LITE_HEADER)
        pre = ["-include", narrow] if lite else \
            ["-include", "torch/all.h", "-include", "cuda.h", "-include", "cuda_runtime.h"]
        isystem = [part for d in self.include_dirs for part in ("-isystem", d)]  # nvcc wants them apart
        return [self.nvcc, *self.define_flags, *isystem, *self.nvcc_flags,
                *self.arch_flags, "--compiler-options", "-fPIC", f"-std={self.std}", *pre, *extra,
                "-c", "cuda.cu", "-o", "cuda.o"]

    def link_command(self, objects: list[str], name: str, extra: list[str]) -> list[str]:
        libs = ["-lc10", "-ltorch_cpu", "-ltorch"]
        if self.backend == "cuda":
            libs = ["-lc10", "-lc10_cuda", "-ltorch_cpu", "-ltorch_cuda", "-ltorch", "-lcudart"]
        return [self.cxx, *objects, "-shared", "-fopenmp", *(f"-L{d}" for d in self.lib_dirs), *libs, *extra, "-o", f"{name}.so"]


def _headers_digest() -> str:
    text = "".join(p.read_text() for p in (OPS_HEADER, LITE_HEADER))
    return hashlib.sha256(text.encode()).hexdigest()[:12]


_OPS_INCLUDE = re.compile(r"^[ \t]*#[ \t]*include[ \t]*<ATen/ops/(\w+)\.h>[ \t]*$", re.M)
_INCLUDE_LINE = re.compile(r"^[ \t]*#[ \t]*(?:include\b|pragma[ \t]+once)[^\n]*$", re.M)


def lite_torch_text(include_dirs: tuple[str, ...] | list[str] = ()) -> str:
    """``torch_lite.h`` with each ``#include <ATen/ops/X.h>`` replaced by that header's own wrappers.

    ``ATen/ops/empty.h`` and its kind hold a few inline functions (``at::empty(...)`` calling
    ``at::_ops::empty_memory_format::call``) after includes of ``ATen/Context.h``, ``ATen/DeviceGuard.h``,
    ``ATen/TensorUtils.h`` and more, which the functions do not use and which are more than half of the narrow
    header's parse time, paid by gcc, cudafe++ and cicc alike (measured: nvcc on a relu kernel 23.3 s -> 11.8 s on
    two cores). Each include becomes ``ATen/ops/X_ops.h`` (the operator's declaration) plus the functions, read
    from the installed torch, so they are always that torch's own. An op header not found keeps its include."""
    def expand(match: re.Match[str]) -> str:
        name = match.group(1)
        for folder in include_dirs:
            path = Path(folder) / "ATen" / "ops" / f"{name}.h"
            if path.is_file():
                body = _INCLUDE_LINE.sub("", path.read_text(errors="replace"))
                return f"#include <ATen/ops/{name}_ops.h>\n{body}"
        return match.group(0)

    text = LITE_HEADER.read_text()
    # The wrappers take TensorOptions and call its helpers: declared by c10/core/TensorOptions.h.
    text = text.replace("#include <ATen/core/Tensor.h>\n", "#include <ATen/core/Tensor.h>\n#include <c10/core/TensorOptions.h>\n", 1)
    return _OPS_INCLUDE.sub(expand, text)


def header_text(lite: bool, include_dirs: tuple[str, ...] | list[str] = ()) -> str:
    """The header pre-included into the host translation unit: narrow (lite, its op headers slimmed from
    ``include_dirs``) or full torch, plus the operator registration helpers."""
    torch_part = lite_torch_text(include_dirs) if lite else "#include <torch/all.h>\n"
    return "#pragma once\n" + torch_part + "\n" + OPS_HEADER.read_text()


def ensure_headers(folder: Path, include_dirs: tuple[str, ...] | list[str] = ()) -> None:
    """Write ``kevin_lite.h``, ``kevin_full.h`` and ``kevin_cuda_lite.h`` into ``folder`` (idempotent)."""
    folder.mkdir(parents=True, exist_ok=True)
    texts = {"kevin_lite.h": header_text(True, include_dirs), "kevin_full.h": header_text(False, include_dirs),
             CUDA_LITE: "#pragma once\n" + lite_torch_text(include_dirs)}
    for name, text in texts.items():
        path = folder / name
        if not path.exists() or path.read_text() != text:
            tmp = path.with_suffix(f".{os.getpid()}.tmp")
            tmp.write_text(text)
            os.replace(tmp, path)


def _precompile(toolchain: Toolchain, lite: bool) -> str:
    header = "kevin_lite.h" if lite else "kevin_full.h"
    folder = Path(toolchain.pch_dir)
    gch, stamp = folder / f"{header}.gch", folder / f"{header}.stamp"
    # The folder's own path is left out, so a cache copied elsewhere keeps its precompiled headers (gcc checks
    # the flags that shape the code itself, and parses the header instead when they do not match).
    signature = json.dumps([f.replace(str(folder), "<headers>") for f in toolchain.cxx_flags(lite)])
    if gch.exists() and stamp.exists() and stamp.read_text() == signature:
        return ""
    flags = [f for f in toolchain.cxx_flags(lite) if f not in ("-include", header)]
    tmp = folder / f"{header}.gch.{os.getpid()}"
    rc, text = _run([toolchain.cxx, *flags, "-x", "c++-header", header, "-o", tmp.name], folder, 900)
    if rc != 0:
        tmp.unlink(missing_ok=True)
        return f"no precompiled {header}: {text.strip()[-500:]}"
    os.replace(tmp, gch)
    stamp.write_text(signature)
    return ""


_IDENTIFIER = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


def _identifiers(toolchain: Toolchain, lite: bool) -> set[str]:
    header = "kevin_lite.h" if lite else "kevin_full.h"
    flags = [f for f in toolchain.cxx_flags(lite) if f not in ("-include", header, *OPT_FLAGS)]
    rc, text = _run([toolchain.cxx, *flags, "-E", "-P", "-x", "c++", header], Path(toolchain.pch_dir), 900)
    return set(_IDENTIFIER.findall(text)) if rc == 0 else set()


def prepare_headers(toolchain: Toolchain) -> str:
    """Write and precompile both headers into ``toolchain.pch_dir`` and list the identifiers only the
    full headers declare (``fallback_needed``): once per toolchain, on the trusted evaluator side.

    Returns a note when something could not be prepared (builds then parse headers, slower).
    """
    import fcntl

    folder = Path(toolchain.pch_dir)
    ensure_headers(folder, toolchain.include_dirs)
    notes = []
    with open(folder / "pch.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        with ThreadPoolExecutor(max_workers=2) as pool:
            notes = [n for n in pool.map(lambda lite: _precompile(toolchain, lite), (True, False)) if n]
        listing = folder / "full_only_identifiers.txt"
        if not listing.exists():
            full_only = _identifiers(toolchain, False) - _identifiers(toolchain, True)
            if toolchain.backend == "cuda":
                full_only |= _cuda_header_identifiers(toolchain)
            tmp = listing.with_suffix(f".{os.getpid()}.tmp")
            tmp.write_text("\n".join(sorted(full_only)))
            os.replace(tmp, listing)
    return "; ".join(notes)


def _cuda_header_identifiers(toolchain: Toolchain) -> set[str]:
    """Names from cuda.h (the driver API): in a CUDA file the full path pre-includes it, the narrow one not."""
    for folder in toolchain.include_dirs:
        path = Path(folder) / "cuda.h"
        if path.is_file():
            return set(_IDENTIFIER.findall(path.read_text(errors="replace")))
    return set()


_QUOTED = re.compile(r"[\u2018'\"`]([^\u2019'\"`\n]{1,200})[\u2019'\"`]")


def fallback_needed(errors: str, full_only: set[str]) -> bool:
    """Could these compiler messages of the narrow build be the narrow headers' doing?

    True when a quoted name in them (gcc quotes with \u2018...\u2019, nvcc with "...") is one that only the
    full torch headers (or, for CUDA, cuda.h) declare: then the full build decides. Otherwise the errors
    are the candidate's own and the full build would report the same lines, so it is skipped.
    """
    for quoted in _QUOTED.findall(errors):
        if any(name in full_only for name in _IDENTIFIER.findall(quoted)):
            return True
    return False


def load_full_only(toolchain: Toolchain) -> set[str] | None:
    """The identifiers ``prepare_headers`` listed; None when there is no listing (always fall back)."""
    try:
        return set((Path(toolchain.pch_dir) / "full_only_identifiers.txt").read_text().split())
    except OSError:
        return None


# --------------------------------------------------------------------------------------------- build


def blank_heavy_includes(source: str) -> str:
    """The source with heavy torch includes replaced by empty lines (line numbers unchanged)."""
    return HEAVY_INCLUDE.sub("", source)


def registration(namespace: str, functions: tuple[str, ...]) -> str:
    """The block appended to main.cpp that registers ``functions`` as operators of ``namespace``."""
    lines = [f"TORCH_LIBRARY({namespace}, m) {{"]
    for fn in functions:
        lines.append(f'  m.def("{fn.split("::")[-1]}", &kevin_ops::Adapter<&{fn}>::call);')
    lines.append("}")
    return "\n".join(lines) + "\n"


@dataclass
class BuildResult:
    """Where a request's library was built, and how long it took."""

    library: str
    """Path of the shared library, relative to the request's own folder (``lite/NAME.so`` or ``full/NAME.so``)."""
    path: str
    """``lite`` (narrow headers) or ``full`` (the narrow headers did not suffice)."""
    seconds: float = 0.0
    kernels: list[str] = field(default_factory=list)


def _run(cmd: list[str], cwd: Path, timeout: float) -> tuple[int, str]:
    try:
        proc = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, timeout=timeout, errors="replace")
    except subprocess.TimeoutExpired:
        return 1, f"the compiler did not finish within {timeout:.0f} s: {shlex.join(cmd[:1])}"
    except OSError as exc:
        return 1, f"could not run {cmd[0]}: {exc}"
    return proc.returncode, (proc.stdout + proc.stderr)


def compile_objects(req: ExtensionRequest, toolchain: Toolchain, folder: Path, lite: bool, jobs: int = 2,
                    timeout: float = 600.0) -> tuple[list[str], str]:
    """Write and compile the translation units of one variant in ``folder``: (object files, '' or the
    compiler's messages)."""
    folder.mkdir(parents=True, exist_ok=True)
    namespace = req.op_namespace(toolchain)
    main = "\n".join(blank_heavy_includes(s) for s in req.cpp_sources)
    (folder / "main.cpp").write_text(main + "\n" + registration(namespace, req.functions))
    host = [toolchain.cxx, *toolchain.cxx_flags(lite), *req.extra_cflags, "-c", "main.cpp", "-o", "main.o"]
    steps: list[Callable[[], tuple[int, str]]] = [lambda: _run(host, folder, timeout)]
    objects = ["main.o"]
    if req.with_cuda:
        (folder / "cuda.cu").write_text("\n".join(blank_heavy_includes(s) for s in req.cuda_sources) + "\n")
        nvcc = toolchain.nvcc_command(lite, list(req.extra_cuda_cflags))
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
    rc, text = _run(toolchain.link_command(objects, req.name, list(req.extra_ldflags)), folder, timeout)
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


def kernel_names(cuda_sources: list[str]) -> list[str]:
    """Names of the ``__global__`` functions defined in CUDA sources."""
    names: list[str] = []
    for source in cuda_sources:
        plain = _KERNEL_ATTRIBUTE.sub(" ", _COMMENT.sub(" ", source))
        names.extend(n for n in _GLOBAL_KERNEL.findall(plain) if n not in names)
    return names


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
