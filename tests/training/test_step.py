"""train_step and build_samples: returns per trajectory, advantages per task over m x n, persistence."""

from __future__ import annotations

import pytest
import torch

from kevin.records.evaluation import EvalResult, Status
from kevin.rewards import RewardConfig
from kevin.rollout.config import RolloutConfig
from kevin.records.generation import GenerationOut
from kevin.rollout.loop import load_rollout
from kevin.records.rollout import TrainingSample, Trajectory, Turn, load_records
from kevin.tasks import make_task
from kevin.training.config import TrainConfig
from kevin.training.loss import LossConfig
from kevin.training.step import build_samples, taught_tasks, train_step
from kevin.training.trainer import GRPOTrainer
from tests.conftest import identity_task_source
from tests.tiny_lm import tiny_model, tiny_tokenizer


def verdict(score: float) -> EvalResult:
    status = Status.CORRECT if score > 0 else Status.INCORRECT
    return EvalResult(task_id="t", candidate_id="c", status=status, correct=score > 0, score=score)


def turn(task, traj, t, score, **kw):
    return Turn(task_id=task, trajectory=traj, turn=t, result=verdict(score),
                prompt_token_ids=[5, 6], response_token_ids=[7, 8, 1], logprobs=[-1.0, -1.0, -0.5], **kw)


def test_build_samples_discounted_returns_and_task_groups():
    g = 0.4
    scores = {("a", 0): [0.0, 1.3, 0.0], ("a", 1): [0.3, 0.0, 2.3], ("b", 0): [0.0, 0.0, 0.0], ("b", 1): [0.0, 0.5, 0.0]}
    trajs = [Trajectory(task_id=k[0], index=k[1], turns=[turn(k[0], k[1], t, s) for t, s in enumerate(v)])
             for k, v in scores.items()]
    trajs[0].turns.reverse()  # turn order in the record must not matter
    samples = build_samples(trajs, RewardConfig(gamma=g))
    assert len(samples) == 12 and [s.turn for s in samples[:3]] == [0, 1, 2]
    expected = {
        ("a", 0): [0 + g * 1.3 + g * g * 0, 1.3 + g * 0, 0.0],
        ("a", 1): [0.3 + g * 0 + g * g * 2.3, 0 + g * 2.3, 2.3],  # a later turn's return: S_1 + gamma S_2
        ("b", 0): [0.0, 0.0, 0.0],
        ("b", 1): [g * 0.5, 0.5, 0.0],
    }
    for s in samples:
        assert s.reward == pytest.approx(expected[(s.task_id, s.trajectory)][s.turn])
    for task in "ab":  # advantages: (R - mean) / (std + eps) over the task's m x n = 6 samples
        r = torch.tensor([x for (t, _), v in expected.items() if t == task for x in v], dtype=torch.float64)
        adv = (r - r.mean()) / (r.std() + 1e-4)
        got = [s.advantage for s in samples if s.task_id == task]
        assert got == pytest.approx(adv.tolist(), abs=1e-9)
    assert samples[0].prompt_token_ids == [5, 6] and samples[0].old_logprobs == [-1.0, -1.0, -0.5]


def test_a_task_teaches_when_some_return_differs_from_the_others():
    # a: one correct kernel among wrong ones; b: every kernel wrong; c: every kernel correct at the same score
    # (equal returns: advantage 0 everywhere); d: in the batch but no sample came back.
    scores = {"a": [[0.0, 1.2], [0.0, 0.0]], "b": [[0.0, 0.0], [0.0, 0.0]], "c": [[1.0, 0.0], [1.0, 0.0]]}
    trajs = [Trajectory(task_id=task, index=i, turns=[turn(task, i, t, s) for t, s in enumerate(row)])
             for task, rows in scores.items() for i, row in enumerate(rows)]
    samples = build_samples(trajs, RewardConfig(gamma=0.4))
    assert {s.task_id for s in samples if s.advantage != 0.0} == {"a", "c"}  # c: turn 0 returns 1.0, turn 1 0.0
    assert taught_tasks(["a", "b", "c", "d"], samples) == {"a": True, "b": False, "c": True, "d": False}
    same = [Trajectory(task_id="e", index=i, turns=[turn("e", i, 0, 0.7)]) for i in range(3)]
    assert taught_tasks(["e"], build_samples(same, RewardConfig(gamma=0.4))) == {"e": False}


def test_turn_groups_compare_a_turn_with_the_same_turn_only():
    # Two trajectories of one task, both correct at 1.0 in both turns (the second turn repeats the first), gamma 0.4:
    # returns turn 0: 1.0 + 0.4 * 1.0 = 1.4, turn 1: 1.0.
    copies = [Trajectory(task_id="a", index=i, turns=[turn("a", i, 0, 1.0), turn("a", i, 1, 1.0)]) for i in range(2)]
    # Task groups (the paper): returns [1.4, 1.0, 1.4, 1.0], mean 1.2, sample std sqrt(4 * 0.04 / 3) = 0.23094, so
    # turn 0 gets +0.2 / (0.23094 + 1e-4) = +0.86565 and the repeated turn 1 -0.86565: told to change a correct kernel.
    by_task = build_samples(copies, RewardConfig(gamma=0.4))
    assert [s.advantage for s in by_task] == pytest.approx([0.86565, -0.86565, 0.86565, -0.86565], abs=1e-5)
    # Turn groups: each turn's two returns are equal, nothing to learn.
    assert [s.advantage for s in build_samples(copies, RewardConfig(gamma=0.4, group="turn"))] == [0.0] * 4
    # Where a turn's trajectories differ, turn groups compare them: trajectory 0 scores [0, 1.2], trajectory 1
    # [0.3, 0.3]; returns turn 0: 0.48 and 0.42 (mean 0.45, sample std 0.042426: advantages +-0.03 / (0.042426 +
    # 1e-4) = +-0.70544), turn 1: 1.2 and 0.3 (+-0.45 / (0.636396 + 1e-4) = +-0.70700). Under task groups the same
    # four returns would rank 1.2 first and 0.3 last whatever the turn.
    mixed = [Trajectory(task_id="a", index=0, turns=[turn("a", 0, 0, 0.0), turn("a", 0, 1, 1.2)]),
             Trajectory(task_id="a", index=1, turns=[turn("a", 1, 0, 0.3), turn("a", 1, 1, 0.3)])]
    samples = build_samples(mixed, RewardConfig(gamma=0.4, group="turn"))
    assert [s.reward for s in samples] == pytest.approx([0.48, 1.2, 0.42, 0.3])
    assert [s.advantage for s in samples] == pytest.approx([0.70544, 0.70700, -0.70544, -0.70700], abs=1e-5)
    assert RewardConfig(group="turn").group_key("a", 1) != RewardConfig(group="turn").group_key("a", 0)
    assert RewardConfig().group_key("a", 1) == RewardConfig().group_key("a", 0)


def test_a_cut_off_answer_scores_as_the_truncation_rule_says():
    # Trajectory: turn 0 correct at 1.0 but cut off at the limit, turn 1 at 0.5 ended by choice; gamma 0.4.
    traj = Trajectory(task_id="a", index=0, turns=[turn("a", 0, 0, 1.0, truncated=True), turn("a", 0, 1, 0.5)])
    other = Trajectory(task_id="a", index=1, turns=[turn("a", 1, 0, 0.0), turn("a", 1, 1, 0.0)])
    kept = build_samples([traj, other], RewardConfig(gamma=0.4))
    assert [s.reward for s in kept[:2]] == [pytest.approx(1.0 + 0.4 * 0.5), 0.5]  # the paper: scored as judged
    zero = build_samples([traj, other], RewardConfig(gamma=0.4, truncation="zero"))
    assert [s.reward for s in zero[:2]] == [pytest.approx(0.0 + 0.4 * 0.5), 0.5]  # its own score 0, the next kept
    # Advantages over the task's 4 samples, returns [0.2, 0.5, 0, 0]: mean 0.175, std (n-1) 0.2363...
    r = torch.tensor([0.2, 0.5, 0.0, 0.0], dtype=torch.float64)
    assert [s.advantage for s in zero] == pytest.approx(((r - r.mean()) / (r.std() + 1e-4)).tolist(), abs=1e-9)
    assert RewardConfig(truncation="zero").turn_score(0.7, False) == 0.7
    with pytest.raises(ValueError, match="rewards.truncation must be one of"):
        RewardConfig(truncation="drop")


def test_build_samples_tokenizes_text_when_the_backend_gave_no_ids():
    tok = tiny_tokenizer()
    t0 = Turn(task_id="a", trajectory=0, turn=0, prompt="<u>hi<a>", response="ab", result=verdict(1.0),
              logprobs=[-0.1])
    t1 = Turn(task_id="a", trajectory=1, turn=0, prompt="<u>hi<a>", response="abc", truncated=True,
              result=verdict(0.0))
    s0, s1 = build_samples([Trajectory("a", 0, [t0]), Trajectory("a", 1, [t1])], RewardConfig(), tok)
    assert s0.prompt_token_ids == tok.encode("<u>hi<a>", add_special_tokens=False)
    assert s0.completion_token_ids == tok.encode("ab", add_special_tokens=False) + [tok.eos_token_id]
    assert s1.completion_token_ids == tok.encode("abc", add_special_tokens=False)  # cut off: no EOS to learn
    assert s0.old_logprobs is None  # server log-probs would not line up with our tokens
    with pytest.raises(ValueError, match="tokenizer"):
        build_samples([Trajectory("a", 0, [t0])], RewardConfig())


def test_text_tokenized_past_what_the_update_accepts_is_cut_to_it(caplog):
    # A server's tokens decoded and encoded again need not round-trip: a turn at the server's limit can come back
    # longer, and the update would refuse the step (a served run stopped so: 29 tokens against 16).
    tok = tiny_tokenizer()
    turn = Turn(task_id="a", trajectory=0, turn=0, prompt="<u>hi<a>", response="abcab", result=verdict(1.0))
    full = tok.encode("abcab", add_special_tokens=False) + [tok.eos_token_id]
    assert len(full) == 6
    (kept,) = build_samples([Trajectory("a", 0, [turn])], RewardConfig(), tok, max_tokens=4)
    assert kept.completion_token_ids == full[:4]
    assert "tokenizes to 6 tokens, more than the 4 the update accepts" in caplog.text
    (whole,) = build_samples([Trajectory("a", 0, [turn])], RewardConfig(), tok, max_tokens=6)
    assert whole.completion_token_ids == full
    # Token ids the server returned are the sample itself: never cut here (the update refuses them if too long).
    served = Turn(task_id="a", trajectory=0, turn=0, prompt="p", response="abcab", result=verdict(1.0),
                  prompt_token_ids=[5], response_token_ids=[7, 8, 9, 10, 11, 12])
    (kept,) = build_samples([Trajectory("a", 0, [served])], RewardConfig(), tok, max_tokens=4)
    assert kept.completion_token_ids == [7, 8, 9, 10, 11, 12]




class Generator:
    """Parseable responses with small token ids; the kernel text says which variant it is."""

    def __init__(self):
        self.calls = 0
        self.config = type("C", (), {"temperature": 1.0})()

    def __call__(self, prompts):
        self.calls += 1
        outs = []
        for i, _ in enumerate(prompts):
            fast = (i + self.calls) % 3 == 0
            text = f"```python\nclass ModelNew(nn.Module):  # {'fast' if fast else 'slow'}\n    x = 1\n```\nsummary"
            outs.append(GenerationOut(text=text, token_ids=[10 + i % 5, 11, 1], logprobs=None,
                                      prompt_token_ids=[2, 5, 6, 3]))
        return outs


def evaluate(items):
    out = []
    for task, cand in items:
        fast = "fast" in cand.source
        out.append(EvalResult(task_id=task.task_id, candidate_id=cand.key,
                              status=Status.CORRECT if fast else Status.INCORRECT, correct=fast, compiled=True,
                              speedup=1.5 if fast else 0.0, score=1.8 if fast else 0.0))
    return out


def test_train_step_end_to_end_with_run_rollouts(tmp_path):
    tok = tiny_tokenizer()
    tasks = [make_task(f"toy/{n}", 1, n, identity_task_source()) for n in "ab"]
    trainer = GRPOTrainer(tiny_model(tok), TrainConfig(lr=1e-3, temperature=1.0, device="cpu",
                                                       loss=LossConfig(max_completion_length=8)), tokenizer=tok)
    before = {k: v.detach().clone() for k, v in trainer.model.named_parameters()}
    gen = Generator()
    result = train_step(tasks, gen, evaluate, RewardConfig(gamma=0.4), RolloutConfig(trajectories=3, turns=2),
                        trainer, out_dir=tmp_path / "step_0", tokenizer=tok)
    assert gen.calls == 2 and len(result.samples) == 2 * 3 * 2 and len(result.update_metrics) == 2
    assert 0 < result.rollout_metrics["correct_share"] < 1
    # Persisted before the update: the rollout turn by turn, and the samples.
    assert load_records(tmp_path / "step_0" / "samples.jsonl", TrainingSample) == result.samples
    assert len(load_rollout(tmp_path / "step_0" / "rollout")) == 6
    for traj in result.trajectories:  # turn 0's return includes gamma x turn 1's score
        r0, r1 = [s.reward for s in result.samples if (s.task_id, s.trajectory) == (traj.task_id, traj.index)]
        assert r1 == pytest.approx(traj.turns[1].score) and r0 == pytest.approx(traj.turns[0].score + 0.4 * r1)
    assert any(not torch.equal(v, before[k]) for k, v in trainer.model.named_parameters())
    # Re-running the same step directory replays the finished rollout instead of generating again.
    again = train_step(tasks, gen, evaluate, RewardConfig(gamma=0.4), RolloutConfig(trajectories=3, turns=2),
                       trainer, out_dir=tmp_path / "step_0", tokenizer=tok)
    assert gen.calls == 2 and [s.reward for s in again.samples] == [s.reward for s in result.samples]


def test_train_step_refuses_mismatched_temperatures():
    tok = tiny_tokenizer()
    trainer = GRPOTrainer(tiny_model(tok), TrainConfig(temperature=0.9, device="cpu"))
    with pytest.raises(ValueError, match="temperature"):
        train_step([], Generator(), evaluate, RewardConfig(), RolloutConfig(), trainer)


# ------------------------------------------------------------------------------ response length


def test_train_step_refuses_a_dr_grpo_constant_that_is_not_the_response_limit():
    """The loss divided by 16384 while generation stopped at 1024 tokens: 16x too small a loss."""
    from kevin.policy.hf import HFPolicy, SamplingConfig

    tok = tiny_tokenizer()
    trainer = GRPOTrainer(tiny_model(tok), TrainConfig(temperature=0.9, device="cpu"))  # constant 16384
    policy = HFPolicy(trainer.model, tok, SamplingConfig(temperature=0.9, max_new_tokens=1024))
    with pytest.raises(ValueError, match=r"divides by loss.max_completion_length = 16384 .* 16x too small"):
        train_step([], policy, evaluate, RewardConfig(), RolloutConfig(), trainer)


def test_length_schedule_raises_the_policy_limit_within_what_the_trainer_accepts(tmp_path):
    """A schedule 8 -> 12 tokens: the step's limit is set on the policy; the loss keeps dividing by 8."""
    from kevin.policy.hf import HFPolicy, SamplingConfig

    tok = tiny_tokenizer()
    tasks = [make_task("toy/a", 1, "a", identity_task_source())]
    trainer = GRPOTrainer(tiny_model(tok), TrainConfig(temperature=1.0, device="cpu", max_response_tokens=12,
                                                       loss=LossConfig(max_completion_length=8)), tokenizer=tok)
    policy = HFPolicy(trainer.model, tok, SamplingConfig(temperature=1.0, max_new_tokens=8, seed=0, stop_token_ids=[]))
    cfg = RolloutConfig(trajectories=2, turns=1, max_prompt_tokens=10**5)
    before = train_step(tasks, policy, evaluate, RewardConfig(), cfg, trainer, max_response_tokens=8)
    after = train_step(tasks, policy, evaluate, RewardConfig(), cfg, trainer, max_response_tokens=12)
    assert policy.max_response_tokens == 12
    assert max(len(s.completion_token_ids) for s in before.samples) <= 8
    assert max(len(s.completion_token_ids) for s in after.samples) <= 12
    with pytest.raises(ValueError, match="accepts at most 12"):
        train_step(tasks, policy, evaluate, RewardConfig(), cfg, trainer, max_response_tokens=16)


def test_the_loss_scale_does_not_change_when_the_limit_is_raised():
    """Documented choice (docs/rl_core.md): the Dr-GRPO constant stays at the first limit, so every token weighs
    1 / (B x 8) before and after a raise to 12. On-policy, a token's loss is -A: for advantages (1, -0.5) over
    completions of 10 and 4 tokens the loss is -(1 x 10 - 0.5 x 4) / (2 x 8) = -0.5."""
    tok = tiny_tokenizer()
    trainer = GRPOTrainer(tiny_model(tok), TrainConfig(temperature=1.0, device="cpu", max_response_tokens=12,
                                                       loss=LossConfig(max_completion_length=8)))
    samples = [TrainingSample([5, 6, 7], [8] * 10, None, 0.0, 1.0, "t", 0, 0),
               TrainingSample([5, 6], [9] * 4, None, 0.0, -0.5, "t", 1, 0)]
    metrics = trainer.accumulate_gradients(samples)
    assert metrics["loss"] == pytest.approx(-0.5, abs=1e-6) and metrics["tokens"] == 14
    too_long = [TrainingSample([5], [8] * 13, None, 0.0, 1.0, "t", 0, 0)]
    with pytest.raises(ValueError, match="more than the 12 this trainer accepts"):
        trainer.update(too_long)
