"""Generation records: the prompt a policy is given and what it returns for it.

``Prompt`` carries both forms a backend may need: the chat messages (an OpenAI chat endpoint sends these, and
the server applies its own chat template) and their rendering with the model's chat template (an in-process
model and a completions endpoint sample from exactly this text). ``GenerationOut`` says which of the two the
response was sampled from, so the trainer scores the very tokens that were sampled (``server_template``).
"""

from __future__ import annotations

from dataclasses import dataclass, field

Messages = list[dict[str, str]]


@dataclass
class Prompt:
    """One prompt as the rollout builds it."""

    messages: Messages
    """The chat messages (system message optional, then the user message)."""
    text: str
    """The messages rendered with the model's chat template, generation prompt included; without a tokenizer,
    the message texts joined by blank lines (a raw prompt, no template)."""
    templated: bool = False
    """``text`` was rendered by a tokenizer's chat template."""
    task_id: str = ""
    """The task whose trajectory asks ("" when unknown). Backends sample from ``text`` or ``messages`` alone; a
    stand-in policy that replays known responses per trajectory reads this and ``trajectory``."""
    trajectory: int | None = None
    """The index of the asking trajectory within its task (None when unknown)."""


@dataclass
class GenerationOut:
    """What a policy backend returns for one prompt."""

    text: str
    token_ids: list[int] = field(default_factory=list)
    """Sampled response token ids (empty if the backend gives none; the trainer then tokenizes ``text``)."""
    logprobs: list[float] | None = None
    """Logprob of each sampled token under the sampling policy, aligned with ``token_ids``."""
    prompt_token_ids: list[int] = field(default_factory=list)
    """The prompt's token ids as the sampler saw them (empty if the backend gives none)."""
    truncated: bool = False
    """Generation stopped at the length limit rather than at an end-of-sequence token."""
    server_template: bool = False
    """The backend sent the prompt's MESSAGES and the server applied its own chat template (an OpenAI chat
    endpoint): the locally rendered ``Prompt.text`` is then not known to be what was sampled, and only the
    server's ``prompt_token_ids`` are. False: the response was sampled from ``Prompt.text`` itself."""
