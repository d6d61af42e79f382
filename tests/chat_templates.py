"""Chat templates of reasoning-model families, written here in our own Jinja (no hub), and a tokenizer to carry them.

Each template renders a conversation the way its family's published template does for the case the rollout
uses (an optional system message, one user message, the generation prompt):

- ``QWQ``: ChatML turns; the generation prompt opens the reasoning: ``<|im_start|>assistant\\n<think>\\n``.
  Later Qwen thinking releases (Qwen3 "Thinking-2507") render the same opening.
- ``R1_DISTILL``: DeepSeek-R1 distills: a BOS, ``<｜User｜>`` / ``<｜Assistant｜>`` markers; the generation
  prompt opens the reasoning: ``<｜Assistant｜><think>\\n``.
- ``QWEN3_HYBRID``: Qwen3's hybrid template: the MODEL opens ``<think>`` itself when thinking is on; with
  ``enable_thinking=False`` the prompt carries an empty, CLOSED block ``<think>\\n\\n</think>\\n\\n``.
- ``PLAIN``: an instruct model without reasoning tags (ChatML, as SmolLM2).
"""

from __future__ import annotations

QWQ = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n<think>\n{% endif %}"
)
R1_DISTILL = (
    "<｜begin▁of▁sentence｜>{% for m in messages %}{% if m['role'] == 'system' %}{{ m['content'] }}"
    "{% elif m['role'] == 'user' %}<｜User｜>{{ m['content'] }}"
    "{% else %}<｜Assistant｜>{{ m['content'] }}<｜end▁of▁sentence｜>{% endif %}{% endfor %}"
    "{% if add_generation_prompt %}<｜Assistant｜><think>\n{% endif %}"
)
QWEN3_HYBRID = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n"
    "{% if enable_thinking is defined and enable_thinking is false %}<think>\n\n</think>\n\n{% endif %}{% endif %}"
)
PLAIN = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)

SPECIALS = ["<|im_end|>", "<|im_start|>", "<|pad|>", "<think>", "</think>", "<｜begin▁of▁sentence｜>", "<｜User｜>",
            "<｜Assistant｜>", "<｜end▁of▁sentence｜>"]


def chat_tokenizer(template: str, eos: str = "<|im_end|>"):
    """A byte-level BPE tokenizer (any text round-trips) with ``template`` as its chat template."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    core = Tokenizer(models.BPE())
    core.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    core.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=400, special_tokens=SPECIALS, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    core.train_from_iterator(["class ModelNew(nn.Module): def forward(self, x): return x", "Okay, so the kernel"],
                             trainer)
    tok = PreTrainedTokenizerFast(tokenizer_object=core, eos_token=eos, pad_token="<|pad|>")
    tok.chat_template = template
    return tok
