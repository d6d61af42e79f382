"""Fixed-shape decoding for ``HFPolicy``: a static KV cache, sampling on the device, a CUDA graph per batch.

The reference loop (``HFPolicy`` with ``static_cache: false``) grows its KV cache and attention mask by a
column every token and reads "has every response ended?" back to the host after every token: on a GPU
each token then costs hundreds of kernel launches from Python plus a device-to-host round trip, and the
GPU idles between them. Here every step has the same shapes, so the step can be captured once and
replayed:

- the KV cache is transformers' ``StaticCache``, sized once per batch for the longest prompt plus the
  response limit (rounded up to a multiple of ``CACHE_ALIGN`` positions); each layer keeps its own write
  position on the device, so a step needs no position from the host;
- the attention mask is our own 4D mask [B, 1, q, L] (True or 0.0 = may attend), which the model uses
  as it is: left padding is masked, and a decode step unmasks one more column, in place;
- the prompt is prefilled in chunks of queries, so no [B, 1, P, L] mask exists for a long prompt
  (``MASK_ELEMENTS`` bounds one chunk's mask);
- sampling, the log-prob of each token, the per-row "ended" flags and lengths stay on the device; the
  host reads "all ended" only every ``stop_check_every`` tokens (the only sync until the end);
- on CUDA the decode step (one forward pass) is captured as a CUDA graph after its first, eager run,
  and replayed for every later token. Optionally the step goes through ``torch.compile`` first.

Sampling draws exactly what ``torch.multinomial(probs, 1)`` draws (``sample_tokens``), so a seeded
policy samples the same tokens on both paths. After the last response ends, up to
``stop_check_every - 1`` more steps run before the host notices; each of them draws from the sampler
too, so the sampler's state after a call depends on ``stop_check_every`` (the reference path stops
drawing at once). The responses themselves never change: a row that ended only receives padding.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

__all__ = ["CACHE_ALIGN", "MASK_ELEMENTS", "DecodeResult", "decode_static", "mask_dtype", "prefill_masks",
           "sample_tokens", "static_unsupported"]

log = logging.getLogger(__name__)

CACHE_ALIGN = 64
"""Cache lengths are rounded up to a multiple of this: fused attention kernels want aligned mask rows."""

MASK_ELEMENTS = 1 << 28
"""Largest prefill mask chunk, in elements (B x queries x L): 256 MiB as booleans (a 32 x 8K-token prompt
batch with a 24K cache prefills about 340 queries per pass)."""


def sample_tokens(probs: torch.Tensor, generator: torch.Generator | None) -> torch.Tensor:
    """One token per row of probs [B, V] (rows need not be normalised), as ``torch.multinomial(probs, 1)``.

    torch draws a single sample by the exponential race argmax(p / E), E ~ Exp(1) from ``generator``; this
    is that draw, without the host-side validity check that makes ``torch.multinomial`` wait for the GPU on
    every call. Same generator state in, same tokens and generator state out.
    """
    race = torch.empty_like(probs).exponential_(1.0, generator=generator)
    return (probs / race).argmax(dim=-1)


def mask_dtype(model: Any) -> torch.dtype | None:
    """The 4D mask type the model's attention takes as it is: bool for sdpa, float (additive) for eager;
    None for anything else (flash-attention kernels take no 4D mask)."""
    impl = getattr(getattr(model, "config", None), "_attn_implementation", None)
    return {"sdpa": torch.bool, "eager": torch.float32}.get(impl)


def static_unsupported(model: Any) -> str | None:
    """Why the static path cannot serve ``model`` (None when it can)."""
    if mask_dtype(model) is None:
        impl = getattr(getattr(model, "config", None), "_attn_implementation", None)
        return f"attention implementation {impl!r} (the static path supports sdpa and eager)"
    config = model.config
    types = getattr(config, "layer_types", None) or ["full_attention"]
    if any(t != "full_attention" for t in types) or getattr(config, "use_sliding_window", False):
        return "sliding-window or mixed attention layers (one 4D mask cannot serve them)"
    try:
        from transformers import StaticCache
        from transformers.cache_utils import StaticLayer
    except ImportError:  # pragma: no cover - transformers < 4.56
        return "this transformers has no StaticCache with per-layer positions"
    layer = StaticLayer(max_cache_len=1)
    if not isinstance(getattr(layer, "cumulative_length", None), torch.Tensor):
        return "this transformers' StaticLayer keeps no write position of its own"
    del StaticCache
    return None


def _new_cache(model: Any, length: int, store: torch.dtype | None = None) -> Any:
    """A static cache of ``length`` positions; ``store``: the one dtype its keys and values are kept in.

    Under autocast the keys leave rotary embedding in float32 (the float32 cos/sin promote them) while the
    values leave their projection in bfloat16; a StaticLayer sizes both buffers from the first write, and
    some transformers releases (5.17) take the keys' dtype for both, so writing the values fails. Casting
    every write to the autocast dtype keeps one dtype whatever the release; attention casts to it anyway."""
    from transformers import StaticCache
    from transformers.cache_utils import StaticLayer

    cache = StaticCache(config=model.config, max_cache_len=length)
    if not all(type(layer) is StaticLayer for layer in cache.layers):
        raise RuntimeError("StaticCache built layers other than StaticLayer for a full-attention model")
    if store is not None:
        for layer in cache.layers:
            layer.update = functools.partial(_update_as, layer.update, store)
    return cache


def _update_as(update: Callable, store: torch.dtype, key_states: torch.Tensor, value_states: torch.Tensor,
               *args: Any, **kwargs: Any) -> Any:
    return update(key_states.to(store), value_states.to(store), *args, **kwargs)


def autocast_store_dtype(device: torch.device) -> torch.dtype | None:
    """The autocast dtype in force on ``device`` (what the static cache keeps), or None outside autocast."""
    if not torch.is_autocast_enabled(device.type):
        return None
    return torch.get_autocast_dtype(device.type)


def prefill_masks(key_ok: torch.Tensor, start: int, end: int, dtype: torch.dtype) -> torch.Tensor:
    """The 4D mask [B, 1, end - start, L] of the prompt queries start..end-1 over the cache's L columns.

    key_ok [B, L]: columns a row may ever attend (its real prompt tokens and every generated column).
    A query attends the allowed columns up to its own position; a padding query attends its own column
    too, so that no row of the mask is empty (an empty softmax row makes NaN, which would reach the real
    tokens' outputs through the cache as 0 x NaN).
    """
    length = key_ok.shape[1]
    cols = torch.arange(length, device=key_ok.device)
    rows = torch.arange(start, end, device=key_ok.device)
    causal = cols[None, :] <= rows[:, None]  # [q, L]
    own = cols[None, :] == rows[:, None]  # [q, L]
    allowed = (key_ok[:, None, :] & causal[None]) | own[None]  # [B, q, L]
    return _as_mask(allowed.unsqueeze(1), dtype)


def _as_mask(allowed: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    if dtype == torch.bool:
        return allowed
    blocked = torch.finfo(dtype).min
    return torch.zeros(allowed.shape, dtype=dtype, device=allowed.device).masked_fill_(~allowed, blocked)


@dataclass
class DecodeResult:
    """One batch's samples, on the model's device."""

    tokens: torch.Tensor
    """[B, N] sampled ids (padding after a row's end)."""
    logprobs: torch.Tensor
    """[B, N] float32 log-prob of each sampled token (see ``HFPolicy``'s convention)."""
    lengths: torch.Tensor
    """[B] tokens per row, its end-of-response token included."""
    finished: torch.Tensor
    """[B] bool: the row ended with an end-of-response token (False = cut at N)."""
    steps: int
    """Decode forward passes after the prefill."""
    graph: bool
    """Whether the decode steps after the first were CUDA-graph replays."""


def decode_static(model: Any, ids: torch.Tensor, mask: torch.Tensor, *, max_new: int, pick: Callable,
                  pad_id: int, eos: torch.Tensor, check_every: int, forward: Callable, cache_kw: str,
                  synced: bool = False, idle: bool = False, use_graph: bool = False,
                  agree_done: Callable[[bool], bool] | None = None,
                  step_forward: Callable | None = None) -> DecodeResult:
    """Sample up to ``max_new`` tokens for left-padded prompts ids/mask [B, P] with a static cache.

    ``pick(logits [B, V] float32) -> (tokens [B], logprobs [B])`` samples; ``forward(model, **kw)`` is the
    model call (``logits_to_keep=1`` where supported); ``agree_done(all_mine_ended) -> stop?`` asks every
    process when ``synced`` (ZeRO-3 lockstep: each process makes the same passes). ``idle``: nothing to
    sample, the passes only keep the processes in step. ``step_forward``: the decode steps' model call, when
    it differs from the prefill's (a compiled one); ``use_graph``: capture the decode step (CUDA only).
    """
    (n, width), device, dtype = ids.shape, ids.device, mask_dtype(model)
    length = -(-(width + max_new - 1) // CACHE_ALIGN) * CACHE_ALIGN
    cache = _new_cache(model, length, autocast_store_dtype(device))
    positions = (mask.cumsum(-1) - 1).clamp(min=0)  # real tokens numbered 0, 1, ... as in a single-prompt pass
    key_ok = torch.ones((n, length), dtype=torch.bool, device=device)
    key_ok[:, :width] = mask.bool()

    logits = _prefill(model, ids, key_ok, positions, forward=forward, cache=cache, cache_kw=cache_kw, dtype=dtype)

    step_ids, step_pos, step_mask = _step_inputs(key_ok, positions, width, pad_id, dtype)
    unmask = True if dtype == torch.bool else 0.0
    step_call = step_forward or forward

    def step() -> torch.Tensor:
        res = step_call(model, input_ids=step_ids, attention_mask=step_mask, position_ids=step_pos, use_cache=True,
                        **{cache_kw: cache})
        return res.logits[:, -1, :]

    drawn = _Draws.empty(n, max_new, pad_id, idle, device)
    all_finished = idle
    graph = graph_out = None
    steps = 0
    for t in range(max_new):
        if all_finished:  # only when synced: wait for the other processes without sampling
            tok = drawn.pad_row
        else:
            tok = drawn.record(t, *pick(logits.float()), eos)
        if (t + 1) % check_every == 0 or t + 1 == max_new:
            all_finished = bool(drawn.finished.all())  # the host sync, once per check_every tokens
            done = agree_done(all_finished) if synced and agree_done is not None else all_finished
            if done:
                break
        if t + 1 == max_new:
            break
        step_ids.copy_(tok.unsqueeze(1))
        step_mask[..., width + t] = unmask  # the column the fed token is written to
        if graph is not None:
            graph.replay()
            logits = graph_out
        else:
            logits = step()
            if use_graph and steps == 0:  # the eager first step warmed everything up: capture the next ones
                graph, graph_out = _capture(step)
        step_pos += 1
        steps += 1
    return DecodeResult(drawn.tokens, drawn.logps, drawn.lengths, drawn.finished, steps, graph is not None)


@dataclass
class _Draws:
    """What the decode loop has sampled so far, in buffers of the whole length: tokens and log-probs [B, N],
    each row's length [B] (N until it ends) and whether it has ended [B]."""

    tokens: torch.Tensor
    logps: torch.Tensor
    lengths: torch.Tensor
    finished: torch.Tensor
    pad_row: torch.Tensor
    """[B] of the pad id: what an ended row feeds."""

    @classmethod
    def empty(cls, n: int, max_new: int, pad_id: int, idle: bool, device: torch.device) -> _Draws:
        return cls(tokens=torch.full((n, max_new), pad_id, dtype=torch.long, device=device),
                   logps=torch.zeros((n, max_new), dtype=torch.float32, device=device),
                   lengths=torch.full((n,), max_new, dtype=torch.long, device=device),
                   finished=torch.full((n,), idle, dtype=torch.bool, device=device),
                   pad_row=torch.full((n,), pad_id, dtype=torch.long, device=device))

    def record(self, t: int, tok: torch.Tensor, lp: torch.Tensor, eos: torch.Tensor) -> torch.Tensor:
        """Store position ``t``'s draws (an ended row gets the pad id) and end the rows that drew an end token;
        returns the tokens to feed next."""
        tok = torch.where(self.finished, self.pad_row, tok)
        self.tokens[:, t], self.logps[:, t] = tok, lp
        ended = ~self.finished & torch.isin(tok, eos)
        self.lengths = torch.where(ended, t + 1, self.lengths)
        self.finished = self.finished | ended
        return tok


def _step_inputs(key_ok: torch.Tensor, positions: torch.Tensor, width: int, pad_id: int,
                 dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The decode step's inputs, in fixed buffers so that a captured graph reads them where they are: the fed
    token [B, 1], its position [B, 1] and the attention mask [B, 1, 1, L] (the prompts' real tokens open)."""
    n, length = key_ok.shape
    step_ids = torch.full((n, 1), pad_id, dtype=torch.long, device=key_ok.device)
    step_pos = positions[:, -1:] + 1
    open_keys = key_ok & (torch.arange(length, device=key_ok.device) < width)[None]
    return step_ids, step_pos, _as_mask(open_keys.view(n, 1, 1, length), dtype)


def _prefill(model: Any, ids: torch.Tensor, key_ok: torch.Tensor, positions: torch.Tensor, *, forward: Callable,
             cache: Any, cache_kw: str, dtype: torch.dtype) -> torch.Tensor:
    """Run the prompts [B, P] into the static cache, in chunks of queries small enough for their [B, 1, q, L]
    masks (the cache advances its own write position by each chunk); the last position's logits [B, V]."""
    n, width = ids.shape
    chunk = max(1, min(width, MASK_ELEMENTS // max(1, n * key_ok.shape[1])))
    out = None
    for start in range(0, width, chunk):
        end = min(width, start + chunk)
        out = forward(model, input_ids=ids[:, start:end], attention_mask=prefill_masks(key_ok, start, end, dtype),
                      position_ids=positions[:, start:end], use_cache=True, **{cache_kw: cache})
    return out.logits[:, -1, :]


def _capture(step: Callable[[], torch.Tensor]) -> tuple[Any, Any]:
    """(graph, its output logits) of one decode step, or (None, None) when capture fails (then eager).

    Capturing runs no kernel, so the cache's write positions do not move; every replay advances them on
    the device exactly as an eager step does.
    """
    graph = torch.cuda.CUDAGraph()
    try:
        # thread_local: another thread of the process (an evaluator's, a data loader's) may use CUDA meanwhile.
        with torch.cuda.graph(graph, capture_error_mode="thread_local"):
            out = step()
    except Exception as exc:  # noqa: BLE001 - any capture failure means: decode eagerly, still correct
        log.warning("CUDA graph capture of the decode step failed (%s: %s); decoding eagerly",
                    type(exc).__name__, exc)
        torch.cuda.synchronize()
        return None, None
    return graph, out
