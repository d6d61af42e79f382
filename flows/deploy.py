"""Deploy the training (and, when present, the evaluation) flow to a Prefect server: a process work pool, one
deployment per flow with a schedule and parameters, and the collapse automation (``kevin.alerts``).

    prefect server start                                    # terminal 1 (UI at http://127.0.0.1:4200)
    export PREFECT_API_URL=http://127.0.0.1:4200/api
    python -m flows.deploy --pool kevin --cron "0 3 * * *"   # terminal 2, project folder: registers them
    prefect worker start --pool kevin                       # terminal 3: runs what the server schedules
    prefect deployment run kevin-train/kevin-train          # or wait for the schedule

The flows run from this project folder (the deployments point at it, so a worker on this machine needs no copy
of the code) with the parameters given here: the training flow reads ``--params`` files in order, then
``--set`` overrides, and resumes its run (``resume``: a scheduled run continues the experiment it left). The
evaluation flow (``flows/evaluate.py``) is deployed with the same settings when the file defines one flow.
"""

from __future__ import annotations

import argparse
import importlib.util
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Sequence

PROJECT = Path(__file__).resolve().parents[1]

__all__ = ["DeploySpec", "deploy", "ensure_pool", "evaluation_entrypoint", "main", "specs"]


@dataclass
class DeploySpec:
    """One deployment: which flow (``entrypoint``, ``file.py:function`` under the project folder), its name, the
    parameters each run gets and its schedule."""

    entrypoint: str
    name: str
    parameters: dict[str, Any] = field(default_factory=dict)
    """The flow's parameters for every run of the deployment (a manual run may override them)."""
    cron: str = ""
    """A cron schedule ("": none; runs are then triggered by hand, an automation or the API)."""
    description: str = ""

    def __post_init__(self) -> None:
        if ":" not in self.entrypoint:
            raise ValueError(f"entrypoint must read path/to/file.py:flow_function, got {self.entrypoint!r}")
        if not self.name:
            raise ValueError("a deployment needs a name")


def evaluation_entrypoint(project: Path = PROJECT) -> str:
    """``flows/evaluate.py:<flow>`` when that file defines one Prefect flow, else "" (not deployed)."""
    path = project / "flows" / "evaluate.py"
    if not path.is_file():
        return ""
    from prefect import Flow

    spec = importlib.util.spec_from_file_location("kevin_deploy_evaluate", path)
    module = importlib.util.module_from_spec(spec)  # type: ignore[arg-type]
    spec.loader.exec_module(module)  # type: ignore[union-attr]
    names = [name for name, value in vars(module).items() if isinstance(value, Flow)]
    return f"flows/evaluate.py:{names[0]}" if len(names) == 1 else ""


def specs(params: Sequence[str], overrides: Sequence[str], project: Path, cron: str, eval_cron: str,
          with_evaluation: bool = True) -> list[DeploySpec]:
    """The deployments: training (resuming its experiment on every run) and evaluation (when there is one)."""
    out = [DeploySpec("flows/train.py:train", "kevin-train",
                      {"params": [str(p) for p in params], "overrides": list(overrides), "resume": True,
                       "project_dir": str(project)}, cron,
                      "Kevin's multi-turn RL training flow; each run resumes the experiment from its checkpoint.")]
    entry = evaluation_entrypoint(PROJECT) if with_evaluation else ""
    if entry:
        # The same settings as training; resume: a run killed mid-way continues (a newer checkpoint is refused by
        # the evaluation itself: trigger it with another evaluate.output_dir in `overrides`).
        out.append(DeploySpec(entry, "kevin-evaluate",
                              {"params": [str(p) for p in params], "overrides": list(overrides), "resume": True,
                               "project_dir": str(project)}, eval_cron,
                              "Kevin's evaluation flow: the newest checkpoint on the eval split."))
    return out


def ensure_pool(name: str) -> None:
    """Create the process work pool ``name`` unless the server has it."""
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.actions import WorkPoolCreate
    from prefect.exceptions import ObjectNotFound

    with get_client(sync_client=True) as client:
        try:
            client.read_work_pool(name)
        except ObjectNotFound:
            client.create_work_pool(WorkPoolCreate(name=name, type="process"))


def deploy(spec: DeploySpec, pool: str, source: Path = PROJECT) -> Any:
    """Register ``spec`` on the configured server (``PREFECT_API_URL``); returns the deployment id. The flow's code
    is read from ``source`` by the worker (a local folder: nothing is built or pushed)."""
    from prefect import flow

    loaded = flow.from_source(source=str(source), entrypoint=spec.entrypoint)
    return loaded.deploy(name=spec.name, work_pool_name=pool, parameters=spec.parameters, cron=spec.cron or None,
                         description=spec.description, build=False, push=False, print_next_steps=False)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--pool", default="kevin", help="the process work pool (created when missing)")
    parser.add_argument("--cron", default="0 3 * * *", help='training schedule (cron; "" for none)')
    parser.add_argument("--eval-cron", default="0 6 * * *", help='evaluation schedule (cron; "" for none)')
    parser.add_argument("--params", action="append", help="params files of the training runs (repeatable; default: "
                                                          "params.yaml then configs/cpu.yaml)")
    parser.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                        help="a setting of the training runs (repeatable)")
    parser.add_argument("--project", default=str(Path.cwd()), help="where runs write (outputs/, mlflow.db)")
    parser.add_argument("--no-evaluation", action="store_true", help="deploy the training flow only")
    args = parser.parse_args(argv)

    from kevin.alerts import ensure_collapse_automation, prefect_api_url
    from kevin.config import RunConfig

    if not prefect_api_url():
        parser.error("no Prefect server configured: start one (`prefect server start`) and set PREFECT_API_URL")
    project = Path(args.project).resolve()
    params = [str((project / p).resolve()) for p in (args.params or ["params.yaml", "configs/cpu.yaml"])]
    config = RunConfig.from_files(params, args.overrides)  # a bad setting fails here, not in the worker
    ensure_pool(args.pool)
    for spec in specs(params, args.overrides, project, args.cron, args.eval_cron, not args.no_evaluation):
        deployment_id = deploy(spec, args.pool)
        schedule = f"schedule {spec.cron!r}" if spec.cron else "no schedule"
        print(f"deployed {spec.name} ({spec.entrypoint}) to pool {args.pool!r}, {schedule}: {deployment_id}")
    automation = ensure_collapse_automation(config=config.alerts)
    print(f"collapse automation: {automation}" if automation else
          f"no collapse automation: set ${config.alerts.webhook_url_env} (the webhook URL) and deploy again")
    print(f"start a worker: prefect worker start --pool {args.pool}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
