"""The compile cache: compiled solutions' libraries on disk (``<cache>/ext/<key>``), and what may enter it.

A compile job builds into its own staging folder; only this (trusted) side reads what it left there (the
libraries' symbol tables and the exact sources compiled: symbols.py, rules.py) and moves it into the cache under
the key the evaluator computed from the solution's source. Candidates only ever read the cache.
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from kevin.evaluation.build_sources import REGISTRATION_MARKER, kernel_names
from kevin.evaluation.rules import cpp_rule_hits
from kevin.evaluation.runs import CompileFacts
from kevin.evaluation.symbols import library_hits
from kevin.evaluation.verdict import Failure
from kevin.records.evaluation import Status


@dataclass
class Compiled:
    """A solution's compile outcome: its libraries' folder in the cache, or why there is none."""

    failure: Failure | None = None
    ext_dir: Path | None = None
    kernels: list[str] = field(default_factory=list)
    """``__global__`` names in the compiled CUDA sources (read here, from the staging folder)."""
    compile_s: float = 0.0
    compile_path: str = ""
    warnings: list[str] = field(default_factory=list)


_REGISTRATION = "\n" + REGISTRATION_MARKER


def _candidate_text(source_file: Path) -> str:
    """A compiled source as the candidate wrote it: our registration block (main.cpp) cut off."""
    text = source_file.read_text(errors="replace")
    cut = text.rfind(_REGISTRATION)
    return text[:cut] if cut >= 0 and source_file.name == "main.cpp" else text


class CompileCache:
    """The built libraries under ``root`` (one folder per solution key), and this process's memory of the
    solutions that failed to compile. Thread-safe."""

    def __init__(self, root: Path):
        self.root = root
        self._lock = threading.Lock()
        self._locks: dict[str, threading.Lock] = {}
        self._failures: dict[str, Compiled] = {}

    def get_or_build(self, key: str, build: Callable[[], Compiled]) -> Compiled:
        """The libraries of ``key`` from the cache, else the failure remembered for it, else ``build()``'s outcome
        (a failure other than a timeout is remembered: the same source fails the same way)."""
        with self._lock:
            lock = self._locks.setdefault(key, threading.Lock())
        with lock:  # identical solutions in one batch are compiled once
            cached = self.cached(key)
            if cached is not None:
                return cached
            if key in self._failures:
                return self._failures[key]
            result = build()
            if result.failure is not None and result.failure.status is not Status.TIMEOUT:
                self._failures[key] = result
            return result

    def cached(self, key: str) -> Compiled | None:
        folder = self.root / key
        try:
            meta = json.loads((folder / "meta.json").read_text())
        except (OSError, ValueError):
            return None
        return Compiled(ext_dir=folder, kernels=[str(k) for k in meta.get("kernels", [])], compile_s=0.0,
                        compile_path=str(meta.get("path", "")))

    def adopt(self, staging: Path, key: str, facts: CompileFacts, rules: dict[str, Any], allowed_ops: list[str],
              link_baseline: Any) -> Compiled:
        """Check what a compile job left in its staging folder and move it into the cache (trusted side)."""
        hits = library_hits(staging, rules["native_symbols"], allowed_ops, link_baseline)
        sources = sorted(p for p in staging.rglob("*")
                         if p.name in ("main.cpp", "cuda.cu") and p.is_file() and not p.is_symlink())
        texts = {p: _candidate_text(p) for p in sources}
        hits += cpp_rule_hits(list(texts.values()), rules)
        if not any(p.suffix == ".so" for p in staging.rglob("*.so")):
            return Compiled(failure=Failure(Status.RUNTIME_ERROR,
                                            "the compile job reported success but built no library"),
                            compile_s=facts.compile_s)
        if hits:
            return Compiled(failure=Failure(Status.RULE_VIOLATION, hits[0].message, rule_id=hits[0].rule_id),
                            compile_s=facts.compile_s)
        kernels = kernel_names([t for p, t in texts.items() if p.name == "cuda.cu"])
        paths = sorted({b["path"] for b in facts.built})
        path = "lite" if paths == ["lite"] else ("full-fallback" if "full" in paths else "")
        folder = self.root / key
        tmp = self.root / f".{key}.{secrets.token_hex(4)}"
        tmp.parent.mkdir(parents=True, exist_ok=True)
        shutil.move(str(staging), str(tmp))
        (tmp / "meta.json").write_text(json.dumps({"kernels": kernels, "path": path, "built": facts.built}))
        try:
            os.rename(tmp, folder)
        except OSError:  # the same solution was adopted meanwhile: keep that one
            shutil.rmtree(tmp, ignore_errors=True)
        return Compiled(ext_dir=folder, kernels=kernels, compile_s=facts.compile_s, compile_path=path,
                        warnings=facts.warnings)


__all__ = ["CompileCache", "Compiled"]
