"""The update and the in-process policy on a CUDA GPU: bf16 autocast, fused AdamW, checkpoints (device machine)."""

from __future__ import annotations

import pytest
import torch

from kevin.policy.hf import HFPolicy, SamplingConfig
from kevin.records.rollout import TrainingSample
from kevin.training.config import TrainConfig
from kevin.training.loss import LossConfig
from kevin.training.trainer import GRPOTrainer, sequence_logprobs
from tests.tiny_lm import tiny_model, tiny_tokenizer

pytestmark = pytest.mark.gpu


def _samples(policy, tok):
    prompts = [tok.apply_chat_template([{"role": "user", "content": t}], add_generation_prompt=True, tokenize=False)
               for t in ("say a", "write something longer please", "x", "abc")]
    outs = policy(prompts)
    return outs, [TrainingSample(o.prompt_token_ids, o.token_ids, o.logprobs, reward=0.0, advantage=a, task_id="t",
                                 trajectory=i, turn=0) for i, (o, a) in enumerate(zip(outs, (1.0, -1.0, 0.5, -0.5)))]


@pytest.mark.parametrize("lora", [False, True])
def test_cuda_generate_update_checkpoint(tmp_path, lora):
    tok = tiny_tokenizer()
    trainer = GRPOTrainer(tiny_model(tok, hidden=64), TrainConfig(lr=1e-3, temperature=1.0, device="cuda", lora=lora,
                                                                  lora_r=4, loss=LossConfig(max_completion_length=16)))
    assert trainer.autocast_dtype == torch.bfloat16 and next(trainer.model.parameters()).is_cuda
    policy = HFPolicy(trainer.model, tok, SamplingConfig(max_new_tokens=16, temperature=1.0, seed=0))
    assert policy.autocast_dtype == torch.bfloat16
    outs, samples = _samples(policy, tok)
    with torch.no_grad(), torch.autocast("cuda", dtype=torch.bfloat16):
        again = sequence_logprobs(trainer.model, [o.prompt_token_ids for o in outs], [o.token_ids for o in outs],
                                  temperature=1.0)
    for i, o in enumerate(outs):  # bf16 compute: the KV-cache path and one full pass agree loosely
        assert torch.allclose(again.logprobs[i, :len(o.token_ids)].cpu(), torch.tensor(o.logprobs), atol=0.1)
    metrics = trainer.update(samples)
    assert all(m["skipped"] == 0 and m["grad_norm"] > 0 for m in metrics)
    assert 0 <= metrics[0]["rollout_logprob_diff"] < 0.1
    path = trainer.save_checkpoint(tmp_path, 0, extra={"policy": policy.state_dict()})
    saved = {n: p.detach().clone() for n, p in trainer.model.named_parameters()}
    trainer.update(samples)
    assert trainer.resume(tmp_path) == 1 and path.name == "step_000000"
    for n, p in trainer.model.named_parameters():
        assert torch.equal(p, saved[n]), n
    state = trainer.resumed_extra["policy"]
    policy.load_state_dict(state)
    first = [o.token_ids for o in policy(["<u>x<a>"] * 3)]
    policy.load_state_dict(state)
    assert [o.token_ids for o in policy(["<u>x<a>"] * 3)] == first  # the sampler's CUDA RNG state round-trips


def test_bf16_gradients_stay_finite_when_prompt_lengths_differ_widely():
    # A left-padded batch gives the short prompts' pad positions attention rows with nothing to attend to; the
    # memory-efficient SDPA backward made NaN of those on the H200 (a GRPO step's both optimiser steps skipped).
    tok = tiny_tokenizer()
    model = tiny_model(tok, hidden=64).cuda().train()
    prompts = [[5 + i % 40 for i in range(n)] for n in (300, 1, 7, 150)]  # ids inside the tiny vocabulary (52)
    completions = [[5 + (7 * i) % 40 for i in range(n)] for n in (5, 40, 1, 12)]
    with torch.autocast("cuda", dtype=torch.bfloat16):
        out = sequence_logprobs(model, prompts, completions, temperature=0.7)
    (out.logprobs.sum() / out.mask.sum()).backward()
    grads = [p.grad for p in model.parameters() if p.grad is not None]
    assert grads and all(bool(torch.isfinite(g).all()) for g in grads)
    assert sum(float(g.norm()) for g in grads) > 0
