"""GRPO training: the loss (``kevin.training.loss``), the update step, checkpoints."""
