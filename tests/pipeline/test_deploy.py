"""The deployments on a real `prefect server start` (loopback): deploy registers the training deployment with
its schedule and parameters in a process work pool, a `prefect worker start` subprocess picks up a triggered run
of a tiny training configuration, and it completes. Deploying also creates the collapse automation."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.servers import prefect_server  # noqa: F401  (the fixture)

REPO = Path(__file__).resolve().parents[2]


def test_specs_hold_the_training_flow_with_its_parameters_and_schedule(tmp_path):
    from flows.deploy import DeploySpec, specs

    (train,) = specs(["a.yaml", "b.yaml"], ["experiment.steps=1"], tmp_path, "0 3 * * *", "", with_evaluation=False)
    assert (train.entrypoint, train.name, train.cron) == ("flows/train.py:train", "kevin-train", "0 3 * * *")
    assert train.parameters == {"params": ["a.yaml", "b.yaml"], "overrides": ["experiment.steps=1"], "resume": True,
                                "project_dir": str(tmp_path)}
    train, evaluate = specs(["a.yaml"], [], tmp_path, "0 3 * * *", "0 6 * * *")
    assert (evaluate.entrypoint, evaluate.name, evaluate.cron) == ("flows/evaluate.py:evaluate", "kevin-evaluate",
                                                                   "0 6 * * *")
    assert evaluate.parameters == {"params": ["a.yaml"], "overrides": [], "resume": True, "project_dir": str(tmp_path)}
    with pytest.raises(ValueError, match="path/to/file.py:flow_function"):
        DeploySpec("flows/train.py", "x")


def test_deploy_then_a_worker_runs_a_triggered_training_run(prefect_server, tmp_path, cache_dir):  # noqa: F811
    from prefect.client.orchestration import get_client

    from tests.flows.conftest import build_model_dir, write_params
    from tests.servers import drain_prefect_workers

    model = build_model_dir(tmp_path / "model")
    params = write_params(tmp_path / "tiny.yaml", max_response_tokens=32, response_length_schedule={},
                          experiment={"name": "deployed", "steps": 1, "tasks_per_batch": 1, "torch_threads": 1},
                          policy={"backend": "hf", "model": str(model)}, rollout={"trajectories": 2, "turns": 1},
                          evaluation={"cache_dir": str(cache_dir)}, monitor={"stop_on": []},
                          splits={"levels": [1]}, train={"micro_batch_size": 2})
    env = {k: v for k, v in os.environ.items() if not k.startswith("PREFECT_")}
    env.update(PREFECT_API_URL=prefect_server, PREFECT_HOME=str(tmp_path / "prefect-client"), OMP_NUM_THREADS="1",
               PREFECT_SERVER_ANALYTICS_ENABLED="false", PYTHONPATH=str(REPO),
               KEVIN_ALERT_WEBHOOK_URL="http://127.0.0.1:9/hooks/kevin")  # never called: no run collapses
    deployed = subprocess.run([sys.executable, "-m", "flows.deploy", "--pool", "kevin-test", "--cron", "0 3 * * *",
                               "--params", str(REPO / "params.yaml"), "--params", str(params),
                               "--project", str(tmp_path), "--no-evaluation"],
                              cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
    assert deployed.returncode == 0, deployed.stdout + deployed.stderr
    assert "deployed kevin-train (flows/train.py:train) to pool 'kevin-test', schedule '0 3 * * *'" in deployed.stdout

    with get_client(sync_client=True) as client:
        deployment = client.read_deployment_by_name("kevin-train/kevin-train")
        assert deployment.work_pool_name == "kevin-test"
        assert client.read_work_pool("kevin-test").type == "process"
        assert [s.schedule.cron for s in deployment.schedules] == ["0 3 * * *"]
        assert deployment.parameters["params"] == [str(REPO / "params.yaml"), str(params)]
        assert deployment.parameters["resume"] is True
        (automation,) = client.read_automations_by_name("kevin-collapse-alert")
        assert f"collapse automation: {automation.id}" in deployed.stdout
        run = client.create_flow_run_from_deployment(deployment.id)

    log = open(tmp_path / "worker.log", "w")
    worker = subprocess.Popen([sys.executable, "-m", "prefect", "worker", "start", "--pool", "kevin-test",
                               "--type", "process", "--limit", "1"], cwd=REPO, env=env, stdout=log,
                              stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 420
        with get_client(sync_client=True) as client:
            while True:
                state = client.read_flow_run(run.id).state
                if state is not None and state.is_final():
                    break
                assert worker.poll() is None, (tmp_path / "worker.log").read_text()[-3000:]
                assert time.monotonic() < deadline, (tmp_path / "worker.log").read_text()[-3000:]
                time.sleep(2)
        assert state.is_completed(), (state, (tmp_path / "worker.log").read_text()[-3000:])
        assert state.message == "1 of 1 steps"
        assert (tmp_path / "outputs" / "deployed" / "steps" / "step_000000" / "summary.json").is_file()
    finally:
        worker.terminate()
        try:
            worker.wait(timeout=30)
        except subprocess.TimeoutExpired:
            worker.kill()
            worker.wait()
        log.close()
        drain_prefect_workers()
