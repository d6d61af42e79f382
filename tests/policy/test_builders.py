"""The in-process tokenizer and model builders (no hub, no network)."""

from __future__ import annotations

import pytest

pytest.importorskip("transformers")

from kevin.policy.builders import (  # noqa: E402
    PRESETS,
    QWEN25_05B_PARAMS,
    QWEN25_15B_PARAMS,
    build_model,
    build_tokenizer,
    count_parameters_meta,
    learned_tokens,
    model_config,
)


@pytest.fixture(scope="module")
def tok():
    return build_tokenizer(["def forward(self, x):\n    return torch.relu(x)\n"] * 3, vocab_size=600)


def test_tokenizer_round_trips_and_has_a_chat_template(tok):
    assert len(tok) == 600 and learned_tokens(tok) < 600  # the rest is reserved tokens
    text = "ModelNew(nn.Module) é ✓"
    assert tok.decode(tok.encode(text, add_special_tokens=False)) == text  # byte-level: any text
    prompt = tok.apply_chat_template([{"role": "user", "content": "hi"}], add_generation_prompt=True, tokenize=False)
    assert prompt == "<|user|>\nhi<|end|>\n<|assistant|>\n"
    ids = tok.encode(prompt, add_special_tokens=False)
    assert tok.convert_tokens_to_ids("<|user|>") == ids[0] and tok.eos_token == "<|end|>"
    assert tok.decode([tok.convert_tokens_to_ids("<|reserved_0|>")], skip_special_tokens=True) == ""


def test_presets_and_the_half_billion_layer_count(tok):
    tiny = model_config("tiny", len(tok), tok)
    assert (tiny.hidden_size, tiny.num_hidden_layers, tiny.vocab_size) == (128, 4, 600)
    big = model_config("0.5b", 16384, tok)
    n = count_parameters_meta(big)
    # The layer count is the one that lands nearest Qwen2.5-0.5B's parameter count: one more or less is farther.
    per_layer = count_parameters_meta(model_config("0.5b", 16384, tok, layers=2)) - count_parameters_meta(
        model_config("0.5b", 16384, tok, layers=1))
    assert abs(n - QWEN25_05B_PARAMS) <= per_layer / 2
    assert model_config("0.5b", 16384, tok, layers=3).num_hidden_layers == 3
    assert set(PRESETS) == {"0.5b", "1.5b", "tiny"}


def test_the_presets_at_qwens_own_vocabulary_are_the_released_models(tok):
    """At Qwen2.5's 151,936-token vocabulary the presets are exactly Qwen2.5-0.5B (24 layers) and Qwen2.5-1.5B
    (28 layers: 233,373,696 embedding + 28 x 46,797,824 per layer + a 1,536 final norm)."""
    small, large = model_config("0.5b", 151936, tok), model_config("1.5b", 151936, tok)
    assert (small.num_hidden_layers, count_parameters_meta(small)) == (24, QWEN25_05B_PARAMS)
    assert (large.hidden_size, large.intermediate_size, large.num_attention_heads, large.num_key_value_heads) == (
        1536, 8960, 12, 2)
    assert (large.num_hidden_layers, count_parameters_meta(large)) == (28, 1_543_714_304) == (28, QWEN25_15B_PARAMS)
    # With the in-process 16K vocabulary the freed embedding rows go into more layers: 32, 1.52B.
    assert model_config("1.5b", 16384, tok).num_hidden_layers == 32


def test_build_model_draws_from_the_seeded_global_rng(tok):
    import torch

    config = model_config("tiny", len(tok), tok, layers=1)
    torch.manual_seed(5)
    first = build_model(config)
    torch.manual_seed(5)
    second = build_model(config)
    assert all(torch.equal(a, b) for a, b in zip(first.parameters(), second.parameters()))
    assert next(first.parameters()).dtype == torch.float32
    assert sum(p.numel() for p in first.parameters()) == count_parameters_meta(config)
