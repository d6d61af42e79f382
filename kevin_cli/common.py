"""What the commands share: the error exit, the evaluation settings every kernel command reads, the params files
and the quieting of libraries that the run commands need before Prefect is imported."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any, NoReturn, Optional

import typer

BACKEND_HELP = "cuda (inline CUDA on a GPU) or cpu (inline C++); default: params.yaml, else cpu"
TIMEOUT_HELP = "seconds one candidate may run (after compiling) before it is killed (0: params.yaml, else 180)"


def die(message: str) -> NoReturn:
    """Bad arguments or input: the message on stderr and exit code 2 (the package docstring lists the codes)."""
    typer.echo(f"error: {message}", err=True)
    raise typer.Exit(2)


def eval_config(backend: str, profile: str, timing_trials: int, correctness_trials: int, params: Optional[Path],
                timeout: float = 0.0) -> Any:
    """The EvalConfig of a kernel command: params.yaml's evaluation section with the command line on top."""
    from kevin.params import eval_config_from_params

    if not math.isfinite(timeout) or timeout < 0:
        die(f"--timeout must be a positive number of seconds (0: the configured default), got {timeout}")
    try:
        return eval_config_from_params(params, backend=backend, profile=profile, timing_trials=timing_trials,
                                       correctness_trials=correctness_trials, timeout_s=timeout)
    except (ValueError, FileNotFoundError) as exc:
        die(str(exc))


def read_solution(path: Path) -> str:
    """Solution text; binary or non-UTF-8 data is kept (it becomes a parse_error verdict)."""
    if not path.is_file():
        die(f"no such solution file: {path}")
    data = path.read_bytes()
    return data.decode("utf-8", errors="replace") if b"\x00" not in data else data.decode("latin-1")


def load_task(path: Path) -> Any:
    """One task file, or exit 2 when it is not a task."""
    from kevin.tasks import TaskError, load_task_file

    try:
        return load_task_file(path)
    except (TaskError, FileNotFoundError) as exc:
        die(str(exc))


def params_files(params: Optional[list[Path]]) -> list[str]:
    """The --params files in order (params.yaml when none), each checked to exist."""
    files = [str(p) for p in params] if params else ["params.yaml"]
    for path in files:
        if not Path(path).is_file():
            die(f"no such params file: {path}")
    return files


def quiet_libraries(verbose: bool) -> None:
    """Keep the terminal to the run's progress lines: Prefect, MLflow, transformers and DeepSpeed report at
    INFO, or draw bars, for things a user of `kevin train` does not need to see (``--verbose`` shows them).
    Also the Prefect settings a run without a server needs, set before Prefect is imported."""
    import os

    # Prefect reads its settings when it is imported, so these come first. The temporary server a run starts
    # for itself has nobody to report usage to (and on a machine without network it logs an error trying).
    os.environ.setdefault("PREFECT_LOGGING_LEVEL", "INFO" if verbose else "WARNING")
    os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
    # Prefect gives that temporary server 20 s to create its database and answer; on a busy 2-core machine it
    # took longer and the run died before its first step. Waiting costs nothing when it starts at once.
    os.environ.setdefault("PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS", "180")
    if verbose:
        return
    os.environ.setdefault("MLFLOW_LOGGING_LEVEL", "WARNING")  # MLflow, too, sets its level when imported
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    import torch

    if not torch.cuda.is_available():
        # DeepSpeed (imported by transformers when saving a checkpoint) warns that it found no GPU unless told.
        os.environ.setdefault("DS_ACCELERATOR", "cpu")
