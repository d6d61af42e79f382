"""Data-parallel update on CPU: two gloo processes take exactly the optimiser step one process takes."""

from __future__ import annotations

import json
import os
import socket
from pathlib import Path

import pytest
import torch

from kevin.records.rollout import TrainingSample
from kevin.training.config import TrainConfig
from kevin.distributed import shard
from kevin.training.loss import LossConfig
from tests.tiny_lm import tiny_model, tiny_tokenizer

MAX_LEN = 12


def _samples() -> list[TrainingSample]:
    g = torch.Generator().manual_seed(7)
    out = []
    for i in range(7):  # odd: the two processes get 4 and 3 samples (one of them with zero advantage)
        prompt = torch.randint(5, 40, (int(torch.randint(3, 9, (1,), generator=g)),), generator=g).tolist()
        completion = torch.randint(5, 40, (int(torch.randint(2, MAX_LEN, (1,), generator=g)),), generator=g).tolist()
        adv = 0.0 if i == 3 else float(torch.randn(1, generator=g))
        out.append(TrainingSample(prompt, completion, None, reward=adv, advantage=adv, task_id=f"t{i % 2}", trajectory=i, turn=0))
    return out


def _train(out_file: str | None = None) -> dict:
    """One update from the same initial weights; the first step's summed gradient, the weights, the metrics."""
    from kevin.distributed import sum_gradients, world
    from kevin.training.trainer import GRPOTrainer

    tok = tiny_tokenizer()
    config = TrainConfig(lr=1e-2, device="cpu", temperature=1.0, micro_batch_size=2, grad_steps=2, warmup_ratio=0.0,
                         max_grad_norm=0.05, loss=LossConfig(max_completion_length=MAX_LEN))
    probe = GRPOTrainer(tiny_model(tok, seed=0), config)
    probe.accumulate_gradients(_samples())
    if world()[1] > 1:
        sum_gradients(probe.params)
    grads = {n: p.grad.detach().clone() for n, p in probe.model.named_parameters()}
    trainer = GRPOTrainer(tiny_model(tok, seed=0), config)
    metrics = trainer.update(_samples())
    result = {"grads": grads, "params": {n: p.detach().clone() for n, p in trainer.model.named_parameters()},
              "metrics": metrics}
    if out_file:
        torch.save(result, out_file)
    return result


def _worker(rank: int, size: int, port: int, out_dir: str) -> None:
    import torch.distributed as dist

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=size)
    torch.set_num_threads(1)
    try:
        _train(str(Path(out_dir) / f"rank{rank}.pt"))
    finally:
        dist.destroy_process_group()


def test_shard_is_strided_and_complete():
    assert shard(range(7), 0, 2) == [0, 2, 4, 6] and shard(range(7), 1, 2) == [1, 3, 5]
    assert shard([4, 9], 0, 1) == [4, 9]


def test_two_processes_take_the_single_process_step(tmp_path):
    import torch.multiprocessing as mp

    torch.set_num_threads(1)
    single = _train()
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    mp.spawn(_worker, args=(2, port, str(tmp_path)), nprocs=2, join=True)
    ranks = [torch.load(tmp_path / f"rank{r}.pt") for r in range(2)]
    for name, grad in single["grads"].items():
        assert grad.abs().sum() > 0, name
        for r in ranks:  # the sum of the two halves is the whole batch's gradient (up to float summation order)
            assert torch.allclose(r["grads"][name], grad, atol=1e-7, rtol=1e-4), name
    for name in single["params"]:  # the same summed gradient everywhere: the same weights, bit for bit
        assert torch.equal(ranks[0]["params"][name], ranks[1]["params"][name]), name
    for step_single, step_ranks in zip(single["metrics"], zip(*[r["metrics"] for r in ranks])):
        for m in step_ranks:  # every process reports the whole batch's figures
            for key in ("loss", "pg_loss", "grad_norm", "entropy", "clip_fraction", "trained_sequences", "sequences"):
                assert m[key] == pytest.approx(step_single[key], rel=1e-4, abs=1e-7), (key, json.dumps(m))
