"""The model a run trains and the backend that generates with it, from the run's config.

- ``embedded`` / ``hf``: the trainer's model generates in-process (``HFPolicy`` on ``trainer.model``), so an
  update is visible to the next rollout without copying anything;
- ``openai``: a server generates (vLLM, ``transformers serve``); the trainer updates a local copy of the served
  weights (``policy.weights``) and ``WeightSync`` hands each update to the server: a new model folder named in
  the requests (``folder``), a LoRA adapter loaded into vLLM (``lora``), or every weight over NCCL (``full``).
``policy.wrap`` names a function that wraps the backend (e.g. the reference replay of the tests and the GPU
script). transformers and torch are imported inside the functions.
"""

from __future__ import annotations

import importlib
import logging
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Sequence

from kevin.config import RunConfig
from kevin.tasks.task import Task

if TYPE_CHECKING:
    from kevin.policy.protocol import Policy
    from kevin.training.trainer import GRPOTrainer

log = logging.getLogger(__name__)

__all__ = ["WeightSync", "build_policy", "load_model", "model_label", "resolve_wrap", "sync_mode", "weights_folder"]

EMBEDDED_LABEL = "SmolLM2-135M-Instruct (embedded)"


def weights_folder(config: RunConfig) -> str:
    """The local folder the trainer loads for an ``openai`` run: ``policy.weights``, else ``policy.model`` when it
    names a folder (``transformers serve`` serves folders by path)."""
    folder = config.policy.weights or config.policy.model
    if not Path(folder).is_dir():
        raise ValueError(f"policy.backend openai trains a local copy of the served weights, but {folder!r} is not a "
                         "model folder; set policy.weights to the folder the server was started from")
    return folder


def model_label(config: RunConfig) -> str:
    """The model as the MLflow ``model`` tag shows it."""
    if config.policy.backend == "openai":
        return f"{config.policy.model} (served at {config.openai.base_url})"
    label = EMBEDDED_LABEL if config.policy.backend == "embedded" else config.policy.model
    if config.sft.enabled:
        from kevin.training.sft import sft_model_dir

        label += f", warm-started ({sft_model_dir(config.sft)})"
    return label


def model_identity(config: RunConfig) -> str:
    """What names the policy's own weights (before any warm start): the embedded model's file and its package's
    version, or the ``policy.model`` a run loads (an adapter fits only the weights it was trained over)."""
    if config.policy.backend == "embedded":
        from kevin.policy.embedded import GGUF_FILE, package_version

        return f"embedded:{GGUF_FILE}@{package_version()}"
    return f"{config.policy.backend}:{config.policy.model}"


def load_model(config: RunConfig, project_dir: str | Path = ".") -> tuple[Any, Any]:
    """(model, tokenizer) the trainer will update, in float32 on the CPU (the trainer moves it to its device and
    keeps float32 master weights). With ``sft.enabled`` that is the warm-started model the sft stage wrote."""
    import torch

    if config.sft.enabled:
        import dataclasses

        from kevin.training.sft import is_adapter, merge_adapter, sft_model_dir

        if config.policy.backend == "openai":
            raise ValueError("sft.enabled warm-starts an in-process policy (backend embedded or hf); for a served "
                             "model, serve the fine-tuned folder and set policy.weights to it instead")
        folder = sft_model_dir(config.sft, project_dir)
        if is_adapter(folder):  # sft.lora: the policy's own base with the warm start's adapter merged in
            base = dataclasses.replace(config, sft=dataclasses.replace(config.sft, enabled=False))
            model, tokenizer = load_model(base, project_dir)
            return merge_adapter(model, folder).eval(), tokenizer
        if not (folder / "config.json").is_file():
            raise ValueError(f"sft.enabled is true but {folder} holds no model: run the warm start first "
                             "(`dvc repro sft`, or `python -m kevin_cli sft --out OUTPUT_DIR`)")
        from transformers import AutoModelForCausalLM, AutoTokenizer

        tokenizer = AutoTokenizer.from_pretrained(str(folder))
        return AutoModelForCausalLM.from_pretrained(str(folder), dtype=torch.float32).eval(), tokenizer
    if config.policy.backend == "embedded":
        from kevin.policy.embedded import load_embedded

        return load_embedded("cpu")
    from transformers import AutoModelForCausalLM, AutoTokenizer

    folder = weights_folder(config) if config.policy.backend == "openai" else config.policy.model
    tokenizer = AutoTokenizer.from_pretrained(folder)
    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32)
    return model.eval(), tokenizer


def load_checkpoint_model(config: RunConfig, checkpoint: Path | None, project_dir: str | Path = ".",
                          full_dtype: Any = None) -> tuple[Any, Any]:
    """(model, tokenizer) of a training checkpoint (``step_N``) on the CPU; None: the run's starting model.

    A full checkpoint's ``model`` folder holds the weights and the tokenizer. A LoRA checkpoint is an adapter over
    exactly the run's starting model (embedded, ``policy.model``, or either with the warm start merged in), so it is
    merged into that, not into whatever base its adapter_config names (which knows nothing of the warm start). Both
    are float32 but a full checkpoint loaded as ``full_dtype`` (bfloat16 where it goes to a GPU: a large model's
    float32 copy need never exist)."""
    from kevin.training.sft import is_adapter, merge_adapter

    if checkpoint is not None and not is_adapter(Path(checkpoint) / "model"):
        import torch
        from transformers import AutoModelForCausalLM, AutoTokenizer

        folder = str(Path(checkpoint) / "model")
        model = AutoModelForCausalLM.from_pretrained(folder, dtype=full_dtype or torch.float32)
        return model.eval(), AutoTokenizer.from_pretrained(folder)
    model, tokenizer = load_model(config, project_dir)
    if checkpoint is not None:
        model = merge_adapter(model, Path(checkpoint) / "model")
    return model.eval(), tokenizer


def sync_mode(config: RunConfig) -> str:
    """How an ``openai`` run pushes weights (``policy.weight_sync``, ``auto`` resolved); "" for in-process runs."""
    if config.policy.backend != "openai":
        return ""
    mode = config.policy.weight_sync
    if mode == "auto":
        mode = "lora" if config.train.lora else "folder"
    if mode == "lora" and not config.train.lora:
        raise ValueError("policy.weight_sync lora loads LoRA adapters into vLLM, but train.lora is false: set "
                         "train.lora: true, or weight_sync folder (transformers serve) or full (vLLM over NCCL)")
    if mode == "folder" and config.train.lora:
        raise ValueError("policy.weight_sync folder writes whole model folders, but train.lora trains an adapter: "
                         "use weight_sync lora (vLLM with --enable-lora)")
    return mode


class WeightSync:
    """Pushes the trainer's weights to the generation server after an update (``mode`` from ``sync_mode``)."""

    def __init__(self, mode: str, policy: Any, config: RunConfig, out_dir: Path):
        from kevin.policy.weight_sync import FolderSync, FullWeightSync, LoraAdapterSync

        self.mode = mode
        self.root = Path(out_dir) / "served"
        self.pusher: Any
        if mode == "folder":
            self.pusher = FolderSync(self.root, policy)
        elif mode == "lora":
            self.pusher = LoraAdapterSync(config.openai.base_url, policy)
        elif mode == "full":
            self.pusher = FullWeightSync(config.openai.base_url)
        else:
            raise ValueError(f"unknown weight sync {mode!r}")

    def push(self, trainer: GRPOTrainer, tokenizer: Any, version: int) -> str:
        """Hand the trainer's current weights to the server as ``version``; returns what is served now."""
        if self.mode == "folder":
            return self.pusher.push(trainer.model, tokenizer, version)
        if self.mode == "lora":
            adapter = self.root / f"adapter_{version:06d}"
            trainer.model.save_pretrained(str(adapter))  # a PeftModel writes the adapter only
            return self.pusher.push(adapter, version=version)
        sent = self.pusher.push(trainer.model)
        return f"{sent} tensors sent over NCCL"

    def close(self) -> None:
        if self.mode == "full":
            self.pusher.close()


def build_policy(config: RunConfig, trainer: GRPOTrainer, tokenizer: Any, out_dir: Path
                 ) -> tuple[Policy, WeightSync | None]:
    """The generation backend of the run and, for a server, its weight sync (None in-process)."""
    if config.policy.backend in ("embedded", "hf"):
        from kevin.policy.hf import HFPolicy

        return HFPolicy(trainer.model, tokenizer, config.sampling), None
    from kevin.policy.openai_backend import OpenAIPolicy

    policy = OpenAIPolicy(config.openai)
    return policy, WeightSync(sync_mode(config), policy, config, out_dir)


def resolve_wrap(spec: str) -> Callable[[Policy, RunConfig, Sequence[Task]], Policy]:
    """The function a ``policy.wrap`` value (``module:function``) names."""
    module_name, _, name = spec.partition(":")
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise ValueError(f"policy.wrap {spec!r}: cannot import {module_name} ({exc})") from exc
    fn = getattr(module, name, None)
    if not callable(fn):
        raise ValueError(f"policy.wrap {spec!r}: {module_name} has no function {name!r}")
    return fn
