"""No false rejections: every bundled cpu reference solution, built and linked the way the evaluator builds it,
passes the native checks (the strict list of what a candidate's object may import, the forbidden classes of the
library, the disassembly of both). The cuda references' objects (nvcc's host and device passes, the host unit)
are checked the same way in test_fast_compile.py, which builds them without a GPU."""

from __future__ import annotations

import os
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from kevin.evaluation.build_sources import ExtensionRequest
from kevin.evaluation.builder import CompileFailure, build_extension
from kevin.evaluation.config import EvalConfig
from kevin.evaluation.rules import load_rules
from kevin.evaluation.symbols import library_hits
from kevin.tasks import bundled_solutions_dir
from tests.evaluation.test_fast_compile import _load_inline_kwargs


@pytest.fixture(scope="module")
def toolchain(cache_dir):
    from kevin.evaluation import Evaluator

    with Evaluator(EvalConfig(backend="cpu", cache_dir=str(cache_dir))) as ev:
        yield ev.toolchain()


@pytest.mark.slow
def test_every_bundled_cpu_reference_passes_the_native_checks(toolchain, tmp_path):
    solutions = sorted(bundled_solutions_dir("cpu").rglob("*.py"))
    assert len(solutions) >= 60
    requests = {s: ExtensionRequest.from_call(_load_inline_kwargs(s)) for s in solutions}  # serially: it patches torch
    rule, ops = load_rules()["native_symbols"], EvalConfig().allowed_runtime_ops

    def check(solution: Path) -> tuple[str, str]:
        folder = tmp_path / f"{solution.parent.name}_{solution.stem}"
        try:
            build_extension(requests[solution], toolchain, folder, jobs=1)
        except CompileFailure as exc:
            return solution.name, exc.text[-1000:]
        return solution.name, "; ".join(h.message for h in library_hits(folder, rule, ops))

    with ThreadPoolExecutor(max_workers=os.cpu_count() or 2) as pool:
        failed = {name: why for name, why in pool.map(check, solutions) if why}
    assert not failed, failed
