"""The multi-process training step on CPU: two gloo processes each roll out half of every task's trajectories
(the real cpu evaluator judges replayed reference kernels, a tiny model samples the rest), gather the verdicts
per turn, update (replicated, or ZeRO-3 with generation in lockstep) and checkpoint; one process running the
same batch trains the same weights, and the checkpoint resumes in one process and in two."""

from __future__ import annotations

import faulthandler
import os
import socket
import time
import warnings
from pathlib import Path

import pytest
import torch

from kevin.training.checkpoint import load_safetensors_dir as _weights
from kevin.training.dp_step import phase_table

pytest.importorskip("transformers")

TASKS = ("level1/01_relu", "level1/03_sigmoid")
TRAJECTORIES, TURNS, NEW_TOKENS = 4, 2, 8
ALL_GATHERED_PER_USE = {"stage3_param_persistence_threshold": 0, "stage3_max_reuse_distance": 0,
                        "stage3_prefetch_bucket_size": 0}
"""Every ZeRO-3 parameter gathered for each use (as in a model too big to keep gathered): every forward pass of
the generation needs both processes."""


def _tasks():
    from kevin.tasks import bundled_tasks_dir, load_task_file

    return [load_task_file(bundled_tasks_dir() / f"{t}.py") for t in TASKS]


def _build_model(folder: Path) -> int:
    """The tiny preset with a tokenizer trained on the bundled suite, saved once: every process starts from it.
    Returns the longest replayed reference in tokens."""
    from kevin.policy.builders import build_model, build_tokenizer, model_config
    from kevin.rollout.replay import longest_response_tokens, reference_responses, tokenizer_corpus

    tok = build_tokenizer(tokenizer_corpus(_tasks(), "cpu"), vocab_size=2048)
    torch.manual_seed(0)
    model = build_model(model_config("tiny", len(tok), tok, layers=2))
    model.save_pretrained(folder)
    tok.save_pretrained(folder)
    from transformers import AutoTokenizer

    return longest_response_tokens(AutoTokenizer.from_pretrained(folder), reference_responses(_tasks(), "cpu"))


def _trainer(folder: Path, zero_stage: int, longest: int):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from kevin.training.config import TrainConfig
    from kevin.training.loss import LossConfig
    from kevin.training.trainer import GRPOTrainer

    config = TrainConfig(lr=1e-3, device="cpu", temperature=0.9, micro_batch_size=2, grad_steps=1, warmup_ratio=0.0,
                         max_grad_norm=1.0, zero_stage=zero_stage, max_response_tokens=longest,
                         zero_options=ALL_GATHERED_PER_USE if zero_stage else {},
                         loss=LossConfig(max_completion_length=NEW_TOKENS))
    tok = AutoTokenizer.from_pretrained(folder)
    return GRPOTrainer(AutoModelForCausalLM.from_pretrained(folder), config, tokenizer=tok)


def _worker(rank: int, size: int, port: int, out_dir: str, zero_stage: int, longest: int, cache: str) -> None:
    import torch.distributed as dist

    out = Path(out_dir)
    log = open(out / f"rank{rank}.log", "w")  # noqa: SIM115 - open until the process exits
    os.dup2(log.fileno(), 2)
    faulthandler.enable(log, all_threads=True)
    warnings.filterwarnings("ignore", category=FutureWarning)
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE=str(size),
                      LOCAL_RANK=str(rank), DS_ACCELERATOR="cpu")
    dist.init_process_group("gloo", rank=rank, world_size=size)
    torch.set_num_threads(1)
    began = time.monotonic()

    def phase(what: str) -> None:  # when a worker fails or hangs, the test shows how far each one got
        print(f"phase: {time.monotonic() - began:.1f}s {what}", file=log, flush=True)

    from kevin.evaluation import EvalConfig, Evaluator
    from kevin.policy.config import SamplingConfig
    from kevin.policy.hf import HFPolicy
    from kevin.rewards import RewardConfig
    from kevin.rollout.config import RolloutConfig
    from kevin.rollout.replay import ReferenceReplay
    from kevin.training.dp_step import DistributedStep

    evaluator = Evaluator(EvalConfig(backend="cpu", correctness_trials=1, warmup_trials=0, timing_trials=1,
                                     cache_dir=cache))
    try:
        trainer = _trainer(out / "model", zero_stage, longest)
        phase("trainer built")
        policy = HFPolicy(trainer.model, trainer.tokenizer, SamplingConfig(temperature=0.9, max_new_tokens=NEW_TOKENS,
                                                                           seed=rank))
        # Each process rolls out 2 of the 4 trajectories of each task (strided: 0 and 2 on rank 0, 1 and 3 on rank 1).
        # Trajectories 0 and 1 replay the reference, so each process replays its first and samples its second from
        # the model (both processes sample: the ZeRO-3 policy's passes need both).
        replay = ReferenceReplay(policy, _tasks(), trajectories=TRAJECTORIES, replayed=2, backend="cpu")
        step = DistributedStep(trainer, replay, evaluator.evaluate_many,
                               RolloutConfig(trajectories=TRAJECTORIES, turns=TURNS, backend="cpu"), RewardConfig())
        result = step.run(_tasks() if rank == 0 else None, checkpoint_dir=out / "ckpt", step=0)
        phase(f"step done: {result.seconds}")
        again = result.samples  # step 1 trains the same samples: resumed or not, the same update must follow
        trainer.update(again)
        trainer.save_checkpoint(out / "straight", 1)
        phase("step 1 done")
        fresh = _trainer(out / "model", zero_stage, longest)
        next_step = fresh.resume(out / "ckpt")
        phase("resumed")
        fresh.update(again)
        fresh.save_checkpoint(out / "resumed2", 1)
        phase("resumed step 1 done")
        torch.save({"samples": [s.to_dict() for s in result.samples], "tasks": result.tasks,
                    "trajectories": [t.to_dict() for t in result.trajectories], "local": result.local,
                    "seconds": result.seconds, "metrics": result.update_metrics, "next_step": next_step,
                    "lockstep": policy._lockstep()}, out / f"rank{rank}.pt")
    finally:
        evaluator.close()
        dist.destroy_process_group()


def _resume_alone(rank: int, port: int, out_dir: str, longest: int) -> None:
    """One ZeRO-3 process resumes the two processes' checkpoint (through DeepSpeed's universal checkpoint) and
    takes the same second update."""
    import torch.distributed as dist

    out = Path(out_dir)
    log = open(out / "rank0_alone.log", "w")  # noqa: SIM115 - open until the process exits
    os.dup2(log.fileno(), 2)
    warnings.filterwarnings("ignore", category=FutureWarning)
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK="0", WORLD_SIZE="1", LOCAL_RANK="0",
                      DS_ACCELERATOR="cpu")
    dist.init_process_group("gloo", rank=0, world_size=1)
    torch.set_num_threads(1)
    from kevin.records.rollout import TrainingSample

    try:
        alone = _trainer(out / "model", 3, longest)
        next_step = alone.resume(out / "ckpt")
        samples = [TrainingSample.from_dict(s) for s in torch.load(out / "rank0.pt", weights_only=False)["samples"]]
        alone.update(samples)
        alone.save_checkpoint(out / "resumed1", 1)
        torch.save({"next_step": next_step}, out / "alone.pt")
    finally:
        dist.destroy_process_group()


def _spawn(out: Path, zero_stage: int, longest: int, cache: str, *, alone: bool = False) -> None:
    import torch.multiprocessing as mp

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    if alone:
        ctx = mp.spawn(_resume_alone, args=(port, str(out), longest), nprocs=1, join=False)
    else:
        ctx = mp.spawn(_worker, args=(2, port, str(out), zero_stage, longest, cache), nprocs=2, join=False)
    deadline = time.monotonic() + 400
    try:
        while not ctx.join(timeout=5):
            if time.monotonic() > deadline:
                for proc in ctx.processes:
                    proc.kill()
                pytest.fail(f"the two processes did not finish in 400 s{_logs(out)}")
    except (mp.ProcessRaisedException, mp.ProcessExitedException) as exc:  # a worker's error or crash: show its log
        for proc in ctx.processes:
            proc.kill()
        pytest.fail(f"{exc}{_logs(out)}")


def _logs(out: Path) -> str:
    return " || ".join(f"{p.stem}: " + " | ".join(p.read_text(errors="replace").splitlines()[-15:])
                       for p in sorted(out.glob("rank*.log")))


@pytest.fixture(scope="module", params=[0, 3], ids=["replicated", "zero3"])
def two_process_step(request, tmp_path_factory, cache_dir):
    if request.param == 3:
        pytest.importorskip("deepspeed", reason="DeepSpeed is the optional extra kevin[deepspeed]")
    out = tmp_path_factory.mktemp(f"multiprocess_stage{request.param}")
    longest = _build_model(out / "model")
    _spawn(out, request.param, longest, str(cache_dir))
    if request.param == 3:
        _spawn(out, 3, longest, str(cache_dir), alone=True)
    return request.param, out, longest


def _samples(saved):
    from kevin.records.rollout import TrainingSample

    return [TrainingSample.from_dict(s) for s in saved["samples"]]


def test_each_process_rolls_out_its_share_and_every_process_gets_the_whole_batch(two_process_step):
    stage, out, _ = two_process_step
    ranks = [torch.load(out / f"rank{r}.pt", weights_only=False) for r in range(2)]
    assert ranks[0]["tasks"] == ranks[1]["tasks"] == list(TASKS)
    assert ranks[0]["trajectories"] == ranks[1]["trajectories"]  # every turn of every trajectory, on both
    assert ranks[0]["samples"] == ranks[1]["samples"]
    assert ranks[0]["lockstep"] is (stage == 3)  # ZeRO-3: the policy generated from partitioned weights
    trajectories = ranks[0]["trajectories"]
    assert [(t["task_id"], t["index"]) for t in trajectories] == [(k, j) for k in TASKS for j in range(TRAJECTORIES)]
    for saved in ranks:
        # 2 tasks x 2 own trajectories x 2 turns; the replayed references (one per task and turn) were judged here.
        assert saved["local"]["prompts"] == 8 and saved["local"]["judged"] == 4
        assert saved["local"]["generated_tokens"] > 0
        assert {k.split("/")[0] for k in saved["seconds"]} >= {"generate", "evaluate", "gather", "update",
                                                              "checkpoint", "step"}
    for traj in trajectories:
        turns = traj["turns"]
        assert [t["turn"] for t in turns] == [0, 1]
        replayed = traj["index"] in (0, 1)  # each process's first trajectory: 0 on rank 0, 1 on rank 1
        assert all((t["result"]["status"] == "correct") is replayed for t in turns), traj["task_id"]
        # turn 1's prompt carries turn 0's verdict, gathered before turn 1 was built
        assert turns[0]["result"]["feedback"] and turns[0]["result"]["feedback"] in turns[1]["prompt"]
    samples = _samples(ranks[0])
    assert len(samples) == len(TASKS) * TRAJECTORIES * TURNS
    for task in TASKS:  # per-task advantages over the whole batch: they sum to 0 over each task's 8 samples
        group = [s.advantage for s in samples if s.task_id == task]
        assert len(group) == 8 and abs(sum(group)) < 1e-6 and max(group) > 0 > min(group)
    assert all(m["trained_sequences"] == 16 for m in ranks[0]["metrics"])


def test_one_process_on_the_same_batch_trains_the_same_weights(two_process_step):
    _, out, longest = two_process_step
    torch.set_num_threads(1)
    single = _trainer(out / "model", 0, longest)
    samples = _samples(torch.load(out / "rank0.pt", weights_only=False))
    single.update(samples)
    got = _weights(out / "ckpt" / "step_000000" / "model")
    initial = _weights(out / "model")
    moved = 0
    for name, value in single.model.named_parameters():
        if name not in got:  # a tied head is saved once
            continue
        # ZeRO-3 reduces the gradient shards in another order than one process sums them, and AdamW's first step
        # (m / sqrt(v): lr times the gradient's sign) turns that float32 noise into up to 2 lr where a gradient is
        # within rounding of zero (seen: 2.4e-6, and 1.3e-5 in one element of a 2-core CI run). So nearly every
        # element must agree to 1e-5 and none may differ by more than that worst case. An update moves the weights
        # by ~lr = 1e-3, a hundred times the tolerance, so a missed or wrong update still fails the first test.
        diff = (got[name] - value.detach()).abs()
        close = torch.isclose(got[name], value.detach(), atol=1e-5, rtol=1e-5).float().mean().item()
        assert close >= 0.99 and diff.max().item() <= 2.5e-3, (name, close, diff.max().item())
        moved += int((got[name] - initial[name]).abs().max() > 1e-4)
    assert moved > len(got) // 2


def test_the_checkpoint_resumes_in_two_processes_and_in_one(two_process_step):
    stage, out, longest = two_process_step
    ranks = [torch.load(out / f"rank{r}.pt", weights_only=False) for r in range(2)]
    assert ranks[0]["next_step"] == ranks[1]["next_step"] == 1
    straight = _weights(out / "straight" / "step_000001" / "model")
    resumed = _weights(out / "resumed2" / "step_000001" / "model")
    for name, value in straight.items():  # resumed in 2 processes: the very same second update
        assert torch.equal(resumed[name], value), name
    if stage == 3:
        # One ZeRO-3 process resumed the partitions of two (DeepSpeed's universal checkpoint, converted once).
        assert torch.load(out / "alone.pt")["next_step"] == 1
        assert (out / "ckpt" / "step_000000" / "deepspeed_universal").is_dir()
        got = _weights(out / "resumed1" / "step_000001" / "model")
    else:  # a replicated checkpoint is the same for any process count
        torch.set_num_threads(1)
        single = _trainer(out / "model", 0, longest)
        assert single.resume(out / "ckpt") == 1
        single.update(_samples(ranks[0]))
        got = {n: p.detach() for n, p in single.model.named_parameters()}
    for name, value in straight.items():  # one process continues the two processes' run: optimiser state included
        assert torch.allclose(got[name], value, atol=2e-6, rtol=1e-5), (name, (got[name] - value).abs().max())
    first = _weights(out / "ckpt" / "step_000000" / "model")
    assert sum(not torch.equal(first[n], straight[n]) for n in straight) > len(straight) // 2  # step 1 trained


def test_phase_table_sums_turns_and_keeps_the_step_order():
    rows = phase_table([{"generate/0": 1.0, "generate/1": 2.0, "update": 4.0, "step": 9.0},
                        {"generate/0": 0.5, "update": 4.5, "step": 9.5}])
    assert rows == [("generate", [3.0, 0.5]), ("update", [4.0, 4.5]), ("step", [9.0, 9.5])]
