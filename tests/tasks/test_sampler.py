"""The task sampler: balanced across levels, seeded, each task once per epoch, resumable from its state."""

from __future__ import annotations

import pytest

from kevin.tasks.sampler import TaskSampler, epoch_order, interleave_levels

LEVELS = {1: [f"l1/{i:02d}" for i in range(10)], 2: [f"l2/{i:02d}" for i in range(10)]}


def test_interleave_spreads_each_level_by_its_size():
    assert interleave_levels({1: ["a", "b"], 2: ["x", "y"]}) == ["a", "x", "b", "y"]
    # 4 and 2 tasks: the level-2 tasks sit at 1/4 and 3/4 of the list (keys 0.25, 0.75).
    assert interleave_levels({1: ["a", "b", "c", "d"], 2: ["x", "y"]}) == ["a", "x", "b", "c", "y", "d"]


def test_an_epoch_holds_every_task_once_and_depends_only_on_the_ids_seed_and_epoch():
    order = epoch_order(LEVELS, seed=3, epoch=0)
    assert sorted(order) == sorted(LEVELS[1] + LEVELS[2])
    assert [t[:2] for t in order] == ["l1", "l2"] * 10  # equal sizes alternate
    shuffled_input = {2: list(reversed(LEVELS[2])), 1: list(reversed(LEVELS[1]))}
    assert epoch_order(shuffled_input, seed=3, epoch=0) == order
    assert epoch_order(LEVELS, seed=3, epoch=1) != order and epoch_order(LEVELS, seed=4, epoch=0) != order


def test_batches_are_balanced_and_never_repeat_a_task_within_an_epoch():
    sampler = TaskSampler(LEVELS, batch_size=4, seed=0)
    first_epoch = [sampler.next_batch() for _ in range(5)]  # 5 x 4 = 20 tasks: exactly one epoch
    assert all(sum(t.startswith("l1") for t in b) == 2 for b in first_epoch)
    drawn = [t for b in first_epoch for t in b]
    assert sorted(drawn) == sorted(LEVELS[1] + LEVELS[2])
    assert drawn == epoch_order(LEVELS, 0, 0)
    assert (sampler.epoch, sampler.drawn) == (1, [])
    assert sampler.next_batch() == epoch_order(LEVELS, 0, 1)[:4]


def test_the_last_batch_of_an_epoch_tops_up_from_the_next_without_repeating():
    ids = {1: ["a", "b", "c"], 2: ["x", "y"]}
    sampler = TaskSampler(ids, batch_size=2, seed=1)
    e0, e1 = epoch_order(ids, 1, 0), epoch_order(ids, 1, 1)
    assert sampler.next_batch() == e0[0:2] and sampler.next_batch() == e0[2:4]
    third = sampler.next_batch()  # one task left in epoch 0, one from epoch 1 that is not that one
    top_up = [t for t in e1 if t != e0[4]][0]
    assert third == [e0[4], top_up] and len(set(third)) == 2
    assert sampler.epoch == 1 and sampler.drawn == [top_up]
    rest = [sampler.next_batch(), sampler.next_batch()]  # epoch 1 goes on without the task it gave already
    assert [t for b in rest for t in b] == [t for t in e1 if t != top_up]


def test_a_restored_sampler_draws_what_the_uninterrupted_one_draws():
    straight = TaskSampler(LEVELS, batch_size=3, seed=7)
    batches = [straight.next_batch() for _ in range(9)]
    interrupted = TaskSampler(LEVELS, batch_size=3, seed=7)
    for _ in range(4):
        interrupted.next_batch()
    state = interrupted.state_dict()
    resumed = TaskSampler(LEVELS, batch_size=3, seed=7)
    resumed.load_state_dict(state)
    assert [resumed.next_batch() for _ in range(5)] == batches[4:]
    with pytest.raises(ValueError, match="another seed"):
        TaskSampler(LEVELS, batch_size=3, seed=8).load_state_dict(state)
    with pytest.raises(ValueError, match="another task_ids"):
        TaskSampler({1: LEVELS[1]}, batch_size=3, seed=7).load_state_dict(state)


@pytest.mark.parametrize("levels, size, message", [
    ({1: []}, 1, "at least one training task"),
    ({1: ["a"], 2: ["a"]}, 1, "unique"),
    ({1: ["a", "b"]}, 3, "only 2 training tasks"),
    ({1: ["a"]}, 0, "positive integer"),
])
def test_bad_settings_are_refused(levels, size, message):
    with pytest.raises(ValueError, match=message):
        TaskSampler(levels, batch_size=size)
