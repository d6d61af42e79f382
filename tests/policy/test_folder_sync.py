"""Weights for a server that loads model folders by path (transformers serve): FolderSync writes each version as a
folder and points the policy at it; the policy's state (request count, served name) round-trips."""

from __future__ import annotations

import json

import pytest

from kevin.policy.openai_backend import OpenAIConfig, OpenAIPolicy
from kevin.policy.weight_sync import FolderSync
from tests.tiny_lm import tiny_model, tiny_tokenizer


def test_each_push_is_a_new_folder_the_policy_then_names(tmp_path):
    import torch
    from safetensors.torch import load_file

    tokenizer = tiny_tokenizer()
    model = tiny_model(tokenizer)
    policy = OpenAIPolicy(OpenAIConfig(model="base", api_key_env=""))
    sync = FolderSync(tmp_path / "served", policy, keep=2)
    first = sync.push(model, tokenizer, 1)
    assert first == str((tmp_path / "served" / "v000001").resolve()) == policy.model == sync.current
    saved = load_file(f"{first}/model.safetensors")
    assert all(torch.equal(saved[k], v) for k, v in model.state_dict().items() if k in saved)
    # transformers serve samples only when the generation config says so.
    assert json.loads((tmp_path / "served" / "v000001" / "generation_config.json").read_text())["do_sample"] is True
    assert (tmp_path / "served" / "v000001" / "tokenizer.json").is_file()
    with torch.no_grad():
        next(model.parameters()).add_(1.0)
    sync.push(model, tokenizer, 2)
    third = sync.push(model, tokenizer, 3)
    assert sorted(p.name for p in (tmp_path / "served").iterdir()) == ["v000002", "v000003"]  # the newest two stay
    assert policy.model == third and not list((tmp_path / "served").glob(".*.tmp"))
    sync.push(model, tokenizer, 3)  # a resumed run pushes its version again: replaced, not refused
    assert policy.model == third
    with pytest.raises(ValueError, match="keep must be at least 1"):
        FolderSync(tmp_path, keep=0)


def test_the_policy_state_keeps_the_seed_offset_and_the_served_name():
    policy = OpenAIPolicy(OpenAIConfig(model="base", api_key_env="", seed=10))
    assert [policy._next_seed() for _ in range(3)] == [10, 11, 12]
    policy.model = "/served/v000002"
    state = policy.state_dict()
    assert state == {"requests": 3, "model": "/served/v000002"}
    resumed = OpenAIPolicy(OpenAIConfig(model="base", api_key_env="", seed=10))
    resumed.load_state_dict(state)
    assert resumed.model == "/served/v000002" and resumed._next_seed() == 13
