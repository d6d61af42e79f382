"""The OpenAI-compatible backend: against a real `transformers serve` on 127.0.0.1 serving a tiny model built
here, and against a scripted fake server for what a real one cannot be made to do on demand (500s, 429s,
slowness, logprobs, vLLM's LoRA endpoints).

Everything listens on 127.0.0.1 only; servers stop in their fixtures' teardown; every request loop is bounded.
"""

from __future__ import annotations

import importlib.util
import json
import os
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from kevin.policy.openai_backend import GenerationError, OpenAIConfig, OpenAIPolicy, parse_response
from kevin.policy.weight_sync import FullWeightSync, LoraAdapterSync, WeightSyncError, peft_merged_name

pytestmark = pytest.mark.skipif(importlib.util.find_spec("openai") is None,
                                reason="the openai backend needs the openai client: pip install openai")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# ------------------------------------------------------------------------------------ fake server


class FakeServer:
    """A scripted OpenAI-compatible server: echoes prompts, records requests, counts requests in flight,
    answers the next ``failures`` statuses before succeeding, and takes vLLM's LoRA admin requests."""

    def __init__(self, delay: float = 0.0, failures=(), finish_reason: str = "stop", logprobs: bool = False,
                 lora_status: int = 200, fail_prompts=None):
        self.delay = delay
        self.fail_prompts = dict(fail_prompts or {})  # prompt -> status it always gets
        self.failures = list(failures)
        self.finish_reason = finish_reason
        self.logprobs = logprobs
        self.lora_status = lora_status
        self.requests: list[tuple[str, dict, dict]] = []  # (path, body, headers)
        self.in_flight = 0
        self.max_in_flight = 0
        self.lock = threading.Lock()
        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        self.httpd.daemon_threads = True
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.httpd.server_address[1]}/v1"

    def start(self) -> "FakeServer":
        self.thread.start()
        return self

    def stop(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()
        self.thread.join(timeout=5)

    def completion_requests(self) -> list[dict]:
        return [body for path, body, _ in self.requests if path.endswith("completions")]

    def _handler(self):
        server = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):  # keep test output clean
                pass

            def _send(self, status: int, payload, headers=None):
                data = (json.dumps(payload) if not isinstance(payload, str) else payload).encode()
                # The request leaves the in-flight count before its answer goes out: once the client reads the
                # answer it may send its next request, which a slow handler thread would otherwise still
                # overlap with, and the count would read one above the client's real bound.
                self._leave_flight()
                try:
                    self.send_response(status)
                    self.send_header("Content-Type", "application/json")
                    self.send_header("Content-Length", str(len(data)))
                    for k, v in (headers or {}).items():
                        self.send_header(k, v)
                    self.end_headers()
                    self.wfile.write(data)
                except (BrokenPipeError, ConnectionResetError):  # the client gave up (the timeout test)
                    pass

            def do_GET(self):
                self._send(200, {"status": "ok"} if self.path == "/health" else {"data": [{"id": "fake"}]})

            def do_POST(self):
                body = json.loads(self.rfile.read(int(self.headers.get("Content-Length", 0))) or b"{}")
                with server.lock:
                    server.requests.append((self.path, body, {k.lower(): v for k, v in self.headers.items()}))
                    failure = server.failures.pop(0) if server.failures else None
                    server.in_flight += 1
                    server.max_in_flight = max(server.max_in_flight, server.in_flight)
                self.counted = True
                try:
                    self._answer(body, failure)
                finally:
                    self._leave_flight()

            def _leave_flight(self):
                if getattr(self, "counted", False):
                    self.counted = False
                    with server.lock:
                        server.in_flight -= 1

            def _answer(self, body, failure):
                if self.path.endswith("_lora_adapter"):
                    if failure is not None:  # vLLM's answer to loading a name it already holds
                        return self._send(failure, {"error": {"message": f"The lora adapter '{body['lora_name']}' "
                                                                         "has already been loaded."}})
                    status = server.lora_status
                    return self._send(status, "Success" if status == 200 else {"detail": "Not Found"})
                if failure is not None:
                    headers = {"Retry-After": "0"} if failure == 429 else None
                    return self._send(failure, {"error": {"message": f"injected {failure}"}}, headers)
                prompt = body.get("prompt") or body.get("messages", [{}])[-1].get("content", "")
                if prompt in server.fail_prompts:
                    return self._send(server.fail_prompts[prompt], {"error": {"message": f"no {prompt}"}})
                # Later prompts answer sooner, so completion order differs from prompt order.
                delay = server.delay(prompt) if callable(server.delay) else server.delay
                time.sleep(delay)
                text = f"echo:{prompt}"
                ids = [ord(c) for c in text[:4]]
                choice = {"index": 0, "finish_reason": server.finish_reason}
                extra = {}
                if body.get("return_token_ids"):  # as vLLM: the response's ids, and the prompt's as IT rendered it
                    choice["token_ids"] = ids
                    rendered = [900 + len(m.get("content", "")) for m in body.get("messages", [])] or [
                        ord(c) for c in body["prompt"][:8]]
                    if self.path == "/v1/completions":
                        choice["prompt_token_ids"] = rendered
                    else:
                        extra["prompt_token_ids"] = rendered
                if self.path == "/v1/completions":
                    choice["text"] = text
                    if server.logprobs and body.get("logprobs") is not None:
                        choice["logprobs"] = {"tokens": [f"token_id:{i}" for i in ids],
                                              "token_logprobs": [-0.5] * len(ids), "top_logprobs": None,
                                              "text_offset": list(range(len(ids)))}
                    obj = "text_completion"
                else:
                    choice["message"] = {"role": "assistant", "content": text, "reasoning_content": "hmm"}
                    if server.logprobs and body.get("logprobs"):
                        choice["logprobs"] = {"content": [{"token": chr(i), "logprob": -0.25, "bytes": None,
                                                           "top_logprobs": []} for i in ids]}
                    obj = "chat.completion"
                self._send(200, {"id": "x", "object": obj, "created": 0, "model": body.get("model"),
                                 "choices": [choice], **extra})

        return Handler


@pytest.fixture
def fake():
    servers: list[FakeServer] = []

    def make(**kwargs) -> FakeServer:
        servers.append(FakeServer(**kwargs).start())
        return servers[-1]

    yield make
    for s in servers:
        s.stop()


def policy_for(server_url: str, **overrides) -> OpenAIPolicy:
    settings = dict(model="fake", base_url=server_url, api_key_env="KEVIN_TEST_NO_SUCH_KEY", backoff_s=0.01,
                    max_backoff_s=0.05, timeout_s=10.0, max_tokens=8)
    settings.update(overrides)
    return OpenAIPolicy(OpenAIConfig(**settings))


# ------------------------------------------------------------------------ fake server: behaviour


def test_concurrency_bound_and_result_order(fake):
    server = fake(delay=lambda prompt: 0.03 * (12 - int(prompt[1:])))
    prompts = [f"p{i}" for i in range(12)]
    with policy_for(server.base_url, max_concurrency=3) as policy:
        outs = policy.generate(prompts)
    assert [o.text for o in outs] == [f"echo:{p}" for p in prompts]
    assert server.max_in_flight == 3  # bounded, and the bound is actually used
    assert len(server.requests) == 12


def test_retries_after_500_429_503_then_success(fake):
    server = fake(failures=[500, 429, 503])
    with policy_for(server.base_url, retries=4) as policy:
        (out,) = policy.generate(["hello"])
    assert out.text == "echo:hello"
    assert len(server.requests) == 4


def test_retries_exhausted_gives_clear_error(fake):
    server = fake(failures=[500] * 10)
    with policy_for(server.base_url, retries=2) as policy, \
            pytest.raises(GenerationError, match=r"after 3 attempt\(s\).*HTTP 500"):
        policy.generate(["hello"])
    assert len(server.requests) == 3


def test_client_error_is_not_retried(fake):
    server = fake(failures=[400])
    with policy_for(server.base_url, retries=4) as policy, pytest.raises(GenerationError, match="refused.*HTTP 400"):
        policy.generate(["hello"])
    assert len(server.requests) == 1


def test_final_failure_abandons_the_rest_of_the_batch(fake):
    server = fake(fail_prompts={"bad": 400, "flaky": 500})
    start = time.monotonic()
    with policy_for(server.base_url, retries=6, backoff_s=1.0, max_backoff_s=8.0) as policy, \
            pytest.raises(GenerationError, match="HTTP 400"):
        policy.generate(["flaky", "bad"])
    assert time.monotonic() - start < 1.5  # "flaky" stopped retrying (it would back off for ~30 s)


def test_unreachable_server_retries_then_names_url():
    url = f"http://127.0.0.1:{free_port()}/v1"
    with policy_for(url, retries=1) as policy, pytest.raises(GenerationError, match="connection error") as info:
        policy.generate(["hello"])
    assert url in str(info.value)


def test_request_timeout(fake):
    server = fake(delay=3.0)
    start = time.monotonic()
    with policy_for(server.base_url, timeout_s=0.3, retries=0) as policy, pytest.raises(GenerationError, match="timed out"):
        policy.generate(["slow"])
    assert time.monotonic() - start < 2.5


def test_truncated_flag_from_finish_reason(fake):
    for reason, truncated in (("length", True), ("stop", False)):
        server = fake(finish_reason=reason)
        with policy_for(server.base_url) as policy:
            assert [o.truncated for o in policy.generate(["a", "b"])] == [truncated, truncated]


def test_logprobs_none_when_server_gives_none(fake):
    server = fake(logprobs=False)
    with policy_for(server.base_url) as policy:
        (out,) = policy.generate(["hello"])
    assert out.logprobs is None and out.token_ids == [] and out.prompt_token_ids == []
    assert server.completion_requests()[0]["logprobs"] == 1  # asked, not given


def test_logprobs_and_token_ids_when_given(fake):
    server = fake(logprobs=True)
    with policy_for(server.base_url) as policy:
        (out,) = policy.generate(["hello"])
    assert out.token_ids == [ord(c) for c in "echo"]
    assert out.logprobs == [-0.5] * 4


def test_request_fields_seeds_and_key(fake, monkeypatch):
    server = fake()
    with policy_for(server.base_url, seed=10, temperature=0.7, top_p=0.9, stop=["```\n\n"]) as policy:
        policy.generate(["a", "b", "c"])
        policy.generate(["d"])
    bodies = server.completion_requests()
    assert sorted(b["seed"] for b in bodies) == [10, 11, 12, 13]  # distinct per request, over calls too
    body = bodies[0]
    assert body["model"] == "fake" and body["max_tokens"] == 8 and body["temperature"] == 0.7
    assert body["top_p"] == 0.9 and body["stop"] == ["```\n\n"] and "return_token_ids" not in body
    assert server.requests[0][2]["authorization"] == "Bearer EMPTY"  # unset variable: placeholder key

    monkeypatch.setenv("KEVIN_TEST_KEY", "sk-test-123")
    with policy_for(server.base_url, api_key_env="KEVIN_TEST_KEY", return_token_ids=True,
                    extra_body={"top_k": 5}) as policy:
        policy.generate(["e"])
    path, body, headers = server.requests[-1]
    assert headers["authorization"] == "Bearer sk-test-123"
    assert body["return_token_ids"] is True and body["top_k"] == 5


def test_chat_endpoint_takes_messages_and_strings(fake):
    server = fake(logprobs=True)
    with policy_for(server.base_url, endpoint="chat") as policy:
        outs = policy.generate([[{"role": "system", "content": "s"}, {"role": "user", "content": "hi"}], "plain"])
    assert [o.text for o in outs] == ["<think>\nhmm\n</think>\necho:hi", "<think>\nhmm\n</think>\necho:plain"]
    assert outs[0].logprobs == [-0.25] * 4
    bodies = server.completion_requests()
    assert {b["messages"][-1]["content"] for b in bodies} == {"hi", "plain"}
    assert all(b["logprobs"] is True for b in bodies)


def test_completions_endpoint_rejects_message_lists(fake):
    server = fake()
    with policy_for(server.base_url) as policy, pytest.raises(TypeError, match="chat template"):
        policy.generate(["ok", [{"role": "user", "content": "x"}]])
    assert server.requests == []  # validated before anything was sent


def test_parse_response_vllm_token_ids_and_mismatch():
    data = {"choices": [{"text": "ab", "finish_reason": "stop", "token_ids": [5, 6], "prompt_token_ids": [1, 2, 3],
                         "logprobs": {"tokens": ["a", "b"], "token_logprobs": [-1.0, -2.0]}}]}
    out = parse_response(data, "completions")
    assert (out.token_ids, out.prompt_token_ids, out.logprobs, out.truncated) == ([5, 6], [1, 2, 3], [-1.0, -2.0], False)
    data["choices"][0]["logprobs"]["token_logprobs"] = [-1.0]  # misaligned: unusable
    assert parse_response(data, "completions").logprobs is None
    chat = {"prompt_token_ids": [9], "choices": [{"message": {"content": "x"}, "finish_reason": "length",
                                                  "token_ids": [4]}]}
    out = parse_response(chat, "chat")
    assert (out.text, out.prompt_token_ids, out.token_ids, out.truncated) == ("x", [9], [4], True)
    with pytest.raises(GenerationError, match="no choices"):
        parse_response({"choices": []}, "chat")


@pytest.mark.parametrize("bad", [dict(model=3), dict(base_url="localhost:8000"), dict(api_key_env="sk-abc123"),
                                 dict(endpoint="responses"), dict(max_concurrency=0), dict(retries=-1),
                                 dict(timeout_s=0), dict(top_p=0), dict(temperature=-1), dict(max_tokens=0),
                                 dict(seed=-1), dict(stop=[""]), dict(extra_body=[])])
def test_config_validation(bad):
    with pytest.raises(ValueError):
        OpenAIConfig(**{"model": "m", **bad})


def test_a_policy_needs_the_served_model_name():
    OpenAIConfig(model="")  # a config section may leave it to the run's policy.model
    with pytest.raises(ValueError, match="served model"):
        OpenAIPolicy(OpenAIConfig(model=""))


def test_config_round_trip():
    cfg = OpenAIConfig(model="m", seed=3, stop=["x"])
    assert OpenAIConfig.from_dict(cfg.to_dict()) == cfg
    assert cfg.server_root == "http://127.0.0.1:8000"
    with pytest.raises(ValueError, match="unknown"):
        OpenAIConfig.from_dict({"model": "m", "temprature": 1.0})


# ------------------------------------------------------------ the sampled prompt is the scored prompt


def _rollout_through(server_url: str, tokenizer, **overrides):
    from kevin.rollout.config import RolloutConfig
    from kevin.rollout.loop import run_rollouts
    from kevin.tasks import make_task
    from tests.conftest import identity_task_source
    from tests.rollout.test_loop import ScriptedEvaluator

    task = make_task("toy/a", 1, "a", identity_task_source())
    with policy_for(server_url, **overrides) as policy:
        (traj,) = run_rollouts([task], policy, ScriptedEvaluator(), RolloutConfig(trajectories=1, turns=1),
                               tokenizer=tokenizer)
    return traj


def test_chat_endpoint_sends_the_messages_not_a_templated_prompt(fake):
    """With a tokenizer the loop renders its chat template; the chat endpoint must still send the MESSAGES
    (the server templates them), or the model samples from a prompt templated twice that nobody scores."""
    from kevin.records.rollout import Trajectory
    from kevin.rewards import RewardConfig
    from kevin.training.step import build_samples
    from tests.chat_templates import PLAIN, chat_tokenizer

    tok = chat_tokenizer(PLAIN)
    server = fake()
    traj = _rollout_through(server.base_url, tok, endpoint="chat")
    (sent,) = server.completion_requests()
    (turn,) = traj.turns
    assert sent["messages"] == turn.prompt_messages  # the messages as built, not the rendered template
    assert "<|im_start|>" not in json.dumps(sent) and turn.prompt.startswith("<|im_start|>user")
    assert turn.server_template
    # The server's template is unknown here and it gave no prompt ids: training on the turn is refused.
    with pytest.raises(ValueError, match="chat endpoint.*no prompt token ids"):
        build_samples([Trajectory("toy/a", 0, [turn])], RewardConfig(), tok)

    # A server that returns its prompt token ids (vLLM's return_token_ids): those are what the trainer scores.
    server = fake()
    traj = _rollout_through(server.base_url, tok, endpoint="chat", return_token_ids=True)
    (sample,) = build_samples([traj], RewardConfig(), tok)
    assert sample.prompt_token_ids == [900 + len(m["content"]) for m in traj.turns[0].prompt_messages]


def test_completions_endpoint_sends_the_rendered_prompt_the_trainer_scores(fake):
    from kevin.rewards import RewardConfig
    from kevin.training.step import build_samples
    from tests.chat_templates import QWQ, chat_tokenizer

    tok = chat_tokenizer(QWQ)
    server = fake()
    traj = _rollout_through(server.base_url, tok, endpoint="completions")
    (sent,) = server.completion_requests()
    (turn,) = traj.turns
    assert sent["prompt"] == turn.prompt and turn.prompt.endswith("<|im_start|>assistant\n<think>\n")
    assert not turn.server_template and turn.reasoning_opened_by_prompt
    (sample,) = build_samples([traj], RewardConfig(), tok)
    assert sample.prompt_token_ids == tok.encode(sent["prompt"], add_special_tokens=False)
    assert "add_special_tokens" not in sent  # a field other servers may refuse, sent only to vLLM
    # vLLM (return_token_ids): told to add no BOS of its own, so its ids are the rendered text's; those are scored.
    server = fake()
    traj = _rollout_through(server.base_url, tok, endpoint="completions", return_token_ids=True)
    (sent,) = server.completion_requests()
    assert sent["add_special_tokens"] is False and sent["return_token_ids"] is True
    (sample,) = build_samples([traj], RewardConfig(), tok)
    assert sample.prompt_token_ids == [ord(c) for c in sent["prompt"][:8]]  # the server's ids, as it returned them


def test_reasoning_parser_output_cut_off_mid_reasoning_stays_unclosed():
    # vLLM's reasoning parser: everything went into reasoning_content and the length limit hit.
    cut = {"choices": [{"message": {"content": None, "reasoning_content": "Okay, the draft"}, "finish_reason": "length"}]}
    assert parse_response(cut, "chat").text == "<think>\nOkay, the draft"
    done = {"choices": [{"message": {"content": "code", "reasoning_content": "Okay."}, "finish_reason": "stop"}]}
    assert parse_response(done, "chat").text == "<think>\nOkay.\n</think>\ncode"
    assert parse_response(done, "chat").server_template and not parse_response(
        {"choices": [{"text": "x", "finish_reason": "stop"}]}, "completions").server_template


# -------------------------------------------------------------------------------------- weight sync


def _adapter_dir(tmp_path: Path, name: str) -> Path:
    path = tmp_path / name
    path.mkdir()
    (path / "adapter_config.json").write_text("{}")
    return path


def test_lora_sync_loads_new_then_unloads_old(fake, tmp_path):
    server = fake()
    policy = policy_for(server.base_url)
    sync = LoraAdapterSync(server.base_url, policy=policy, prefix="adapter")
    first, second = _adapter_dir(tmp_path, "step1"), _adapter_dir(tmp_path, "step2")
    assert sync.push(first) == "adapter-1"
    assert sync.push(second) == "adapter-2"
    assert [(p, b) for p, b, _ in server.requests] == [
        ("/v1/load_lora_adapter", {"lora_name": "adapter-1", "lora_path": str(first.resolve())}),
        ("/v1/load_lora_adapter", {"lora_name": "adapter-2", "lora_path": str(second.resolve())}),
        ("/v1/unload_lora_adapter", {"lora_name": "adapter-1"}),
    ]
    assert policy.model == "adapter-2" and sync.current == "adapter-2"
    policy.generate(["after sync"])
    assert server.completion_requests()[-1]["model"] == "adapter-2"  # generation now samples the new adapter


def test_lora_sync_replaces_a_version_the_server_already_holds(fake, tmp_path):
    server = fake(failures=[400])  # the server kept adapter-5 from before the trainer restarted
    sync = LoraAdapterSync(server.base_url, prefix="adapter")
    path = _adapter_dir(tmp_path, "step5")
    assert sync.push(path, version=5) == "adapter-5"
    assert [(p, b["lora_name"]) for p, b, _ in server.requests] == [
        ("/v1/load_lora_adapter", "adapter-5"), ("/v1/unload_lora_adapter", "adapter-5"),
        ("/v1/load_lora_adapter", "adapter-5")]


def test_lora_sync_errors(fake, tmp_path):
    server = fake(lora_status=404)
    with pytest.raises(WeightSyncError, match="VLLM_ALLOW_RUNTIME_LORA_UPDATING"):
        LoraAdapterSync(server.base_url).push(_adapter_dir(tmp_path, "a"))
    with pytest.raises(FileNotFoundError, match="adapter_config.json"):
        LoraAdapterSync(server.base_url).push(tmp_path)
    with pytest.raises(WeightSyncError, match="is the vLLM server running"):
        LoraAdapterSync(f"http://127.0.0.1:{free_port()}/v1", timeout_s=2).push(_adapter_dir(tmp_path, "b"))


def test_full_sync_unreachable_server_is_a_clear_error():
    sync = FullWeightSync(f"http://127.0.0.1:{free_port()}/v1", connect_timeout_s=2)
    with pytest.raises(ConnectionError, match="vllm serve"):
        sync.connect()


@pytest.mark.skipif(importlib.util.find_spec("vllm") is not None, reason="vllm is installed here")
def test_full_sync_without_vllm_says_so(fake):
    server = fake()
    with pytest.raises(ImportError, match="vllm"):
        FullWeightSync(server.base_url, connect_timeout_s=2).connect()


def test_full_sync_sends_every_tensor_then_resets_prefix_cache():
    torch = pytest.importorskip("torch")

    class Client:  # stands in for TRL's VLLMClient (that needs vLLM and a GPU)
        def __init__(self):
            self.calls = []

        def update_named_params(self, metadata, pairs):
            self.calls.append(("update", metadata, [n for n, _ in pairs]))

        def reset_prefix_cache(self):
            self.calls.append(("reset",))

    sync = FullWeightSync("http://127.0.0.1:1/v1")
    sync.client = Client()
    model = torch.nn.Sequential(torch.nn.Linear(3, 2))
    assert sync.push(model) == 2
    (kind, metadata, names), reset = sync.client.calls
    assert metadata == [("0.weight", "float32", [2, 3]), ("0.bias", "float32", [2])]
    assert names == ["0.weight", "0.bias"] and reset == ("reset",)


def test_peft_names_map_to_base_names():
    assert peft_merged_name("base_model.model.model.layers.0.self_attn.q_proj.base_layer.weight") == \
        "model.layers.0.self_attn.q_proj.weight"
    assert peft_merged_name("base_model.model.model.layers.0.self_attn.q_proj.lora_A.default.weight") is None
    assert peft_merged_name("base_model.model.lm_head.modules_to_save.default.weight") == "lm_head.weight"
    assert peft_merged_name("base_model.model.lm_head.original_module.weight") is None


# ----------------------------------------------------------------------- real server: transformers serve


def _build_tiny_model(out: Path, seed: int, eos_only: bool = False) -> Path:
    """A 2-layer Llama with a byte-level BPE tokenizer (300 tokens) and a chat template, built here.
    ``eos_only`` zeroes the output head: every logit ties, greedy picks id 0, which is the end token."""
    import torch
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    core = Tokenizer(models.BPE())
    core.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    core.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=300, special_tokens=["<|im_end|>", "<|im_start|>", "<|pad|>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    core.train_from_iterator(["write a fast relu kernel", "class ModelNew(nn.Module): def forward(self, x)"], trainer)
    tok = PreTrainedTokenizerFast(tokenizer_object=core, eos_token="<|im_end|>", pad_token="<|pad|>")
    tok.chat_template = ("{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n"
                         "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")
    assert tok.eos_token_id == 0
    config = LlamaConfig(vocab_size=len(tok), hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
                         eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id, bos_token_id=None)
    torch.manual_seed(seed)
    model = LlamaForCausalLM(config)
    if eos_only:
        with torch.no_grad():
            model.lm_head.weight.zero_()
    model.generation_config.do_sample = True  # so temperature > 0 samples (temperature 0 is greedy)
    model.save_pretrained(out)
    tok.save_pretrained(out)
    return out


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    """`transformers serve` on 127.0.0.1 with two tiny model directories (the request names the directory)."""
    if importlib.util.find_spec("fastapi") is None or importlib.util.find_spec("uvicorn") is None:
        pytest.skip("transformers serve needs its serving extra: pip install 'transformers[serving]'")
    root = tmp_path_factory.mktemp("served")
    tiny = _build_tiny_model(root / "tiny", seed=0)
    eos = _build_tiny_model(root / "eos", seed=1, eos_only=True)
    port = free_port()
    log_path = root / "serve.log"
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false", "OMP_NUM_THREADS": "1"}
    cmd = [sys.executable, "-c", "import sys; from transformers.cli.transformers import main; sys.exit(main())",
           "serve", "--host", "127.0.0.1", "--port", str(port), "--device", "cpu"]
    with open(log_path, "wb") as log_file:
        proc = subprocess.Popen(cmd, stdout=log_file, stderr=subprocess.STDOUT, env=env)
    try:
        deadline = time.monotonic() + 120
        while True:  # bounded by the deadline
            if proc.poll() is not None:
                pytest.fail(f"transformers serve exited with {proc.returncode}:\n{log_path.read_text()[-3000:]}")
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2) as response:
                    if response.status == 200:
                        break
            except OSError:
                pass
            if time.monotonic() > deadline:
                pytest.fail(f"transformers serve did not come up in 120 s:\n{log_path.read_text()[-3000:]}")
            time.sleep(0.25)
        yield {"base_url": f"http://127.0.0.1:{port}/v1", "tiny": str(tiny), "eos": str(eos), "log": log_path}
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=5)


def real_policy(served, model_key: str = "tiny", **overrides) -> OpenAIPolicy:
    settings = dict(model=served[model_key], base_url=served["base_url"], api_key_env="", temperature=0.0,
                    max_tokens=6, timeout_s=120.0, retries=1, backoff_s=0.1)
    settings.update(overrides)
    return OpenAIPolicy(OpenAIConfig(**settings))


def test_real_server_completions_order_truncation_no_logprobs(served):
    prompts = ["write a fast relu kernel", "class ModelNew", "hello", "def forward(self, x)", "fast", "kernel x"]
    with real_policy(served, max_concurrency=3) as policy:
        batch = policy.generate(prompts)
        one_by_one = [policy.generate([p])[0] for p in prompts]
    assert [o.text for o in batch] == [o.text for o in one_by_one]  # greedy: same answer, so same position
    assert len({o.text for o in batch}) >= 2  # the prompts give different answers: the order check means something
    assert all(o.truncated for o in batch)  # a random model does not stop within 6 tokens
    assert all(o.logprobs is None and o.token_ids == [] for o in batch)  # transformers serve returns none


def test_real_server_chat_endpoint(served):
    from kevin.records.generation import Prompt

    messages = [{"role": "user", "content": "write a fast relu kernel"}]
    # A Prompt record's rendered text must not be sent: the server gets (and templates) its messages.
    record = Prompt(messages=messages, text="<|im_start|>user\nNOT SENT<|im_end|>\n", templated=True)
    with real_policy(served, endpoint="chat", max_concurrency=2) as policy:
        outs = policy.generate([messages, "class ModelNew", record])
    assert len(outs) == 3 and all(isinstance(o.text, str) and o.truncated and o.server_template for o in outs)
    assert outs[2].text == outs[0].text  # greedy: the record was answered as its messages


def test_real_server_stop_at_eos_is_not_truncated(served):
    with real_policy(served, model_key="eos") as policy:
        (out,) = policy.generate(["write a fast relu kernel"])
    assert out.truncated is False and out.text == ""


def test_real_server_seeds_vary_and_repeat(served):
    prompt = ["write a fast relu kernel"] * 4
    # One request at a time: transformers serve seeds torch's global RNG, which concurrent requests would share.
    with real_policy(served, temperature=1.0, seed=7, max_concurrency=1, max_tokens=8) as policy:
        first = [o.text for o in policy.generate(prompt)]
    with real_policy(served, temperature=1.0, seed=7, max_concurrency=1, max_tokens=8) as policy:
        again = [o.text for o in policy.generate(prompt)]
    assert first == again  # same seeds, same samples
    assert len(set(first)) > 1  # the copies of one prompt got different seeds


def test_real_server_unknown_model_is_a_clear_error(served, tmp_path):
    with real_policy(served, model=str(tmp_path / "missing"), retries=0) as policy, pytest.raises(GenerationError):
        policy.generate(["x"])
