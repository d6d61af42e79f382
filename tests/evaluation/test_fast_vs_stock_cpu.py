"""Our compile path (precompiled torch header, content-hashed build directories) against the stock one
(``use_pch=False``): same verdicts on every bundled cpu solution and the same error lines shown to the
policy for every source that does not compile (issue: evaluation at speed). About 15-25 minutes on 2
cores: the stock path builds each of the 60 solutions without the precompiled header."""

from __future__ import annotations

import re

import pytest

from kevin.evaluation import Candidate, EvalConfig, Evaluator, Status
from kevin.evaluation.candidates import reference_candidates
from kevin.tasks import load_bundled_suite
from tests.conftest import RELU_BODY, cpp_solution

pytestmark = pytest.mark.slow

BROKEN = {
    "undeclared": RELU_BODY.replace("return y;", "return undeclared_symbol_xyz;"),
    "syntax": RELU_BODY.replace("auto y = torch::empty_like(xc);", "auto y = torch::empty_like(xc)"),
    "types": RELU_BODY.replace("float* out = y.data_ptr<float>();", "int* out = y.data_ptr<float>();"),
}


def _policy_view(error: str) -> list[str]:
    """The error lines without build paths, which differ between two build directories by design."""
    lines = [re.sub(r"/\S*/(?=[^/\s]+\.(?:cpp|cu|h|o|so)\b)", "", line) for line in error.splitlines()]
    return [line for line in lines if "error" in line]


@pytest.fixture(scope="module")
def verdicts(tmp_path_factory, relu_task):
    items = reference_candidates(load_bundled_suite(), "cpu")
    items += [(relu_task, Candidate(relu_task.task_id, cpp_solution(body, name=f"t_broken_{k}"), candidate_id=k))
              for k, body in BROKEN.items()]
    out = {}
    for pch in (True, False):
        cache = tmp_path_factory.mktemp(f"pch{int(pch)}")
        # Two compile workers on two cores: the compiles dominate here, and the verdicts do not depend on timing.
        config = EvalConfig(backend="cpu", use_pch=pch, correctness_trials=5, timing_trials=5, warmup_trials=1,
                            compile_workers=2, cache_dir=str(cache))
        out[pch] = {r.candidate_id: r for r in Evaluator(config).evaluate_many(items)}
    return out


def test_same_verdicts_with_and_without_the_fast_path(verdicts):
    fast, stock = verdicts[True], verdicts[False]
    assert set(fast) == set(stock)
    for key in fast:
        assert fast[key].status is stock[key].status, key
        assert fast[key].correct == stock[key].correct
    assert sum(r.status is Status.CORRECT for r in fast.values()) == len(fast) - len(BROKEN) >= 60


@pytest.mark.parametrize("name", sorted(BROKEN))
def test_same_compiler_errors_reach_the_policy(verdicts, name):
    fast, stock = verdicts[True][name], verdicts[False][name]
    assert fast.status is Status.COMPILE_ERROR and stock.status is Status.COMPILE_ERROR
    assert _policy_view(fast.error) == _policy_view(stock.error) != []
