"""`kevin eval`: verdicts on exit code 0, bad arguments on exit code 2 with a clear message."""

from __future__ import annotations

import json

from typer.testing import CliRunner

from kevin.cli import app
from tests.conftest import REPO

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
