"""Train/eval splits: the exact rule, stability, balance, the bundled suite and a KernelBench-layout folder."""

from __future__ import annotations

import json
import random

import pytest

from kevin.tasks import (
    Split,
    SplitConfig,
    load_bundled_suite,
    make_split,
    make_task,
    read_split,
    split_tasks,
    write_split,
)
from kevin.tasks.splits import allocate
from tests.conftest import identity_task_source, write_kernelbench_dir


def tasks_of(ids: list[str]) -> list:
    """Task records for ids ``levelN/name`` (each with its own source, so digests differ)."""
    return [make_task(i, int(i.split("/")[0][5:]), i.split("/")[1], identity_task_source(i)) for i in ids]


def suite(counts: dict[int, int], prefix: str = "t") -> list:
    return tasks_of([f"level{level}/{i}_{prefix}{i}" for level, n in counts.items() for i in range(1, n + 1)])


def side(split: Split) -> dict[str, str]:
    return {**{i: "train" for i in split.train_ids}, **{i: "eval" for i in split.eval_ids}}


def test_allocate_shares_by_largest_remainder():
    assert allocate(3, {1: 5, 2: 3}) == {1: 2, 2: 1}  # exact 1.875 / 1.125: the spare one goes to .875
    assert allocate(20, {1: 30, 2: 30}) == {1: 10, 2: 10}
    assert allocate(20, {1: 100, 2: 100}) == {1: 10, 2: 10}
    assert allocate(5, {1: 2, 2: 2, 3: 2}) == {1: 2, 2: 2, 3: 1}  # equal remainders: lower levels first
    assert allocate(0, {1: 4}) == {1: 0}
    with pytest.raises(ValueError, match="cannot share 7"):
        allocate(7, {1: 3, 2: 3})


def test_exact_split_of_a_small_list():
    # sha256("7:<id>") ranks level 1 as 3_c (0d4f..), 5_e (47f1..), 4_d (55b5..), 2_b (86d4..), 1_a (a664..)
    # and level 2 as 2_g (0c88..), 1_f (14cb..), 3_h (f774..); eval_size 3 shares as {1: 2, 2: 1}.
    tasks = tasks_of(["level1/1_a", "level1/2_b", "level1/3_c", "level1/4_d", "level1/5_e",
                      "level2/1_f", "level2/2_g", "level2/3_h"])
    split = split_tasks(tasks, SplitConfig(seed=7, eval_size=3))
    assert split.eval_ids == ["level1/3_c", "level1/5_e", "level2/2_g"]
    assert split.train_ids == ["level1/1_a", "level1/2_b", "level1/4_d", "level2/1_f", "level2/3_h"]
    assert split.counts() == {"train": {1: 3, 2: 2}, "eval": {1: 2, 2: 1}}
    first = split.train[0]
    assert (first.level, first.digest, first.path) == (1, tasks[0].digest, "")


def test_the_same_tasks_in_any_order_give_the_same_split():
    tasks = suite({1: 30, 2: 30})
    reference = split_tasks(tasks, SplitConfig(seed=3))
    for trial in range(5):
        shuffled = list(tasks)
        random.Random(trial).shuffle(shuffled)
        assert split_tasks(shuffled, SplitConfig(seed=3)) == reference


def test_an_added_task_moves_no_other_task_unless_it_takes_an_eval_place():
    """Exact eval counts allow one displacement at most: the last eval task of the newcomer's level."""
    config = SplitConfig(seed=5, eval_size=20)
    tasks = suite({1: 30, 2: 30})
    before = side(split_tasks(tasks, config))
    outcomes = set()
    for k in range(40):
        newcomer = tasks_of([f"level{1 + k % 2}/new_{k}"])[0]
        after = side(split_tasks(tasks + [newcomer], config))
        moved = sorted(i for i in before if after[i] != before[i])
        if after[newcomer.task_id] == "train":
            assert moved == [], f"{newcomer.task_id} went to train yet moved {moved}"
        else:
            assert len(moved) == 1 and before[moved[0]] == "eval" and after[moved[0]] == "train"
            assert moved[0].split("/")[0] == newcomer.task_id.split("/")[0]
        outcomes.add(after[newcomer.task_id])
    assert outcomes == {"train", "eval"}  # both cases were exercised


def test_editing_a_task_moves_nothing():
    tasks = suite({1: 12, 2: 12})
    edited = list(tasks)
    edited[4] = make_task(tasks[4].task_id, tasks[4].level, tasks[4].name, identity_task_source("rewritten"))
    a, b = split_tasks(tasks, SplitConfig(seed=1)), split_tasks(edited, SplitConfig(seed=1))
    assert side(a) == side(b)
    assert [e.digest for e in a.train + a.eval] != [e.digest for e in b.train + b.eval]


@pytest.mark.parametrize("counts,eval_size", [({1: 30, 2: 30}, 20), ({1: 10, 2: 7}, 5), ({1: 9, 2: 4, 3: 6}, 6)])
def test_no_overlap_and_each_level_keeps_its_share(counts, eval_size):
    tasks = suite(counts)
    quota = allocate(eval_size, counts)
    eval_sets = set()
    for seed in range(20):
        split = split_tasks(tasks, SplitConfig(seed=seed, eval_size=eval_size, levels=tuple(counts)))
        assert not set(split.train_ids) & set(split.eval_ids)
        assert sorted(split.train_ids + split.eval_ids) == sorted(t.task_id for t in tasks)
        assert split.counts()["eval"] == quota
        assert split.counts()["train"] == {level: n - quota[level] for level, n in counts.items()}
        eval_sets.add(tuple(split.eval_ids))
    assert len(eval_sets) == 20  # every seed held out another set


def test_unstratified_split_ranks_all_levels_together():
    tasks = suite({1: 30, 2: 30})
    shares = set()
    for seed in range(10):
        split = split_tasks(tasks, SplitConfig(seed=seed, eval_size=20, stratify=False))
        assert len(split.eval_ids) == 20 and not set(split.train_ids) & set(split.eval_ids)
        shares.add(split.counts()["eval"].get(1, 0))
    assert len(shares) > 1  # the level 1 share varies with the seed


def test_default_sizes_per_source():
    assert SplitConfig().eval_count(60) == 20  # bundled: a third (10 + 10 of 30 + 30)
    assert SplitConfig(source="/data/KernelBench").eval_count(200) == 20  # KernelBench: a tenth
    assert SplitConfig(eval_fraction=0.25).eval_count(10) == 3  # 2.5 rounds half up
    assert SplitConfig(eval_size=7).eval_count(60) == 7


def test_paper_default_on_a_kernelbench_sized_suite():
    tasks = suite({1: 100, 2: 100, 3: 50})
    split = split_tasks(tasks, SplitConfig(source="/data/KernelBench"))
    assert split.counts() == {"train": {1: 90, 2: 90}, "eval": {1: 10, 2: 10}}  # level 3 left out


def test_config_validation_says_what_to_do():
    cases = [
        ({"eval_size": 5, "eval_fraction": 0.2}, "not both"),
        ({"eval_fraction": 1.0}, "strictly between 0 and 1"),
        ({"eval_fraction": 0}, "strictly between 0 and 1"),
        ({"eval_size": 0}, "positive integer"),
        ({"eval_size": True}, "positive integer"),
        ({"levels": []}, "non-empty list of positive integers"),
        ({"levels": [0, 1]}, "non-empty list of positive integers"),
        ({"seed": "x"}, "seed must be an integer"),
        ({"source": ""}, "source must be"),
        ({"stratify": "yes"}, "true or false"),
        ({"eval_sise": 3}, "unknown splits settings"),
    ]
    for data, message in cases:
        with pytest.raises(ValueError, match=message):
            SplitConfig.from_dict(data)
    assert SplitConfig.from_dict({"levels": [2, 1, 2]}).levels == (1, 2)


def test_unsplittable_inputs_are_clear_errors():
    with pytest.raises(ValueError, match=r"repeated: \['level1/1_t1'\]"):
        split_tasks(suite({1: 3}) + suite({1: 1}), SplitConfig(levels=[1], eval_size=1))
    with pytest.raises(ValueError, match=r"no tasks of level\(s\) \[2\]"):
        split_tasks(suite({1: 3}), SplitConfig(eval_size=1))
    with pytest.raises(ValueError, match="choose splits.eval_size between 1 and 5"):
        split_tasks(suite({1: 3, 2: 3}), SplitConfig(eval_size=6))


def test_bundled_suite_split():
    split = make_split(SplitConfig())
    assert split.counts() == {"train": {1: 20, 2: 20}, "eval": {1: 10, 2: 10}}
    digests = {t.task_id: t.digest for t in load_bundled_suite()}
    for entry in split.train + split.eval:
        assert entry.path == f"{entry.task_id}.py"
        assert entry.digest == digests[entry.task_id]
    assert make_split(SplitConfig()) == split


def test_kernelbench_checkout_split_and_file_round_trip(tmp_path):
    write_kernelbench_dir(tmp_path / "kb", {1: 10, 2: 10, 3: 2})
    config = SplitConfig(source=str(tmp_path / "kb"), eval_fraction=0.2)
    split = make_split(config)
    assert split.counts() == {"train": {1: 8, 2: 8}, "eval": {1: 2, 2: 2}}
    assert {e.path for e in split.train + split.eval} == {
        f"level{level}/{i}_Scale{i}.py" for level in (1, 2) for i in range(1, 11)}

    path = write_split(tmp_path / "splits" / "kb.json", split)
    data = json.loads(path.read_text())
    assert data["format"] == 1 and data["config"]["eval_fraction"] == 0.2 and data["config"]["levels"] == [1, 2]
    assert {"task_id", "level", "digest", "path"} == set(data["eval"][0])
    assert read_split(path) == split
    no_eval = Split(config=config, train=split.train)
    assert read_split(write_split(tmp_path / "no_eval.json", no_eval)) == no_eval  # written as is, judged by the checks


def test_reading_something_that_is_not_a_split(tmp_path):
    with pytest.raises(FileNotFoundError, match="no such split file"):
        read_split(tmp_path / "absent.json")
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    with pytest.raises(ValueError, match="not a JSON split file"):
        read_split(bad)
    bad.write_text(json.dumps({"train": []}))
    with pytest.raises(ValueError, match="not a split file of format 1"):
        read_split(bad)
    bad.write_text(json.dumps({"format": 1, "config": {}, "train": [{"task_id": "level1/a"}], "eval": []}))
    with pytest.raises(ValueError, match=r"train\[0\]: missing \['level', 'digest'\]"):
        read_split(bad)
