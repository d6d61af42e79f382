"""KernelTarget: parsing, its error text, and the exact value of each property on both targets."""

import json

import pytest

from kevin.records.target import TARGETS, KernelTarget


def test_parse_accepts_both_targets_and_compares_as_strings():
    assert KernelTarget.parse("cuda") is KernelTarget.CUDA
    assert KernelTarget.parse("cpu") is KernelTarget.CPU
    assert KernelTarget.parse(KernelTarget.CPU) is KernelTarget.CPU
    assert KernelTarget.CUDA == "cuda" and KernelTarget.CPU == "cpu"
    assert str(KernelTarget.CUDA) == "cuda" and f"{KernelTarget.CPU}" == "cpu"
    assert json.dumps({"backend": KernelTarget.CUDA}) == '{"backend": "cuda"}'
    assert TARGETS == ("cuda", "cpu")


@pytest.mark.parametrize("bad", ["x", "CUDA", "", "nvidia"])
def test_parse_rejects_anything_else(bad):
    with pytest.raises(ValueError) as err:
        KernelTarget.parse(bad)
    assert str(err.value) == f"kernel target must be 'cuda' or 'cpu', got {bad!r}"


@pytest.mark.parametrize("target, expected", [
    (KernelTarget.CUDA, dict(is_gpu=True, default_profile="default", default_flush_bytes=256 * 1024 * 1024,
                             default_clock_slack_ms=0.1, overlaps_compiles=True, prestarts_runs=True,
                             limits_address_space=False)),
    (KernelTarget.CPU, dict(is_gpu=False, default_profile="cpu", default_flush_bytes=32 * 1024 * 1024,
                            default_clock_slack_ms=1.0, overlaps_compiles=False, prestarts_runs=False,
                            limits_address_space=True)),
])
def test_properties(target, expected):
    assert {name: getattr(target, name) for name in expected} == expected


def test_eval_config_and_prompts_share_the_target_defaults():
    from kevin.evaluation.config import EvalConfig
    from kevin.rollout.prompts import resolved_profile

    for backend in TARGETS:
        cfg = EvalConfig(backend=backend)
        assert cfg.target is KernelTarget.parse(backend)
        assert cfg.resolved_profile == resolved_profile(backend) == cfg.target.default_profile
        assert cfg.resolved_flush_bytes == cfg.target.default_flush_bytes
        assert cfg.resolved_clock_slack_ms == cfg.target.default_clock_slack_ms
    assert EvalConfig(backend="cpu", profile="small").resolved_profile == "small"
