"""Kevin: multi-turn RL for writing fast, correct GPU kernels, with an evaluator that cannot be gamed."""

__version__ = "0.1.0"
