"""In-process tokenizer and model builders: a real training step with no hub and no network.

- ``build_tokenizer``: a byte-level BPE chat tokenizer trained here on given texts (e.g. the bundled tasks,
  reference solutions and rendered prompts: ``kevin.rollout.replay.tokenizer_corpus``), padded with reserved
  special tokens up to a vocabulary size, with a small chat template;
- ``model_config`` / ``build_model``: a randomly initialised Qwen2-architecture causal LM from a size preset
  (``0.5b``: Qwen2.5-0.5B's widths, with as many layers as bring the parameter count nearest Qwen2.5-0.5B's;
  ``1.5b``: Qwen2.5-1.5B's widths, likewise; ``tiny``: a few million parameters).
Such a model writes no kernels; it is for measuring throughput and exercising the whole update (the
benchmark pairs it with ``kevin.rollout.replay.ReplayPolicy``). transformers, tokenizers and torch are imported
inside the functions.
"""

from __future__ import annotations

from typing import Any, Sequence

__all__ = ["CHAT_TEMPLATE", "PRESETS", "PRESET_TARGETS", "QWEN25_05B_PARAMS", "QWEN25_15B_PARAMS", "SPECIAL_TOKENS", "build_model", "build_tokenizer",
           "count_parameters_meta", "learned_tokens", "model_config"]

# Qwen2.5-0.5B: hidden 896, 24 layers, 14 heads, 2 KV heads, MLP 4864, a 151936-token tied vocabulary:
# 494,032,768 parameters. With our smaller vocabulary the layer count is raised to come close to that.
QWEN25_05B_PARAMS = 494_032_768
# Qwen2.5-1.5B: hidden 1536, 28 layers, 12 heads, 2 KV heads, MLP 8960, the same tied vocabulary: 1,543,714,304.
QWEN25_15B_PARAMS = 1_543_714_304
PRESETS: dict[str, dict[str, int]] = {
    "0.5b": {"hidden": 896, "layers": 0, "heads": 14, "kv_heads": 2, "intermediate": 4864, "max_new_tokens": 512},
    "1.5b": {"hidden": 1536, "layers": 0, "heads": 12, "kv_heads": 2, "intermediate": 8960, "max_new_tokens": 512},
    "tiny": {"hidden": 128, "layers": 4, "heads": 4, "kv_heads": 2, "intermediate": 384, "max_new_tokens": 32},
}
"""Model sizes; layers 0 = as many as bring the parameter count closest to the released model's
(``PRESET_TARGETS``). ``max_new_tokens`` is the response length the benchmark uses with each."""
PRESET_TARGETS: dict[str, int] = {"0.5b": QWEN25_05B_PARAMS, "1.5b": QWEN25_15B_PARAMS}
"""Parameter count each preset with ``layers`` 0 aims at."""

SPECIAL_TOKENS = ["<|pad|>", "<|end|>", "<|system|>", "<|user|>", "<|assistant|>"]
CHAT_TEMPLATE = (
    "{% for m in messages %}<|{{ m['role'] }}|>\n{{ m['content'] }}<|end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>\n{% endif %}"
)


def build_tokenizer(texts: Sequence[str], vocab_size: int = 16384) -> Any:
    """A byte-level BPE chat tokenizer trained in-process on ``texts`` (no hub, no network).

    The BPE merges are learned from ``texts``; a small corpus runs out of merges well before
    ``vocab_size`` (every word of it already one token), so the rest of the table is filled with
    reserved special tokens ``<|reserved_k|>``, as released models reserve unused rows: the
    tokenizer's length then equals the model's vocabulary, and any id a random model samples decodes
    (reserved ones to nothing, being special). Byte-level, so any text round-trips.

    Returns a ``transformers.PreTrainedTokenizerFast`` with pad ``<|pad|>``, eos ``<|end|>`` and a chat
    template that writes each message as ``<|role|>\\nTEXT<|end|>\\n`` and opens the reply with
    ``<|assistant|>\\n``, so ``apply_chat_template`` works and a reply ends at ``<|end|>``.
    """
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    core = Tokenizer(models.BPE())
    core.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    core.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=SPECIAL_TOKENS, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    core.train_from_iterator(list(texts), trainer=trainer)
    learned = core.get_vocab_size()
    reserved = [AddedToken(f"<|reserved_{i}|>", special=True) for i in range(vocab_size - learned)]
    if reserved:
        core.add_special_tokens(reserved)
    tok = PreTrainedTokenizerFast(tokenizer_object=core, pad_token="<|pad|>", eos_token="<|end|>",
                                  additional_special_tokens=SPECIAL_TOKENS[2:])
    tok.chat_template = CHAT_TEMPLATE
    return tok


def learned_tokens(tokenizer: Any) -> int:
    """Tokens the BPE learned (bytes, merges, our special tokens): all but the reserved padding."""
    return sum(not t.startswith("<|reserved_") for t in tokenizer.get_vocab())



def model_config(preset: str, vocab_size: int, tokenizer: Any, layers: int = 0) -> Any:
    """A Qwen2 config for ``preset`` (0.5b, 1.5b: layers chosen to land nearest the released model's parameter
    count, ``PRESET_TARGETS``; ``layers`` > 0 overrides)."""
    from transformers import Qwen2Config

    p = PRESETS[preset]

    def make(n_layers: int) -> Any:
        cfg = Qwen2Config(
            vocab_size=vocab_size, hidden_size=p["hidden"], intermediate_size=p["intermediate"],
            num_hidden_layers=n_layers, num_attention_heads=p["heads"], num_key_value_heads=p["kv_heads"],
            max_position_embeddings=32768, tie_word_embeddings=True, use_sliding_window=False,
            pad_token_id=tokenizer.pad_token_id, eos_token_id=tokenizer.eos_token_id, bos_token_id=None,
        )
        cfg._attn_implementation = "sdpa"
        return cfg

    n = layers or p["layers"]
    if not n:
        one, two = count_parameters_meta(make(1)), count_parameters_meta(make(2))
        per_layer, base = two - one, 2 * one - two
        n = max(1, round((PRESET_TARGETS[preset] - base) / per_layer))
    return make(n)


def count_parameters_meta(config: Any) -> int:
    """Parameter count of a config's model, built on the meta device (no memory, no init)."""
    import torch
    from transformers import Qwen2ForCausalLM

    with torch.device("meta"):
        return sum(p.numel() for p in Qwen2ForCausalLM(config).parameters())


def build_model(config: Any, device: str = "cpu") -> Any:
    """A random-init float32 Qwen2 model, initialised directly on ``device`` (a 0.5B init on CPU takes a while).

    It draws from torch's global RNG: seed it first (``kevin.training.rng.seed_everything``) for a repeatable
    initialisation."""
    import torch
    from transformers import Qwen2ForCausalLM

    with torch.device(device):
        model = Qwen2ForCausalLM(config)
    return model.float()
