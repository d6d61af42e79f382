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


# ------------------------------------------------------------------------------------ barren tasks rest

FOUR = {1: ["a", "b"], 2: ["x", "y"]}


def _epochs(sampler: TaskSampler, epochs: int, barren: set[str]) -> list[list[str]]:
    """The tasks of each epoch, drawn one at a time; every draw of a task in ``barren`` teaches nothing."""
    seen: list[list[str]] = [[] for _ in range(epochs)]
    while sampler.epoch < epochs:
        epoch = sampler.epoch
        (task,) = sampler.next_batch()
        sampler.record(task, taught=task not in barren)
        seen[epoch].append(task)
    return seen


def test_a_barren_task_sits_out_the_next_epochs_then_returns():
    sampler = TaskSampler(FOUR, batch_size=1, seed=0, rest_epochs=2)
    epochs = _epochs(sampler, 7, barren={"x"})
    assert [sorted(e) for e in epochs] == [["a", "b", "x", "y"], ["a", "b", "y"], ["a", "b", "y"],
                                           ["a", "b", "x", "y"], ["a", "b", "y"], ["a", "b", "y"],
                                           ["a", "b", "x", "y"]]
    # Resting filters the epoch's order, it does not reshuffle it: the others keep their places.
    assert epochs[1] == [t for t in epoch_order(FOUR, 0, 1) if t != "x"]
    # Off: every task every epoch, and the orders are the plain sampler's.
    plain = _epochs(TaskSampler(FOUR, batch_size=1, seed=0), 3, barren={"x"})
    assert plain == [epoch_order(FOUR, 0, e) for e in range(3)]


def test_a_task_that_teaches_again_is_no_longer_rested_and_an_epoch_order_is_fixed_when_it_begins():
    sampler = TaskSampler(FOUR, batch_size=2, seed=3, rest_epochs=1)
    first = sampler.next_batch()
    sampler.record(first[0], taught=False)
    assert sampler.resting == {first[0]: 2}  # epoch 0 now, rests in epoch 1, back in epoch 2
    # The second half of epoch 0 was fixed when it began; epoch 1 goes without the resting task.
    assert sampler.next_batch() == epoch_order(FOUR, 3, 0)[2:]
    rest_of_epoch_1 = [t for t in epoch_order(FOUR, 3, 1) if t != first[0]]
    assert sampler.next_batch() == rest_of_epoch_1[:2]
    sampler.record(first[0], taught=True)  # as if it had taught after all: no longer resting ...
    assert sampler.resting == {}
    # ... from the next epoch on: epoch 1's order was fixed when it began, and still lacks it.
    assert sampler.next_batch()[0] == rest_of_epoch_1[2] and sampler.epoch == 2


def test_an_epoch_with_fewer_eligible_tasks_than_a_batch_draws_from_every_task():
    sampler = TaskSampler(FOUR, batch_size=2, seed=0, rest_epochs=3)
    for task in sampler.next_batch() + sampler.next_batch():  # all of epoch 0
        sampler.record(task, taught=task == "a")
    assert sorted(sampler.resting) == ["b", "x", "y"]  # only "a" is eligible in epoch 1: fewer than a batch
    assert sampler.next_batch() == epoch_order(FOUR, 0, 1)[:2]


def test_a_resting_sampler_resumes_where_it_stopped_and_old_states_load_as_no_rest():
    def run(sampler: TaskSampler, steps: int) -> list[list[str]]:
        batches = []
        for _ in range(steps):
            batch = sampler.next_batch()
            for task in batch:
                sampler.record(task, taught=not task.startswith("l2"))
            batches.append(batch)
        return batches

    straight = run(TaskSampler(LEVELS, batch_size=3, seed=5, rest_epochs=1), 20)
    interrupted = TaskSampler(LEVELS, batch_size=3, seed=5, rest_epochs=1)
    run(interrupted, 8)
    resumed = TaskSampler(LEVELS, batch_size=3, seed=5, rest_epochs=1)
    resumed.load_state_dict(interrupted.state_dict())
    assert run(resumed, 12) == straight[8:]
    # Level-2 tasks never teach here: after the first epoch they are drawn every other epoch only.
    drawn = [t for b in straight for t in b]
    assert sum(t.startswith("l1") for t in drawn) > 1.5 * sum(t.startswith("l2") for t in drawn)

    old = TaskSampler(LEVELS, batch_size=3, seed=5)
    old.next_batch()
    state = {k: v for k, v in old.state_dict().items() if k not in ("rest_epochs", "resting", "order")}
    again = TaskSampler(LEVELS, batch_size=3, seed=5)
    again.load_state_dict(state)
    assert again.next_batch() == old.next_batch()
    with pytest.raises(ValueError, match="another rest_epochs"):
        TaskSampler(LEVELS, batch_size=3, seed=5, rest_epochs=1).load_state_dict(state)
    with pytest.raises(ValueError, match="integer >= 0"):
        TaskSampler(LEVELS, batch_size=3, rest_epochs=-1)
    with pytest.raises(ValueError, match="not one of"):
        old.record("l3/00", taught=False)
