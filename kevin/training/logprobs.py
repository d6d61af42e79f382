"""Token log-probs of completions under a causal LM, as pure functions of a model and token ids.

Shared by the update (current, old and reference log-probs) and by any check of generation/training
mismatch. The convention matches ``HFPolicy``'s: log softmax(logits / temperature) at the sampled token.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Sequence

import torch

__all__ = ["SequenceLogprobs", "pad_prompt_completion", "sequence_logprobs", "token_logprobs"]


def pad_prompt_completion(prompt_ids: Sequence[Sequence[int]], completion_ids: Sequence[Sequence[int]], pad_id: int,
                          device: torch.device | str = "cpu") -> tuple[torch.Tensor, ...]:
    """Pack prompt + completion pairs into one batch: prompts LEFT-padded to P, completions RIGHT-padded to T.

    Every completion then occupies the last T columns, so the logits that predict it are the last T + 1
    positions (``logits_to_keep``) whatever the prompt lengths.
    Returns input_ids [B, P+T], attention_mask [B, P+T], position_ids [B, P+T] (real tokens numbered from
    0, as in a single-sequence pass), completion_mask [B, T] (bool, True = real completion token).
    """
    if len(prompt_ids) != len(completion_ids):
        raise ValueError(f"{len(prompt_ids)} prompts but {len(completion_ids)} completions")
    width_p = max((len(p) for p in prompt_ids), default=0)
    width_c = max((len(c) for c in completion_ids), default=0)
    b = len(prompt_ids)
    ids = torch.full((b, width_p + width_c), pad_id, dtype=torch.long)
    mask = torch.zeros((b, width_p + width_c), dtype=torch.long)
    for i, (p, c) in enumerate(zip(prompt_ids, completion_ids)):
        if not len(p):
            raise ValueError(f"sample {i} has an empty prompt; the first completion token needs a context")
        ids[i, width_p - len(p):width_p] = torch.as_tensor(list(p), dtype=torch.long)
        ids[i, width_p:width_p + len(c)] = torch.as_tensor(list(c), dtype=torch.long)
        mask[i, width_p - len(p):width_p + len(c)] = 1
    positions = (mask.cumsum(-1) - 1).clamp(min=0)
    completion_mask = mask[:, width_p:].bool()
    return ids.to(device), mask.to(device), positions.to(device), completion_mask.to(device)


def token_logprobs(logits: torch.Tensor, tokens: torch.Tensor, temperature: float = 1.0, *,
                   with_entropy: bool = False) -> tuple[torch.Tensor, torch.Tensor | None]:
    """log softmax(logits / temperature) at ``tokens``: logits [B, T, V], tokens [B, T] -> [B, T] float32.

    Also the entropy [B, T] of each position's distribution (no gradient) when asked. One sequence at a
    time, so only one [T, V] float32 copy of bf16 logits exists outside autograd's saved tensors.
    """
    logps, entropies = [], []
    for row_logits, row_tokens in zip(logits, tokens):  # [T, V], [T]
        lp = torch.log_softmax(row_logits.float() / temperature, dim=-1)  # [T, V]
        logps.append(lp.gather(-1, row_tokens.unsqueeze(-1)).squeeze(-1))  # [T]
        if with_entropy:
            with torch.no_grad():
                entropies.append(-(lp.exp() * lp).sum(-1))  # [T]
    return torch.stack(logps), (torch.stack(entropies) if with_entropy else None)


@dataclass
class SequenceLogprobs:
    """Per-token results of ``sequence_logprobs`` for B completions padded to T tokens."""

    logprobs: torch.Tensor
    """[B, T] float32 log-prob of each completion token (0 at padding), differentiable."""
    mask: torch.Tensor
    """[B, T] bool, True at real completion tokens."""
    entropy: torch.Tensor | None = None
    """[B, T] float32 entropy of the policy at each completion position (0 at padding, no gradient)."""


def sequence_logprobs(model: Any, prompt_ids: Sequence[Sequence[int]], completion_ids: Sequence[Sequence[int]], *,
                      temperature: float = 1.0, pad_token_id: int = 0, with_entropy: bool = False) -> SequenceLogprobs:
    """Token log-probs [B, T] of each completion given its prompt under ``model``, with the padding mask.

    log p(c_t | prompt, c_<t) = log softmax(z_t / temperature)[c_t], z the model's logits: the same quantity
    ``HFPolicy`` records while sampling. Run it under ``torch.no_grad()`` for old/reference log-probs.
    """
    device = next(model.parameters()).device
    ids, attn, positions, cmask = pad_prompt_completion(prompt_ids, completion_ids, pad_token_id, device)
    width_c = cmask.shape[1]
    if width_c == 0:  # nothing to score (every completion empty): no forward pass needed
        zeros = torch.zeros(cmask.shape, dtype=torch.float32, device=device)
        return SequenceLogprobs(zeros, cmask, zeros.clone() if with_entropy else None)
    kwargs = dict(input_ids=ids, attention_mask=attn, position_ids=positions, use_cache=False)
    try:
        logits = model(**kwargs, logits_to_keep=width_c + 1).logits[:, :-1]  # [B, T, V]
    except TypeError as exc:  # a model without logits_to_keep: take the last T+1 positions ourselves
        if "logits_to_keep" not in str(exc):
            raise
        logits = model(**kwargs).logits[:, -width_c - 1:-1]
    logp, entropy = token_logprobs(logits, ids[:, -width_c:], temperature, with_entropy=with_entropy)
    zero = torch.zeros((), dtype=logp.dtype, device=device)
    logp = torch.where(cmask, logp, zero)
    if entropy is not None:
        entropy = torch.where(cmask, entropy, zero)
    return SequenceLogprobs(logp, cmask, entropy)
