"""Pushing updated weights to a running generation server, so the next rollout samples from the new policy.

Three ways, by what the server can take:

* ``LoraAdapterSync``: after an update, the trainer saves the LoRA adapter (a PEFT directory) and this loads
  it into vLLM through its runtime adapter endpoints; the policy then samples from the new adapter.
* ``FolderSync``: full weights written as a model folder that ``transformers serve`` loads by name.
* ``FullWeightSync``: full fine-tuning; streams every parameter to vLLM over NCCL with TRL's ``VLLMClient``.

Each re-points the ``OpenAIPolicy`` (``kevin.policy.openai_backend``) it is given at what it pushed. The few
admin requests go through the standard library, so importing this module costs nothing.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import tempfile
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any, Iterable, Iterator

from kevin.policy.openai_backend import OpenAIPolicy, server_root

log = logging.getLogger(__name__)


class WeightSyncError(RuntimeError):
    """The server refused or did not answer a weight update."""


def _http_json(method: str, url: str, payload: dict[str, Any] | None, timeout_s: float) -> tuple[int, str]:
    """(status, body text) of one request; raises ``ConnectionError`` when nothing answers."""
    data = json.dumps(payload).encode() if payload is not None else None
    request = urllib.request.Request(url, data=data, method=method, headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=timeout_s) as response:
            return response.status, response.read().decode("utf-8", "replace")
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode("utf-8", "replace")
    except (urllib.error.URLError, OSError) as exc:
        reason = getattr(exc, "reason", exc)
        raise ConnectionError(f"no server answers at {url}: {reason}") from exc


class LoraAdapterSync:
    """Loads each new LoRA adapter into a running vLLM server and points the policy at it.

    Server side: ``VLLM_ALLOW_RUNTIME_LORA_UPDATING=True vllm serve BASE --enable-lora --max-lora-rank R``
    (and ``--max-loras 2``: the new adapter is loaded before the old one is unloaded). The adapter directory
    (``adapter_config.json`` + weights, as ``peft`` saves it) must be readable by the server at the same path.

    Each push loads the adapter under a NEW name (``{prefix}-{version}``), switches the policy to it, then
    unloads the previous one. A fresh name per version rather than an in-place reload under one name: vLLM's
    prefix cache is keyed by adapter id, and a same-name reload has served stale cached blocks of the previous
    weights (vllm issue 42125); ``load_inplace`` re-reads the adapter from disk at every step on some versions.
    """

    def __init__(self, base_url: str, policy: OpenAIPolicy | None = None, prefix: str = "kevin-lora",
                 timeout_s: float = 300.0):
        self.root = server_root(base_url)
        self.policy = policy
        self.prefix = prefix
        self.timeout_s = timeout_s
        self.current: str | None = None
        """Name of the adapter loaded by the last push (None before the first)."""
        self._version = 0

    def push(self, adapter_dir: str | Path, version: int | None = None) -> str:
        """Load ``adapter_dir`` as the newest adapter; return the name it is served under."""
        path = Path(adapter_dir).resolve()
        if not (path / "adapter_config.json").is_file():
            raise FileNotFoundError(f"{path} is not a PEFT adapter directory (no adapter_config.json); save it with "
                                    "model.save_pretrained(dir) on the peft model")
        self._version = self._version + 1 if version is None else int(version)
        name = f"{self.prefix}-{self._version}"
        if name == self.current:
            raise ValueError(f"adapter version {self._version} is already loaded as {name!r}; push a new version")
        load = {"lora_name": name, "lora_path": str(path)}
        try:
            self._post("/v1/load_lora_adapter", load)
        except WeightSyncError as exc:
            # A resumed run pushes a version the (still running) server already holds from before the restart:
            # replace it rather than fail. Anything else is a real error.
            if "already" not in str(exc).lower():
                raise
            log.warning("adapter %s is already loaded on the server (a resumed run?); reloading it", name)
            self.unload(name)
            self._post("/v1/load_lora_adapter", load)
        previous, self.current = self.current, name
        if self.policy is not None:
            self.policy.model = name
        if previous is not None:
            try:
                self.unload(previous)
            except WeightSyncError as exc:  # the new adapter is live; a leftover old one only costs memory
                log.warning("could not unload the previous adapter %s: %s", previous, exc)
        return name

    def unload(self, name: str) -> None:
        self._post("/v1/unload_lora_adapter", {"lora_name": name})

    def _post(self, path: str, payload: dict[str, Any]) -> None:
        url = self.root + path
        try:
            status, text = _http_json("POST", url, payload, self.timeout_s)
        except ConnectionError as exc:
            raise WeightSyncError(f"{exc}; is the vLLM server running?") from exc
        if status == 200:
            return
        hint = ""
        if status in (404, 405):
            hint = (" (the server has no runtime LoRA endpoints: start vLLM with --enable-lora and "
                    "VLLM_ALLOW_RUNTIME_LORA_UPDATING=True in its environment)")
        raise WeightSyncError(f"POST {url} {json.dumps(payload)} -> HTTP {status}: {text[:500]}{hint}")


class FolderSync:
    """Full weights for a server that loads a model folder by the name a request gives (``transformers serve``):
    each push writes the model as a new folder under ``root`` (``v000001``, ...: weights, tokenizer and a
    generation config that samples) and points the policy at it; the server loads it at its first request.

    For vLLM, which serves the model it was started with, use ``LoraAdapterSync`` or ``FullWeightSync``. The
    newest ``keep`` folders stay (the server may still be answering from the one before); older ones go.
    """

    def __init__(self, root: str | Path, policy: OpenAIPolicy | None = None, keep: int = 2):
        if keep < 1:
            raise ValueError(f"keep must be at least 1 (the folder being served), got {keep}")
        self.root = Path(root)
        self.policy = policy
        self.keep = keep
        self.current: str | None = None
        """The folder of the last push (None before the first)."""

    def folder(self, version: int) -> Path:
        return self.root / f"v{version:06d}"

    def push(self, model: Any, tokenizer: Any, version: int) -> str:
        """Write ``model`` (with ``tokenizer``) as version ``version`` and serve it; returns the folder's path."""
        from kevin.policy.embedded import export_hf_dir

        final = self.folder(version).resolve()
        self.root.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=f".{final.name}.", suffix=".tmp", dir=self.root))
        try:
            export_hf_dir(tmp, model, tokenizer)
            if final.exists():  # the same version pushed again (a resumed run): replace it
                shutil.rmtree(final)
            os.rename(tmp, final)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
        self.current = str(final)
        if self.policy is not None:
            self.policy.model = self.current
        versions = sorted(p for p in self.root.glob("v*") if p.is_dir())
        for old in versions[:-self.keep]:
            shutil.rmtree(old, ignore_errors=True)
        return self.current


def peft_merged_name(name: str) -> str | None:
    """The base-model parameter name of a PEFT model's parameter after ``merge_adapter()``, or None for the
    LoRA factors themselves (they are folded into the base weights, not sent).

    ``base_model.model.model.layers.0.q_proj.base_layer.weight`` -> ``model.layers.0.q_proj.weight``; the
    ``modules_to_save`` copies replace the original module's name."""
    if "lora_" in name or ".original_module." in name:
        return None
    name = name.removeprefix("base_model.model.")
    name = name.replace(".base_layer.", ".")
    name = name.replace(".modules_to_save.default.", ".")
    return name


def _named_tensors(model: Any) -> Iterator[tuple[str, Any]]:
    """The (name, tensor) pairs vLLM expects: plain parameters, or a PEFT model's merged base weights."""
    if hasattr(model, "peft_config"):
        for name, param in model.named_parameters():
            merged = peft_merged_name(name)
            if merged is not None:
                yield merged, param.data
    else:
        for name, param in model.named_parameters():
            yield name, param.data


class FullWeightSync:
    """Pushes every weight of the updated model into a vLLM server over NCCL, through TRL's ``VLLMClient``.

    Server side (in vLLM's own environment): ``VLLM_SERVER_DEV_MODE=1 vllm serve BASE --weight-transfer-config
    '{"backend": "nccl"}'``. Trainer side: a CUDA device, and ``vllm`` importable next to ``trl`` (TRL's client
    imports vLLM's NCCL helpers); where the trainer's environment cannot hold vllm (it clashes with prefect),
    train LoRA and use ``LoraAdapterSync``, which needs nothing but HTTP.

    Not covered: gathering ZeRO-3 shards (pass ``push_named`` the gathered tensors, one at a time, from inside
    ``deepspeed.zero.GatheredParameters``).
    """

    def __init__(self, base_url: str, device: str | int = 0, group_port: int = 51216, connect_timeout_s: float = 5.0):
        self.root = server_root(base_url)
        self.device = device
        self.group_port = group_port
        self.connect_timeout_s = connect_timeout_s
        self.client: Any = None

    def connect(self) -> None:
        """Check the server answers, then open the NCCL group with it (blocks until the server joins)."""
        try:
            status, text = _http_json("GET", self.root + "/health", None, self.connect_timeout_s)
        except ConnectionError as exc:
            raise ConnectionError(
                f"{exc}. FullWeightSync needs a running vLLM server: start it in its own environment with "
                "`VLLM_SERVER_DEV_MODE=1 vllm serve MODEL --weight-transfer-config '{\"backend\": \"nccl\"}'`") from exc
        if status != 200:
            raise WeightSyncError(f"{self.root}/health answered HTTP {status}: {text[:300]}")
        client_cls = _trl_vllm_client()
        try:
            self.client = client_cls(base_url=self.root, group_port=self.group_port,
                                     connection_timeout=self.connect_timeout_s)
        except ImportError as exc:
            raise ImportError(f"{exc} -- TRL's VLLMClient imports vllm in the TRAINER's environment; install a vllm "
                              "that matches the server's version there, or use LoRA with LoraAdapterSync") from exc
        self.client.init_communicator(device=self.device)

    def push(self, model: Any) -> int:
        """Send every parameter of ``model`` (a plain or PEFT model, unwrapped from DDP/accelerate); returns the
        number of tensors sent. A PEFT model is merged for the transfer and unmerged afterwards."""
        merge = hasattr(model, "merge_adapter") and hasattr(model, "unmerge_adapter")
        if merge:
            model.merge_adapter()
        try:
            return self.push_named(_named_tensors(model))
        finally:
            if merge:
                model.unmerge_adapter()

    def push_named(self, named_tensors: Iterable[tuple[str, Any]]) -> int:
        """Send (name, tensor) pairs, names as the server's model names them (HF names for HF models)."""
        if self.client is None:
            self.connect()
        pairs = list(named_tensors)
        if not pairs:
            return 0
        if hasattr(self.client, "update_named_params"):  # TRL >= 1.16: one batched transfer
            metadata = [(n, str(t.dtype).removeprefix("torch."), list(t.shape)) for n, t in pairs]
            self.client.update_named_params(metadata, iter(pairs))
        else:
            for name, tensor in pairs:
                self.client.update_named_param(name, tensor)
        # Cached KV blocks were computed with the old weights.
        self.client.reset_prefix_cache()
        return len(pairs)

    def close(self) -> None:
        if self.client is not None:
            self.client.close_communicator()
            self.client = None


def _trl_vllm_client() -> Any:
    """TRL's VLLMClient class: ``trl.generation.vllm_client`` (TRL 1.x), ``trl.extras.vllm_client`` (0.x)."""
    try:
        from trl.generation.vllm_client import VLLMClient
    except ImportError:
        try:
            from trl.extras.vllm_client import VLLMClient
        except ImportError as exc:
            raise ImportError("FullWeightSync needs TRL's vLLM client: pip install 'trl>=1.16' (and vllm)") from exc
    return VLLMClient
