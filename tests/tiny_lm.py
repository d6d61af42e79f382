"""A tiny causal LM and a character-level chat tokenizer, built in-process (no hub, no network).

Shared by tests/policy and tests/training. Every character of ``ALPHABET`` is one token; the chat
template wraps a user message as ``<u>TEXT<a>`` and the model's turn ends with ``<eos>``.
"""

from __future__ import annotations

import string

ALPHABET = string.ascii_lowercase + string.digits + " .,:;!?-=()"
SPECIALS = ["<pad>", "<eos>", "<u>", "<a>", "<unk>"]
CHAT_TEMPLATE = (
    "{% for m in messages %}{% if m['role'] == 'user' %}<u>{{ m['content'] }}{% else %}"
    "<a>{{ m['content'] }}<eos>{% endif %}{% endfor %}{% if add_generation_prompt %}<a>{% endif %}"
)


def tiny_tokenizer():
    from tokenizers import Tokenizer, decoders, models
    from transformers import PreTrainedTokenizerFast

    vocab = {tok: i for i, tok in enumerate(SPECIALS + list(ALPHABET))}
    # BPE with no merges = one token per character; special tokens are matched whole before that.
    core = Tokenizer(models.BPE(vocab=vocab, merges=[], unk_token="<unk>"))
    core.decoder = decoders.Fuse()  # join characters back without spaces
    tok = PreTrainedTokenizerFast(tokenizer_object=core, pad_token="<pad>", eos_token="<eos>", unk_token="<unk>",
                                  additional_special_tokens=["<u>", "<a>"])
    tok.chat_template = CHAT_TEMPLATE
    return tok


def tiny_model(tokenizer, *, hidden: int = 48, layers: int = 2, seed: int = 0, attn: str = "sdpa"):
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(
        vocab_size=len(tokenizer), hidden_size=hidden, intermediate_size=2 * hidden, num_hidden_layers=layers,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512,
        pad_token_id=tokenizer.pad_token_id, eos_token_id=tokenizer.eos_token_id, bos_token_id=None,
        tie_word_embeddings=False,
    )
    config._attn_implementation = attn
    with torch.random.fork_rng():
        torch.manual_seed(seed)
        model = LlamaForCausalLM(config)
    return model.float().eval()
