"""Token log-probs of completions under a causal LM, as pure functions of a model and token ids.

Shared by the update (current, old and reference log-probs) and by any check of generation/training
mismatch. The convention matches ``HFPolicy``'s: log softmax(logits / temperature) at the sampled token.

Memory: the logits of a whole micro-batch, [B, T, V] with a 150K vocabulary and 16K-token completions,
are tens of GB, and autograd would keep a float32 log-softmax of that size until the backward pass. So
``sequence_logprobs`` runs the model's decoder for the hidden states, then the output layer, log-softmax
and gather over ``chunk_tokens`` real completion tokens at a time, each chunk under activation
checkpointing: the backward pass recomputes one chunk's logits at a time, and only the hidden states
(B x T x hidden) are kept. Values and gradients are those of the one-pass computation (up to float
summation order; tests/training/test_logprobs.py). A model whose logits are not ``head(decoder(x))``
(a logit soft-cap or scale: known config fields, and a check once per model on two tokens), or that
exposes no decoder and head (a DeepSpeed engine), takes the one-pass path.
"""

from __future__ import annotations

import weakref
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch.utils.checkpoint import checkpoint

__all__ = ["LOGIT_CHUNK_TOKENS", "SequenceLogprobs", "chunked_token_logprobs", "pad_prompt_completion",
           "sequence_logprobs", "split_decoder_head", "token_logprobs"]

LOGIT_CHUNK_TOKENS = 1024
"""Completion tokens whose logits exist at once (1024 x a 150K vocabulary x 4 bytes = 0.6 GB)."""


def pad_prompt_completion(prompt_ids: Sequence[Sequence[int]], completion_ids: Sequence[Sequence[int]], pad_id: int,
                          device: torch.device | str = "cpu") -> tuple[torch.Tensor, ...]:
    """Pack prompt + completion pairs into one batch, each sequence from column 0 and RIGHT-padded to L.

    Why not left-pad the prompts: a left pad position is a query that may attend to nothing (every key before it
    is padding). Its attention row is fully masked, and the memory-efficient SDPA kernel's backward turns such a
    row into NaN gradients for the whole batch (measured on the H200, 2026-12-04: both optimiser steps of a GRPO
    step skipped). Right padding leaves every query at least its own sequence's first token.
    Returns input_ids [B, L], attention_mask [B, L], position_ids [B, L] (0, 1, ... from each sequence's start),
    completion_mask [B, T] (bool, True = real completion token, T the longest completion) and completion_index
    [B, T] (the column of each completion token in input_ids; at padding, some real column past the first).
    """
    if len(prompt_ids) != len(completion_ids):
        raise ValueError(f"{len(prompt_ids)} prompts but {len(completion_ids)} completions")
    width = max((len(p) + len(c) for p, c in zip(prompt_ids, completion_ids)), default=0)
    width_c = max((len(c) for c in completion_ids), default=0)
    b = len(prompt_ids)
    ids = torch.full((b, width), pad_id, dtype=torch.long)
    mask = torch.zeros((b, width), dtype=torch.long)
    index = torch.zeros((b, width_c), dtype=torch.long)
    for i, (p, c) in enumerate(zip(prompt_ids, completion_ids)):
        if not len(p):
            raise ValueError(f"sample {i} has an empty prompt; the first completion token needs a context")
        n = len(p) + len(c)
        ids[i, :n] = torch.as_tensor(list(p) + list(c), dtype=torch.long)
        mask[i, :n] = 1
        # Padding points at a real column >= 1 (its gather is masked out; the column before it must exist).
        index[i] = len(p) if len(c) else max(1, len(p) - 1)
        index[i, :len(c)] = torch.arange(len(p), n)
    positions = torch.arange(width, dtype=torch.long).expand(b, width).clone()
    lengths = torch.tensor([len(c) for c in completion_ids], dtype=torch.long).unsqueeze(1)  # [B, 1]
    completion_mask = torch.arange(width_c).expand(b, width_c) < lengths
    return ids.to(device), mask.to(device), positions.to(device), completion_mask.to(device), index.to(device)


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


def _head_logprobs(hidden: torch.Tensor, tokens: torch.Tensor, head: Any, temperature: float,
                   with_entropy: bool) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Log-probs [N] (and entropies [N], no gradient) of tokens [N] from hidden states [N, H] through ``head``."""
    lp = torch.log_softmax(head(hidden).float() / temperature, dim=-1)  # [N, V]
    entropy = None
    if with_entropy:
        with torch.no_grad():
            entropy = -(lp.exp() * lp).sum(-1)
    return lp.gather(-1, tokens.unsqueeze(-1)).squeeze(-1), entropy


def chunked_token_logprobs(hidden: torch.Tensor, tokens: torch.Tensor, mask: torch.Tensor, head: Any,
                           temperature: float = 1.0, *, chunk_tokens: int = LOGIT_CHUNK_TOKENS,
                           with_entropy: bool = False) -> tuple[torch.Tensor, torch.Tensor | None]:
    """``token_logprobs`` from hidden states: hidden [B, T, H] (the states that predict tokens [B, T]),
    mask [B, T] (True = a real token) -> log-probs [B, T] float32, 0 where masked; entropies [B, T] too.

    Only the masked-in tokens go through ``head``, ``chunk_tokens`` at a time; with gradients on, each
    chunk is checkpointed, so at most one chunk's [chunk, V] logits exist, in the forward and the backward.
    """
    b, t = tokens.shape
    index = mask.reshape(-1).nonzero().squeeze(1)  # [N] flat positions of the real tokens
    states = hidden.reshape(b * t, -1).index_select(0, index)  # [N, H]
    targets = tokens.reshape(-1).index_select(0, index)  # [N]
    grad = torch.is_grad_enabled() and states.requires_grad
    logps, entropies = [], []
    for start in range(0, index.numel(), chunk_tokens):
        args = (states[start:start + chunk_tokens], targets[start:start + chunk_tokens], head, temperature, with_entropy)
        lp, ent = checkpoint(_head_logprobs, *args, use_reentrant=False) if grad else _head_logprobs(*args)
        logps.append(lp)
        entropies.append(ent)
    flat = torch.zeros(b * t, dtype=torch.float32, device=hidden.device)
    logp = (flat.index_copy(0, index, torch.cat(logps)) if logps else flat).view(b, t)
    entropy = None
    if with_entropy:
        entropy = (flat.index_copy(0, index, torch.cat(entropies)) if entropies else flat).view(b, t)
    return logp, entropy


_SPLIT_OK: weakref.WeakKeyDictionary[Any, bool] = weakref.WeakKeyDictionary()

LOGIT_TRANSFORMS = ("final_logit_softcapping", "logit_softcapping", "logit_scale", "logits_scaling")
"""Config fields of transformers models that change the logits after the output layer (Gemma 2/3's soft-cap,
Cohere's and Granite's scales): a model that sets one takes the one-pass path."""


def split_decoder_head(model: Any) -> tuple[Any, Any] | None:
    """(decoder, output layer) of a transformers causal LM (or a peft model around one) when its logits are
    ``head(decoder(...).last_hidden_state)``, else None. Checked once per model: two tokens through both."""
    from transformers import PreTrainedModel

    base = model.get_base_model() if hasattr(model, "get_base_model") else model  # peft: adapters are in place
    if not isinstance(base, PreTrainedModel):  # e.g. a DeepSpeed engine: its own forward must run
        return None
    get_decoder, get_head = getattr(base, "get_decoder", None), getattr(base, "get_output_embeddings", None)
    if get_decoder is None or get_head is None:
        return None
    try:
        decoder, head = get_decoder(), get_head()
    except (AttributeError, NotImplementedError):
        return None
    if not isinstance(decoder, torch.nn.Module) or not isinstance(head, torch.nn.Module):
        return None
    config = base.config.get_text_config() if hasattr(base.config, "get_text_config") else base.config
    if any(getattr(config, name, None) not in (None, 1, 1.0) for name in LOGIT_TRANSFORMS):
        return None  # a soft-cap barely shows on the check's small logits: trust the config for these
    try:
        ok = _SPLIT_OK[model]
    except (KeyError, TypeError):
        ok = _same_logits(model, decoder, head)
        try:
            _SPLIT_OK[model] = ok
        except TypeError:
            pass
    return (decoder, head) if ok else None


def _same_logits(model: Any, decoder: Any, head: Any) -> bool:
    """Whether ``model``'s logits equal ``head(decoder(.))``'s on two tokens (eval mode: no dropout)."""
    device = next(model.parameters()).device
    ids = torch.tensor([[0, 1]], device=device)
    was_training = model.training
    model.eval()
    try:
        with torch.no_grad():
            whole = model(input_ids=ids, use_cache=False).logits.float()
            split = head(decoder(input_ids=ids, use_cache=False).last_hidden_state).float()
    except Exception:  # noqa: BLE001 - a model that cannot be split this way takes the one-pass path
        return False
    finally:
        model.train(was_training)
    return whole.shape == split.shape and torch.allclose(whole, split, rtol=1e-3, atol=1e-3)


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
                      temperature: float = 1.0, pad_token_id: int = 0, with_entropy: bool = False,
                      chunk_tokens: int = LOGIT_CHUNK_TOKENS) -> SequenceLogprobs:
    """Token log-probs [B, T] of each completion given its prompt under ``model``, with the padding mask.

    log p(c_t | prompt, c_<t) = log softmax(z_t / temperature)[c_t], z the model's logits: the same quantity
    ``HFPolicy`` records while sampling. Run it under ``torch.no_grad()`` for old/reference log-probs.
    ``chunk_tokens``: completion tokens per output-layer chunk (see the module docstring); 0 = the one-pass
    path, which materialises the micro-batch's [B, T, V] logits.
    """
    device = next(model.parameters()).device
    ids, attn, positions, cmask, cindex = pad_prompt_completion(prompt_ids, completion_ids, pad_token_id, device)
    width_c = cmask.shape[1]
    if width_c == 0:  # nothing to score (every completion empty): no forward pass needed
        zeros = torch.zeros(cmask.shape, dtype=torch.float32, device=device)
        return SequenceLogprobs(zeros, cmask, zeros.clone() if with_entropy else None)
    targets = ids.gather(1, cindex)  # [B, T] each row's completion tokens (its last prompt token at padding)
    before = cindex - 1  # [B, T] the columns whose outputs predict them
    kwargs = dict(input_ids=ids, attention_mask=attn, position_ids=positions, use_cache=False)
    split = split_decoder_head(model) if chunk_tokens > 0 else None
    if split is not None:
        decoder, head = split
        states = decoder(**kwargs).last_hidden_state  # [B, L, H]
        hidden = states.gather(1, before.unsqueeze(-1).expand(-1, -1, states.shape[-1]))  # [B, T, H]
        logp, entropy = chunked_token_logprobs(hidden, targets, cmask, head, temperature,
                                               chunk_tokens=chunk_tokens, with_entropy=with_entropy)
        return SequenceLogprobs(logp, cmask, entropy)
    keep = ids.shape[1] - int(before.min())  # the logits from the earliest column that predicts a completion token
    try:
        logits = model(**kwargs, logits_to_keep=keep).logits  # [B, keep, V]
    except TypeError as exc:  # a model without logits_to_keep: take the last columns ourselves
        if "logits_to_keep" not in str(exc):
            raise
        logits = model(**kwargs).logits[:, -keep:]
    rows = before - (ids.shape[1] - keep)  # [B, T] rows of ``logits``
    logits = logits.gather(1, rows.unsqueeze(-1).expand(-1, -1, logits.shape[-1]))  # [B, T, V]
    logp, entropy = token_logprobs(logits, targets, temperature, with_entropy=with_entropy)
    zero = torch.zeros((), dtype=logp.dtype, device=device)
    logp = torch.where(cmask, logp, zero)
    if entropy is not None:
        entropy = torch.where(cmask, entropy, zero)
    return SequenceLogprobs(logp, cmask, entropy)
