"""Chunked log-probs (the output layer over a few tokens at a time) against the one-pass computation."""

from __future__ import annotations

import pytest
import torch

from kevin.training.logprobs import chunked_token_logprobs, sequence_logprobs, split_decoder_head
from tests.tiny_lm import tiny_model, tiny_tokenizer

PROMPTS = [[5, 6, 7, 8, 9], [10, 11], [12, 13, 14], [15]]
COMPLETIONS = [[20, 21, 22, 23, 24, 25, 26], [27, 28], [], [29, 30, 31, 32]]
"""Different prompt and completion lengths (one empty): left and right padding in one batch."""
WEIGHTS = torch.linspace(-1.0, 2.0, 7)
"""Per-position weights of the test loss, so every token's gradient differs."""


@pytest.fixture(scope="module")
def tok():
    return tiny_tokenizer()


def _loss_and_grads(model, chunk: int, temperature: float = 0.7):
    model.zero_grad(set_to_none=True)
    out = sequence_logprobs(model, PROMPTS, COMPLETIONS, temperature=temperature, with_entropy=True, chunk_tokens=chunk)
    loss = (out.logprobs * WEIGHTS[: out.logprobs.shape[1]]).sum()
    loss.backward()
    grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
    return out, loss.detach(), grads


@pytest.mark.parametrize("chunk", [1, 3, 1024])
def test_chunked_values_and_gradients_equal_the_one_pass_ones(tok, chunk):
    model = tiny_model(tok, seed=1).train()
    ref, ref_loss, ref_grads = _loss_and_grads(model, 0)
    got, loss, grads = _loss_and_grads(model, chunk)
    assert split_decoder_head(model) is not None  # the chunked path really ran
    assert torch.equal(got.mask, ref.mask)
    assert torch.allclose(got.logprobs, ref.logprobs, atol=1e-6, rtol=0)
    assert torch.allclose(got.entropy, ref.entropy, atol=1e-6, rtol=0)
    assert (got.logprobs[~got.mask] == 0).all() and (got.entropy[~got.mask] == 0).all()
    assert torch.allclose(loss, ref_loss, atol=1e-6, rtol=0)
    assert grads.keys() == ref_grads.keys() and len(grads) == len(list(model.parameters()))
    for name, g in grads.items():
        assert torch.allclose(g, ref_grads[name], atol=1e-6, rtol=1e-5), name


def test_chunked_token_logprobs_by_hand():
    # Two positions of one row, a 3-token vocabulary, an identity head: log-probs are log_softmax(h / T).
    hidden = torch.tensor([[[1.0, 2.0, 3.0], [0.0, 0.0, 0.0]]], requires_grad=True)
    tokens, mask = torch.tensor([[2, 1]]), torch.tensor([[True, False]])
    logp, entropy = chunked_token_logprobs(hidden, tokens, mask, torch.nn.Identity(), 2.0, chunk_tokens=1,
                                           with_entropy=True)
    z = torch.tensor([0.5, 1.0, 1.5])
    expected = 1.5 - torch.logsumexp(z, 0)
    assert logp[0, 0].item() == pytest.approx(expected.item(), abs=1e-7) and logp[0, 1].item() == 0.0
    p = torch.softmax(z, 0)
    assert entropy[0, 0].item() == pytest.approx(-(p * p.log()).sum().item(), abs=1e-7)
    logp.sum().backward()
    # d/dh_j of (h_2 - logsumexp(h)) / T... = (onehot_j - p_j) / T; the masked position gets nothing.
    assert torch.allclose(hidden.grad[0, 0], (torch.tensor([0.0, 0.0, 1.0]) - p) / 2.0, atol=1e-7)
    assert (hidden.grad[0, 1] == 0).all()


def test_no_grad_and_lora_models_take_the_chunked_path(tok):
    peft = pytest.importorskip("peft")
    model = peft.get_peft_model(tiny_model(tok, seed=2), peft.LoraConfig(r=4, target_modules="all-linear"))
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "lora_B" in name:
                p.normal_(0, 0.5)  # adapters that change the logits
        assert split_decoder_head(model) is not None
        chunked = sequence_logprobs(model, PROMPTS, COMPLETIONS, chunk_tokens=2)
        whole = sequence_logprobs(model, PROMPTS, COMPLETIONS, chunk_tokens=0)
        with model.disable_adapter():
            base = sequence_logprobs(model, PROMPTS, COMPLETIONS, chunk_tokens=2)
    assert torch.allclose(chunked.logprobs, whole.logprobs, atol=1e-6, rtol=0)
    assert not torch.allclose(base.logprobs, whole.logprobs, atol=1e-3)


def test_a_model_whose_logits_are_not_head_of_decoder_takes_the_one_pass_path(tok):
    from transformers import LlamaForCausalLM

    class Scaled(LlamaForCausalLM):  # a logit scale after the output layer, as some architectures have
        def forward(self, *args, **kwargs):
            out = super().forward(*args, **kwargs)
            out.logits = out.logits * 3.0
            return out

    base = tiny_model(tok, seed=4)
    model = Scaled(base.config)
    model.load_state_dict(base.state_dict())
    assert split_decoder_head(model) is None
    got = sequence_logprobs(model, PROMPTS, COMPLETIONS, chunk_tokens=2)
    whole = sequence_logprobs(model, PROMPTS, COMPLETIONS, chunk_tokens=0)
    assert torch.equal(got.logprobs, whole.logprobs)
    assert not torch.allclose(got.logprobs, sequence_logprobs(base, PROMPTS, COMPLETIONS).logprobs, atol=1e-3)


def test_a_logit_soft_cap_in_the_config_takes_the_one_pass_path(tok):
    model = tiny_model(tok, seed=6)
    assert split_decoder_head(model) is not None
    model.config.final_logit_softcapping = 30.0  # Gemma 2's field: tanh(z / 30) * 30 after the output layer
    assert split_decoder_head(model) is None
