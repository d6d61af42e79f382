"""The process's random number generators: seeding them (the ENTRY POINT's job) and checkpointing them.

The trainer never seeds: a library object that reseeds the global RNG when it is built would reset whatever
the program drew before it (data shuffles, model initialisation) and make two trainers in one process
interfere. A training script calls ``seed_everything(config.seed)`` first, before it builds the model, so
every process of a launch draws the same initial weights (and LoRA factors); checkpoints save and restore
the generators' states so a resumed run continues the same streams.
"""

from __future__ import annotations

import random
from typing import Any

import torch

__all__ = ["rng_state", "seed_everything", "set_rng_state"]


def seed_everything(seed: int) -> None:
    """Seed python, numpy and torch (every CUDA device too) with ``seed``."""
    random.seed(seed)
    try:
        import numpy as np

        np.random.seed(seed)
    except ImportError:  # numpy is a dependency, but the trainer does not need it
        pass
    torch.manual_seed(seed)  # also seeds every CUDA device


def rng_state() -> dict[str, Any]:
    """Every generator's state (python, numpy, torch CPU and CUDA), for a checkpoint."""
    state: dict[str, Any] = {"python": random.getstate(), "torch": torch.get_rng_state()}
    try:
        import numpy as np

        state["numpy"] = np.random.get_state()
    except ImportError:
        pass
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict[str, Any]) -> None:
    """Restore what ``rng_state`` returned."""
    random.setstate(state["python"])
    torch.set_rng_state(state["torch"])
    if "numpy" in state:
        import numpy as np

        np.random.set_state(state["numpy"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])
