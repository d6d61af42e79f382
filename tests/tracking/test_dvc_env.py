"""The DVC variables the tracker reads, checked against a real `dvc exp run --temp` (a queued/temporary
experiment runs in a copy of the repository; its tags and store must still be right)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]

PROBE = """
import json, os, sys
from pathlib import Path
from kevin.tracking import dvc_tags, store_folder
out = {"cwd": os.getcwd(), "tags": dvc_tags(os.environ), "store": str(store_folder(Path.cwd(), os.environ))}
Path(sys.argv[1]).write_text(json.dumps(out))
"""


def test_dvc_exp_run_gives_the_experiment_name_and_the_repository_root(tmp_path):
    repo, result = tmp_path / "repo", tmp_path / "result.json"
    repo.mkdir()
    env = {k: v for k, v in os.environ.items() if not k.startswith("DVC_")}
    env.update(PYTHONPATH=str(REPO), DVC_NO_ANALYTICS="1", GIT_AUTHOR_NAME="t", GIT_AUTHOR_EMAIL="t@example.com",
               GIT_COMMITTER_NAME="t", GIT_COMMITTER_EMAIL="t@example.com")

    def run(*cmd: str) -> str:
        proc = subprocess.run(cmd, cwd=repo, env=env, capture_output=True, text=True, timeout=300)
        assert proc.returncode == 0, f"{cmd}: {proc.stdout[-2000:]} {proc.stderr[-2000:]}"
        return proc.stdout.strip()

    run("git", "init", "-q")
    run(sys.executable, "-m", "dvc", "init", "-q")
    (repo / "probe.py").write_text(PROBE)
    (repo / "params.yaml").write_text("seed: 1\n")
    (repo / "dvc.yaml").write_text(
        f"stages:\n  probe:\n    cmd: {sys.executable} probe.py {result}\n    deps: [probe.py]\n    params: [seed]\n")
    run("git", "add", "-A")
    run("git", "commit", "-q", "-m", "probe stage")
    head = run("git", "rev-parse", "HEAD")

    run(sys.executable, "-m", "dvc", "exp", "run", "--temp", "-n", "gamma-0.8", "-S", "seed=2")
    seen = json.loads(result.read_text())
    assert seen["tags"] == {"dvc.exp_name": "gamma-0.8", "dvc.baseline_rev": head, "dvc.stage": "probe"}
    assert Path(seen["cwd"]).resolve() != repo.resolve()  # it ran in a temporary copy ...
    assert Path(seen["store"]).resolve() == repo.resolve()  # ... and the store is still the repository's
