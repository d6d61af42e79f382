"""In-process generation with a transformers causal LM (CPU or GPU): the ``hf`` policy backend.

``HFPolicy(model, tokenizer, SamplingConfig(...))`` is a ``Generate`` callable for the rollout loop:
``policy(prompts) -> list[GenerationOut]``, one per prompt, in order. The trainer can share the same
model object, so every update is visible to the next rollout without copying weights.

Why our own sampling loop rather than ``model.generate``:
- the log-prob of every sampled token is taken from one [B, V] row at a time. ``generate``'s
  ``output_logits`` keeps every step's [B, V] logits until the end: 16K tokens x 16 prompts x a 150K
  vocabulary would be ~150 GB;
- sampling draws from a private ``torch.Generator``: a seeded policy is reproducible, and generating
  never moves the global RNG that the trainer checkpoints;
- left padding and position ids are explicit, so a prompt's tokens do not depend on its batch
  (tests/policy check this against a single-prompt forward pass).

Two decoding paths draw the same tokens (docs/generation.md): the static path (``kevin.policy.decode``,
default: a preallocated KV cache, a fixed-shape step captured as a CUDA graph on the GPU, sampling and
end tracking on the device, a host sync every ``stop_check_every`` tokens) and the reference path
(``static_cache: false``, or a model the static path cannot serve: a growing cache, a sync per token).
Neither does paged attention or speculative decoding: for that, serve the model with vLLM and use the
``openai`` backend.

Log-prob convention (``GenerationOut.logprobs``): logprobs[t] = log_softmax(z_t / temperature)[token_t]
in float32, z_t the raw logits. top_p decides which tokens may be sampled, but the recorded log-prob is
NOT renormalised over the top-p nucleus: the trainer's ``sequence_logprobs`` (temperature-scaled, no
truncation) recomputes exactly this quantity from a forward pass, so the stored values match the
trainer's to float precision and serve as a check of generation/training mismatch. (The trainer
recomputes its old log-probs anyway, because a server backend may return none.) With temperature 0
(greedy decoding) the log-probs are at temperature 1.
"""

from __future__ import annotations

import contextlib
import dataclasses
import inspect
import logging
from typing import Any, Sequence

import torch

from kevin.distributed import max_over_processes, world
from kevin.policy.config import SamplingConfig
from kevin.policy.decode import decode_static, sample_tokens, static_unsupported
from kevin.records.generation import GenerationOut, Prompt

__all__ = ["DecodeStats", "HFPolicy", "SamplingConfig", "left_pad", "top_p_filter"]


# ------------------------------------------------------------------------------ pure helpers


def left_pad(seqs: Sequence[Sequence[int]], pad_id: int, device: torch.device | str = "cpu"
             ) -> tuple[torch.Tensor, torch.Tensor]:
    """Left-pad token lists: ids [B, P] (pad_id in front), attention mask [B, P] (1 = real token).

    Left padding puts every prompt's last token in the last column, so one decoding step appends to all.
    """
    width = max(len(s) for s in seqs)
    ids = torch.full((len(seqs), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(seqs), width), dtype=torch.long)
    for i, s in enumerate(seqs):
        if len(s):
            ids[i, width - len(s):] = torch.as_tensor(list(s), dtype=torch.long)
            mask[i, width - len(s):] = 1
    return ids.to(device), mask.to(device)


def top_p_filter(logits: torch.Tensor, top_p: float) -> torch.Tensor:
    """Logits [B, V] with every token outside the top-p nucleus set to -inf (the most likely one always stays)."""
    if top_p >= 1.0:
        return logits
    sorted_logits, order = torch.sort(logits, dim=-1, descending=True)  # [B, V]
    probs = torch.softmax(sorted_logits, dim=-1)
    # Drop a token when the tokens ranked above it already reach top_p (so the first token is never dropped).
    drop_sorted = (torch.cumsum(probs, dim=-1) - probs) >= top_p  # [B, V]
    drop = torch.zeros_like(drop_sorted).scatter(-1, order, drop_sorted)
    return logits.masked_fill(drop, float("-inf"))


def _cache_kwarg(model: Any) -> str:
    """Name of the KV-cache argument: ``cache`` from transformers 5.24 on, ``past_key_values`` before."""
    base = model.get_base_model() if hasattr(model, "get_base_model") else model  # peft wraps the model
    return "cache" if "cache" in inspect.signature(base.forward).parameters else "past_key_values"


def _cache_of(out: Any) -> Any:
    cache = getattr(out, "cache", None)
    return cache if cache is not None else out.past_key_values


def _forward(model: Any, **kwargs: Any) -> Any:
    """model(**kwargs) with ``logits_to_keep=1`` where the model supports it (saves the prompt's [B, P, V] logits)."""
    try:
        return model(logits_to_keep=1, **kwargs)
    except TypeError as exc:
        if "logits_to_keep" not in str(exc):
            raise
        return model(**kwargs)


# ------------------------------------------------------------------------------ the policy


class HFPolicy:
    """A transformers causal LM + tokenizer as a batched sampler returning ``GenerationOut`` per prompt.

    ``model`` may be a plain ``PreTrainedModel`` or a peft ``PeftModel``; it stays where it is (device and
    dtype are the caller's: the trainer moves it). ``autocast_dtype`` runs generation under
    ``torch.autocast`` (default: bfloat16 on CUDA when the weights are float32, e.g. the trainer's fp32
    master weights; nothing on CPU).

    ``synced``: every process of the group makes the same forward passes, as a model whose weights DeepSpeed
    ZeRO-3 partitions needs (each pass gathers them from every process). A process whose prompts are done
    feeds padding until the others are done too, and one with fewer batches (or no prompts) runs idle ones;
    neither draws from the sampler, so each prompt's sample is what an unsynced policy would draw. None
    (default) turns it on when the model's parameters are ZeRO-3 partitions and a group of 2+ processes
    exists; every process must then call the policy equally often.
    """

    def __init__(self, model: Any, tokenizer: Any, config: SamplingConfig | None = None, *,
                 autocast_dtype: torch.dtype | None = None, synced: bool | None = None):
        self.model = model
        self.synced = synced
        self.tokenizer = tokenizer
        # A copy: a length schedule changes the limit of this policy, not of the config it was built from.
        self.config = dataclasses.replace(config) if config is not None else SamplingConfig()
        pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
        if pad is None:
            raise ValueError("the tokenizer has neither a pad nor an eos token; set tokenizer.pad_token")
        self.pad_token_id = int(pad)
        self.eos_token_ids = self._eos_ids()
        if not self.eos_token_ids:
            raise ValueError("no end-of-sequence token id: set tokenizer.eos_token or sampling.stop_token_ids")
        if autocast_dtype is None and self.device.type == "cuda" and _param_dtype(model) == torch.float32:
            autocast_dtype = torch.bfloat16
        self.autocast_dtype = autocast_dtype
        # Created at the first call, on the model's device then (the trainer may move the model after this).
        self._generator: torch.Generator | None = None
        self._pending_state: torch.Tensor | None = None
        self._static_reason: str | None | bool = False  # False: not asked yet; None: the static path serves
        self._compiled: Any = None
        self.last_call = DecodeStats()
        """How the last call decoded: path, CUDA graph, forward passes (benchmarks and tests read it)."""

    @classmethod
    def from_pretrained(cls, name_or_path: str, config: SamplingConfig | None = None, *, device: str | None = None,
                        dtype: torch.dtype | str = "auto", **model_kwargs: Any) -> "HFPolicy":
        """Load a model directory (or hub name, where reachable) with its tokenizer onto ``device``."""
        from transformers import AutoModelForCausalLM, AutoTokenizer

        tokenizer = AutoTokenizer.from_pretrained(name_or_path)
        model = AutoModelForCausalLM.from_pretrained(name_or_path, dtype=dtype, **model_kwargs)
        model.to(device or ("cuda" if torch.cuda.is_available() else "cpu"))
        return cls(model.eval(), tokenizer, config)

    def _eos_ids(self) -> set[int]:
        ids: set[int] = set(self.config.stop_token_ids)
        if self.tokenizer.eos_token_id is not None:
            ids.add(int(self.tokenizer.eos_token_id))
        gen_eos = getattr(getattr(self.model, "generation_config", None), "eos_token_id", None)
        if gen_eos is not None:
            ids.update(int(i) for i in (gen_eos if isinstance(gen_eos, (list, tuple)) else [gen_eos]))
        return ids

    @property
    def device(self) -> torch.device:
        return next(self.model.parameters()).device

    # -- RNG state (so a resumed run continues the same sample stream)

    def _sampler(self) -> torch.Generator | None:
        """The private generator (None without a seed: the global RNG is used)."""
        if self.config.seed is None:
            return None
        if self._generator is None or self._generator.device != self.device:
            self._generator = torch.Generator(device=self.device).manual_seed(self.config.seed)
            if self._pending_state is not None:
                self._generator.set_state(self._pending_state)
                self._pending_state = None
        return self._generator

    def state_dict(self) -> dict[str, Any]:
        """The sampler's RNG state (save it with a checkpoint so a resumed run draws the same samples)."""
        gen = self._sampler()
        return {"generator": gen.get_state() if gen is not None else None}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if state.get("generator") is None or self.config.seed is None:
            return
        self._generator, self._pending_state = None, state["generator"]

    def close(self) -> None:
        """Nothing to release: the model is the trainer's (``Policy.close``)."""

    # -- generation

    def __call__(self, prompts: Sequence[Prompt | str]) -> list[GenerationOut]:
        return self.generate(prompts)

    @property
    def max_response_tokens(self) -> int:
        """The current response length limit (``sampling.max_new_tokens``)."""
        return self.config.max_new_tokens

    def set_max_response_tokens(self, tokens: int) -> None:
        """Change the response length limit from the next call on (a length schedule raising it mid-run)."""
        if isinstance(tokens, bool) or not isinstance(tokens, int) or tokens < 1:
            raise ValueError(f"the response length limit must be a positive number of tokens, got {tokens!r}")
        self.config.max_new_tokens = tokens

    def generate(self, prompts: Sequence[Prompt | str]) -> list[GenerationOut]:
        """Sample one response per prompt: a ``Prompt`` record (its rendered ``text`` is sampled from) or a
        string already rendered with the chat template."""
        if not prompts:
            return self.generate_ids([])  # synced, this process still takes part in the others' passes
        texts = [p.text if isinstance(p, Prompt) else p for p in prompts]
        encoded = self.tokenizer(texts, add_special_tokens=self.config.add_special_tokens)["input_ids"]
        return self.generate_ids(encoded)

    def _lockstep(self) -> bool:
        """Whether this call must make the same forward passes as every other process (see ``synced``)."""
        if self.synced is not None:
            return self.synced
        # DeepSpeed marks the parameters it partitions with a ``ds_id``.
        return world()[1] > 1 and any(hasattr(p, "ds_id") for p in self.model.parameters())

    def generate_ids(self, prompt_ids: Sequence[Sequence[int]]) -> list[GenerationOut]:
        """Sample one response per tokenized prompt; outputs in input order."""
        empty = [i for i, p in enumerate(prompt_ids) if len(p) == 0]
        if empty:
            raise ValueError(f"prompts {empty} are empty after tokenization; every prompt needs at least one token")
        # Batch prompts of similar length together (less padding); results go back to input order.
        order = sorted(range(len(prompt_ids)), key=lambda i: len(prompt_ids[i]))
        bs = self.config.batch_size or max(1, len(order))  # 0: every prompt in one batch
        batches = [order[start:start + bs] for start in range(0, len(order), bs)]
        synced = self._lockstep()
        self.last_call = DecodeStats(path=self._path())
        count = max_over_processes(len(batches)) if synced else len(batches)
        outs: list[GenerationOut | None] = [None] * len(prompt_ids)
        was_training = self.model.training
        self.model.eval()  # no dropout; transformers also turns the KV cache off for checkpointing in train mode
        try:
            for k in range(count):
                if k >= len(batches):  # idle: its passes gather the weights the other processes need
                    self._sample_batch([[self.pad_token_id]], synced=True, idle=True)
                    continue
                idx = batches[k]
                for i, out in zip(idx, self._sample_batch([list(prompt_ids[i]) for i in idx], synced=synced)):
                    outs[i] = out
        finally:
            self.model.train(was_training)
        return [o for o in outs if o is not None]

    def _pick(self, logits: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Next tokens [B] and their log-probs [B] from raw logits [B, V] (float32); see the module docstring."""
        cfg = self.config
        if cfg.greedy:
            tokens = logits.argmax(dim=-1)  # [B]
            logp = torch.log_softmax(logits, dim=-1)
        else:
            scaled = logits / cfg.temperature  # [B, V]
            logp = torch.log_softmax(scaled, dim=-1)
            probs = torch.softmax(top_p_filter(scaled, cfg.top_p), dim=-1)
            tokens = sample_tokens(probs, self._sampler())  # [B]: torch.multinomial's draw, without its sync
        return tokens, logp.gather(1, tokens.unsqueeze(1)).squeeze(1)

    def _path(self) -> str:
        """``static`` or ``reference`` (see the module docstring); why not static is logged once."""
        if not self.config.static_cache:
            return "reference"
        if self._static_reason is False:
            self._static_reason = static_unsupported(self.model)
            if self._static_reason is not None:
                logging.getLogger(__name__).info("HFPolicy decodes with the reference loop: %s",
                                                 self._static_reason)
        return "static" if self._static_reason is None else "reference"

    def _step_forward(self, synced: bool) -> Any:
        """The decode step's model call: compiled with ``sampling.compile``, else None (the plain one). Not in
        ZeRO-3 lockstep: the passes gather partitioned weights through hooks a compiled graph would not run."""
        if not self.config.compile or synced:
            return None
        if self._compiled is None or self._compiled[0] is not self.model:
            # dynamic: the batch and the cache length change from call to call; one compilation serves them.
            self._compiled = (self.model, torch.compile(self.model, dynamic=True))
        return lambda model, **kw: _forward(self._compiled[1], **kw)

    @torch.no_grad()
    def _sample_batch(self, prompts: list[list[int]], *, synced: bool = False, idle: bool = False
                      ) -> list[GenerationOut]:
        """One batch of responses. ``synced``: go on feeding padding until every process's batch is done;
        ``idle``: a batch with nothing to sample (it only makes the passes)."""
        if self.last_call.path == "static":
            return self._sample_batch_static(prompts, synced=synced, idle=idle)
        return self._sample_batch_reference(prompts, synced=synced, idle=idle)

    def _autocast(self) -> Any:
        return (torch.autocast(self.device.type, dtype=self.autocast_dtype) if self.autocast_dtype is not None
                else contextlib.nullcontext())

    def _sample_batch_static(self, prompts: list[list[int]], *, synced: bool, idle: bool) -> list[GenerationOut]:
        device, cfg = self.device, self.config
        ids, mask = left_pad(prompts, self.pad_token_id, device)  # [B, P]
        eos = torch.tensor(sorted(self.eos_token_ids), device=device)
        use_graph = cfg.cuda_graph and device.type == "cuda" and not synced
        with self._autocast():
            res = decode_static(self.model, ids, mask, max_new=cfg.max_new_tokens, pick=self._pick,
                                pad_id=self.pad_token_id, eos=eos, check_every=cfg.stop_check_every,
                                forward=_forward_model, cache_kw=_cache_kwarg(self.model), synced=synced, idle=idle,
                                use_graph=use_graph, step_forward=self._step_forward(synced),
                                agree_done=lambda mine: max_over_processes(int(not mine)) == 0)
        self.last_call.add(res.steps + 1, res.graph)
        return self._outputs(prompts, res.tokens, res.logprobs, res.lengths, res.finished)

    def _outputs(self, prompts: list[list[int]], tokens: torch.Tensor, logps: torch.Tensor, lengths: torch.Tensor,
                 finished: torch.Tensor) -> list[GenerationOut]:
        # One transfer of each tensor, then plain lists (a per-row .tolist() would sync per row).
        tokens_l, logps_l = tokens.tolist(), logps.tolist()
        lengths_l, finished_l = lengths.tolist(), finished.tolist()
        results = []
        for i, prompt in enumerate(prompts):
            k = lengths_l[i]
            token_ids = tokens_l[i][:k]
            results.append(GenerationOut(
                text=self.tokenizer.decode(token_ids, skip_special_tokens=True),
                token_ids=token_ids,
                logprobs=logps_l[i][:k],
                prompt_token_ids=list(prompt),
                truncated=not finished_l[i],
            ))
        return results

    def _sample_batch_reference(self, prompts: list[list[int]], *, synced: bool, idle: bool) -> list[GenerationOut]:
        device, cfg = self.device, self.config
        n, max_new = len(prompts), cfg.max_new_tokens
        ids, mask = left_pad(prompts, self.pad_token_id, device)  # [B, P]
        # Real tokens are numbered 0, 1, ... whatever their padding, as in a single-prompt pass.
        positions = (mask.cumsum(-1) - 1).clamp(min=0)  # [B, P]
        next_pos = positions[:, -1:] + 1  # [B, 1]
        eos = torch.tensor(sorted(self.eos_token_ids), device=device)
        tokens = torch.full((n, max_new), self.pad_token_id, dtype=torch.long, device=device)  # [B, N]
        logps = torch.zeros((n, max_new), dtype=torch.float32, device=device)  # [B, N]
        lengths = torch.full((n,), max_new, dtype=torch.long, device=device)  # [B]: EOS included
        finished = torch.full((n,), idle, dtype=torch.bool, device=device)  # [B]
        cache_kw = _cache_kwarg(self.model)
        passes = 1
        with self._autocast():
            out = _forward(self.model, input_ids=ids, attention_mask=mask, position_ids=positions, use_cache=True)
            all_finished = idle  # read back once per token (a host sync on the GPU)
            for t in range(max_new):
                if all_finished:  # only when synced: wait for the other processes without sampling
                    tok = torch.full((n,), self.pad_token_id, dtype=torch.long, device=device)
                else:
                    tok, lp = self._pick(out.logits[:, -1, :].float())  # [B], [B]
                    tok = torch.where(finished, torch.full_like(tok, self.pad_token_id), tok)
                    tokens[:, t], logps[:, t] = tok, lp
                    ended = ~finished & torch.isin(tok, eos)
                    lengths = torch.where(ended, torch.full_like(lengths, t + 1), lengths)
                    finished |= ended
                all_finished = bool(finished.all())
                done = max_over_processes(int(not all_finished)) == 0 if synced else all_finished
                if done or t + 1 == max_new:
                    break
                mask = torch.cat([mask, torch.ones((n, 1), dtype=mask.dtype, device=device)], dim=1)
                out = _forward(self.model, input_ids=tok.unsqueeze(1), attention_mask=mask, position_ids=next_pos,
                               use_cache=True, **{cache_kw: _cache_of(out)})
                next_pos = next_pos + 1
                passes += 1
        self.last_call.add(passes, False)
        return self._outputs(prompts, tokens, logps, lengths, finished)


def _param_dtype(model: Any) -> torch.dtype:
    return next(model.parameters()).dtype


def _forward_model(model: Any, **kwargs: Any) -> Any:
    return _forward(model, **kwargs)


@dataclasses.dataclass
class DecodeStats:
    """How one ``HFPolicy`` call decoded."""

    path: str = ""
    """``static`` or ``reference``."""
    batches: int = 0
    """Batches sampled (idle lockstep batches included)."""
    forward_passes: int = 0
    """Forward passes over all batches (a chunked prefill counts once)."""
    graph_batches: int = 0
    """Batches whose decode steps were CUDA-graph replays."""

    def add(self, passes: int, graph: bool) -> None:
        self.batches += 1
        self.forward_passes += passes
        self.graph_batches += int(graph)
