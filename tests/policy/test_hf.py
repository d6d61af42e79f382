"""HFPolicy on a tiny in-process model: shapes, log-probs, truncation, seeding, left padding."""

from __future__ import annotations

import math

import pytest
import torch

from kevin.policy.hf import HFPolicy, SamplingConfig, left_pad, top_p_filter
from kevin.training.trainer import sequence_logprobs
from tests.tiny_lm import tiny_model, tiny_tokenizer


@pytest.fixture(scope="module")
def tok():
    return tiny_tokenizer()


@pytest.fixture(scope="module")
def model(tok):
    return tiny_model(tok)


def chat(tok, text):
    return tok.apply_chat_template([{"role": "user", "content": text}], add_generation_prompt=True, tokenize=False)


@pytest.fixture(scope="module")
def prompts(tok):
    return [chat(tok, t) for t in ("say a", "hello there my friend, how are you", "x", "abc def")]


def test_outputs_shapes_and_logprobs(tok, model, prompts):
    outs = HFPolicy(model, tok, SamplingConfig(max_new_tokens=12, temperature=1.0))(prompts)
    assert len(outs) == len(prompts)
    for prompt, out in zip(prompts, outs):
        assert out.prompt_token_ids == tok(prompt, add_special_tokens=False)["input_ids"]
        assert 1 <= len(out.token_ids) <= 12 and len(out.logprobs) == len(out.token_ids)
        assert all(math.isfinite(lp) and lp <= 0 for lp in out.logprobs)
        assert out.text == tok.decode(out.token_ids, skip_special_tokens=True)
        # truncated <=> no EOS: a finished response ends with EOS and holds no other
        ends = out.token_ids[-1] == tok.eos_token_id
        assert out.truncated == (not ends)
        assert tok.eos_token_id not in out.token_ids[:-1]
        if out.truncated:
            assert len(out.token_ids) == 12


def test_eos_stops_and_is_not_truncated(tok, model, prompts):
    # Make EOS the only possible token: every response is exactly [eos], not truncated, logprob ~0.
    eos = tok.eos_token_id

    class Forced(torch.nn.Module):
        def __init__(self, inner):
            super().__init__()
            self.inner = inner

        def forward(self, **kw):
            out = self.inner(**kw)
            bias = torch.full_like(out.logits, -1e4)
            bias[..., eos] = 0.0
            out.logits = out.logits + bias
            return out

    forced = Forced(model)
    forced.generation_config = None
    outs = HFPolicy(forced, tok, SamplingConfig(max_new_tokens=5))(prompts)
    assert all(o.token_ids == [eos] and not o.truncated and o.text == "" for o in outs)
    assert all(o.logprobs[0] == pytest.approx(0.0, abs=1e-3) for o in outs)


def test_same_seed_same_samples_different_seed_different(tok, model, prompts):
    cfg = SamplingConfig(max_new_tokens=10, temperature=1.0, seed=123)
    a = HFPolicy(model, tok, cfg)(prompts)
    torch.manual_seed(999)  # the global RNG must not matter with a seed
    b = HFPolicy(model, tok, cfg)(prompts)
    c = HFPolicy(model, tok, SamplingConfig(max_new_tokens=10, temperature=1.0, seed=124))(prompts)
    assert [o.token_ids for o in a] == [o.token_ids for o in b]
    assert [o.logprobs for o in a] == [o.logprobs for o in b]
    assert [o.token_ids for o in a] != [o.token_ids for o in c]


def test_seeded_policy_leaves_global_rng_alone(tok, model, prompts):
    torch.manual_seed(5)
    expected = torch.rand(3)
    torch.manual_seed(5)
    HFPolicy(model, tok, SamplingConfig(max_new_tokens=4, seed=1))(prompts)
    assert torch.equal(torch.rand(3), expected)


def test_generator_state_round_trip(tok, model, prompts):
    policy = HFPolicy(model, tok, SamplingConfig(max_new_tokens=6, temperature=1.0, seed=7))
    policy(prompts)
    state = policy.state_dict()
    first = [o.token_ids for o in policy(prompts)]
    policy.load_state_dict(state)
    assert [o.token_ids for o in policy(prompts)] == first


def test_left_padding_batched_equals_single_prompt_recompute(tok, model, prompts):
    """A prompt's log-probs in a padded batch equal an unpadded single-sequence forward pass."""
    outs = HFPolicy(model, tok, SamplingConfig(max_new_tokens=10, temperature=0.7, batch_size=4))(prompts)
    assert len({len(o.prompt_token_ids) for o in outs}) > 1  # really padded
    for out in outs:
        single = sequence_logprobs(model, [out.prompt_token_ids], [out.token_ids], temperature=0.7)
        assert torch.allclose(single.logprobs[0], torch.tensor(out.logprobs), atol=1e-5)


def test_batch_size_does_not_change_greedy_output(tok, model, prompts):
    one = HFPolicy(model, tok, SamplingConfig(max_new_tokens=8, temperature=0.0, batch_size=1))(prompts)
    all_ = HFPolicy(model, tok, SamplingConfig(max_new_tokens=8, temperature=0.0, batch_size=4))(prompts)
    assert [o.token_ids for o in one] == [o.token_ids for o in all_]
    for a, b in zip(one, all_):
        assert a.logprobs == pytest.approx(b.logprobs, abs=1e-5)


def test_model_training_mode_restored(tok, model, prompts):
    model.train()
    HFPolicy(model, tok, SamplingConfig(max_new_tokens=3))(prompts[:1])
    assert model.training
    model.eval()


def test_top_p_filter_keeps_nucleus():
    logits = torch.log(torch.tensor([[0.5, 0.3, 0.15, 0.05]]))
    kept = torch.isfinite(top_p_filter(logits, 0.7))
    assert kept.tolist() == [[True, True, False, False]]
    assert torch.isfinite(top_p_filter(logits, 0.1)).tolist() == [[True, False, False, False]]
    assert torch.equal(top_p_filter(logits, 1.0), logits)


def test_top_p_samples_only_nucleus_tokens(tok, model, prompts):
    outs = HFPolicy(model, tok, SamplingConfig(max_new_tokens=6, temperature=1.0, top_p=1e-6))(prompts)
    greedy = HFPolicy(model, tok, SamplingConfig(max_new_tokens=6, temperature=0.0))(prompts)
    assert [o.token_ids for o in outs] == [o.token_ids for o in greedy]  # a tiny nucleus = the argmax token


def test_left_pad():
    ids, mask = left_pad([[1, 2, 3], [4]], pad_id=0)
    assert ids.tolist() == [[1, 2, 3], [0, 0, 4]] and mask.tolist() == [[1, 1, 1], [0, 0, 1]]


@pytest.mark.parametrize("kwargs", [dict(temperature=-0.1), dict(top_p=0.0), dict(top_p=1.5), dict(max_new_tokens=0),
                                    dict(batch_size=0), dict(seed=-1), dict(stop_token_ids=[-3]),
                                    dict(add_special_tokens="yes")])
def test_sampling_config_validation(kwargs):
    with pytest.raises(ValueError):
        SamplingConfig(**kwargs)


def test_sampling_config_round_trip():
    cfg = SamplingConfig(temperature=0.5, stop_token_ids=[3])
    assert SamplingConfig.from_dict(cfg.to_dict()) == cfg
    with pytest.raises(ValueError, match="unknown sampling"):
        SamplingConfig.from_dict({"temp": 1.0})


def test_empty_prompt_list_and_empty_prompt(tok, model):
    policy = HFPolicy(model, tok, SamplingConfig(max_new_tokens=2))
    assert policy([]) == []
    with pytest.raises(ValueError, match="empty"):
        policy.generate_ids([[]])


def test_importing_kevin_policy_does_not_import_transformers():
    import subprocess
    import sys

    code = "import sys, kevin, kevin.policy; print('transformers' in sys.modules, 'torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.split() == ["False", "False"]


def test_generates_with_a_lora_model_and_logprobs_match_the_trainer(tok):
    pytest.importorskip("peft")
    from kevin.training.config import TrainConfig
    from kevin.training.trainer import GRPOTrainer

    trainer = GRPOTrainer(tiny_model(tok, seed=2), TrainConfig(lora=True, lora_r=4, temperature=0.9, device="cpu"))
    with torch.no_grad():  # non-zero adapters, so the adapters really take part in generation
        for name, p in trainer.model.named_parameters():
            if "lora_B" in name:
                p.normal_(0, 0.5)
    outs = HFPolicy(trainer.model, tok, SamplingConfig(max_new_tokens=6, temperature=0.9))(
        [chat(tok, "say a"), chat(tok, "a longer prompt")])
    got = sequence_logprobs(trainer.model, [o.prompt_token_ids for o in outs], [o.token_ids for o in outs],
                            temperature=0.9)
    with trainer.model.disable_adapter():
        base = sequence_logprobs(trainer.model, [o.prompt_token_ids for o in outs], [o.token_ids for o in outs],
                                 temperature=0.9)
    for i, o in enumerate(outs):
        n = len(o.token_ids)
        assert torch.allclose(got.logprobs[i, :n], torch.tensor(o.logprobs), atol=1e-5)
        assert not torch.allclose(base.logprobs[i, :n], torch.tensor(o.logprobs), atol=1e-3)
