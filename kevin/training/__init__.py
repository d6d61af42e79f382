"""GRPO training: the loss (``loss``), settings (``config``), the update and checkpoints (``trainer``), and
one pipeline step (``step``: rollout -> returns -> advantages -> update). Import the submodules directly;
this package imports nothing on its own."""
