"""The baseline cache's second timing: a baseline timed beside other work is lowered, never raised."""

from __future__ import annotations

import json

import pytest

from kevin.evaluation.baselines import BaselineCache


def timings(*values):
    """A measure function that returns ``values`` in turn, and counts its calls."""
    calls = []

    def measure():
        calls.append(1)
        value = values[len(calls) - 1]
        if isinstance(value, Exception):
            raise value
        return value

    return measure, calls


def test_a_second_timing_keeps_the_faster_and_is_done_once(tmp_path):
    cache = BaselineCache(tmp_path / "baselines.json")
    cache.put("softplus", 2.667, {"measured": "then"})  # timed beside the policy's generation
    assert not cache.confirmed("softplus")
    measure, calls = timings(0.30)
    assert cache.confirm("softplus", measure) == 0.30 and cache.get("softplus") == 0.30
    assert cache.confirmed("softplus") and len(calls) == 1
    assert cache.confirm("softplus", measure) == 0.30 and len(calls) == 1  # confirmed: not timed again
    entry = json.loads((tmp_path / "baselines.json").read_text())["softplus"]
    assert entry["ms"] == 0.30 and entry["confirmed"] is True and entry["timings_ms"] == [2.667, 0.30]
    # Another evaluator sharing the file knows it is confirmed and does not time it again.
    other = BaselineCache(tmp_path / "baselines.json")
    assert other.confirmed("softplus") and other.confirm("softplus", timings()[0]) == 0.30


def test_a_slower_second_timing_leaves_the_first(tmp_path):
    cache = BaselineCache(tmp_path / "baselines.json")
    cache.put("gelu", 0.412, {})
    measure, _ = timings(0.55)
    assert cache.confirm("gelu", measure) == 0.412 and cache.get("gelu") == 0.412 and cache.confirmed("gelu")


def test_a_failed_second_timing_leaves_the_first_unconfirmed(tmp_path):
    cache = BaselineCache(tmp_path / "baselines.json")
    cache.put("gelu", 0.412, {})
    measure, calls = timings(RuntimeError("judge died"), 0.40)
    assert cache.confirm("gelu", measure) == 0.412 and not cache.confirmed("gelu")
    assert cache.confirm("gelu", measure) == 0.40 and cache.confirmed("gelu") and len(calls) == 2  # tried again
    with pytest.raises(KeyError, match="no baseline of relu"):
        cache.confirm("relu", measure)


def test_a_value_confirmed_elsewhere_only_ever_lowers_this_ones(tmp_path):
    path = tmp_path / "baselines.json"
    mine = BaselineCache(path)
    mine.put("conv", 1.29, {})
    path.write_text(json.dumps({"conv": {"ms": 3.64, "confirmed": True}}))  # a file that says otherwise
    assert mine.confirm("conv", timings()[0]) == 1.29 and mine.get("conv") == 1.29
    path.write_text(json.dumps({"conv": {"ms": 1.01, "confirmed": True}}))
    fresh = BaselineCache(path)
    assert fresh.confirm("conv", timings()[0]) == 1.01
