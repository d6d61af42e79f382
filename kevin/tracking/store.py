"""The MLflow store's side of a run: its experiment (created once, marked a model-training one), the run file that
lets a resume (or an evaluation of a checkpoint) find the run, and the batch sizes MLflow's API takes.

Functions over an explicit ``MlflowClient``, never the fluent API's global active run: the library keeps no
process-wide state. mlflow is imported inside them.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any, TypeVar

# The package's logger, as before it was split into modules.
logger = logging.getLogger(__package__)

RUN_FILE = "mlflow_run.json"
# Items per log_batch call: MLflow refuses more than 100 params or tags, or 1000 metrics, in one batch.
BATCH_PARAMS = 100
BATCH_METRICS = 1000
# MLflow 3's experiment tag that names what an experiment is for; "custom_model_development" is its model-training
# kind (the others: "genai_development", "finetuning", ...). Without it the UI treats the experiment as GenAI work.
EXPERIMENT_KIND_TAG = "mlflow.experimentKind"
EXPERIMENT_KIND = "custom_model_development"

T = TypeVar("T")


def batches(items: Sequence[T], size: int) -> Iterator[Sequence[T]]:
    """``items`` in consecutive slices of at most ``size`` (one log_batch call each)."""
    for i in range(0, len(items), size):
        yield items[i:i + size]


def experiment_id(client: Any, name: str, artifact_location: str | None) -> str:
    """The id of the active experiment ``name``, created (with ``artifact_location`` and the model-training kind)
    when the store has none; a deleted one is refused, with how to restore it."""
    from mlflow.exceptions import MlflowException

    experiment = client.get_experiment_by_name(name)
    if experiment is None:
        try:
            return client.create_experiment(name, artifact_location=artifact_location,
                                            tags={EXPERIMENT_KIND_TAG: EXPERIMENT_KIND})
        except MlflowException:  # another process created it between the lookup and the create
            experiment = client.get_experiment_by_name(name)
            if experiment is None:
                raise
    if experiment.lifecycle_stage != "active":
        raise ValueError(f"MLflow experiment {name!r} is deleted; restore it (mlflow experiments restore "
                         f"--experiment-id {experiment.experiment_id}) or set tracking.experiment_name to another name")
    mark_training_experiment(client, experiment)
    return experiment.experiment_id


def mark_training_experiment(client: Any, experiment: Any) -> None:
    """Tag ``experiment`` a model-training one unless it is already."""
    # An experiment made before the kind was set, or typed GenAI in the UI's first-visit prompt (whose default
    # choice is GenAI), is marked a model-training one.
    from mlflow.exceptions import MlflowException

    kind = experiment.tags.get(EXPERIMENT_KIND_TAG)
    if kind == EXPERIMENT_KIND:
        return
    logger.info("MLflow experiment %r: %s %r -> %r", experiment.name, EXPERIMENT_KIND_TAG, kind, EXPERIMENT_KIND)
    try:
        client.set_experiment_tag(experiment.experiment_id, EXPERIMENT_KIND_TAG, EXPERIMENT_KIND)
    except MlflowException as exc:  # e.g. a shared server that lets us log runs but not edit the experiment
        logger.warning("MLflow experiment %r keeps %s %r: %s", experiment.name, EXPERIMENT_KIND_TAG, kind, exc)


def read_run_file(path: Path) -> dict[str, str] | None:
    """The run recorded at ``path`` (a run folder's RUN_FILE); None when there is no file."""
    if not path.is_file():
        return None
    data = json.loads(path.read_text())
    if not isinstance(data, dict) or "run_id" not in data:
        raise ValueError(f"{path} holds no run_id; delete it to start a new MLflow run")
    return data


def write_run_file(path: Path, record: Mapping[str, Any]) -> None:
    """Record the run at ``path`` (atomically: a crash mid-write must not leave a resume without its run id)."""
    from kevin.records.jsonl import atomic_write_text

    atomic_write_text(path, json.dumps(dict(record), indent=1) + "\n")


def training_run_record(checkpoint: str | Path) -> dict[str, str] | None:
    """The MLflow run of the training run that saved ``checkpoint`` (``<run folder>/checkpoints/step_N``), as its
    run folder's ``mlflow_run.json`` records it (run_id, experiment_id, tracking_uri); None when there is none (a
    checkpoint moved out of its run folder, a run trained with tracking off)."""
    path = Path(checkpoint).parent.parent / RUN_FILE
    if not path.is_file():
        return None
    data = json.loads(path.read_text(encoding="utf-8"))
    return data if isinstance(data, dict) and data.get("run_id") else None
