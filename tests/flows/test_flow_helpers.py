"""The flow's small parts: which failures a generation retries, artifact keys, the config it reads."""

from __future__ import annotations

import pytest

from flows.common import artifact_key, one_based_name, run_key
from flows.common import transient as _transient
from flows.train import _artifact_key, load_config
from kevin.policy.openai_backend import GenerationError
from tests.conftest import REPO


@pytest.mark.parametrize("error, retried", [
    (GenerationError("http://127.0.0.1:8000/v1/completions: request failed after 5 attempt(s)"), True),
    (ConnectionError("no server answers"), True),
    (TimeoutError("Scope timed out after 600 second(s)."), True),
    (ValueError("the prompt is empty"), False),
    (RuntimeError("generate returned 3 outputs for 4 prompts"), False),
])
def test_only_failures_that_pass_are_retried(error, retried):
    from prefect.states import Failed

    assert _transient(None, None, Failed(data=error)) is retried


def test_artifact_keys_are_lowercase_letters_digits_and_dashes_and_count_steps_from_one():
    assert _artifact_key("cpu-demo", "3f2a9c1b", 0) == "cpu-demo-3f2a9c1b-step-1"
    assert _artifact_key("Gamma_0.8", "0e1d2c3b", 11) == "gamma-0-8-0e1d2c3b-step-12"
    assert artifact_key("--A  b__c--", "evaluation") == "a-b-c-evaluation"


def test_task_run_names_count_steps_turns_and_waves_from_one():
    from prefect._internal.engine import resolve_custom_task_run_name

    from flows.train import evaluate, sample_batch

    name = one_based_name("generate-{step}-turn-{turn}-wave-{wave}")
    assert name(parameters={"run": object(), "step": 0, "turn": 1, "wave": 0}) == "generate-1-turn-2-wave-1"
    assert one_based_name("{rollout}-turn-{turn}")(parameters={"rollout": "4x2", "turn": 0}) == "4x2-turn-1"
    # Prefect hands the callable the task's parameters (it must take ``parameters`` to get them).
    assert resolve_custom_task_run_name(evaluate, {"run": None, "step": 4, "turn": 0, "wave": 1,
                                                   "parsed": ""}) == "evaluate-5-turn-1-wave-2"
    assert resolve_custom_task_run_name(sample_batch, {"run": None, "step": 0}) == "sample-batch-1"


def test_an_artifact_s_run_is_its_mlflow_run_id_else_the_flow_run_s(harness):
    from prefect import flow

    assert run_key({"run_id": "0123456789abcdef0123456789abcdef"}) == "01234567"
    assert run_key({}) == "run"  # outside a flow run

    @flow
    def probe() -> tuple[str, str]:
        from prefect.runtime import flow_run

        return run_key({}), flow_run.id.replace("-", "")[:8]

    key, flow_run_id = probe()
    assert key == flow_run_id


def test_the_flow_reads_params_files_in_order_then_overrides():
    config = load_config([str(REPO / "params.yaml"), str(REPO / "configs" / "cpu.yaml")], ["rollout.turns=3"])
    assert (config.experiment.name, config.rollout.turns, config.rollout.trajectories) == ("cpu-demo", 3, 2)
    with pytest.raises(FileNotFoundError, match="no such params file"):
        load_config([str(REPO / "missing.yaml")], [])
