"""The ``experiment`` section of params.yaml: what a training run is called, where it writes, how long it runs,
how its tasks are drawn, and how the flow treats its steps (checkpoint cadence, retries, timeouts)."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kevin.settings import Settings, positive_int, seconds

_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*$")


@dataclass
class ExperimentConfig(Settings):
    """One training run: its name, output folder, length, task batches and step handling."""

    section = "experiment"

    name: str = "kevin"
    """Names the run everywhere: its output folder (``outputs/<name>``), its MLflow run and its Prefect flow run.
    Give each ablation its own name; letters, digits, '.', '_' and '-'."""

    output_dir: str = ""
    """Where the run writes its steps (rollouts, samples, verdicts), checkpoints and served weights; "" is
    ``outputs/<name>`` under the project folder."""

    steps: int = 40
    """Training steps (rollout batches) to run (the paper's final run: 40). Also the length of the learning-rate
    schedule (``train.total_steps`` is taken from here)."""

    tasks_per_batch: int = 8
    """Tasks per training step (the paper: 8), drawn from the train split balanced across levels, seeded, each task
    once per epoch."""

    tasks: list[str] = field(default_factory=list)
    """Train on these tasks of the split's train side only (ids such as ``level1/02_gelu``); []: every train task. For
    a short run that should practise what its warm start knows (the CPU main job). A task outside the train side is
    an error: no held-out task can slip into training."""

    rest_barren_epochs: int = 0
    """A task whose draw taught nothing (every sample's advantage 0, e.g. no sample ever correct) sits out this many
    epochs of the task sampler, then is drawn again; its place goes to tasks that still teach. 0: every task every
    epoch (the paper's sampler). It changes the task mix, so the per-step mean score is no longer comparable across
    steps: compare tasks with themselves (``kevin learning``) or evaluate checkpoints."""

    seed: int = 0
    """Seed of the task sampler (the model's and the sampler's generators are seeded by ``train.seed`` and
    ``sampling.seed``)."""

    split: str = ""
    """A split file written by ``kevin split``: the run trains on its train tasks. "" draws the split from the
    ``splits`` section."""

    checkpoint_every: int = 1
    """Save a checkpoint every this many steps (and at the last step, and when the run stops). A resume replays the
    steps after the newest checkpoint from their saved rollouts: nothing is generated or judged again, only
    their updates are recomputed."""

    torch_threads: int = 0
    """PyTorch's threads in the training process (generation and update); 0: PyTorch's default, one per core. On
    a CPU machine that other work shares, 1 is often much faster: a small model's generation is many small
    operations, and every one of them waits for the slowest thread."""

    update_threads: int = 0
    """PyTorch's threads during the update only; 0: as ``torch_threads``. The update is a few large matrix products
    with nothing else running (the step's kernels are judged by then), so it can use every core even where
    generation is faster on one."""

    rollout_waves: int = 1
    """Groups a step's trajectories are cut into so that their turns overlap: while one wave's kernels compile and
    run, the next wave generates (``kevin/rollout/waves.py``). Wave k holds the trajectories whose index is k modulo
    this number, so it must not exceed ``rollout.trajectories``. 1: generate the whole turn, then judge it. With the
    ``cpu`` backend, a wave's timed runs share the cores with the next wave's generation on a CPU policy: keep 1
    there unless the policy is served elsewhere."""

    generation_retries: int = 2
    """Retries of a turn's generation that failed in a way that passes (a generation server timing out or
    refusing connections); other errors fail the run at once."""

    retry_delay_s: float = 10.0
    """Wait before the first retry of a generation; doubled for each further retry."""

    generation_timeout_s: float = 0.0
    """Give up a turn's generation after this many seconds (then retried as above); 0: no limit."""

    update_timeout_s: float = 0.0
    """Fail the run when one update takes longer than this many seconds; 0: no limit."""

    time_limit_s: float = 0.0
    """Pause the run, checkpointed, before a step that would end more than this many seconds after the run began
    (judged by its slowest step so far, and never less than the median of the run's last 5 recorded steps);
    ``--resume`` continues it. For machines lent for a fixed time: a hard kill
    loses the step in flight's update, a pause loses nothing. 0: no limit."""

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not _NAME.match(self.name):
            raise ValueError(f"experiment.name must be letters, digits, '.', '_' or '-' (it names a folder, an MLflow "
                             f"run and a Prefect flow run), got {self.name!r}")
        if not isinstance(self.output_dir, str) or not isinstance(self.split, str):
            raise ValueError("experiment.output_dir and experiment.split must be paths (strings) or empty")
        for name in ("steps", "tasks_per_batch", "checkpoint_every", "rollout_waves"):
            if not positive_int(getattr(self, name)):
                raise ValueError(f"experiment.{name} must be a positive integer, got {getattr(self, name)!r}")
        if not isinstance(self.tasks, list) or not all(isinstance(t, str) and t for t in self.tasks):
            raise ValueError(f"experiment.tasks must be a list of task ids (e.g. [level1/02_gelu]), or [] for every "
                             f"train task, got {self.tasks!r}")
        if isinstance(self.seed, bool) or not isinstance(self.seed, int):
            raise ValueError(f"experiment.seed must be an integer, got {self.seed!r}")
        if isinstance(self.rest_barren_epochs, bool) or not isinstance(self.rest_barren_epochs, int) \
                or self.rest_barren_epochs < 0:
            raise ValueError(f"experiment.rest_barren_epochs must be an integer >= 0 (0: no task rests), "
                             f"got {self.rest_barren_epochs!r}")
        if isinstance(self.torch_threads, bool) or not isinstance(self.torch_threads, int) or self.torch_threads < 0:
            raise ValueError(f"experiment.torch_threads must be an integer >= 0 (0: one per core), got {self.torch_threads!r}")
        if isinstance(self.update_threads, bool) or not isinstance(self.update_threads, int) or self.update_threads < 0:
            raise ValueError(f"experiment.update_threads must be an integer >= 0 (0: torch_threads), "
                             f"got {self.update_threads!r}")
        if isinstance(self.generation_retries, bool) or not isinstance(self.generation_retries, int) \
                or self.generation_retries < 0:
            raise ValueError(f"experiment.generation_retries must be an integer >= 0, got {self.generation_retries!r}")
        for name in ("retry_delay_s", "generation_timeout_s", "update_timeout_s", "time_limit_s"):
            if not seconds(getattr(self, name)):
                raise ValueError(f"experiment.{name} must be a number of seconds >= 0, got {getattr(self, name)!r}")

    def resolved_output_dir(self, project_dir: str | Path) -> Path:
        """The run's output folder: ``output_dir`` (relative to the project folder), else ``outputs/<name>``."""
        path = Path(self.output_dir) if self.output_dir else Path("outputs") / self.name
        return path if path.is_absolute() else Path(project_dir) / path


NO_CHECKPOINT = ("", "none")


@dataclass
class EvaluateConfig(Settings):
    """One evaluation run (``kevin evaluate``): which model or checkpoint, on which tasks, written where. The budget
    splits and metrics come from the ``analysis`` section, beam-style selection from the ``beam`` section."""

    section = "evaluate"

    name: str = "evaluate"
    """Names the run in the tables, plots and comparison, and its MLflow run; letters, digits, '.', '_' and '-'."""

    output_dir: str = "outputs/evaluate"
    """Where the run writes its rollouts, metrics, curves, tables and plots (relative to the project folder)."""

    checkpoint: str = "outputs/train/checkpoints"
    """A training checkpoint to evaluate: a checkpoints folder (its newest ``step_N``) or one ``step_N`` folder.
    ``none`` (or "") evaluates the model of the ``policy`` section; so does a checkpoints folder that holds no
    checkpoint yet (said in the log and in the ``checkpoint`` tag)."""

    split: str = "data/splits/split.json"
    """The split file (``kevin split``) whose eval tasks are evaluated; when it does not exist, or is "", the
    ``splits`` section draws the split (the same seeded draw ``kevin split`` writes)."""

    max_tasks: int = 0
    """Evaluate only the first this many eval tasks (a quick look); 0: all of them."""

    tasks: str = "eval"
    """Which side of the split is evaluated: `eval` (the held-out tasks) or `train` (the tasks the policy trained
    on: did training improve what it practised, beside whether it generalises)."""

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not _NAME.match(self.name):
            raise ValueError(f"evaluate.name must be letters, digits, '.', '_' or '-' (it names the run in tables and "
                             f"MLflow), got {self.name!r}")
        for name in ("output_dir", "checkpoint", "split"):
            if not isinstance(getattr(self, name), str):
                raise ValueError(f"evaluate.{name} must be a path (a string), got {getattr(self, name)!r}")
        if not self.output_dir:
            raise ValueError("evaluate.output_dir must name a folder, e.g. outputs/evaluate")
        if self.tasks not in ("eval", "train"):
            raise ValueError(f"evaluate.tasks must be eval or train (the side of the split), got {self.tasks!r}")
        if isinstance(self.max_tasks, bool) or not isinstance(self.max_tasks, int) or self.max_tasks < 0:
            raise ValueError(f"evaluate.max_tasks must be an integer >= 0 (0: every eval task), got {self.max_tasks!r}")

    @property
    def uses_checkpoint(self) -> bool:
        return self.checkpoint.strip().lower() not in NO_CHECKPOINT

    def resolved_output_dir(self, project_dir: str | Path) -> Path:
        path = Path(self.output_dir)
        return path if path.is_absolute() else Path(project_dir) / path
