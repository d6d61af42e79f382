"""Run by test_zero3_cpu under `accelerate launch --config_file configs/accelerate_zero3.yaml`: one update
with train.zero_stage left to the launcher; rank 0 writes what it saw to the JSON file argv[1]."""

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repo root: `kevin` and `tests`


def main() -> None:
    from kevin.distributed import init_from_env
    from kevin.training.trainer import GRPOTrainer
    from tests.tiny_lm import tiny_model, tiny_tokenizer
    from tests.training.test_zero3_cpu import _batch, _config

    rank, size = init_from_env()
    config = _config(0)
    config.zero_stage = None  # what the launcher says
    tok = tiny_tokenizer()
    trainer = GRPOTrainer(tiny_model(tok, seed=0), config, tokenizer=tok)
    metrics = trainer.update(_batch(1))
    if rank == 0:
        Path(sys.argv[1]).write_text(json.dumps({"world_size": size, "zero_stage": trainer.zero_stage,
                                                 "engine": trainer.engine is not None, "metrics": metrics}))


if __name__ == "__main__":
    main()
