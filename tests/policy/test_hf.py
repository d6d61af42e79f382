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
                                    dict(batch_size=-1), dict(seed=-1), dict(stop_token_ids=[-3]),
                                    dict(add_special_tokens="yes"), dict(stop_check_every=0),
                                    dict(static_cache=1), dict(cuda_graph="yes"), dict(compile=None)])
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


# ------------------------------------------------------------------------------ the static (fast) path


def _run(model, tok, prompt_ids, **cfg):
    policy = HFPolicy(model, tok, SamplingConfig(**cfg))
    outs = policy.generate_ids(prompt_ids)
    return policy, outs


@pytest.fixture(scope="module")
def prompt_ids(tok, prompts):
    ids = [tok(p, add_special_tokens=False)["input_ids"] for p in prompts]
    assert len({len(i) for i in ids}) == len(ids)  # every length different: real left padding
    return ids


def _same_samples(a, b):
    assert [o.token_ids for o in a] == [o.token_ids for o in b]
    assert [o.truncated for o in a] == [o.truncated for o in b]
    for x, y in zip(a, b):
        assert x.logprobs == pytest.approx(y.logprobs, abs=1e-5)


@pytest.mark.parametrize("temperature", [1.0, 0.0])
def test_static_path_samples_what_the_reference_path_samples(tok, model, prompt_ids, temperature):
    cfg = dict(max_new_tokens=12, temperature=temperature, seed=11, batch_size=0)
    fast, a = _run(model, tok, prompt_ids, **cfg)
    ref, b = _run(model, tok, prompt_ids, static_cache=False, **cfg)
    assert (fast.last_call.path, ref.last_call.path) == ("static", "reference")
    assert fast.last_call.batches == 1  # batch_size 0: the call's four prompts in one batch
    _same_samples(a, b)


def test_static_path_log_probs_match_a_forward_pass_of_each_sample(tok, model, prompt_ids):
    policy, outs = _run(model, tok, prompt_ids, max_new_tokens=10, temperature=0.8, stop_check_every=3)
    assert policy.last_call.path == "static"
    for out in outs:
        single = sequence_logprobs(model, [out.prompt_token_ids], [out.token_ids], temperature=0.8)
        assert torch.allclose(single.logprobs[0], torch.tensor(out.logprobs), atol=1e-5)


def test_static_path_with_eager_attention(tok, prompt_ids):
    model = tiny_model(tok, seed=3, attn="eager")  # float additive 4D mask instead of a boolean one
    fast, a = _run(model, tok, prompt_ids, max_new_tokens=8, temperature=1.0, seed=2)
    _, b = _run(model, tok, prompt_ids, max_new_tokens=8, temperature=1.0, seed=2, static_cache=False)
    assert fast.last_call.path == "static"
    _same_samples(a, b)


def test_chunked_prefill_equals_one_pass(tok, model, prompt_ids, monkeypatch):
    import kevin.policy.decode as decode

    whole = _run(model, tok, prompt_ids, max_new_tokens=6, temperature=1.0, seed=4)[1]
    # A budget of one query row per chunk: every prompt is prefilled token by token, and the shorter
    # prompts' first chunks are padding only (their queries must not turn into NaN).
    monkeypatch.setattr(decode, "MASK_ELEMENTS", 1)
    chunked = _run(model, tok, prompt_ids, max_new_tokens=6, temperature=1.0, seed=4)[1]
    _same_samples(whole, chunked)
    assert all(math.isfinite(lp) for o in chunked for lp in o.logprobs)


def _stop_config(**kw):
    # Four of the 41 tokens end a response: responses end at different steps, some run to the limit.
    return dict(temperature=1.0, seed=5, max_new_tokens=24, stop_token_ids=[10, 11, 12, 13], **kw)


def test_early_stop_is_read_every_n_tokens(tok, model, prompt_ids):
    _, ref = _run(model, tok, prompt_ids, static_cache=False, **_stop_config())
    lengths = [len(o.token_ids) for o in ref]
    assert not any(o.truncated for o in ref) and len(set(lengths)) > 1, lengths  # all ended, at different steps
    longest = max(lengths)
    for every in (1, 4, 7):
        policy, outs = _run(model, tok, prompt_ids, stop_check_every=every, **_stop_config())
        _same_samples(outs, ref)  # the steps after the last end change nothing
        # The host notices at the first multiple of `every` at or after the longest response's end.
        checked_at = min(-(-longest // every) * every, 24)
        assert policy.last_call.forward_passes == checked_at  # the prefill + one pass per fed token
    assert lengths and longest < 24


def test_max_new_tokens_is_respected(tok, model, prompt_ids):
    policy, outs = _run(model, tok, prompt_ids, max_new_tokens=5, temperature=1.0, seed=1, stop_check_every=16,
                        stop_token_ids=[])
    assert policy.last_call.forward_passes == 5  # the 5th token is sampled, never fed
    assert all(len(o.token_ids) <= 5 for o in outs)
    assert all(o.truncated == (o.token_ids[-1] != tok.eos_token_id) for o in outs)
    assert any(o.truncated and len(o.token_ids) == 5 for o in outs)


def test_batches_of_a_size_and_one_batch_agree_greedily(tok, model, prompt_ids):
    one = _run(model, tok, prompt_ids, max_new_tokens=8, temperature=0.0, batch_size=0)
    pairs = _run(model, tok, prompt_ids, max_new_tokens=8, temperature=0.0, batch_size=2)
    assert (one[0].last_call.batches, pairs[0].last_call.batches) == (1, 2)
    _same_samples(one[1], pairs[1])


def test_sample_tokens_draws_what_multinomial_draws():
    from kevin.policy.decode import sample_tokens

    probs = torch.softmax(torch.randn(5, 300, generator=torch.Generator().manual_seed(0)) * 4, dim=-1)
    probs[1, 100:] = 0.0  # a top-p style cut
    a, b = torch.Generator().manual_seed(9), torch.Generator().manual_seed(9)
    for _ in range(20):
        assert torch.equal(torch.multinomial(probs, 1, generator=a).squeeze(1), sample_tokens(probs, b))
    assert torch.equal(a.get_state(), b.get_state())


def test_models_the_static_path_cannot_serve_fall_back_to_the_reference_path(tok):
    from types import SimpleNamespace

    from transformers import Qwen2Config

    from kevin.policy.decode import static_unsupported

    flash = SimpleNamespace(config=SimpleNamespace(_attn_implementation="flash_attention_2"))
    assert "flash_attention_2" in static_unsupported(flash)
    sliding = Qwen2Config(num_hidden_layers=2, use_sliding_window=True, sliding_window=8, max_window_layers=1)
    sliding._attn_implementation = "sdpa"
    assert "sliding" in static_unsupported(SimpleNamespace(config=sliding))
    model = tiny_model(tok)
    assert static_unsupported(model) is None
    model.config._attn_implementation = "flex_attention"  # takes no 4D mask of ours
    assert HFPolicy(model, tok, SamplingConfig(max_new_tokens=3))._path() == "reference"
    assert HFPolicy(tiny_model(tok), tok, SamplingConfig(static_cache=False))._path() == "reference"


def test_static_path_under_autocast_keeps_one_cache_dtype(tok, model, prompt_ids, monkeypatch):
    """Under bfloat16 autocast (the trainer's float32 weights on CUDA) keys leave rotary embedding in float32 and
    values leave their projection in bfloat16: the cache must keep both in the autocast dtype (transformers 5.17
    sized both from the keys and failed writing the values), and sampling still matches the reference path."""
    from kevin.policy import decode

    caches = []
    made = decode._new_cache
    monkeypatch.setattr(decode, "_new_cache", lambda *a, **k: caches.append(made(*a, **k)) or caches[-1])
    cfg = dict(max_new_tokens=6, temperature=0.0, seed=1)
    fast = HFPolicy(model, tok, SamplingConfig(**cfg), autocast_dtype=torch.bfloat16)
    got = fast.generate_ids(prompt_ids)
    assert fast.last_call.path == "static" and caches
    dtypes = {(layer.keys.dtype, layer.values.dtype) for layer in caches[-1].layers}
    assert dtypes == {(torch.bfloat16, torch.bfloat16)}
    ref = HFPolicy(model, tok, SamplingConfig(static_cache=False, **cfg), autocast_dtype=torch.bfloat16)
    want = ref.generate_ids(prompt_ids)
    assert [len(o.token_ids) for o in got] == [len(o.token_ids) for o in want]


@pytest.mark.slow
def test_a_compiled_decode_step_samples_what_the_plain_one_does_and_sees_weight_updates(tok, prompt_ids):
    """sampling.compile (the gpu profile's setting): same samples as the plain step, and after an optimiser step
    the compiled step decodes with the new weights (they are inputs of the compiled code, not constants in it)."""
    model = tiny_model(tok, seed=3)
    plain_cfg = dict(temperature=0.0, max_new_tokens=12)
    compiled = HFPolicy(model, tok, SamplingConfig(**plain_cfg, compile=True))
    before = compiled.generate_ids(prompt_ids)
    _same_samples(before, _run(model, tok, prompt_ids, **plain_cfg)[1])
    assert compiled._compiled is not None and compiled._compiled[0] is model
    model.train()
    ids = torch.tensor([prompt_ids[0]])
    model(input_ids=ids, labels=ids).loss.backward()
    torch.optim.SGD(model.parameters(), lr=0.5).step()
    after = compiled.generate_ids(prompt_ids)
    assert [o.token_ids for o in after] != [o.token_ids for o in before]
    _same_samples(after, _run(model, tok, prompt_ids, **plain_cfg)[1])
    assert model.training  # the policy puts the model back in the mode it found
