"""The root config: every section of params.yaml in one object, shared values set once and handed down."""

from __future__ import annotations

import json

import pytest
import yaml

from kevin.config import RunConfig
from kevin.evaluation.config import EvalConfig
from kevin.params import HANDED_DOWN, SECTIONS, eval_config_from_params
from kevin.policy.config import SamplingConfig
from tests.conftest import REPO


def test_defaults_hand_the_shared_values_to_every_section():
    run = RunConfig()
    assert run.evaluation.backend == run.rollout.backend == "cpu"
    assert run.evaluation.profile == run.rollout.profile == ""
    assert run.sampling.temperature == run.openai.temperature == run.train.temperature == 0.9
    # The Dr-GRPO constant is the response length limit (it was 16384 against a 1024-token generation limit).
    assert run.train.loss.max_completion_length == run.sampling.max_new_tokens == run.openai.max_tokens == 16384
    assert run.train.max_response_tokens == 22528  # the longest response the schedule allows
    assert [run.response_tokens_at(s) for s in (0, 29, 30, 39)] == [16384, 16384, 22528, 22528]


def test_params_yaml_shows_every_section_with_its_defaults():
    shown = yaml.safe_load((REPO / "params.yaml").read_text())
    assert list(shown) == list(RunConfig().params_dict())  # every shared value and every section, in order
    assert RunConfig.from_params(REPO / "params.yaml") == RunConfig()
    expected = RunConfig().params_dict()
    for name in SECTIONS:
        if name == "evaluation":  # the evaluator's section shows its main settings; each at its default
            assert all(expected["evaluation"][k] == v for k, v in shown["evaluation"].items())
        else:
            assert shown[name] == expected[name], name


def test_overrides_and_a_shared_value_set_once():
    run = RunConfig.from_params(REPO / "params.yaml", ["temperature=1.0", "train.lr=1.0e-6", "backend=cuda",
                                                        "response_length_schedule.10=20000", "rollout.turns=8"])
    assert run.sampling.temperature == run.openai.temperature == run.train.temperature == 1.0
    assert run.train.lr == 1e-6 and run.rollout.turns == 8
    assert run.evaluation.backend == run.rollout.backend == "cuda"
    assert run.response_length_schedule == {10: 20000, 30: 22528} and run.response_tokens_at(10) == 20000
    # A section that restates a shared value must agree with it.
    assert RunConfig.from_params(None, ["sampling.temperature=0.9"]).sampling.temperature == 0.9
    with pytest.raises(ValueError, match=r"sampling.temperature is 0.5 but temperature is 0.9; temperature is set once"):
        RunConfig.from_params(None, ["sampling.temperature=0.5"])
    with pytest.raises(ValueError, match=r"train.loss.max_completion_length is 1024 but max_response_tokens is 16384"):
        RunConfig.from_params(None, ["train.loss.max_completion_length=1024"])
    with pytest.raises(ValueError, match="evaluation.backend is 'cuda' but backend is 'cpu'"):
        RunConfig.from_dict({"evaluation": {"backend": "cuda"}})
    assert RunConfig.from_params(None, ["policy.backend=openai", "policy.model=served"]).openai.model == "served"


@pytest.mark.parametrize("data, message", [
    ({"trainn": {}}, r"unknown params.yaml keys \['trainn'\]"),
    ({"rollout": {"m": 16}}, r"unknown rollout settings: \['m'\]"),
    ({"train": {"loss": {"epsilon": 0.2}}}, r"unknown loss settings: \['epsilon'\]"),
    ({"monitor": {"treshold": 1}}, r"unknown monitor settings: \['treshold'\]"),
    ({"policy": {"backend": "vllm"}}, "policy.backend must be one of"),
    ({"temperature": 0}, "temperature must be > 0"),
    ({"response_length_schedule": {30: 8000}}, "may only raise it"),
    ({"response_length_schedule": {0: 20000}}, "training step >= 1"),
    ({"response_length_schedule": [30, 22528]}, "must map steps to lengths"),
    ({"train": {"max_response_tokens": 30000}}, "train.max_response_tokens is 30000 but the longest response length"),
])
def test_mistakes_are_refused_with_what_to_do(data, message):
    with pytest.raises(ValueError, match=message):
        RunConfig.from_dict(data)


def test_bad_overrides():
    with pytest.raises(ValueError, match="key.sub=value"):
        RunConfig.from_params(None, ["train.lr"])
    with pytest.raises(ValueError, match="is a value, not a section"):
        RunConfig.from_params(REPO / "params.yaml", ["temperature.x=1"])


def test_round_trip_and_section_objects():
    run = RunConfig.from_params(None, ["temperature=0.7", "rollout.turns=2"])
    assert RunConfig.from_dict(json.loads(json.dumps(run.to_dict()))) == run
    # A complete section object must agree with the shared values; a dict gets them filled in.
    with pytest.raises(ValueError, match="sampling.max_new_tokens is 1024 but max_response_tokens is 16384"):
        RunConfig(sampling=SamplingConfig())
    assert RunConfig(sampling={"top_p": 0.5}).sampling == SamplingConfig(top_p=0.5, max_new_tokens=16384)
    assert RunConfig(max_response_tokens=512, response_length_schedule={},
                     sampling=SamplingConfig(max_new_tokens=512)).train.max_response_tokens == 512


def test_every_handed_down_field_exists_on_its_section():
    run = RunConfig()
    for paths in HANDED_DOWN.values():
        for path in paths:
            node = getattr(run, path[0])
            for part in path[1:]:
                node = getattr(node, part)  # raises if a section renamed its field


def test_eval_config_from_params_reads_the_shared_backend(tmp_path):
    params = tmp_path / "params.yaml"
    params.write_text("backend: cuda\nevaluation:\n  timing_trials: 7\n")
    cfg = eval_config_from_params(params)
    assert isinstance(cfg, EvalConfig) and cfg.backend == "cuda" and cfg.timing_trials == 7
    assert eval_config_from_params(params, backend="cpu", timing_trials=3).backend == "cpu"  # the command line wins
    params.write_text("backend: cpu\nevaluation:\n  backend: cuda\n")
    with pytest.raises(ValueError, match="set once"):
        eval_config_from_params(params)
    assert eval_config_from_params(None).backend == "cpu"


def test_a_later_file_replaces_top_level_values_and_merges_sections(tmp_path):
    base, top = tmp_path / "base.yaml", tmp_path / "top.yaml"
    base.write_text("max_response_tokens: 512\nresponse_length_schedule: {30: 22528}\n"
                    "train:\n  lr: 0.001\n  loss:\n    eps_low: 0.1\n    eps_high: 0.3\n")
    top.write_text("response_length_schedule: {}\ntrain:\n  loss:\n    eps_high: 0.25\n")
    run = RunConfig.from_files([base, top])
    # {} clears the raise: merged entry by entry it kept {30: 22528}, and a 512-token run generated up to 22,528
    # tokens from step 30 on.
    assert run.response_length_schedule == {} and run.response_tokens_at(45) == 512
    assert run.train.max_response_tokens == 512
    # A section, and a section within it, change only where the later file names a setting.
    assert (run.train.lr, run.train.loss.eps_low, run.train.loss.eps_high) == (0.001, 0.1, 0.25)
    top.write_text("response_length_schedule: {40: 1024}\n")
    assert RunConfig.from_files([base, top]).response_length_schedule == {40: 1024}  # replaced, not {30:, 40:}


@pytest.mark.parametrize("name", sorted(p.name for p in (REPO / "configs").glob("*.yaml") if p.name != "accelerate_zero3.yaml"))
def test_every_bundled_config_loads_over_params_yaml(name):
    # The learning runs' configs are layered over configs/h200_learn.yaml as scripts/gpu_learn.sh layers them;
    # configs/gpu.yaml wants the user's model (accelerate_zero3.yaml is accelerate's, not ours).
    layers = [REPO / "params.yaml"] + ([REPO / "configs/h200_learn.yaml"] if name.startswith("h200_learn_") else [])
    model = ["policy.model=/path/to/model"] if name == "gpu.yaml" else []
    run = RunConfig.from_files(layers + [REPO / "configs" / name], model)
    shown = yaml.safe_load((REPO / "configs" / name).read_text()) or {}
    if "response_length_schedule" in shown:  # a top-level value: the file's, whatever params.yaml says
        assert run.response_length_schedule == {int(k): v for k, v in shown["response_length_schedule"].items()}
    for section, values in shown.items():  # what the file says is what the run gets
        if isinstance(values, dict) and section in SECTIONS:
            got = run.params_dict()[section]
            for key, value in values.items():
                if not isinstance(value, dict) and f"{section}.{key}={got[key]}" not in model:
                    assert got[key] == value, (section, key)
