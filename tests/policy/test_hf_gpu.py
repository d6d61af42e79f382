"""The static decoding path and the chunked log-probs on a CUDA GPU (the device machine; skipped elsewhere)."""

from __future__ import annotations

import pytest
import torch

from kevin.policy.hf import HFPolicy, SamplingConfig
from kevin.training.logprobs import sequence_logprobs
from tests.tiny_lm import tiny_model, tiny_tokenizer

pytestmark = pytest.mark.gpu

PROMPTS = [[5, 6, 7, 8, 9, 10, 11], [12, 13], [14, 15, 16, 17], [18]]


@pytest.fixture(scope="module")
def tok():
    return tiny_tokenizer()


def _gen(model, tok, **cfg):
    policy = HFPolicy(model, tok, SamplingConfig(**{"max_new_tokens": 40, "temperature": 1.0, "seed": 3, **cfg}))
    return policy, policy.generate_ids(PROMPTS)


def _same(a, b, atol):
    assert [o.token_ids for o in a] == [o.token_ids for o in b]
    for x, y in zip(a, b):
        assert x.logprobs == pytest.approx(y.logprobs, abs=atol)


def test_sample_tokens_draws_what_multinomial_draws_on_cuda():
    from kevin.policy.decode import sample_tokens

    probs = torch.softmax(torch.randn(8, 5000, device="cuda") * 3, dim=-1)
    a = torch.Generator(device="cuda").manual_seed(1)
    b = torch.Generator(device="cuda").manual_seed(1)
    for _ in range(10):
        assert torch.equal(torch.multinomial(probs, 1, generator=a).squeeze(1), sample_tokens(probs, b))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_cuda_graph_replays_sample_what_eager_steps_sample(tok, dtype):
    # float32 weights sample under bfloat16 autocast (the trainer's masters); bfloat16 weights without it.
    model = tiny_model(tok, seed=1).to("cuda", dtype)
    graph, a = _gen(model, tok)
    eager, b = _gen(model, tok, cuda_graph=False)
    assert (graph.last_call.graph_batches, eager.last_call.graph_batches) == (1, 0)
    _same(a, b, atol=1e-6)  # the same kernels, replayed


def test_cuda_graph_samples_a_lora_wrapped_model_and_sees_its_updates(tok):
    """The training policy is a PEFT model whose adapter the optimiser changes in place between generations: a
    graph captured per batch must sample what eager steps sample, before and after an update."""
    from peft import LoraConfig, get_peft_model

    base = tiny_model(tok, seed=4).to("cuda")
    model = get_peft_model(base, LoraConfig(r=4, lora_alpha=8, target_modules="all-linear", lora_dropout=0.0))
    # float32 weights: the policy samples under bfloat16 autocast, as the trainer's model does.
    before = [_gen(model, tok, cuda_graph=g)[1] for g in (True, False)]
    _same(*before, atol=1e-6)
    with torch.no_grad():  # an "update": every adapter weight moves, in place (the optimiser's way)
        for name, p in model.named_parameters():
            if "lora_" in name:
                p.add_(torch.randn_like(p) * 0.5)
    graph, after = _gen(model, tok, cuda_graph=True)
    eager = _gen(model, tok, cuda_graph=False)[1]
    assert graph.last_call.graph_batches == 1
    _same(after, eager, atol=1e-6)
    assert [o.token_ids for o in after] != [o.token_ids for o in before[0]]  # the update changed what it samples


def test_graph_path_log_probs_match_the_trainer_forward(tok):
    model = tiny_model(tok, seed=2).to("cuda")
    policy, outs = _gen(model, tok, cuda_graph=True, temperature=0.8)
    assert policy.last_call.graph_batches == 1
    with torch.autocast("cuda", dtype=torch.bfloat16), torch.no_grad():
        again = sequence_logprobs(model, [o.prompt_token_ids for o in outs], [o.token_ids for o in outs],
                                  temperature=0.8)
    for i, o in enumerate(outs):
        assert torch.allclose(again.logprobs[i, :len(o.token_ids)].cpu(), torch.tensor(o.logprobs), atol=5e-2)


def test_chunked_logprobs_keep_the_update_memory_down():
    from transformers import Qwen2Config, Qwen2ForCausalLM

    config = Qwen2Config(vocab_size=65536, hidden_size=64, intermediate_size=128, num_hidden_layers=1,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=4096)
    model = Qwen2ForCausalLM(config).to("cuda")
    prompts = [[1, 2, 3]] * 4
    completions = [list(range(10, 2058))] * 4  # 4 x 2048 tokens: one-pass logits are 4 x 2048 x 65536

    def peak(chunk: int) -> tuple[float, torch.Tensor]:
        model.zero_grad(set_to_none=True)
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        start = torch.cuda.memory_allocated()
        with torch.autocast("cuda", dtype=torch.bfloat16):
            out = sequence_logprobs(model, prompts, completions, chunk_tokens=chunk, with_entropy=True)
        out.logprobs.sum().backward()
        torch.cuda.synchronize()
        grad = model.lm_head.weight.grad.clone()
        return (torch.cuda.max_memory_allocated() - start) / 2**30, grad

    one_pass, g1 = peak(0)
    chunked, g2 = peak(1024)
    print(f"update peak over the model: one pass {one_pass:.2f} GiB, chunked {chunked:.2f} GiB")
    # The figures go into every message: a device call returns only the tail of its output.
    assert one_pass > 2.0, f"one pass {one_pass:.2f} GiB: less than its float32 log-softmax"
    assert chunked < one_pass / 3, f"chunked {chunked:.2f} GiB against one pass {one_pass:.2f} GiB"
    # bf16 products summed in another order differ element by element (0.03 at worst on the H200, 2026-12-04);
    # the same gradient means the same direction and size as a whole.
    rel = float((g1 - g2).norm() / g1.norm())
    assert rel < 1e-2, f"head gradients differ by {rel:.3g} of their norm"


def test_compiled_decode_step_log_probs_match_a_forward_pass(tok):
    model = tiny_model(tok, seed=5).to("cuda", torch.bfloat16)
    compiled, outs = _gen(model, tok, compile=True, temperature=0.8)
    assert compiled.last_call.graph_batches == 1
    with torch.no_grad():
        again = sequence_logprobs(model, [o.prompt_token_ids for o in outs], [o.token_ids for o in outs],
                                  temperature=0.8)
    for i, o in enumerate(outs):
        assert torch.allclose(again.logprobs[i, :len(o.token_ids)].cpu(), torch.tensor(o.logprobs), atol=5e-2)
