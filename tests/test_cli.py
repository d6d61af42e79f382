"""`kevin eval`: verdicts on exit code 0, bad arguments on exit code 2 with a clear message."""

from __future__ import annotations

import json
import time

import pytest
from typer.testing import CliRunner

from kevin_cli import app
from tests.conftest import RELU_BODY, REPO, cpp_solution

RELU_TASK = str(REPO / "data" / "tasks" / "level1" / "01_relu.py")
runner = CliRunner()


def invoke(*args, env=None):
    return runner.invoke(app, list(args), env=env)


def test_eval_json_of_a_rule_violation(tmp_path, cache_dir):
    sol = tmp_path / "sol.py"
    sol.write_text("import torch\nimport torch.nn as nn\n\nclass ModelNew(nn.Module):\n    def forward(self, x):\n        return torch.relu(x)\n")
    result = invoke("eval", RELU_TASK, str(sol), "--json", env={"KEVIN_CACHE_DIR": str(cache_dir)})
    assert result.exit_code == 0, result.output
    data = json.loads(result.output)
    assert data["status"] == "rule_violation" and data["score"] == 0.0


def test_eval_bad_arguments(tmp_path):
    sol = tmp_path / "sol.py"
    sol.write_text("x = 1\n")
    missing = invoke("eval", str(tmp_path / "nope.py"), str(sol))
    assert missing.exit_code == 2 and "no such file" in missing.output
    bad_task = tmp_path / "task.py"
    bad_task.write_text("def get_inputs():\n    return []\n")
    r = invoke("eval", str(bad_task), str(sol))
    assert r.exit_code == 2 and "must define Model" in r.output
    r = invoke("eval", RELU_TASK, str(tmp_path / "absent.py"))
    assert r.exit_code == 2 and "no such solution file" in r.output
    r = invoke("eval", RELU_TASK, str(sol), "--backend", "tpu")
    assert r.exit_code == 2 and "backend must be one of" in r.output


def test_eval_junk_solutions_are_parse_errors(tmp_path, cache_dir):
    for name, data in {"empty.py": b"", "junk.bin": bytes(range(256)), "nomodel.py": b"import torch\n"}.items():
        path = tmp_path / name
        path.write_bytes(data)
        r = invoke("eval", RELU_TASK, str(path), "--json", env={"KEVIN_CACHE_DIR": str(cache_dir)})
        assert r.exit_code == 0, r.output
        assert json.loads(r.output)["status"] == "parse_error"


def test_tasks_lists_the_bundled_suite():
    r = invoke("tasks")
    assert r.exit_code == 0 and "level1/01_relu" in r.output


def test_unknown_task_errors_carry_no_stray_quotes(tmp_path):
    folder = tmp_path / "solutions"
    folder.mkdir()
    (folder / "my_relu.py").write_text("x = 1\n")
    r = invoke("eval-batch", str(folder))
    assert r.exit_code == 2 and r.output == "error: no task 'my_relu'\n"
    jsonl = tmp_path / "candidates.jsonl"
    jsonl.write_text(json.dumps({"task_id": "my_relu", "source": ""}) + "\n")
    r = invoke("eval-batch", str(jsonl))
    assert r.exit_code == 2
    assert r.output == f"error: {jsonl}:1: expected {{task_id, source}} of a known task (no task 'my_relu')\n"


def test_timeout_option_sets_the_run_time_limit(tmp_path):
    from kevin_cli.common import eval_config as _config

    params = tmp_path / "params.yaml"
    params.write_text("evaluation:\n  timeout_s: 30\n")
    assert _config("", "", 0, 0, None).timeout_s == 180.0  # EvalConfig's default
    assert _config("", "", 0, 0, params).timeout_s == 30.0  # 0: the params file's value
    assert _config("", "", 0, 0, params, 7.5).timeout_s == 7.5  # the command line wins
    for command in ("eval", "eval-batch", "suite"):
        assert "--timeout" in invoke(command, "--help").output, command
    sol = tmp_path / "sol.py"
    sol.write_text("x = 1\n")
    for bad in ("-1", "nan", "inf"):
        r = invoke("eval", RELU_TASK, str(sol), "--timeout", bad)
        assert r.exit_code == 2, bad
        assert r.output == f"error: --timeout must be a positive number of seconds (0: the configured default), got {float(bad)}\n"


@pytest.mark.slow
def test_eval_timeout_kills_a_hanging_kernel(tmp_path, cache_dir):
    """One real C++ compile (about 10 s on 2 cores), then a forward that never returns, killed after --timeout."""
    sol = tmp_path / "hang.py"
    sol.write_text(cpp_solution(RELU_BODY, forward="while True:\n            x = x", name="cli_hang"))
    start = time.monotonic()
    r = invoke("eval", RELU_TASK, str(sol), "--timeout", "4", "--json", env={"KEVIN_CACHE_DIR": str(cache_dir)})
    assert r.exit_code == 0, r.output
    data = json.loads(r.output)
    assert data["status"] == "timeout" and data["error"].startswith("no verdict within 4 s")
    assert time.monotonic() - start < 150  # not the default 180 s


def test_the_temporary_prefect_server_of_a_run_gets_time_to_start_on_a_busy_machine():
    """Prefect waits 20 s for the server a run without PREFECT_API_URL starts; on a loaded 2-core machine that
    was too short. The CLI raises the wait before Prefect reads its settings, unless the user set one."""
    import os
    import subprocess
    import sys

    probe = ("from kevin_cli.common import quiet_libraries\nquiet_libraries(True)\n"
             "from prefect.settings import PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS as wait\n"
             "print(wait.value())")
    env = {k: v for k, v in os.environ.items() if not k.startswith("PREFECT_")}
    env["PYTHONPATH"] = str(REPO)
    waits = []
    for extra in ({}, {"PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS": "45"}):
        done = subprocess.run([sys.executable, "-c", probe], env={**env, **extra}, capture_output=True, text=True,
                              timeout=300)
        assert done.returncode == 0, done.stderr[-2000:]
        waits.append(done.stdout.split()[-1])
    assert waits == ["180", "45"]
