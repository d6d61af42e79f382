"""The tags every run gets: where its code came from (git), what launched it (DVC, a Prefect deployment, a shell)
and the DVC experiment or Prefect flow run it belongs to, so a run in the UI can be traced back to its cause.

Read from the environment and the checkout only; prefect is imported only when a flow run can exist.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path


def git_commit(project_dir: str | Path) -> tuple[str, bool] | None:
    """(commit, dirty) of the git checkout holding ``project_dir``; None outside a repository or without git.
    dirty: tracked files differ from the commit (untracked files do not count)."""
    def git(*args: str) -> str:
        return subprocess.run(["git", "-C", str(project_dir), *args], capture_output=True, text=True,
                              timeout=30, check=True).stdout.strip()
    try:
        commit = git("rev-parse", "HEAD")
        dirty = bool(git("status", "--porcelain", "--untracked-files=no"))
    except (OSError, subprocess.SubprocessError):
        return None
    return commit, dirty


def dvc_tags(env: Mapping[str, str]) -> dict[str, str]:
    """Tags from the variables DVC sets for the command of a stage: ``DVC_EXP_NAME`` (the experiment's name,
    under ``dvc exp run`` only), ``DVC_EXP_BASELINE_REV`` (the commit it derives from) and ``DVC_STAGE``
    (the stage, also under ``dvc repro``)."""
    names = {"DVC_EXP_NAME": "dvc.exp_name", "DVC_EXP_BASELINE_REV": "dvc.baseline_rev", "DVC_STAGE": "dvc.stage"}
    return {tag: env[var] for var, tag in names.items() if env.get(var)}


def prefect_flow_run() -> dict[str, str]:
    """The Prefect flow run this process works for: {"id", "name", "deployment_id"} (name and deployment only
    inside the run's own context, where reading them costs no API call); {} outside a flow run or without
    Prefect. The id also comes from a task run's context or from ``PREFECT__FLOW_RUN_ID``, which a Prefect worker
    sets for the flow run's process."""
    # A flow run in this process has imported prefect; one in a parent process left its id in the environment.
    # Otherwise there is none, and importing prefect (seconds) is skipped.
    if "prefect" not in sys.modules and not os.environ.get("PREFECT__FLOW_RUN_ID"):
        return {}
    try:
        from prefect.context import FlowRunContext
        from prefect.runtime import flow_run
    except ImportError:
        return {}
    run_id = flow_run.id
    if not run_id:
        return {}
    found = {"id": str(run_id)}
    context = FlowRunContext.get()
    if context is not None and context.flow_run is not None and str(context.flow_run.id) == found["id"]:
        found["name"] = context.flow_run.name or ""
        found["deployment_id"] = str(context.flow_run.deployment_id or "")
    return {k: v for k, v in found.items() if v}


def launcher(env: Mapping[str, str], flow_run: Mapping[str, str]) -> str:
    """What started the run: "dvc" (``dvc repro`` / ``dvc exp run``, which set ``DVC_STAGE`` for a stage's
    command), "prefect" (a Prefect deployment's run: a schedule, an automation, ``prefect deployment run``), else
    "cli" (a command typed in a shell; ``kevin train`` runs its Prefect flow in-process, without a deployment)."""
    if env.get("DVC_STAGE"):
        return "dvc"
    if flow_run.get("deployment_id"):
        return "prefect"
    return "cli"


def launcher_tags(env: Mapping[str, str], flow_run: Mapping[str, str]) -> dict[str, str]:
    """``kevin.launcher`` and the Prefect flow run (``prefect.flow_run_id``, ``prefect.flow_run_name``,
    ``prefect.deployment_id``) when there is one, whoever launched it."""
    tags = {"kevin.launcher": launcher(env, flow_run)}
    names = {"id": "prefect.flow_run_id", "name": "prefect.flow_run_name", "deployment_id": "prefect.deployment_id"}
    tags.update({tag: flow_run[key] for key, tag in names.items() if flow_run.get(key)})
    return tags


def run_tags(project_dir: str | Path, env: Mapping[str, str], *, model: str = "", backend: str = "",
             flow_run: Mapping[str, str] | None = None) -> dict[str, str]:
    """The tags every run gets: git commit (also as MLflow's own source-commit tag, which the UI shows),
    whether the checkout was dirty, model, backend, the DVC experiment, and what launched the run
    (``launcher_tags`` of ``flow_run``, by default the Prefect flow run this process works for)."""
    tags: dict[str, str] = {}
    git = git_commit(project_dir)
    if git is not None:
        tags["git.commit"] = tags["mlflow.source.git.commit"] = git[0]
        tags["git.dirty"] = str(git[1]).lower()
    if model:
        tags["model"] = model
    if backend:
        tags["backend"] = backend
    tags.update(dvc_tags(env))
    tags.update(launcher_tags(env, prefect_flow_run() if flow_run is None else flow_run))
    return tags
