"""Training runs: the ``experiment`` settings, the live objects of one run and one method per step of the
recipe (``run.TrainingRun``), the per-step report and progress display. ``flows/train.py`` wires the steps as
Prefect tasks. Import the submodules directly; this package imports nothing on its own (its config module is
read by ``kevin.config`` without loading the trainer)."""
