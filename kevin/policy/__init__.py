"""Generation backends: in-process transformers (``hf``); an OpenAI-compatible server (``openai_backend``).

Every backend is a callable ``list[Prompt] -> list[GenerationOut]`` (records of ``kevin.records.generation``;
the rollout loop's ``Generate``). Names are resolved lazily so that ``import kevin.policy`` never imports
torch or transformers. The policy layer sits below the rollout: it imports records, never the loop.
"""

from __future__ import annotations

import importlib
from typing import Any

_LAZY = {
    "HFPolicy": "kevin.policy.hf",
    "SamplingConfig": "kevin.policy.config",
    "PolicyConfig": "kevin.policy.config",
    "OpenAIPolicy": "kevin.policy.openai_backend",
    "OpenAIConfig": "kevin.policy.openai_backend",
    "LoraAdapterSync": "kevin.policy.weight_sync",
    "FullWeightSync": "kevin.policy.weight_sync",
    "FolderSync": "kevin.policy.weight_sync",
    "embedded_model_path": "kevin.policy.embedded",
    "embedded_hf_dir": "kevin.policy.embedded",
    "load_embedded": "kevin.policy.embedded",
    "export_hf_dir": "kevin.policy.embedded",
}

__all__ = sorted(_LAZY)


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'kevin.policy' has no attribute {name!r}")
    return getattr(importlib.import_module(module), name)
