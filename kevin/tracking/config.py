"""Where a run is tracked: ``TrackingConfig`` and the rules that pin its store and artifact folder to the project,
so tracking does not depend on the folder a command was started from (or on DVC's temporary copies).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from kevin.settings import Settings


@dataclass
class TrackingConfig(Settings):
    """Where and how a training run is tracked in MLflow."""

    section = "tracking"

    enabled: bool = True
    """Track this run in MLflow; False turns every Tracker method into a no-op (mlflow is then never imported)."""

    tracking_uri: str = "sqlite:///mlflow.db"
    """The MLflow store. A relative sqlite path is taken from the project folder, so the README's
    ``mlflow ui --backend-store-uri sqlite:///mlflow.db`` run there opens it; ``sqlite:////abs/path.db`` or a
    server (``http://host:5000``) work too. The ``./mlruns`` file store is refused (MLflow deprecated it)."""

    artifact_location: str = "mlartifacts"
    """Where a NEW experiment of a sqlite store keeps its artifacts: a folder (relative to the project folder)
    or a URI (``s3://bucket/kevin``). With a tracking server the server decides unless this is a URI."""

    experiment_name: str = "kevin"
    """The MLflow experiment; ablations of one study share it, so the UI compares their runs side by side."""

    run_name: str = ""
    """The run's name; "" uses the DVC experiment name under ``dvc exp run``, else MLflow picks one."""

    kernel_sample_size: int = 8
    """How many kernels (with their verdicts) each step stores as a readable sample; 0 stores none."""

    log_rollouts: bool = True
    """Store each step's rollout records (JSONL) as artifacts; off saves space on long runs."""

    plot_every: int = 1
    """Redraw the run's plots and step table every this many steps (and always when the run ends)."""

    def __post_init__(self) -> None:
        uri = self.tracking_uri.strip()
        if not uri:
            raise ValueError("tracking.tracking_uri is empty; use sqlite:///mlflow.db (the default) or a server URL")
        if "://" not in uri or uri.startswith("file:"):
            raise ValueError(
                f"tracking.tracking_uri {self.tracking_uri!r} is a file store, which MLflow 3 refuses by default; "
                "use sqlite:///mlflow.db (a database in the project folder) or a tracking server URL"
            )
        if not self.experiment_name.strip():
            raise ValueError("tracking.experiment_name is empty; name the MLflow experiment, e.g. 'kevin'")
        if not isinstance(self.kernel_sample_size, int) or self.kernel_sample_size < 0:
            raise ValueError(f"tracking.kernel_sample_size must be an integer >= 0 (0 stores no sample), "
                             f"got {self.kernel_sample_size!r}")
        if not isinstance(self.plot_every, int) or self.plot_every < 1:
            raise ValueError(f"tracking.plot_every must be an integer >= 1, got {self.plot_every!r}")


def store_folder(project_dir: str | Path, env: Mapping[str, str]) -> Path:
    """The folder a relative store path is taken from: the DVC repository's root (``DVC_ROOT``) when DVC runs
    the command, else ``project_dir``. ``dvc exp run --queue`` / ``--temp`` run each experiment in a temporary
    copy of the repository and set ``DVC_ROOT`` to the original, so every ablation lands in its one database
    instead of a copy that is deleted afterwards."""
    return Path(env["DVC_ROOT"]) if env.get("DVC_ROOT") else Path(project_dir)


def resolve_tracking_uri(uri: str, project_dir: str | Path) -> str:
    """``uri`` with a relative sqlite path made absolute against ``project_dir`` (other URIs unchanged).

    ``sqlite:///mlflow.db`` names a path relative to the working directory; tracking must not depend on where
    the command was started, so it is pinned to the project folder: ``sqlite:////abs/project/mlflow.db``.
    """
    prefix = "sqlite:///"
    if not uri.startswith(prefix):
        return uri
    path = uri[len(prefix):]
    if not path or path.startswith("/") or path == ":memory:":
        return uri
    return prefix + str((Path(project_dir) / path).resolve())


def resolve_artifact_location(location: str, tracking_uri: str, project_dir: str | Path) -> str | None:
    """The artifact location for a new experiment: a URI as is; a folder, for a sqlite store, as an absolute
    ``file://`` URI under ``project_dir``; None (the store's default) for a folder with a tracking server."""
    if not location:
        return None
    if "://" in location:
        return location
    if not tracking_uri.startswith("sqlite:"):
        return None
    return (Path(project_dir) / location).resolve().as_uri()


def experiment_ui_path(experiment_id: str | None) -> str:
    """The experiment's runs in the MLflow UI, in its model-training view: append to the UI's address
    (``http://127.0.0.1:5000/``). MLflow 3.17's UI takes its view from a sidebar switch (GenAI / Model training,
    remembered by the browser, GenAI until switched) or from ``workflowType`` in the address, not from the
    experiment's kind tag; this address opens the training view whatever the switch says."""
    return f"#/experiments/{experiment_id}/runs?workflowType=machine_learning"
