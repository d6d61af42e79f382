"""A policy that writes junk: the collapse monitor stops the run cleanly (checkpoint, the flow's final state, the
MLflow tags). With a real `prefect server start` on loopback the automation our code makes posts the stop to a
webhook listener; without a server (`kevin train`, Prefect's ephemeral API) the alert is logged, tagged and in the
final state."""

from __future__ import annotations

import json
import os
import queue
import subprocess
import sys
import time
from pathlib import Path

import pytest

from kevin.alerts import AlertConfig, alert_text, ensure_collapse_automation
from kevin.monitor import Alert
from tests.alerts.test_alerts import _wait_until_live
from tests.conftest import REPO
from tests.flows.conftest import mlflow_run, write_params
from tests.servers import prefect_server, webhook  # noqa: F401  (fixtures)

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")

PARAMS = REPO / "params.yaml"
STOP = "collapse: junk_share at step 1 (step 1: junk_share 1 > 0.1: many responses are repetitive junk"


def junk_params(path: Path, name: str, model: Path, split: Path, cache: Path, **alerts) -> Path:
    """Three steps of 2 tasks x 2 trajectories x 1 turn with the model that repeats one word."""
    return write_params(path, max_response_tokens=48, response_length_schedule={},
                        experiment={"name": name, "steps": 3, "tasks_per_batch": 2, "split": str(split)},
                        policy={"backend": "hf", "model": str(model)}, sampling={"batch_size": 4},
                        rollout={"trajectories": 2, "turns": 1}, evaluation={"cache_dir": str(cache)}, alerts=alerts)


def check_stopped_run(root: Path, name: str) -> dict:
    """What every stopped run leaves: the stop step's checkpoint and no later step; its reason in monitor.json and in
    the MLflow run, which ended KILLED. Returns the stop step's monitor.json."""
    out = root / "outputs" / name
    assert (out / "checkpoints" / "step_000001").is_dir() and not (out / "steps" / "step_000002").exists()
    monitor = json.loads((out / "steps" / "step_000001" / "monitor.json").read_text())
    assert monitor["stop_reason"].startswith(STOP) and monitor["row"]["junk_share"] == 1.0
    _, run = mlflow_run(root)
    assert run.info.status == "KILLED"
    assert run.data.tags["stop.reason"] == monitor["stop_reason"]
    assert (run.data.tags["stop.step"], run.data.tags["stop.metric"]) == ("1", "junk_share")
    return monitor


def test_a_collapsing_run_stops_and_the_automation_posts_it_to_the_webhook(prefect_server, webhook, model_dirs,  # noqa: F811
                                                                           split_file, cache_dir, tmp_path, one_thread):
    from prefect.client.orchestration import get_client

    from flows.train import train

    url, received = webhook
    names = {"automation_name": "kevin-train-collapse", "block_name": "kevin-train-collapse-hook"}
    # The run makes the automation itself when it starts (and finds this one); made and probed here first, since
    # a sqlite-backed server only acts on a new automation a moment after making it, and this run is quick.
    config = AlertConfig(webhook_url=url, **names)
    ensure_collapse_automation(config=config)
    _wait_until_live(config, received)
    params = junk_params(tmp_path / "junk.yaml", "junk", model_dirs["junk"], split_file, cache_dir,
                         webhook_url=url, **names)
    state = train(params=[str(PARAMS), str(params)], project_dir=str(tmp_path), return_state=True)

    assert state.is_completed() and state.name == "Stopped" and state.message.startswith(STOP)
    result = state.result()
    assert result["steps_done"] == 2 and result["stop_reason"] == state.message
    monitor = check_stopped_run(tmp_path, "junk")
    with get_client(sync_client=True) as client:
        flow_run = client.read_flow_run(state.state_details.flow_run_id)
    assert (flow_run.state.name, flow_run.state.message) == ("Stopped", state.message)

    # Every alert of the step is an event; the first step of each streak and the stop reach the webhook.
    alerts = [Alert.from_dict(a) for a in monitor["alerts"]]
    stop = next(a for a in alerts if a.should_stop)
    expected = {json.dumps({"text": alert_text(a, monitor["row"], run_name="junk")}) for a in alerts}
    got: set[str] = set()
    deadline = time.monotonic() + 60
    while got != expected and time.monotonic() < deadline:
        try:
            path, ctype, body = received.get(timeout=1)
        except queue.Empty:
            continue
        if "run probe:" not in body["text"]:
            got.add(json.dumps(body))
            assert (path, ctype) == ("/hooks/kevin", "application/json")
    assert got == expected
    assert json.dumps({"text": alert_text(stop, monitor["row"], run_name="junk")}) in got

    # A stopped run stays stopped: resuming it runs no further step and ends in the same state.
    again = train(params=[str(PARAMS), str(params)], resume=True, project_dir=str(tmp_path), return_state=True)
    assert (again.name, again.message) == ("Stopped", state.message)
    assert not (tmp_path / "outputs" / "junk" / "steps" / "step_000002").exists()


def test_without_a_server_kevin_train_logs_tags_and_states_the_stop(model_dirs, split_file, cache_dir, tmp_path):
    params = junk_params(tmp_path / "junk.yaml", "junk-local", model_dirs["junk"], split_file, cache_dir)
    env = {k: v for k, v in os.environ.items() if not k.startswith("PREFECT_")}  # no server: the ephemeral API
    env.update(PYTHONPATH=str(REPO), PREFECT_HOME=str(tmp_path / "prefect"), PREFECT_SERVER_ANALYTICS_ENABLED="false",
               OMP_NUM_THREADS="1")
    proc = subprocess.run([sys.executable, "-m", "kevin_cli", "train", "--params", str(PARAMS), "--params", str(params)],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=900)
    output = proc.stdout + proc.stderr
    assert proc.returncode == 0, output[-3000:]
    monitor = check_stopped_run(tmp_path, "junk-local")
    assert f"STOPPED after 2 of 3 steps: {monitor['stop_reason']}" in " ".join(output.split())
    assert "no Prefect server configured (PREFECT_API_URL): alert not sent as an event" in output
    assert "[Kevin STOPPED] run junk-local: step 1: junk_share 1 > 0.1" in output
    # The same command again would start over the run in that folder: refused, with what to do instead.
    again = subprocess.run(proc.args, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert again.returncode == 2 and "already holds a run of experiment 'junk-local'; continue it with --resume" in \
        " ".join(again.stderr.split())
