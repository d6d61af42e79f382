"""Our ``load_inline``: what a candidate's ``torch.utils.cpp_extension.load_inline`` call does inside the
harness.

- compile mode (a compile job, no GPU): the C++ rules and the flag allow-list are applied to the exact
  arguments (strings built at run time included), then ``builder.build_extension`` compiles them into
  the job's own staging folder. Nothing is loaded: no code of the candidate's library ever runs in a
  compile job, and calling the extension while the module is imported there is an error.
- run mode: the library the evaluator moved into the (read-only) cache for this solution is loaded with
  ``torch.ops.load_library``; nothing is compiled. The returned object calls the registered operators
  and counts the calls (the run-time decoy check).
"""

from __future__ import annotations

import inspect
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from kevin.evaluation.build_sources import ExtensionRequest, RequestError
from kevin.evaluation.builder import CompileFailure, build_extension, find_library
from kevin.evaluation.rules import RuleHit, cpp_rule_hits, flag_hits
from kevin.evaluation.toolchain import Toolchain
from kevin.records.target import KernelTarget


class RuleFailure(Exception):
    """A rule was broken in what the candidate handed to ``load_inline``."""

    def __init__(self, hit: RuleHit):
        super().__init__(hit.describe())
        self.hit = hit


class NotBuilt(Exception):
    """Run mode: the cache holds no library for these arguments (they differ from the compile job's)."""


def _signature() -> inspect.Signature:
    """torch's own ``load_inline`` signature (read before the harness replaces the function)."""
    from torch.utils import cpp_extension

    global _SIGNATURE
    if _SIGNATURE is None:
        _SIGNATURE = inspect.signature(cpp_extension.load_inline)
    return _SIGNATURE


_SIGNATURE: inspect.Signature | None = None


class CompiledExtension:
    """The object ``load_inline`` returns to the candidate: attribute access gives its functions."""

    def __init__(self, namespace: Any, functions: tuple[str, ...], counter: dict[str, int]):
        self._namespace, self._functions, self._counter = namespace, functions, counter

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__") or name not in {f.split("::")[-1] for f in self._functions}:
            raise AttributeError(f"the extension has no function {name!r} (it was not listed in functions=[...])")
        op = getattr(self._namespace, name)
        counter = self._counter

        def call(*args: Any) -> Any:
            counter["calls"] = counter.get("calls", 0) + 1
            return op(*args)

        call.__name__ = name
        return call


class _NotLoaded:
    """Compile mode: the extension exists only as files; its functions cannot run here."""

    def __init__(self, functions: tuple[str, ...]):
        self._functions = functions

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)

        def refuse(*args: Any, **kwargs: Any) -> Any:
            raise RuntimeError("the extension's functions cannot be called while the solution is imported "
                               "(call them in ModelNew.forward)")

        return refuse


@dataclass
class InlineLoader:
    """Replacement for ``load_inline`` bound to one job."""

    mode: str
    """``compile`` or ``run``."""
    toolchain: Toolchain
    backend: str
    rules: dict[str, dict[str, Any]]
    folder: Path
    """compile: the staging folder to build into; run: this solution's (read-only) cache folder."""
    max_jobs: int = 2
    compile_timeout_s: float = 600.0
    requests: list[ExtensionRequest] = field(default_factory=list)
    built: list[dict[str, Any]] = field(default_factory=list)
    compile_seconds: float = 0.0
    call_counter: dict[str, int] = field(default_factory=dict)
    on_built: Callable[[dict[str, Any]], None] | None = None

    def __post_init__(self) -> None:
        _signature()  # bound now, while load_inline is still torch's

    def load_inline(self, *args: Any, **kwargs: Any) -> Any:
        try:
            params = dict(_signature().bind(*args, **kwargs).arguments)
        except TypeError as exc:
            raise TypeError(f"load_inline: {exc}") from None
        req = ExtensionRequest.from_call(params)
        self._check(req)
        self.requests.append(req)
        if self.mode == "compile":
            return self._compile(req)
        return self._load(req)

    def _check(self, req: ExtensionRequest) -> None:
        hits = cpp_rule_hits(list(req.cpp_sources) + list(req.cuda_sources), self.rules)
        hits += flag_hits([*req.extra_cflags, *req.extra_cuda_cflags, *req.extra_ldflags], self.rules, words=True)
        if req.cuda_sources and not KernelTarget.parse(self.backend).is_gpu:
            hits.append(RuleHit("inline_kernel_required", "CUDA sources on the cpu backend: write C++ for the cpu backend"))
        if hits:
            raise RuleFailure(hits[0])

    def _compile(self, req: ExtensionRequest) -> Any:
        start = time.perf_counter()
        try:
            result = build_extension(req, self.toolchain, self.folder, self.max_jobs, self.compile_timeout_s)
        finally:
            self.compile_seconds += time.perf_counter() - start
        info = {"name": req.name, "dir": req.dir_name(self.toolchain), "path": result.path, "seconds": result.seconds}
        self.built.append(info)
        if self.on_built:
            self.on_built(info)
        return _NotLoaded(req.functions)

    def _load(self, req: ExtensionRequest) -> Any:
        import torch

        library = find_library(self.folder, req, self.toolchain)
        if library is None:
            raise NotBuilt(f"no library was built for load_inline(name={req.name!r}) with these arguments "
                           "(a solution must pass the same arguments every time it is imported)")
        torch.ops.load_library(str(library))
        return CompiledExtension(getattr(torch.ops, req.op_namespace(self.toolchain)), req.functions, self.call_counter)

    def missing_inline_kernel(self) -> RuleHit | None:
        """After the solution is imported: was real inline compute handed to the compiler?"""
        if not self.requests:
            return RuleHit("inline_kernel_required", "no load_inline call: the compute must be an inline kernel")
        if KernelTarget.parse(self.backend).is_gpu:
            from kevin.evaluation.build_sources import kernel_names

            if not kernel_names([s for r in self.requests for s in r.cuda_sources]):
                return RuleHit("inline_kernel_required", "no __global__ CUDA kernel was compiled")
        return None


__all__ = ["CompileFailure", "CompiledExtension", "InlineLoader", "NotBuilt", "RequestError", "RuleFailure"]
