"""The flow's small parts: which failures a generation retries, artifact keys, the config it reads."""

from __future__ import annotations

import pytest

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


def test_artifact_keys_are_lowercase_letters_digits_and_dashes():
    assert _artifact_key("cpu-demo", 3) == "cpu-demo-step-3"
    assert _artifact_key("Gamma_0.8", 12) == "gamma-0-8-step-12"


def test_the_flow_reads_params_files_in_order_then_overrides():
    config = load_config([str(REPO / "params.yaml"), str(REPO / "configs" / "cpu.yaml")], ["rollout.turns=3"])
    assert (config.experiment.name, config.rollout.turns, config.rollout.trajectories) == ("cpu-demo", 3, 2)
    with pytest.raises(FileNotFoundError, match="no such params file"):
        load_config([str(REPO / "missing.yaml")], [])
