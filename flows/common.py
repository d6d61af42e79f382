"""What the training and evaluation flows share: their flow-run names and which failures Prefect retries."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from kevin.config import RunConfig


def run_name(pick: Callable[[RunConfig], str], default: str) -> str:
    """The flow run's name from its own parameters' config (``pick`` chooses the field), ``-resume`` when it
    resumes; ``default`` when the config does not load (the flow itself then reports why)."""
    from prefect.runtime import flow_run

    params = flow_run.parameters
    try:
        name = pick(RunConfig.from_files(params.get("params") or ["params.yaml"], params.get("overrides") or []))
    except (ValueError, TypeError, FileNotFoundError):
        name = default
    return f"{name}-resume" if params.get("resume") else name


def transient(task: Any, task_run: Any, state: Any) -> bool:
    """Retry a generation only for failures that pass: a server that timed out or refused the connection."""
    from kevin.policy.openai_backend import GenerationError

    try:
        state.result()
    except (GenerationError, ConnectionError, TimeoutError):
        return True
    except BaseException:  # noqa: BLE001  (any other failure is final)
        return False
    return False
