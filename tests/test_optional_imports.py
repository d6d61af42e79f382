"""The library imports without the orchestration packages: prefect, mlflow, dvc, great-expectations and ray
(prefect-ray) are imported only inside the functions that use them, so `import kevin.<anything>` works where they are not
installed (and stays fast where they are)."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

# Run in a fresh interpreter: this test process may have imported them already (the tracking/alerts tests).
PROBE = textwrap.dedent('''
    import importlib, pkgutil, sys

    BLOCKED = {"prefect", "mlflow", "dvc", "great_expectations", "ray", "prefect_ray"}

    class NotInstalled:
        """Makes the blocked packages look uninstalled to this interpreter."""
        def find_spec(self, name, path=None, target=None):
            if name.split(".")[0] in BLOCKED:
                raise ModuleNotFoundError(f"No module named {name!r}", name=name)
            return None

    sys.meta_path.insert(0, NotInstalled())
    try:
        import mlflow
        raise SystemExit("the blocker let mlflow through")
    except ModuleNotFoundError:
        pass

    import kevin
    names = sorted(m.name for m in pkgutil.walk_packages(kevin.__path__, "kevin."))
    for name in names:
        importlib.import_module(name)
    for required in ("kevin.monitor", "kevin.rollout", "kevin.training", "kevin.tracking", "kevin.alerts",
                     "kevin.evaluation.cluster"):
        assert required in names, required

    # The pure parts of tracking and alerts work too, and a disabled tracker never needs mlflow.
    from kevin.alerts import alert_event
    from kevin.monitor import Alert, Severity
    from kevin.tracking import StepSummary, Tracker, TrackingConfig, step_metrics
    metrics = step_metrics(StepSummary(step=0, statuses={"correct": 1, "incorrect": 3}))
    assert metrics["eval/status/correct"] == 0.25, metrics
    alert = Alert("junk_share", 0.5, 0.1, 1, Severity.CRITICAL, True, "step 1: junk")
    assert alert_event(alert, {}, run_id="r")["resource"]["kevin.alert.notify"] == "true"
    with Tracker(TrackingConfig(enabled=False)).start({"a": 1}) as tracker:
        tracker.log_step(StepSummary(step=0))
    # The cluster's planning needs no ray; a run that leaves the cluster off gets this machine's Evaluator.
    import tempfile
    from kevin.evaluation import EvalConfig
    from kevin.evaluation.cluster import batch_evaluator
    from kevin.evaluation.cluster_plan import ClusterConfig, NodeSlots, plan_workers
    assert len(plan_workers([NodeSlots("n", "10.0.0.1", 16, 2)], "cuda", ClusterConfig())) == 2
    local = batch_evaluator(EvalConfig(cache_dir=tempfile.mkdtemp()), ClusterConfig(enabled=False))
    assert type(local).__name__ == "Evaluator", type(local)

    leaked = sorted(m for m in sys.modules if m.split(".")[0] in BLOCKED)
    assert not leaked, leaked
    print(len(names), "modules")
''')


def test_every_kevin_module_imports_without_the_orchestration_packages():
    proc = subprocess.run([sys.executable, "-c", PROBE], cwd=REPO, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.strip().endswith("modules")
