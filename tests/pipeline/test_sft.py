"""The warm start: examples in the answer format the rollout parses, and a real TRL SFTTrainer run on a tiny model
that makes the answers more likely and is what the training run then loads."""

from __future__ import annotations

import pytest

TASKS = ("level1/01_relu", "level1/03_sigmoid")


@pytest.fixture(scope="module")
def tasks():
    from kevin.tasks import find_task, load_bundled_suite

    suite = load_bundled_suite()
    return [find_task(suite, t) for t in TASKS]


def test_each_example_is_the_first_turn_prompt_and_an_answer_the_parser_reads_back_to_the_reference(tasks):
    from kevin.rollout.parsing import parse_response
    from kevin.rollout.prompts import PromptBuilder
    from kevin.tasks import bundled_solution_path
    from kevin.training.sft import reasoning_text, sft_examples, summary_text

    examples = sft_examples(tasks, "cpu")
    assert len(examples) == 2
    for task, example in zip(tasks, examples):
        assert example["prompt"] == PromptBuilder("cpu").messages(task, [])
        (answer,) = example["completion"]
        assert answer["role"] == "assistant"
        parsed = parse_response(answer["content"])
        assert not parsed.parse_error
        assert parsed.kernel.strip() == bundled_solution_path(task, "cpu").read_text().strip()
        assert parsed.reasoning.strip() == reasoning_text(task, "cpu")
        assert parsed.summary.strip() == summary_text("cpu")


def test_tasks_without_a_reference_are_named(tasks, tmp_path):
    import dataclasses

    from kevin.training.sft import sft_examples

    stray = dataclasses.replace(tasks[0], task_id="level1/nope", name="nope")
    with pytest.raises(FileNotFoundError, match=r"level1/nope"):
        sft_examples([stray], "cpu")


@pytest.mark.parametrize("bad, message", [({"lr": -1.0}, "sft.lr must be a positive"),
                                          ({"epochs": 0}, "sft.epochs"), ({"batch_size": 0}, "sft.batch_size"),
                                          ({"enabled": "yes"}, "sft.enabled must be true or false")])
def test_bad_settings_say_what_to_write(bad, message):
    from kevin.training.sft import SFTConfig

    with pytest.raises(ValueError, match=message):
        SFTConfig(**bad)


def _answer_loss(model, tokenizer, example) -> float:
    """Mean negative log-likelihood of the answer's tokens after the prompt."""
    import torch

    prompt = tokenizer.apply_chat_template(example["prompt"], add_generation_prompt=True, tokenize=False)
    full = tokenizer.apply_chat_template(example["prompt"] + example["completion"], tokenize=False)
    assert full.startswith(prompt)
    ids = tokenizer(full, add_special_tokens=False, return_tensors="pt")["input_ids"]
    start = len(tokenizer(prompt, add_special_tokens=False)["input_ids"])
    labels = ids.clone()
    labels[:, :start] = -100
    with torch.no_grad():
        return float(model(input_ids=ids, labels=labels).loss)


def test_sft_trainer_makes_the_answers_likelier_and_the_run_loads_its_model(tasks, tmp_path):
    import torch
    from transformers import AutoModelForCausalLM

    from kevin.config import RunConfig
    from kevin.experiment.policies import load_model
    from kevin.policy.builders import build_model, build_tokenizer, model_config
    from kevin.rollout.replay import tokenizer_corpus
    from kevin.training.sft import SFTConfig, run_sft, sft_examples, sft_model_dir

    tokenizer = build_tokenizer(tokenizer_corpus(tasks, "cpu"), vocab_size=1024)
    with torch.random.fork_rng():
        torch.manual_seed(0)
        model = build_model(model_config("tiny", len(tokenizer), tokenizer, layers=2))
    examples = sft_examples(tasks, "cpu")
    before = [_answer_loss(model, tokenizer, e) for e in examples]
    config = SFTConfig(enabled=True, output_dir=str(tmp_path / "sft"), epochs=3.0, lr=1.0e-3)
    metrics = run_sft(config, model, tokenizer, examples, tmp_path / "sft")
    assert metrics["examples"] == 2 and metrics["steps"] == 6  # 2 examples, batch 1, 3 epochs
    per_epoch = metrics["per_epoch"]
    assert [row["epoch"] for row in per_epoch] == [1, 2, 3]
    assert all({"loss", "entropy", "token_accuracy"} <= set(row) for row in per_epoch), per_epoch
    assert per_epoch[-1]["loss"] < per_epoch[0]["loss"], per_epoch
    saved = sft_model_dir(config)
    assert saved == tmp_path / "sft" / "model"
    trained = AutoModelForCausalLM.from_pretrained(saved).eval()
    after = [_answer_loss(trained, tokenizer, e) for e in examples]
    assert all(a < b - 0.1 for a, b in zip(after, before)), (before, after)

    # The training run starts from the warm-started weights when sft.enabled, and says what to do when missing.
    run = RunConfig.from_dict({"policy": {"backend": "hf", "model": "unused"}, "sft": config.to_dict()})
    loaded, _ = load_model(run)
    for name, tensor in trained.state_dict().items():
        assert torch.equal(loaded.state_dict()[name], tensor), name
    # An example that does not fit is refused before training, with the length it needs.
    short = SFTConfig(enabled=True, output_dir=str(tmp_path / "short"), max_length=100)
    with pytest.raises(ValueError, match=r"2 of 2 warm-start examples are longer than sft.max_length \(100 tokens"):
        run_sft(short, trained, tokenizer, examples, tmp_path / "short")
    missing = RunConfig.from_dict({"sft": {"enabled": True, "output_dir": str(tmp_path / "none")}})
    with pytest.raises(ValueError, match=r"holds no model: run the warm start first \(`dvc repro sft`"):
        load_model(missing)


def test_a_lora_warm_start_saves_an_adapter_that_the_run_merges_into_its_base(tasks, tmp_path):
    import torch

    from kevin.config import RunConfig
    from kevin.experiment.policies import load_model
    from kevin.policy.builders import build_model, build_tokenizer, model_config
    from kevin.rollout.replay import tokenizer_corpus
    from kevin.training.sft import SFTConfig, is_adapter, run_sft, sft_examples, sft_model_dir

    tokenizer = build_tokenizer(tokenizer_corpus(tasks, "cpu"), vocab_size=1024)
    with torch.random.fork_rng():
        torch.manual_seed(0)
        base = build_model(model_config("tiny", len(tokenizer), tokenizer, layers=2))
    base_dir = tmp_path / "base"
    base.save_pretrained(str(base_dir))
    tokenizer.save_pretrained(str(base_dir))
    examples = sft_examples(tasks, "cpu")
    before = [_answer_loss(base, tokenizer, e) for e in examples]
    original = {k: v.clone() for k, v in base.state_dict().items()}
    config = SFTConfig(enabled=True, output_dir=str(tmp_path / "sft"), epochs=3.0, lr=3.0e-3, lora=True, lora_r=4)
    run_sft(config, base, tokenizer, examples, tmp_path / "sft")
    folder = sft_model_dir(config)
    # The adapter alone: peft's config and the low-rank matrices, no copy of the base's weights.
    assert is_adapter(folder) and not (folder / "model.safetensors").exists()
    from safetensors.torch import load_file

    saved = load_file(str(folder / "adapter_model.safetensors"))
    assert saved and all("lora_A" in k or "lora_B" in k for k in saved)
    assert sum(t.numel() for t in saved.values()) < sum(t.numel() for t in original.values()) / 4

    run = RunConfig.from_dict({"policy": {"backend": "hf", "model": str(base_dir)}, "sft": config.to_dict()})
    merged, _ = load_model(run)
    assert not hasattr(merged, "peft_config")  # a plain model: the RL run may wrap it in its own adapter
    # ... or train every weight (train.lora false, the CPU main job): peft froze the base, the merge gives it back.
    assert all(p.requires_grad for p in merged.parameters())
    state = {k: v.clone() for k, v in merged.state_dict().items()}
    assert set(state) == set(original)
    changed = [k for k in original if not torch.equal(state[k], original[k])]
    assert changed and all(k.endswith("proj.weight") for k in changed)  # the linear layers, nothing else
    after = [_answer_loss(merged, tokenizer, e) for e in examples]
    assert all(a < b - 0.1 for a, b in zip(after, before)), (before, after)
    # Loading twice gives the same weights: the base and the adapter rebuild it bit for bit.
    again, _ = load_model(run)
    assert all(torch.equal(again.state_dict()[k], v) for k, v in state.items())

    # A LoRA checkpoint of the RL run is an adapter over that warm-started base: the evaluation merges it into the
    # same base (not into the bare base its adapter_config names).
    from peft import LoraConfig, get_peft_model

    from kevin.experiment.evaluate import load_generator

    rl = get_peft_model(merged, LoraConfig(r=2, lora_alpha=4, target_modules=["q_proj"], task_type="CAUSAL_LM"))
    with torch.no_grad():
        for name, param in rl.named_parameters():
            if "lora_B" in name:
                param.fill_(0.01)
    checkpoint = tmp_path / "checkpoints" / "step_000001"
    rl.save_pretrained(str(checkpoint / "model"))
    expected = {k: v.clone() for k, v in rl.merge_and_unload().state_dict().items()}
    policy, _ = load_generator(run, checkpoint)
    got = policy.model.state_dict()
    assert all(torch.equal(got[k], v) for k, v in expected.items())
    assert not torch.equal(expected["model.layers.0.self_attn.q_proj.weight"],
                           state["model.layers.0.self_attn.q_proj.weight"])
    # No checkpoint: the model the run starts from, the warm start included.
    start, _ = load_generator(run, None)
    assert all(torch.equal(start.model.state_dict()[k], v) for k, v in state.items())


@pytest.mark.parametrize("bad, message", [({"lora": "yes"}, "sft.lora must be true or false"),
                                          ({"lora_r": 0}, "sft.lora_r must be a positive integer")])
def test_bad_lora_settings_say_what_to_write(bad, message):
    from kevin.training.sft import SFTConfig

    with pytest.raises(ValueError, match=message):
        SFTConfig(**bad)


def test_a_prebuilt_warm_start_is_reused_only_when_its_fingerprint_is_this_one(tasks, tmp_path):
    import dataclasses
    import json

    from kevin.training.sft import SFTConfig, reuse_prebuilt, sft_examples, warm_start_fingerprint

    examples = sft_examples(tasks, "cpu")
    config = SFTConfig(enabled=True, lora=True, lora_r=8, epochs=12.0, lr=1.0e-3, prebuilt=str(tmp_path / "pre"))
    base = "embedded:SmolLM2-135M-Instruct.Q4_1.gguf@0.1.2"
    fingerprint = warm_start_fingerprint(config, examples, base)
    assert len(fingerprint) == 64 and fingerprint == warm_start_fingerprint(config, examples, base)
    # Every input that shapes the result changes it; where the result goes, or whether it may be reused, does not.
    changed = [warm_start_fingerprint(dataclasses.replace(config, epochs=11.0), examples, base),
               warm_start_fingerprint(dataclasses.replace(config, lora_r=16), examples, base),
               warm_start_fingerprint(config, examples[:1], base),
               warm_start_fingerprint(config, examples[::-1], base),
               warm_start_fingerprint(config, examples, "hf:/models/other")]
    assert len(set(changed) | {fingerprint}) == 6
    assert warm_start_fingerprint(dataclasses.replace(config, output_dir="x", prebuilt=""), examples, base) == fingerprint

    out = tmp_path / "out"
    assert reuse_prebuilt(dataclasses.replace(config, prebuilt=""), fingerprint, out) == (None, "sft.prebuilt is not set")
    assert reuse_prebuilt(config, fingerprint, out)[0] is None  # nothing there yet
    pre = tmp_path / "pre"
    (pre / "model").mkdir(parents=True)
    (pre / "model" / "adapter_config.json").write_text("{}")
    record = {"enabled": True, "examples": 2, "steps": 24, "train_loss": 0.01, "fingerprint": fingerprint}
    (pre / "sft.json").write_text(json.dumps(record))
    metrics, why = reuse_prebuilt(config, changed[0], out)
    assert metrics is None and "fingerprint differs" in why and not (out / "model").exists()
    metrics, why = reuse_prebuilt(config, fingerprint, out)
    assert why == "" and metrics == {**record, "prebuilt": str(pre)}
    assert (out / "model" / "adapter_config.json").read_text() == "{}"


def test_the_warm_starts_log_is_summed_up_per_epoch():
    """`kevin sft` reports the warm start's loss, entropy and token accuracy per epoch (the mean of TRL's per-step
    log): the entropy at the end says how much the warm start left RL to choose between."""
    from kevin.training.sft import epoch_figures

    log = [
        {"loss": 2.0, "entropy": 1.5, "mean_token_accuracy": 0.5, "epoch": 0.5},
        {"loss": 1.0, "entropy": 0.5, "mean_token_accuracy": 0.7, "epoch": 1.0},
        {"loss": 0.4, "entropy": 0.2, "mean_token_accuracy": 0.9, "epoch": 1.5},
        {"loss": 0.2, "epoch": 2.0},  # a row without entropy counts for the loss only
        {"train_loss": 0.9, "train_runtime": 3.0, "epoch": 2.0},  # TRL's closing summary: no per-step figures
    ]
    assert epoch_figures(log) == [
        {"epoch": 1, "loss": 1.5, "entropy": 1.0, "token_accuracy": 0.6},
        {"epoch": 2, "loss": 0.3, "entropy": 0.2, "token_accuracy": 0.9},
    ]
    assert epoch_figures([]) == []
