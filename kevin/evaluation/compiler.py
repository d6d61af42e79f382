"""Compiling candidates: our stand-in for ``torch.utils.cpp_extension.load_inline``.

A solution calls ``load_inline`` at import. Inside the harness that name is replaced by
``InlineCompiler.load_inline``, which
- re-applies the C++ rules and the flag allow-list to the exact sources and flags (so strings built at
  run time are checked too) before anything is compiled;
- builds into a content-hashed directory under the cache, so identical sources (common in RL: many
  trajectories converge on one kernel) compile once, and the run phase of a candidate finds the
  library its compile phase built (ninja sees nothing to do);
- records the ``__global__`` kernel names (for the decoy check) and counts calls into the extension;
- turns a build failure into ``CompileFailure`` carrying the compiler's own error lines.
"""

from __future__ import annotations

import hashlib
import inspect
import json
import os
import re
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from kevin.evaluation.rules import RuleHit, cpp_rule_hits, flag_hits

_HEAVY_INCLUDE = re.compile(r'^[ \t]*#[ \t]*include[ \t]*[<"](?:torch/extension\.h|torch/types\.h|torch/torch\.h|ATen/ATen\.h)[>"][^\n]*$', re.M)
LITE_HEADER = Path(__file__).with_name("torch_lite.h")

# Kernel attributes that take parentheses and may stand anywhere between ``__global__`` and the name
# (``__global__ void __launch_bounds__(256) k(...)`` is as common as the other order).
_KERNEL_ATTRIBUTE = re.compile(
    r"\b(?:__launch_bounds__|__cluster_dims__|__maxnreg__|__attribute__|__declspec|alignas)\s*\((?:[^()]|\((?:[^()]|\([^()]*\))*\))*\)"
    r"|\[\[.*?\]\]"
)
_COMMENT = re.compile(r"//[^\n]*|/\*.*?\*/", re.S)
_GLOBAL_KERNEL = re.compile(r"__global__\s+(?:[\w:<>,\s\*&]+?\s+)?(\w+)\s*\(")


class CompileFailure(Exception):
    """The candidate's sources did not compile; ``text`` holds the compiler output."""

    def __init__(self, text: str):
        super().__init__(text)
        self.text = text


class RuleFailure(Exception):
    """A rule was broken in what the candidate handed to ``load_inline``."""

    def __init__(self, hit: RuleHit):
        super().__init__(hit.describe())
        self.hit = hit


def kernel_names(cuda_sources: list[str]) -> list[str]:
    """Names of the ``__global__`` functions defined in CUDA sources."""
    names: list[str] = []
    for source in cuda_sources:
        plain = _KERNEL_ATTRIBUTE.sub(" ", _COMMENT.sub(" ", source))
        names.extend(n for n in _GLOBAL_KERNEL.findall(plain) if n not in names)
    return names


def _as_list(value: Any) -> list[str]:
    if value is None:
        return []
    if isinstance(value, str):
        return [value]
    return [str(v) for v in value]


def lite_variant(params: dict[str, Any], signature_names: set[str]) -> dict[str, Any] | None:
    """The same extension with its CUDA sources parsed against ``torch_lite.h`` instead of the full
    torch headers (about 20x less to parse); None when the fast path does not apply.

    The header text is pasted into the CUDA source (not put on the include path) so the compile
    flags, and with them torch's precompiled-header signature for main.cpp, stay the same.
    """
    if "no_implicit_headers" not in signature_names or params.get("no_implicit_headers"):
        return None
    cuda = _as_list(params.get("cuda_sources"))
    if not cuda:
        return None
    lite = dict(params)
    header = LITE_HEADER.read_text()
    lite["cuda_sources"] = [header, "#include <cuda.h>\n#include <cuda_runtime.h>"] + [_HEAVY_INCLUDE.sub("", c) for c in cuda]
    lite["cpp_sources"] = ["#include <torch/extension.h>"] + _as_list(params.get("cpp_sources"))
    lite["no_implicit_headers"] = True
    return lite


def build_key(fields: dict[str, Any]) -> str:
    """Content hash of everything that determines the built library."""
    import torch

    payload = json.dumps(
        {**fields, "torch": torch.__version__, "python": sys.version_info[:2], "arch": os.environ.get("TORCH_CUDA_ARCH_LIST", "")},
        sort_keys=True,
        default=str,
    )
    return hashlib.sha256(payload.encode()).hexdigest()[:24]


class ExtensionProxy:
    """Wraps a compiled module so the harness can tell whether its functions were really called."""

    def __init__(self, module: Any, counter: dict[str, int]):
        self._module = module
        self._counter = counter

    def __getattr__(self, name: str) -> Any:
        value = getattr(self._module, name)
        if not callable(value):
            return value
        counter = self._counter

        def counted(*args: Any, **kwargs: Any) -> Any:
            counter["calls"] = counter.get("calls", 0) + 1
            return value(*args, **kwargs)

        return counted


@dataclass
class InlineCompiler:
    """Replacement for ``load_inline`` bound to one candidate evaluation."""

    cache_dir: Path
    backend: str
    rules: dict[str, dict[str, Any]]
    use_pch: bool = True
    max_jobs: int = 2
    kernels: list[str] = field(default_factory=list)
    cuda_kernel_seen: bool = False
    cpp_functions: list[str] = field(default_factory=list)
    compile_seconds: float = 0.0
    call_counter: dict[str, int] = field(default_factory=dict)
    original: Callable[..., Any] | None = None
    fast_cuda: bool = True
    fast_path: str = ""  # "lite" when the narrow-header build succeeded, "full-fallback" when it did not

    def load_inline(self, *args: Any, **kwargs: Any) -> Any:
        from torch.utils import cpp_extension

        original = self.original or cpp_extension.load_inline
        bound = inspect.signature(original).bind(*args, **kwargs)
        params = dict(bound.arguments)
        cpp = _as_list(params.get("cpp_sources"))
        cuda = _as_list(params.get("cuda_sources"))
        flags = [*_as_list(params.get("extra_cflags")), *_as_list(params.get("extra_cuda_cflags")), *_as_list(params.get("extra_ldflags"))]
        hits = cpp_rule_hits(cpp + cuda, self.rules) + flag_hits(flags, self.rules)
        if params.get("extra_include_paths"):
            hits.append(RuleHit("load_inline_flags", "extra_include_paths is not allowed"))
        if _as_list(params.get("sycl_sources")):
            hits.append(RuleHit("inline_kernel_required", "sycl sources are not supported"))
        if cuda and self.backend != "cuda":
            hits.append(RuleHit("inline_kernel_required", "CUDA sources on the cpu backend: write C++ for the cpu backend"))
        if hits:
            raise RuleFailure(hits[0])
        names = kernel_names(cuda)
        self.kernels.extend(names)
        self.cuda_kernel_seen = self.cuda_kernel_seen or bool(names)
        self.cpp_functions.extend(_as_list(params.get("functions")))

        # torch deletes its shared precompiled header whenever use_pch is False, so every call in this
        # project passes True unless custom flags would make the header's signature differ.
        params["use_pch"] = self.use_pch and not params.get("extra_cflags")
        params["verbose"] = False
        os.environ["MAX_JOBS"] = str(self.max_jobs)
        # The precompiled header is shared by every candidate and built by the evaluator; torch would
        # delete it whenever a call does not use it, so that deletion is switched off here.
        cpp_extension.remove_extension_h_precompiler_headers = _keep_pch
        lite = lite_variant(params, set(inspect.signature(original).parameters)) if self.fast_cuda else None
        if lite is not None:
            lite_dir = self._build_dir(lite)
            failed_marker = lite_dir / "KEVIN_LITE_FAILED"
            if not failed_marker.exists():
                try:
                    module = self._build(original, lite, lite_dir)
                    self.fast_path = "lite"
                    return ExtensionProxy(module, self.call_counter)
                except CompileFailure:
                    failed_marker.touch()  # the run phase (and identical candidates) go straight to the full build
            self.fast_path = "full-fallback"  # needs more than the narrow header: the stock build decides
        module = self._build(original, params, self._build_dir(params))
        return ExtensionProxy(module, self.call_counter)

    def _build_dir(self, params: dict[str, Any]) -> Path:
        key_fields = {k: params.get(k) for k in ("name", "cpp_sources", "cuda_sources", "functions", "extra_cflags",
                                                  "extra_cuda_cflags", "extra_ldflags", "with_cuda", "is_python_module",
                                                  "with_pytorch_error_handling", "no_implicit_headers")}
        build_dir = self.cache_dir / "ext" / f"{params.get('name', 'ext')}_{build_key(key_fields)}"
        build_dir.mkdir(parents=True, exist_ok=True)
        return build_dir

    def _build(self, original: Callable[..., Any], params: dict[str, Any], build_dir: Path) -> Any:
        start = time.perf_counter()
        try:
            return original(**{**params, "build_directory": str(build_dir)})
        except Exception as exc:  # the compiler's verdict, handed back to the policy
            raise CompileFailure(str(exc)) from None
        finally:
            self.compile_seconds += time.perf_counter() - start

    def missing_inline_kernel(self) -> RuleHit | None:
        """After the solution is imported: was real inline compute handed to the compiler?"""
        if self.backend == "cuda" and not self.cuda_kernel_seen:
            return RuleHit("inline_kernel_required", "no __global__ CUDA kernel was compiled")
        if not self.cpp_functions and not self.kernels:
            return RuleHit("inline_kernel_required", "no inline C++/CUDA function was compiled")
        return None


def _keep_pch() -> None:
    """Stand-in for torch's remove_extension_h_precompiler_headers (see InlineCompiler.load_inline)."""


def prepare_torch_pch(cache_dir: Path) -> str:
    """Build (or confirm) torch's precompiled ``torch/extension.h`` in the evaluator process.

    Candidates run without write access to the torch tree, and parallel compile workers would race
    to write the same file, so the evaluator builds it once, under a lock, before any compile job.
    Returns a note when no header could be prepared (compiles then just take longer).
    """
    import fcntl

    try:
        from torch.utils import cpp_extension
    except ImportError as exc:
        return f"no precompiled header: {exc}"
    build = getattr(cpp_extension, "_check_and_build_extension_h_precompiler_headers", None)
    if build is None:
        return "no precompiled header: this torch has no PCH support"
    cache_dir.mkdir(parents=True, exist_ok=True)
    with open(cache_dir / "pch.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            build([], [])
        except (RuntimeError, OSError) as exc:
            return f"no precompiled header: {exc}"
    return ""


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
