"""What the training flow shows on a Prefect server, read back from a real temporary one (Prefect's test harness):
the flow run's name and ``resumed`` tag, the ``kevin.*`` loggers' lines in the flow run's logs, the step reports'
artifact keys, and the collapse automation that ``flows/deploy.py`` makes. The run itself is a stand-in
(``StubRun``) that does no training: what is tested is the flow around it."""

from __future__ import annotations

import logging
import threading
import uuid
from pathlib import Path
from typing import Any

import pytest

import flows.train
from tests.conftest import REPO
from tests.servers import drain_prefect_workers

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")

PARAMS = [str(REPO / "params.yaml"), str(REPO / "configs" / "cpu.yaml")]
MONITOR_WARNING = "step 1: junk_share 0.5 > 0.1: many responses are repetitive junk"
THREAD_WARNING = "judge worker 3 restarted"


class StubRun:
    """Stands in for ``TrainingRun``: each method writes the file the next task is handed, and ``open`` logs as the
    project does, through ``kevin.*`` loggers, once from the flow's thread and once from a thread of its own."""

    def __init__(self, config: Any, *, project_dir: str, resume: bool, progress: Any):
        from kevin.experiment.progress import Progress

        self.config, self.resume, self.progress = config, resume, progress or Progress()  # as TrainingRun does
        self.name, self.steps = config.experiment.name, config.experiment.steps
        self.out_dir = config.experiment.resolved_output_dir(project_dir)
        self.waves, self.turns = 1, 1
        self.stop_reason = self.paused = ""
        self.mlflow = {"run_id": uuid.uuid4().hex}  # a new run: a new MLflow run id

    def open(self) -> int:
        (self.out_dir / "steps" / "step_000000").mkdir(parents=True, exist_ok=True)  # the run has started
        logging.getLogger("kevin.monitor").warning("%s", MONITOR_WARNING)
        worker = threading.Thread(target=logging.getLogger("kevin.evaluation.cluster").warning, args=(THREAD_WARNING,))
        worker.start()
        worker.join()
        self.progress.run_started(self.name, 0, self.steps, str(self.out_dir), self.resume)
        return 0

    def done(self, step: int) -> bool:
        return step >= self.steps

    def _file(self, step: int, name: str) -> str:
        path = self.out_dir / "steps" / f"step_{step:06d}" / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(f"# {self.name}: {name} of step {step + 1}\n")
        return str(path)

    def sample_batch(self, step: int) -> str:
        return self._file(step, "batch.json")

    def generate(self, step: int, turn: int, wave: int) -> None:
        return None  # no live trajectory: the rollout ends

    def aggregate(self, step: int) -> str:
        return self._file(step, "samples.jsonl")

    def update(self, step: int) -> str:
        return self._file(step, "update.json")

    def check_collapse(self, step: int) -> str:
        return self._file(step, "monitor.json")

    def checkpoint(self, step: int) -> None:
        return None

    def sync_weights(self, step: int) -> str:
        return ""

    def track(self, step: int) -> Path:
        return Path(self._file(step, "report.md"))

    def result(self) -> dict[str, Any]:
        return {"steps_done": self.steps, "mlflow": dict(self.mlflow)}

    def close(self, error: BaseException | None = None) -> None:
        pass


@pytest.fixture
def stub_run(monkeypatch):
    monkeypatch.setattr(flows.train, "TrainingRun", StubRun)


def train(project: Path, name: str, resume: bool, steps: int = 1):
    overrides = [f"experiment.name={name}", f"experiment.steps={steps}"]
    return flows.train.train(params=PARAMS, overrides=overrides, resume=resume, project_dir=str(project),
                             return_state=True)


def read_flow_run(state):
    from prefect.client.orchestration import get_client

    with get_client(sync_client=True) as client:
        return client.read_flow_run(state.state_details.flow_run_id)


def test_a_resumable_run_is_named_after_the_experiment_and_tagged_only_when_it_continues(harness, stub_run, tmp_path):
    # resume=True on an empty folder (a deployment's first scheduled run): a fresh run, not a resume.
    fresh = train(tmp_path, "cpu-demo", resume=True)
    assert fresh.is_completed(), fresh.message
    first = read_flow_run(fresh)
    assert (first.name, first.tags) == ("cpu-demo", [])
    # The next run finds the run in the folder and continues it: the same name, tagged.
    again = read_flow_run(train(tmp_path, "cpu-demo", resume=True))
    assert (again.name, again.tags) == ("cpu-demo", ["resumed"])


def test_kevin_loggers_reach_the_flow_run_logs(harness, stub_run, tmp_path):
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import LogFilter, LogFilterFlowRunId

    project = logging.getLogger("kevin")
    before = (project.level, list(project.handlers))
    state = train(tmp_path, "logged", resume=False)
    assert state.is_completed(), state.message
    drain_prefect_workers()  # the logs are sent in batches from a background worker
    with get_client(sync_client=True) as client:
        logs = client.read_logs(LogFilter(flow_run_id=LogFilterFlowRunId(any_=[state.state_details.flow_run_id])))
    lines = {(log.name, log.level, log.message) for log in logs}
    assert ("kevin.monitor", logging.WARNING, MONITOR_WARNING) in lines
    # A thread the project started itself (no Prefect context) still lands in the flow run's logs.
    assert ("kevin.evaluation.cluster", logging.WARNING, THREAD_WARNING) in lines
    # On a worker (no progress given) the progress lines are INFO lines of kevin.train.
    out_dir = tmp_path / "outputs" / "logged"
    assert ("kevin.train", logging.INFO, f"[logged] starting: 1 steps, outputs in {out_dir}") in lines
    # Nothing stays behind once the flow is over: the logger's level and handlers are as they were.
    assert (project.level, list(project.handlers)) == before


def test_outside_a_flow_run_the_kevin_logger_is_left_alone():
    from flows.common import project_logs_in_flow_run

    project = logging.getLogger("kevin")
    before = (project.level, list(project.handlers))
    with project_logs_in_flow_run():
        assert (project.level, list(project.handlers)) == before


def test_step_reports_are_keyed_by_run_and_numbered_from_one(harness, stub_run, tmp_path):
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import ArtifactFilter, ArtifactFilterKey

    # Two runs of one experiment name (two project folders): neither overwrites the other's reports.
    states = [train(tmp_path / folder, "Gamma_0.8", resume=False, steps=2) for folder in ("a", "b")]
    assert all(state.is_completed() for state in states), [state.message for state in states]
    runs = [state.result()["mlflow"]["run_id"][:8] for state in states]
    with get_client(sync_client=True) as client:
        found = client.read_artifacts(artifact_filter=ArtifactFilter(key=ArtifactFilterKey(like_="gamma-0-8-")))
    reports = {artifact.key: artifact.data for artifact in found}
    assert set(reports) == {f"gamma-0-8-{run}-step-{step}" for run in runs for step in (1, 2)}
    assert reports[f"gamma-0-8-{runs[1]}-step-2"] == "# Gamma_0.8: report.md of step 2\n"
