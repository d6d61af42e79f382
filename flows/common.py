"""What the training and evaluation flows share: their flow-run names and tags, artifact keys, which failures Prefect
retries, and the project's log lines in the flow run's logs."""

from __future__ import annotations

import logging
import re
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from typing import Any
from uuid import UUID

from kevin.config import RunConfig

PROJECT_LOGGER = "kevin"
"""The logger above every ``kevin.*`` logger (the monitor's warnings, the trainer's, the progress lines)."""
RESUMED_TAG = "resumed"
"""The tag of a flow run that continued a run found in its output folder."""


def run_name(pick: Callable[[RunConfig], str], default: str) -> str:
    """The flow run's name from its own parameters' config (``pick`` chooses the field, the experiment's name);
    ``default`` when the config does not load (the flow itself then reports why). Not whether it resumes: the
    ``resume`` parameter only allows it (a deployment sets it on every run, its first included); the flow tags
    the run ``resumed`` once it has found a run to continue (``tag_flow_run``)."""
    from prefect.runtime import flow_run

    params = flow_run.parameters
    try:
        return pick(RunConfig.from_files(params.get("params") or ["params.yaml"], params.get("overrides") or []))
    except (ValueError, TypeError, FileNotFoundError):
        return default


def tag_flow_run(tag: str) -> None:
    """Add ``tag`` to the current flow run's tags (outside a flow run: nothing)."""
    from prefect.client.orchestration import get_client
    from prefect.context import FlowRunContext

    context = FlowRunContext.get()
    if context is None or context.flow_run is None:
        return
    tags = sorted({*context.flow_run.tags, tag})
    with get_client(sync_client=True) as client:
        client.update_flow_run(context.flow_run.id, tags=tags)


COUNTED_FROM_ONE = ("step", "turn", "wave")
"""Task parameters that index files from 0 but that users count from 1 (progress lines, artifacts, MLflow)."""


def one_based_name(template: str) -> Callable[..., str]:
    """A ``task_run_name`` for Prefect: ``template`` formatted with the task's parameters, ``step``, ``turn`` and
    ``wave`` counted from 1, so "generate-1-turn-2-wave-1" in the UI is the first step's second turn, as the report
    and MLflow (``turn_2``) call it. Prefect passes the parameters to a callable that takes ``parameters``."""

    def name(parameters: dict[str, Any]) -> str:
        shown = {k: v + 1 if k in COUNTED_FROM_ONE and isinstance(v, int) and not isinstance(v, bool) else v
                 for k, v in parameters.items()}
        return template.format(**shown)

    return name


def artifact_key(*parts: str) -> str:
    """A Prefect artifact key made of ``parts``: Prefect takes lowercase letters, digits and dashes only."""
    return re.sub(r"[^a-z0-9]+", "-", "-".join(parts).lower()).strip("-")


def run_key(mlflow: Mapping[str, str]) -> str:
    """Which run an artifact belongs to, in its key: the first 8 characters of the MLflow run id (a resume keeps
    it, so a redone step's report is a new version of the same artifact; a new run gets another), else of the flow
    run's id (tracking off). Without either (no flow run): "run"."""
    from prefect.context import FlowRunContext

    if mlflow.get("run_id"):
        return mlflow["run_id"][:8]
    context = FlowRunContext.get()
    return context.flow_run.id.hex[:8] if context is not None and context.flow_run is not None else "run"


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


def _in_run_context() -> bool:
    from prefect.context import FlowRunContext, TaskRunContext

    return FlowRunContext.get() is not None or TaskRunContext.get() is not None


def _run_log_handler(flow_run_id: UUID) -> logging.Handler:
    """Prefect's API log handler, which also takes records logged where Prefect sees no run (a thread the project
    started itself, e.g. an evaluator's) and files them under ``flow_run_id`` instead of warning."""
    from prefect.logging.handlers import APILogHandler

    class RunLogHandler(APILogHandler):
        def prepare(self, record: logging.LogRecord) -> dict[str, Any]:
            if getattr(record, "flow_run_id", None) is None and not _in_run_context():
                record = logging.makeLogRecord({**record.__dict__, "flow_run_id": flow_run_id})
            return super().prepare(record)

    return RunLogHandler()


def _sends_to_api(logger: logging.Logger) -> bool:
    from prefect.logging.handlers import APILogHandler

    return any(isinstance(handler, APILogHandler) for handler in logger.handlers)


@contextmanager
def project_logs_in_flow_run(name: str = PROJECT_LOGGER) -> Iterator[None]:
    """Inside the block, the records of logger ``name`` and its children also go to the current flow run's logs
    (``prefect flow-run logs``, the UI's log tab), not only to the console: Prefect sends only its own loggers
    there. A logger without a level of its own gets Prefect's (``PREFECT_LOGGING_LEVEL``, INFO), as Prefect's own
    loggers do, so the INFO lines show too. Both are undone at the end of the block; outside a flow run, or when
    the logger already sends to the API (``PREFECT_LOGGING_EXTRA_LOGGERS=kevin``), no handler is added. Set up
    here, when the flow runs, rather than on import: the same code then works in ``kevin train``'s process and in
    the process a worker starts."""
    from prefect.context import FlowRunContext
    from prefect.settings import PREFECT_LOGGING_LEVEL

    logger = logging.getLogger(name)
    context = FlowRunContext.get()
    if context is None or context.flow_run is None:
        yield
        return
    handler = None if _sends_to_api(logger) else _run_log_handler(context.flow_run.id)
    if handler is not None:
        logger.addHandler(handler)
    level = logger.level
    if level == logging.NOTSET:
        logger.setLevel(PREFECT_LOGGING_LEVEL.value())
    try:
        yield
    finally:
        logger.setLevel(level)
        if handler is not None:
            logger.removeHandler(handler)
