"""The training run's collapse monitor across a resume: which tasks each draw solved (``forgotten_share``)."""

from __future__ import annotations

from kevin.config import RunConfig
from kevin.experiment.files import step_dir
from kevin.experiment.run import TrainingRun
from kevin.monitor import CollapseMonitor, MonitorConfig
from kevin.pipeline import KERNELS_FILE
from kevin.records.jsonl import write_jsonl


def test_a_checkpoint_without_the_solved_tasks_recalls_them_from_the_steps_kernels(tmp_path):
    run = TrainingRun(RunConfig.from_dict({"experiment": {"name": "recall"}}), project_dir=tmp_path, resume=True)
    # Steps 0 and 1 were checkpointed (the resume continues at 2); step 2's files are a redo's and not read.
    kernels = {0: [("a", False), ("a", True), ("b", False)], 1: [("b", True), ("c", False)], 2: [("a", False)]}
    for step, rows in kernels.items():
        step_dir(run.out_dir, step).mkdir(parents=True)
        write_jsonl(step_dir(run.out_dir, step) / KERNELS_FILE, [{"task_id": t, "correct": ok} for t, ok in rows])
    run.monitor, run.next_step = CollapseMonitor(MonitorConfig(expected_opening="Okay,")), 2
    run._recall_solved()
    assert run.monitor.solved == {"a": True, "b": True, "c": False}  # a at step 0; b's latest draw (step 1) solved it
    run.monitor.observe(2, ["Okay, a", "Okay, b"], solved={"a": False, "b": True})
    assert run.monitor.history[-1]["forgotten_share"] == 0.5
