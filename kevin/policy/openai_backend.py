"""Generation through any OpenAI-compatible server.

``OpenAIPolicy`` is the rollout loop's ``generate(prompts) -> list[GenerationOut]`` over HTTP. Works with a
vLLM server started in its own environment (vllm pins fastapi/transformers ranges that clash with prefect),
with ``transformers serve`` (the CPU test server), and with API models as baselines.
Requests run concurrently on a thread pool (at most ``max_concurrency`` in flight), each retried with
exponential backoff on connection errors, timeouts, 408/409/429 and 5xx; anything else fails at once.
Pushing updated weights to the server after a training step is ``kevin.policy.weight_sync``.

What it does not cover: streaming responses, ``n > 1`` per request (the loop sends the m copies of a prompt
as m requests, which vLLM's prefix cache makes nearly as cheap), tool calls.

The prompt that was sampled is the prompt the trainer scores, on both endpoints:
- ``completions`` sends ``Prompt.text``, rendered here with the model's chat template; the trainer tokenizes
  that same text (or, better, takes the server's own prompt token ids when it returns them);
- ``chat`` sends ``Prompt.messages`` and the SERVER applies its chat template. Sending the rendered text as a
  user message instead would template it twice: the model would sample from a prompt the trainer never
  scores. The response is marked ``server_template``; the trainer then scores the server's prompt token ids
  (vLLM with ``return_token_ids``) and refuses the turn when the server gave none.

Logprobs and token ids: vLLM returns per-token logprobs when asked (``logprobs``) and, with
``return_token_ids=True`` (vLLM >= 0.10.2), the exact prompt and response token ids. ``transformers serve``
and most APIs return neither, so ``GenerationOut.logprobs`` is None and ``token_ids`` is empty: the trainer
then tokenizes the text and recomputes the logprobs itself (the sampling policy equals the current policy
on the first gradient step, so nothing is lost but compute).

The ``openai`` client is imported lazily (only when the first request is sent), so importing this module
costs nothing.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import random
import re
import threading
from concurrent.futures import FIRST_EXCEPTION, ThreadPoolExecutor, wait
from dataclasses import dataclass, field
from typing import Any, Sequence, Union

from kevin.records.generation import GenerationOut, Prompt
from kevin.settings import Settings

log = logging.getLogger(__name__)

Messages = list[dict[str, Any]]
PromptInput = Union[Prompt, str, Messages]
"""A ``Prompt`` record (completions sends its rendered text, chat its messages), a string (completions: the
prompt as is; chat: one user message) or a message list (chat only)."""

ENDPOINTS = ("completions", "chat")
RETRY_STATUS = frozenset({408, 409, 429})
"""Besides every 5xx: request timeout, conflict (OpenAI's own client retries these) and rate limiting."""

_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_NO_KEY = "EMPTY"
"""Sent when no key is configured: the client refuses an empty key, and a vLLM server without --api-key
accepts anything."""


class GenerationError(RuntimeError):
    """A request to the generation server failed for good (after its retries, or at once for a 4xx)."""


# ----------------------------------------------------------------------------------------------- config


@dataclass
class OpenAIConfig(Settings):
    """Where the server is, how hard to push it, and how to sample."""

    section = "openai backend"

    model: str = ""
    """Served model name, as listed by ``GET {base_url}/models``: vLLM's ``--served-model-name`` (default: the
    path or hub id it was started with); for ``transformers serve``, the model directory. ``LoraAdapterSync``
    re-points the policy at the adapter it loads. Required by ``OpenAIPolicy``; in a run it is ``policy.model``."""

    base_url: str = "http://127.0.0.1:8000/v1"
    """Root of the OpenAI API, including ``/v1``."""

    api_key_env: str = "OPENAI_API_KEY"
    """NAME of the environment variable holding the API key (never the key itself, so configs and MLflow
    params can be shared). Empty, or an unset variable, sends a placeholder key: fine for a local vLLM server
    started without ``--api-key``."""

    endpoint: str = "completions"
    """``completions`` (the prompt is sent as rendered, chat template included: what the trainer will score;
    for a tokenizer that adds a BOS token itself, pass vLLM ``extra_body={"add_special_tokens": false}`` so it
    is not doubled) or ``chat`` (the messages are sent and the server applies its own chat template; training
    on such turns needs the server's prompt token ids, i.e. vLLM with ``return_token_ids``)."""

    max_concurrency: int = 8
    """Requests in flight at once. vLLM batches concurrent requests itself, so set this near its
    ``--max-num-seqs`` (256 by default) for throughput; keep it low for rate-limited APIs."""

    timeout_s: float = 600.0
    """Per-request timeout in seconds (one attempt); long kernel responses at 16k tokens take minutes."""

    retries: int = 4
    """Extra attempts after a retryable failure (connection error, timeout, 408/409/429, 5xx)."""

    backoff_s: float = 1.0
    """Wait before the first retry; doubles each retry (with jitter), capped by ``max_backoff_s``."""

    max_backoff_s: float = 30.0
    """Longest wait between two attempts, also the cap on a server's ``Retry-After``."""

    temperature: float = 1.0
    """Sampling temperature; 0 is greedy. In a run: the root config's ``temperature``."""

    top_p: float = 1.0
    """Nucleus sampling mass in (0, 1]."""

    max_tokens: int = 1024
    """Most tokens generated per response; a response that hits it is marked ``truncated``. In a run: the root
    config's ``max_response_tokens``."""

    seed: int | None = None
    """Base sampling seed. Request k of this policy (counted over its whole life) uses ``seed + k``, so the m
    copies of one prompt still differ while a rerun with the same call sequence repeats. None: server's choice."""

    logprobs: bool = True
    """Ask for the logprob of each sampled token (used as the old-policy logprobs of the off-policy step).
    Servers that do not give them (``transformers serve``, many APIs) ignore the field."""

    return_token_ids: bool = False
    """vLLM extension (>= 0.10.2): also return the exact prompt and response token ids, so the trainer scores
    precisely the sampled tokens instead of a re-tokenization. Other servers may reject the unknown field
    (``transformers serve`` answers 422), so it is off by default; turn it on for vLLM. On the completions
    endpoint it also sends vLLM's ``add_special_tokens: false``: the rendered prompt carries its own special
    tokens, so the server tokenizes exactly the text that was rendered (``extra_body`` can override it)."""

    stop: list[str] = field(default_factory=list)
    """Stop strings (empty: stop at the model's end-of-sequence token only)."""

    extra_body: dict[str, Any] = field(default_factory=dict)
    """Further request fields passed through verbatim, e.g. vLLM's ``{"top_k": 50}`` or
    ``{"return_tokens_as_token_ids": true}``."""

    def __post_init__(self) -> None:
        if not isinstance(self.model, str):
            raise ValueError(f"model must be the served model's name (a string), got {self.model!r}")
        if not isinstance(self.base_url, str) or not self.base_url.startswith(("http://", "https://")):
            raise ValueError(f"base_url must be an http(s) URL ending in /v1, got {self.base_url!r}")
        if self.api_key_env and not _ENV_NAME.match(self.api_key_env):
            raise ValueError("api_key_env must be the NAME of an environment variable holding the key "
                             "(e.g. OPENAI_API_KEY), never the key itself")
        if self.endpoint not in ENDPOINTS:
            raise ValueError(f"endpoint must be one of {ENDPOINTS}, got {self.endpoint!r}")
        for name in ("max_concurrency", "max_tokens"):
            _check_int(name, getattr(self, name), minimum=1)
        _check_int("retries", self.retries, minimum=0)
        if self.seed is not None:
            _check_int("seed", self.seed, minimum=0)
        for name in ("timeout_s", "backoff_s", "max_backoff_s", "temperature", "top_p"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not value >= 0:  # NaN fails too
                raise ValueError(f"{name} must be a number >= 0, got {value!r}")
        if self.timeout_s == 0:
            raise ValueError("timeout_s must be > 0 (seconds per request attempt)")
        if not 0 < self.top_p <= 1:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p!r}")
        if not isinstance(self.stop, list) or not all(isinstance(s, str) and s for s in self.stop):
            raise ValueError(f"stop must be a list of non-empty strings, got {self.stop!r}")
        if not isinstance(self.extra_body, dict):
            raise ValueError(f"extra_body must be a mapping of request fields, got {self.extra_body!r}")

    @property
    def server_root(self) -> str:
        """The server's root URL (``base_url`` without ``/v1``): vLLM's admin endpoints hang off it."""
        return server_root(self.base_url)

    def api_key(self) -> str:
        return (os.environ.get(self.api_key_env) if self.api_key_env else None) or _NO_KEY


def _check_int(name: str, value: Any, minimum: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ValueError(f"{name} must be an integer >= {minimum}, got {value!r}")


def server_root(base_url: str) -> str:
    url = base_url.rstrip("/")
    return url[: -len("/v1")] if url.endswith("/v1") else url


# ----------------------------------------------------------------------------------------------- policy


class _Retryable(Exception):
    """One attempt failed in a way worth retrying; ``retry_after`` is the server's hint in seconds, if any."""

    def __init__(self, message: str, retry_after: float | None = None):
        super().__init__(message)
        self.retry_after = retry_after


class OpenAIPolicy:
    """``generate(prompts)`` against an OpenAI-compatible server; results come back in prompt order.

    Thread-safe; one instance per server. ``close()`` (or a ``with`` block) releases the HTTP connections.
    """

    def __init__(self, config: OpenAIConfig, client: Any = None):
        if not config.model:
            raise ValueError("OpenAIConfig.model must name the served model (see GET {base_url}/models; for vLLM its "
                             "--served-model-name or the path it was started with)")
        # A copy: a length schedule changes the limit of this policy, not of the config it was built from.
        self.config = dataclasses.replace(config)
        self.model = config.model
        """Model name sent with each request; ``LoraAdapterSync.push`` switches it to the newest adapter."""
        self._client = client
        self._lock = threading.Lock()
        self._requests = 0  # requests issued so far: the seed offset

    # -- public

    def __call__(self, prompts: Sequence[PromptInput]) -> list[GenerationOut]:
        return self.generate(prompts)

    @property
    def max_response_tokens(self) -> int:
        """The current response length limit (``max_tokens``)."""
        return self.config.max_tokens

    def set_max_response_tokens(self, tokens: int) -> None:
        """Change the response length limit from the next call on (a length schedule raising it mid-run)."""
        _check_int("max_tokens", tokens, minimum=1)
        self.config.max_tokens = tokens

    def generate(self, prompts: Sequence[PromptInput]) -> list[GenerationOut]:
        """One response per prompt, in order. Raises ``GenerationError`` if any prompt fails for good
        (its retries spent, or a non-retryable answer); the other requests are then abandoned."""
        prompts = list(prompts)
        if not prompts:
            return []
        bodies = [self._body(p, self._next_seed()) for p in prompts]  # validate every prompt before sending any
        client = self._get_client()
        abort = threading.Event()  # set on the first final failure: stops the others' retries early
        workers = min(self.config.max_concurrency, len(bodies))
        pool = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="kevin-openai")
        try:
            futures = [pool.submit(self._request, client, body, abort) for body in bodies]
            done, _ = wait(futures, return_when=FIRST_EXCEPTION)
            failed = [f for f in futures if f in done and f.exception() is not None]
            if failed:
                abort.set()
                raise failed[0].exception()
            return [f.result() for f in futures]
        finally:
            # Queued requests are dropped; running ones end within one timeout (they see ``abort`` before retrying).
            pool.shutdown(wait=True, cancel_futures=True)

    def state_dict(self) -> dict[str, Any]:
        """What a checkpoint keeps so a resumed run sends the seeds an uninterrupted one would: the request count
        (request k is sampled with ``seed + k``) and the served model name (an adapter sync changes it)."""
        with self._lock:
            return {"requests": self._requests, "model": self.model}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        with self._lock:
            self._requests = int(state.get("requests", 0))
            self.model = str(state.get("model") or self.model)

    def close(self) -> None:
        client, self._client = self._client, None
        if client is not None and hasattr(client, "close"):
            client.close()

    def __enter__(self) -> "OpenAIPolicy":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- requests

    def _next_seed(self) -> int | None:
        with self._lock:
            k = self._requests
            self._requests += 1
        return None if self.config.seed is None else self.config.seed + k

    def _body(self, prompt: PromptInput, seed: int | None) -> dict[str, Any]:
        """The request fields for one prompt (model is added at send time: an adapter sync may change it)."""
        cfg = self.config
        body: dict[str, Any] = {"max_tokens": cfg.max_tokens, "temperature": cfg.temperature, "top_p": cfg.top_p}
        if cfg.endpoint == "completions":
            if isinstance(prompt, Prompt):
                prompt = prompt.text
            if not isinstance(prompt, str):
                raise TypeError("the completions endpoint takes rendered prompts (Prompt records or strings); render "
                                "the messages with the tokenizer's chat template, or use endpoint='chat'")
            body["prompt"] = prompt
            if cfg.logprobs:
                body["logprobs"] = 1  # top-1 alternatives; the sampled token's logprob always comes with them
        else:
            if isinstance(prompt, Prompt):
                # The messages, never the rendered text: the server applies the chat template itself.
                messages: Messages = [dict(m) for m in prompt.messages]
            elif isinstance(prompt, str):
                messages = [{"role": "user", "content": prompt}]
            elif isinstance(prompt, list) and all(isinstance(m, dict) and "role" in m for m in prompt):
                messages = prompt
            else:
                raise TypeError(f"a chat prompt must be a string or a list of {{'role', 'content'}} messages, "
                                f"got {type(prompt).__name__}")
            body["messages"] = messages
            if cfg.logprobs:
                body["logprobs"] = True
        if seed is not None:
            body["seed"] = seed
        if cfg.stop:
            body["stop"] = list(cfg.stop)
        if cfg.return_token_ids:
            body["return_token_ids"] = True
            if cfg.endpoint == "completions":
                # The rendered prompt already holds the special tokens its template writes; vLLM would prepend
                # another BOS by default, and the model would sample from a prompt the local text does not show.
                body["add_special_tokens"] = False
        body.update(cfg.extra_body)
        return body

    def _url(self) -> str:
        path = "/completions" if self.config.endpoint == "completions" else "/chat/completions"
        return self.config.base_url.rstrip("/") + path

    def _request(self, client: Any, body: dict[str, Any], abort: threading.Event) -> GenerationOut:
        """One prompt, with retries. Exponential backoff with jitter so that many failed requests do not
        come back to a recovering server all at the same moment."""
        cfg = self.config
        attempts = cfg.retries + 1
        last = ""
        for attempt in range(attempts):
            if abort.is_set():
                raise GenerationError(f"{self._url()}: abandoned after another request of the batch failed")
            try:
                return parse_response(self._send(client, body), cfg.endpoint, self._url())
            except _Retryable as exc:
                last = str(exc)
                if attempt + 1 == attempts:
                    break
                delay = min(cfg.max_backoff_s, cfg.backoff_s * 2**attempt) * random.uniform(0.5, 1.0)
                if exc.retry_after is not None:
                    delay = max(delay, min(exc.retry_after, cfg.max_backoff_s))
                log.warning("%s: attempt %d/%d failed (%s); retrying in %.2fs", self._url(), attempt + 1, attempts,
                            last, delay)
                if abort.wait(delay):
                    raise GenerationError(f"{self._url()}: abandoned after another request of the batch failed")
        raise GenerationError(f"{self._url()} (model {self.model!r}): request failed after {attempts} attempt(s); "
                              f"last error: {last}. Is the server up and serving this model? "
                              "(raise `retries` / `timeout_s` for a slow or overloaded server)")

    def _send(self, client: Any, body: dict[str, Any]) -> dict[str, Any]:
        """One HTTP attempt through the openai client; returns the response as plain JSON data.

        The client's own retries are off (max_retries=0): retrying here keeps the policy (which statuses,
        how long, when to give up) in one place and visible in the logs."""
        import openai

        body = dict(body)
        known = {"model": self.model}
        # Typed parameters for the fields every server knows; the rest (vLLM extensions) go in extra_body.
        typed = ("prompt", "messages", "max_tokens", "temperature", "top_p", "seed", "stop", "logprobs")
        for key in typed:
            if key in body:
                known[key] = body.pop(key)
        api = client.completions if self.config.endpoint == "completions" else client.chat.completions
        try:
            response = api.create(**known, extra_body=body or None, timeout=self.config.timeout_s)
        except openai.APITimeoutError as exc:
            raise _Retryable(f"timed out after {self.config.timeout_s}s") from exc
        except openai.APIConnectionError as exc:
            raise _Retryable(f"connection error: {exc.__cause__ or exc}") from exc
        except openai.APIStatusError as exc:
            status = exc.status_code
            message = f"HTTP {status}: {_error_text(exc)}"
            if status in RETRY_STATUS or status >= 500:
                raise _Retryable(message, _retry_after(exc)) from exc
            hint = ""
            if status == 401:
                hint = (f" (check the API key in ${self.config.api_key_env}"
                        f"{', which is not set' if self.config.api_key_env not in os.environ else ''})")
            elif status == 404:
                hint = f" (is {self.model!r} served here? GET {self.config.base_url}/models lists the served names)"
            elif status in (400, 422) and (self.config.return_token_ids or self.config.extra_body):
                hint = (" (if this server does not take vLLM's extra fields, set return_token_ids=False and "
                        "extra_body={})")
            raise GenerationError(f"{self._url()} (model {self.model!r}) refused the request: {message}{hint}") from exc
        return response.model_dump() if hasattr(response, "model_dump") else dict(response)

    def _get_client(self) -> Any:
        with self._lock:
            if self._client is None:
                try:
                    import openai
                except ImportError as exc:  # pragma: no cover - depends on the environment
                    raise ImportError("the openai backend needs the openai client: pip install 'openai>=1.40'") from exc
                self._client = openai.OpenAI(base_url=self.config.base_url, api_key=self.config.api_key(),
                                             timeout=self.config.timeout_s, max_retries=0)
            return self._client


def _error_text(exc: Any) -> str:
    body = getattr(exc, "body", None)
    if isinstance(body, dict):
        detail = body.get("message") or body.get("detail") or body.get("error") or body
        return str(detail)[:500]
    return str(getattr(exc, "message", exc))[:500]


def _retry_after(exc: Any) -> float | None:
    response = getattr(exc, "response", None)
    value = response.headers.get("retry-after") if response is not None else None
    try:
        return max(0.0, float(value)) if value is not None else None
    except ValueError:  # an HTTP date: rare from inference servers; the backoff covers it
        return None


# ------------------------------------------------------------------------------------------- parsing


def parse_response(data: dict[str, Any], endpoint: str, url: str = "") -> GenerationOut:
    """A completions / chat completions response (JSON data) as a ``GenerationOut``.

    Reads the vLLM extensions where present: ``token_ids`` (per choice), ``prompt_token_ids`` (per choice on
    completions, top level on chat), and ``token_id:N`` tokens (``return_tokens_as_token_ids``). A separate
    ``reasoning_content`` (vLLM's reasoning parser) is put back in front of the text as ``<think>...</think>``,
    where the response parser looks for it; a response cut off inside its reasoning (no content, finish reason
    ``length``) gets no closing tag, since the reasoning never ended. ``server_template``: the chat endpoint,
    where the server rendered the prompt."""
    choices = data.get("choices") or []
    if not choices or not isinstance(choices[0], dict):
        raise GenerationError(f"{url}: response has no choices: {json.dumps(data)[:300]}")
    choice = choices[0]
    if endpoint == "completions":
        text = choice.get("text") or ""
    else:
        message = choice.get("message") or {}
        text = message.get("content") or ""
        reasoning = message.get("reasoning_content") or message.get("reasoning")
        if reasoning:
            unfinished = not text and choice.get("finish_reason") == "length"
            text = f"<think>\n{reasoning}" if unfinished else f"<think>\n{reasoning}\n</think>\n{text}"
    token_ids = [int(t) for t in (choice.get("token_ids") or [])]
    prompt_token_ids = [int(t) for t in (choice.get("prompt_token_ids") or data.get("prompt_token_ids") or [])]

    values, tokens = _logprob_entries(choice.get("logprobs"), endpoint)
    if not token_ids and tokens and all(isinstance(t, str) and t.startswith("token_id:") for t in tokens):
        token_ids = [int(t[len("token_id:"):]) for t in tokens]
    logprobs: list[float] | None = None
    if values is not None and values and all(isinstance(v, (int, float)) for v in values):
        logprobs = [float(v) for v in values]
        if token_ids and len(logprobs) != len(token_ids):
            log.warning("%s: %d logprobs for %d token ids; dropping the logprobs (the trainer recomputes them)",
                        url, len(logprobs), len(token_ids))
            logprobs = None
    return GenerationOut(text=text, token_ids=token_ids, logprobs=logprobs, prompt_token_ids=prompt_token_ids,
                         truncated=choice.get("finish_reason") == "length", server_template=endpoint == "chat")


def _logprob_entries(logprobs: Any, endpoint: str) -> tuple[list[Any] | None, list[Any] | None]:
    """(logprob of each sampled token, the tokens) from either endpoint's logprobs shape, or (None, None)."""
    if not isinstance(logprobs, dict):
        return None, None
    if endpoint == "completions":
        values = logprobs.get("token_logprobs")
        tokens = logprobs.get("tokens")
        return (list(values) if values is not None else None), (list(tokens) if tokens is not None else None)
    content = logprobs.get("content")
    if not isinstance(content, list):
        return None, None
    return [e.get("logprob") for e in content], [e.get("token") for e in content]
