"""Shared pieces of the flow tests: tiny models saved as HF folders (one that samples, one that only repeats a
word), a split of two cheap bundled tasks, a params file writer, and Prefect's test harness."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

TASKS = ("level1/01_relu", "level1/03_sigmoid")
"""The train split of the flow tests: level-1 tasks whose C++ references compile quickly."""
JUNK_WORD = " kernel"


def build_model_dir(out: Path, junk: bool = False) -> Path:
    """A 2-layer Qwen2 with a byte-level BPE tokenizer trained on the bundled tasks, saved as an HF folder.
    ``junk``: every position's hidden state is the same vector and the output head only knows one token, so the
    model writes `` kernel kernel kernel ...`` until the length limit (a collapsed policy)."""
    import torch

    from kevin.policy.builders import build_model, build_tokenizer, model_config
    from kevin.rollout.replay import tokenizer_corpus
    from kevin.tasks import find_task, load_bundled_suite

    suite = load_bundled_suite()
    tokenizer = build_tokenizer(tokenizer_corpus([find_task(suite, t) for t in TASKS], "cpu"), vocab_size=1024)
    config = model_config("tiny", len(tokenizer), tokenizer, layers=2)
    config.tie_word_embeddings = not junk
    with torch.random.fork_rng():
        torch.manual_seed(0)
        model = build_model(config)
    if junk:
        (word,) = tokenizer.encode(JUNK_WORD, add_special_tokens=False)
        with torch.no_grad():
            model.model.embed_tokens.weight.fill_(0.1)
            for layer in model.model.layers:  # the layers add nothing to the residual stream
                layer.self_attn.o_proj.weight.zero_()
                layer.mlp.down_proj.weight.zero_()
            model.lm_head.weight.zero_()
            model.lm_head.weight[word].fill_(1.0)  # its logit: the hidden size (128); every other token's: 0
    model.generation_config.do_sample = True
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    return out


@pytest.fixture(scope="session")
def model_dirs(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("models")
    return {"tiny": build_model_dir(root / "tiny"), "junk": build_model_dir(root / "junk", junk=True)}


@pytest.fixture(scope="session")
def split_file(tmp_path_factory) -> Path:
    from kevin.tasks import Split, SplitConfig, SplitEntry, find_task, load_bundled_suite, write_split

    suite = load_bundled_suite()
    entries = tuple(SplitEntry(t.task_id, t.level, t.digest) for t in (find_task(suite, i) for i in TASKS))
    held = find_task(suite, "level1/02_gelu")
    split = Split(SplitConfig(levels=(1,)), train=entries, eval=(SplitEntry(held.task_id, 1, held.digest),))
    return write_split(tmp_path_factory.mktemp("split") / "split.json", split)


def mlflow_run(root: Path):
    """The one MLflow run of the experiment `kevin` in the store of project folder `root`."""
    from mlflow.tracking import MlflowClient

    client = MlflowClient(f"sqlite:///{root / 'mlflow.db'}")
    runs = client.search_runs([client.get_experiment_by_name("kevin").experiment_id])
    assert len(runs) == 1, [r.info.run_name for r in runs]
    return client, runs[0]


def write_params(path: Path, **sections: Any) -> Path:
    """A params file holding ``sections`` (the run's settings that differ from params.yaml's)."""
    path.write_text(yaml.safe_dump(sections, sort_keys=False))
    return path


def replay_params(path: Path, name: str, model: Path, split: Path, cache: Path, **extra: Any) -> Path:
    """Two steps of 2 tasks x 2 trajectories x 2 turns with the tiny model; half the trajectories replay the
    reference solution in their first turn (tests/flows/policies.py), judged by the real cpu evaluator."""
    sections: dict[str, Any] = {
        "max_response_tokens": 448,  # the longest replayed reference (sigmoid) is about 400 tokens
        "response_length_schedule": {},
        # Barren tasks rest: no task here is barren (each has a replayed correct kernel), so the draws are the plain
        # sampler's, and a resume restores a sampler that rests.
        "experiment": {"name": name, "steps": 2, "tasks_per_batch": 2, "split": str(split), "rest_barren_epochs": 1},
        "policy": {"backend": "hf", "model": str(model), "wrap": "tests.flows.policies:replay_first_turn"},
        "sampling": {"batch_size": 8},
        "rollout": {"trajectories": 2, "turns": 2},
        # Few trials keep the test short; the clock slack keeps an honest kernel from being ruled a timing
        # mismatch on a busy 2-core CI machine.
        "evaluation": {"timing_trials": 5, "warmup_trials": 1, "correctness_trials": 2, "cache_dir": str(cache),
                       "clock_slack_ms": 1000.0},
        "train": {"lr": 1.0e-3, "micro_batch_size": 8},
    }
    for key, value in extra.items():
        sections[key] = {**sections.get(key, {}), **value} if isinstance(value, dict) else value
    return write_params(path, **sections)


@pytest.fixture(scope="module")
def harness():
    """Prefect's test harness (a temporary server and database) for the module; yields its API URL."""
    from prefect.settings import PREFECT_API_URL, PREFECT_SERVER_ANALYTICS_ENABLED, temporary_settings
    from prefect.testing.utilities import prefect_test_harness

    from tests.servers import drain_prefect_workers

    drain_prefect_workers()  # events queued for an earlier module's server must not wait for this harness
    # No telemetry from the harness's server (it also fights the flow runs over the sqlite database).
    with temporary_settings(updates={PREFECT_SERVER_ANALYTICS_ENABLED: False}), \
            prefect_test_harness(server_startup_timeout=120):
        yield PREFECT_API_URL.value()


@pytest.fixture
def one_thread():
    """Generation of a tiny model is op-bound: extra threads only fight over 2 busy cores."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)
