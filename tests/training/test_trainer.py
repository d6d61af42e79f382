"""GRPOTrainer and sequence_logprobs on a tiny in-process model (CPU, float32)."""

from __future__ import annotations

import copy
import json
import random

import pytest
import torch

from kevin.records.rollout import TrainingSample
from kevin.training.config import TrainConfig
from kevin.training.loss import LossConfig
from kevin.training.trainer import (
    GRPOTrainer,
    latest_checkpoint,
    list_checkpoints,
    lr_factor,
    pad_prompt_completion,
    sequence_logprobs,
)
from tests.tiny_lm import tiny_model, tiny_tokenizer

MAX_LEN = 16


@pytest.fixture(scope="module")
def tok():
    return tiny_tokenizer()


@pytest.fixture
def model(tok):
    return tiny_model(tok, seed=1)


def make_samples(n=6, seed=0, vocab=52):
    """Random prompts/completions of different lengths with mixed-sign advantages."""
    g = torch.Generator().manual_seed(seed)
    out = []
    for i in range(n):
        p = int(torch.randint(3, 12, (1,), generator=g))
        c = int(torch.randint(1, MAX_LEN + 1, (1,), generator=g))
        out.append(TrainingSample(
            prompt_token_ids=torch.randint(5, vocab, (p,), generator=g).tolist(),
            completion_token_ids=torch.randint(5, vocab, (c,), generator=g).tolist(),
            old_logprobs=None, reward=0.0, advantage=float(torch.randn((), generator=g)) * 2,
            task_id=f"t{i % 2}", trajectory=i, turn=0))
    return out


def config(**kw):
    base = dict(lr=1e-2, temperature=1.0, warmup_ratio=0.0, micro_batch_size=4, device="cpu",
                loss=LossConfig(max_completion_length=MAX_LEN))
    base.update(kw)
    return TrainConfig(**base)


def params_of(model):
    return {k: v.detach().clone() for k, v in model.named_parameters()}


# ------------------------------------------------------------------------------ sequence_logprobs


def test_pad_prompt_completion_layout():
    ids, attn, pos, cmask, index = pad_prompt_completion([[7, 8, 9], [5], [4]], [[1], [2, 3, 4], []], pad_id=0)
    # Every sequence starts at column 0, so no query's attention row is all padding (NaN gradients on the GPU).
    assert ids.tolist() == [[7, 8, 9, 1], [5, 2, 3, 4], [4, 0, 0, 0]]
    assert attn.tolist() == [[1, 1, 1, 1], [1, 1, 1, 1], [1, 0, 0, 0]]
    assert pos.tolist() == [[0, 1, 2, 3]] * 3
    assert cmask.tolist() == [[True, False, False], [True, True, True], [False, False, False]]
    assert index[0, 0] == 3 and index[1].tolist() == [1, 2, 3]  # the columns of the completion tokens
    assert bool((index >= 1).all())  # padding too: the column before each index exists


def test_sequence_logprobs_equals_manual_gather_and_masks(model):
    samples = make_samples(5)
    temperature = 0.8
    got = sequence_logprobs(model, [s.prompt_token_ids for s in samples], [s.completion_token_ids for s in samples],
                            temperature=temperature, with_entropy=True)
    width = max(len(s.completion_token_ids) for s in samples)
    assert got.logprobs.shape == got.mask.shape == got.entropy.shape == (5, width)
    for i, s in enumerate(samples):
        n, p = len(s.completion_token_ids), len(s.prompt_token_ids)
        assert got.mask[i].tolist() == [True] * n + [False] * (width - n)
        assert torch.all(got.logprobs[i, n:] == 0) and torch.all(got.entropy[i, n:] == 0)
        with torch.no_grad():  # one unpadded sequence, full logits, explicit gather
            logits = model(torch.tensor([s.prompt_token_ids + s.completion_token_ids])).logits[0]
        lp = torch.log_softmax(logits[p - 1:p + n - 1] / temperature, dim=-1)  # [n, V]
        manual = lp.gather(1, torch.tensor(s.completion_token_ids).unsqueeze(1)).squeeze(1)
        assert torch.allclose(got.logprobs[i, :n], manual, atol=1e-5)
        entropy = -(lp.exp() * lp).sum(-1)
        assert torch.allclose(got.entropy[i, :n], entropy, atol=1e-5)


def test_sequence_logprobs_gradient_flows_and_empty_completions(model):
    got = sequence_logprobs(model, [[5, 6]], [[7, 8]])
    got.logprobs.sum().backward()
    assert model.lm_head.weight.grad is not None
    empty = sequence_logprobs(model, [[5, 6], [7]], [[], []])
    assert empty.logprobs.shape == (2, 0)
    with pytest.raises(ValueError, match="empty prompt"):
        sequence_logprobs(model, [[]], [[5]])


# ------------------------------------------------------------------------------ updates


def test_update_changes_parameters_and_reports_metrics(model):
    before = params_of(model)
    trainer = GRPOTrainer(model, config())
    metrics = trainer.update(make_samples())
    assert len(metrics) == 2
    first, second = metrics
    assert first["on_policy"] == 1.0 and second["on_policy"] == 0.0
    # On-policy: every ratio is exactly 1, so nothing is clipped and the KL estimate is 0.
    assert first["ratio_mean"] == pytest.approx(1.0) and first["clip_fraction"] == 0.0 and first["approx_kl"] == 0.0
    assert second["approx_kl"] > 0 and second["ratio_mean"] != pytest.approx(1.0, abs=1e-9)
    for m in metrics:
        assert m["entropy"] > 0 and m["tokens_per_s"] > 0 and m["grad_norm"] > 0 and m["skipped"] == 0.0
    changed = [k for k, v in model.named_parameters() if not torch.equal(v, before[k])]
    assert len(changed) == len(before)
    assert trainer.optimizer_steps == 2


def test_off_policy_step_uses_first_step_logprobs(model):
    """Step 2's ratios are taken against the log-probs of the policy before step 1."""
    samples = make_samples()
    with torch.no_grad():
        before = sequence_logprobs(model, [s.prompt_token_ids for s in samples],
                                   [s.completion_token_ids for s in samples]).logprobs
    trainer = GRPOTrainer(model, config(grad_steps=1))
    trainer.update(samples)
    old = {}
    for i, s in enumerate(samples):
        old[i] = before[i, :len(s.completion_token_ids)]
    trainer.optimizer.zero_grad()
    m = trainer.accumulate_gradients(samples, old_logprobs=old)
    with torch.no_grad():
        now = sequence_logprobs(model, [s.prompt_token_ids for s in samples],
                                [s.completion_token_ids for s in samples])
    ratio = torch.exp(now.logprobs - before)[now.mask]
    assert m["ratio_mean"] == pytest.approx(float(ratio.mean()), rel=1e-5)


def test_grad_clip_reports_pre_clip_norm_and_applies_max(model):
    trainer = GRPOTrainer(model, config(grad_steps=1))
    samples = make_samples()
    # The norm the trainer reports must be the norm of the raw accumulated gradient.
    probe = GRPOTrainer(copy.deepcopy(model), config(grad_steps=1))
    probe.accumulate_gradients(samples)
    raw = torch.linalg.vector_norm(torch.stack([p.grad.norm() for p in probe.params])).item()
    (m,) = trainer.update(samples)
    assert m["grad_norm"] == pytest.approx(raw, rel=1e-5)
    assert m["grad_norm"] > 0.05  # the test is only meaningful if clipping had work to do
    assert m["grad_norm_clipped"] <= 0.05 + 1e-6


def test_clip_applied_to_the_step(model):
    """The gradient the optimiser receives has norm max_grad_norm when the raw norm is larger."""
    trainer = GRPOTrainer(model, config(grad_steps=1, max_grad_norm=0.05))
    seen = []
    trainer.optimizer.register_step_pre_hook(lambda opt, args, kwargs: seen.append(
        torch.linalg.vector_norm(torch.stack([p.grad.norm() for p in trainer.params])).item()))
    (m,) = trainer.update(make_samples())
    assert m["grad_norm"] > 0.05 and seen == [pytest.approx(0.05, rel=1e-4)]


@pytest.mark.parametrize("aggregation", ["dr_grpo", "token_mean", "sequence_mean"])
def test_micro_batching_gives_the_full_batch_gradient(tok, aggregation):
    samples = make_samples(7)
    grads = []
    for micro in (1, 3, 7):
        model = tiny_model(tok, seed=2)
        trainer = GRPOTrainer(model, config(micro_batch_size=micro,
                                            loss=LossConfig(max_completion_length=MAX_LEN, aggregation=aggregation)))
        trainer.accumulate_gradients(samples)
        grads.append({k: p.grad.clone() for k, p in model.named_parameters()})
    for other in grads[1:]:
        for k, g in grads[0].items():
            assert torch.allclose(g, other[k], atol=1e-6, rtol=0), k


def test_skipping_zero_advantage_samples_keeps_the_gradient(tok):
    samples = make_samples(6)
    for s in samples[::2]:
        s.advantage = 0.0
    grads, metrics = [], []
    for skip in (True, False):
        model = tiny_model(tok, seed=2)
        trainer = GRPOTrainer(model, config(skip_zero_advantage=skip))
        metrics.append(trainer.accumulate_gradients(samples))
        grads.append({k: p.grad.clone() for k, p in model.named_parameters()})
    assert metrics[0]["trained_sequences"] == 3 and metrics[1]["trained_sequences"] == 6
    assert metrics[0]["loss"] == pytest.approx(metrics[1]["loss"], abs=1e-7)
    for k, g in grads[0].items():
        assert torch.allclose(g, grads[1][k], atol=1e-7), k


def test_all_zero_advantages_take_no_step(model):
    samples = make_samples(4)
    for s in samples:
        s.advantage = 0.0
    before = params_of(model)
    metrics = GRPOTrainer(model, config()).update(samples)
    assert all(m["grad_norm"] == 0.0 and m["trained_sequences"] == 0 for m in metrics)
    assert all(torch.equal(v, before[k]) for k, v in model.named_parameters())


def test_empty_completions_are_harmless(model):
    samples = make_samples(4)
    for s in samples[:2]:
        s.completion_token_ids = []
    metrics = GRPOTrainer(model, config(micro_batch_size=2)).update(samples)
    assert metrics[0]["trained_sequences"] == 2 and metrics[0]["sequences"] == 4 and metrics[0]["grad_norm"] > 0


def test_split_batch_uses_disjoint_minibatches(model):
    samples = make_samples(6)
    metrics = GRPOTrainer(model, config(split_batch=True)).update(samples)
    assert [m["sequences"] for m in metrics] == [3, 3]
    assert metrics[0]["on_policy"] == 1.0 and metrics[1]["on_policy"] == 0.0
    assert metrics[1]["approx_kl"] > 0  # the second mini-batch sees the policy moved by the first


def test_gradient_checkpointing_same_gradient(tok):
    samples = make_samples(4)
    grads = []
    for ckpt in (False, True):
        model = tiny_model(tok, seed=2)
        GRPOTrainer(model, config(gradient_checkpointing=ckpt)).accumulate_gradients(samples)
        grads.append({k: p.grad.clone() for k, p in model.named_parameters()})
    for k, g in grads[0].items():
        assert torch.allclose(g, grads[1][k], atol=1e-6), k


def test_kl_to_reference_full_finetuning(model):
    trainer = GRPOTrainer(model, config(loss=LossConfig(max_completion_length=MAX_LEN, beta=0.1)))
    assert trainer.ref_model is not None and not any(p.requires_grad for p in trainer.ref_model.parameters())
    first, second = trainer.update(make_samples())
    assert first["kl_ref"] == pytest.approx(0.0, abs=1e-7)  # the policy still equals the reference
    assert second["kl_ref"] > 0


def test_no_reference_model_without_kl(model):
    assert GRPOTrainer(model, config()).ref_model is None


def test_rollout_logprob_mismatch_metric(model):
    samples = make_samples(3)
    with torch.no_grad():
        lp = sequence_logprobs(model, [s.prompt_token_ids for s in samples], [s.completion_token_ids for s in samples])
    for i, s in enumerate(samples):
        s.old_logprobs = (lp.logprobs[i, :len(s.completion_token_ids)] - 0.5).tolist()
    (m, _) = GRPOTrainer(model, config()).update(samples)
    assert m["rollout_logprob_diff"] == pytest.approx(0.5, abs=1e-4)


def test_sample_checks(model):
    trainer = GRPOTrainer(model, config())
    with pytest.raises(ValueError, match="at least one"):
        trainer.update([])
    long = make_samples(1)[0]
    long.completion_token_ids = [5] * (MAX_LEN + 1)
    with pytest.raises(ValueError, match="max_completion_length"):
        trainer.update([long])


# ------------------------------------------------------------------------------ LoRA


def test_lora_trains_only_adapter_weights(model):
    pytest.importorskip("peft")
    before = params_of(model)
    trainer = GRPOTrainer(model, config(lora=True, lora_r=4, lora_alpha=8, lr=5e-2,
                                        lora_target_modules=["q_proj", "v_proj"]))
    names = [n for n, p in trainer.model.named_parameters() if p.requires_grad]
    assert names and all("lora_" in n for n in names)
    lora_before = {n: p.detach().clone() for n, p in trainer.model.named_parameters() if p.requires_grad}
    trainer.update(make_samples())
    base = dict(trainer.model.get_base_model().named_parameters())
    for k, v in before.items():
        key = k.replace("q_proj.weight", "q_proj.base_layer.weight").replace("v_proj.weight", "v_proj.base_layer.weight")
        assert torch.equal(base[key], v), k
    assert any(not torch.equal(p, lora_before[n]) for n, p in trainer.model.named_parameters() if p.requires_grad)


def test_lora_kl_reference_is_adapter_free_base(model):
    pytest.importorskip("peft")
    trainer = GRPOTrainer(model, config(lora=True, lora_r=4, loss=LossConfig(max_completion_length=MAX_LEN, beta=0.1)))
    assert trainer.ref_model is None
    first, second = trainer.update(make_samples())
    assert first["kl_ref"] == pytest.approx(0.0, abs=1e-7)  # LoRA B starts at 0: adapters change nothing yet
    assert second["kl_ref"] > 0


# ------------------------------------------------------------------------------ checkpoints


def _opt_state(trainer):
    return {k: {n: t.clone() if torch.is_tensor(t) else t for n, t in v.items()}
            for k, v in trainer.optimizer.state_dict()["state"].items()}


@pytest.mark.parametrize("lora", [False, True])
def test_checkpoint_round_trip(tok, tmp_path, lora):
    if lora:
        pytest.importorskip("peft")
    trainer = GRPOTrainer(tiny_model(tok, seed=4), config(lora=lora, lora_r=4), tokenizer=tok)
    trainer.update(make_samples(seed=1))
    path = trainer.save_checkpoint(tmp_path, step=0, extra={"sampler": torch.arange(3)})
    saved_params = {n: p.detach().clone() for n, p in trainer.model.named_parameters()}
    saved_opt, saved_lr = _opt_state(trainer), trainer.optimizer.param_groups[0]["lr"]
    draws = (random.random(), torch.rand(2))
    trainer.update(make_samples(seed=2))  # move everything on
    state = trainer.load_checkpoint(path)
    assert state["step"] == 0 and state["optimizer_steps"] == 2 and torch.equal(state["extra"]["sampler"], torch.arange(3))
    assert state["config"] == trainer.config.to_dict()
    for n, p in trainer.model.named_parameters():
        assert torch.equal(p, saved_params[n]), n
    restored = _opt_state(trainer)
    assert restored.keys() == saved_opt.keys()
    for k in saved_opt:
        for n, t in saved_opt[k].items():
            assert torch.equal(torch.as_tensor(restored[k][n]), torch.as_tensor(t)), (k, n)
    assert trainer.optimizer.param_groups[0]["lr"] == saved_lr and trainer.optimizer_steps == 2
    assert random.random() == draws[0] and torch.equal(torch.rand(2), draws[1])
    files = {p.name for p in (path / "model").iterdir()}
    assert ("adapter_model.safetensors" in files) if lora else ("model.safetensors" in files)
    assert "tokenizer.json" in files
    assert json.loads((path / "trainer_state.json").read_text())["lora"] is lora


def test_resumed_run_continues_identically(tok, tmp_path):
    """Train 3 steps straight vs 2 steps + checkpoint + fresh trainer resumed + 1 step: same weights."""
    batches = [make_samples(seed=s) for s in range(3)]
    straight = GRPOTrainer(tiny_model(tok, seed=5), config())
    for b in batches:
        straight.update(b)
    first = GRPOTrainer(tiny_model(tok, seed=5), config())
    for step, b in enumerate(batches[:2]):
        first.update(b)
        first.save_checkpoint(tmp_path, step)
    resumed = GRPOTrainer(tiny_model(tok, seed=99), config())  # different init: the checkpoint must win
    start = resumed.resume(tmp_path)
    assert start == 2
    for b in batches[start:]:
        resumed.update(b)
    for (n, a), (_, b) in zip(straight.model.named_parameters(), resumed.model.named_parameters()):
        assert torch.allclose(a, b, atol=1e-7), n


def test_a_resume_with_a_changed_lr_goes_on_at_the_new_lr(tok, tmp_path):
    # The optimiser's and the scheduler's saved states both hold the old lr; the configured one must win.
    cfg = dict(lr_schedule="linear", warmup_ratio=0.0)
    first = GRPOTrainer(tiny_model(tok, seed=5), config(lr=1e-2, **cfg))
    first.update(make_samples(seed=1))  # 2 optimiser steps
    first.save_checkpoint(tmp_path, 0)
    same = GRPOTrainer(tiny_model(tok, seed=5), config(lr=1e-2, **cfg))
    same.resume(tmp_path)
    changed = GRPOTrainer(tiny_model(tok, seed=5), config(lr=3e-2, **cfg))
    changed.resume(tmp_path)
    total = changed.config.total_optimizer_steps
    factor = 1.0 - 2 / total  # linear decay after 2 of its optimiser steps
    assert same.optimizer.param_groups[0]["lr"] == pytest.approx(1e-2 * factor, rel=1e-12)
    assert changed.optimizer.param_groups[0]["lr"] == pytest.approx(3e-2 * factor, rel=1e-12)
    before = params_of(changed.model)
    changed.update(make_samples(seed=2))
    assert changed.scheduler.get_last_lr()[0] == pytest.approx(3e-2 * (1.0 - 4 / total), rel=1e-12)
    assert any(not torch.equal(before[n], p) for n, p in changed.model.named_parameters())


def test_resume_without_checkpoint_starts_at_zero(model, tmp_path):
    assert GRPOTrainer(model, config()).resume(tmp_path / "none") == 0


def test_keep_last_k_and_ignore_partial(model, tmp_path):
    trainer = GRPOTrainer(model, config(keep_checkpoints=2))
    for step in range(4):
        trainer.save_checkpoint(tmp_path, step)
    (tmp_path / ".step_000009.abc.tmp").mkdir()  # a save killed half-way
    (tmp_path / "step_000010").mkdir()  # no trainer_state.json: not finished
    assert [s for s, _ in list_checkpoints(tmp_path)] == [2, 3]
    assert latest_checkpoint(tmp_path).name == "step_000003"
    assert trainer.resume(tmp_path) == 4
    trainer.save_checkpoint(tmp_path, 3)  # saving a step again replaces it
    assert [s for s, _ in list_checkpoints(tmp_path)] == [2, 3]


def test_lora_checkpoint_refused_by_full_trainer(tok, tmp_path):
    pytest.importorskip("peft")
    GRPOTrainer(tiny_model(tok), config(lora=True, lora_r=4)).save_checkpoint(tmp_path, 0)
    with pytest.raises(ValueError, match="train.lora"):
        GRPOTrainer(tiny_model(tok), config()).resume(tmp_path)


# ------------------------------------------------------------------------------ config, schedule


def test_lr_schedule():
    assert [lr_factor(s, warmup=2, total=6, schedule="constant") for s in range(4)] == [0.5, 1.0, 1.0, 1.0]
    assert lr_factor(2, warmup=2, total=6, schedule="linear") == 1.0
    assert lr_factor(6, warmup=2, total=6, schedule="linear") == 0.0
    assert lr_factor(4, warmup=2, total=6, schedule="cosine") == pytest.approx(0.5)
    assert TrainConfig(total_steps=40, grad_steps=2, warmup_ratio=0.03).warmup_steps == 3


@pytest.mark.parametrize("kwargs", [dict(lr=0), dict(warmup_ratio=1.0), dict(lr_schedule="step"), dict(grad_steps=0),
                                    dict(micro_batch_size=0), dict(max_grad_norm=0), dict(temperature=0),
                                    dict(adam_betas=(0.9,)), dict(dtype="fp16"), dict(lora="yes"),
                                    dict(lora_target_modules=[]), dict(device="tpu"), dict(keep_checkpoints=0),
                                    dict(loss={"eps_low": 2.0})])
def test_train_config_validation(kwargs):
    with pytest.raises(ValueError):
        TrainConfig(**kwargs)


def test_train_config_round_trip():
    cfg = TrainConfig(lr=1e-5, loss=LossConfig(beta=0.01), lora_target_modules=["q_proj"])
    again = TrainConfig.from_dict(json.loads(json.dumps(cfg.to_dict())))
    assert again == cfg
    with pytest.raises(ValueError, match="unknown train"):
        TrainConfig.from_dict({"learning_rate": 1.0})


def test_accelerate_zero3_config_parses():
    pytest.importorskip("accelerate")
    from pathlib import Path

    from accelerate.commands.config.config_args import ClusterConfig

    path = Path(__file__).resolve().parents[2] / "configs" / "accelerate_zero3.yaml"
    cfg = ClusterConfig.from_yaml_file(str(path))
    assert cfg.distributed_type.value == "DEEPSPEED" and cfg.deepspeed_config["zero_stage"] == 3
    assert cfg.deepspeed_config["gradient_clipping"] == TrainConfig().max_grad_norm


# ------------------------------------------------------------------------------ RNG


def test_the_trainer_leaves_the_global_rng_to_the_entry_point(model):
    """Building a trainer must not reseed: that would reset whatever the program drew before it."""
    torch.manual_seed(123)
    random.seed(123)
    torch_before, python_before = torch.get_rng_state(), random.getstate()
    GRPOTrainer(model, config())
    assert torch.equal(torch.get_rng_state(), torch_before) and random.getstate() == python_before


def test_seed_everything_makes_lora_initialisation_repeatable(tok):
    from kevin.training.rng import rng_state, seed_everything, set_rng_state

    def lora_factors():
        seed_everything(7)  # what an entry point does before building the model and trainer
        trainer = GRPOTrainer(tiny_model(tok, seed=3), config(lora=True, lora_r=4))
        return {n: p.detach().clone() for n, p in trainer.model.named_parameters() if "lora_A" in n}

    first, second = lora_factors(), lora_factors()
    assert first.keys() == second.keys() and all(torch.equal(first[k], second[k]) for k in first)
    state = rng_state()
    draw = torch.rand(3)
    set_rng_state(state)
    assert torch.equal(torch.rand(3), draw)
