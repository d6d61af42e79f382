"""Task records, size profiles and loaders (bundled suite and an external KernelBench-style checkout)."""

from __future__ import annotations

import pytest

from kevin.tasks import (
    TaskError,
    UnknownTaskError,
    find_task,
    load_bundled_suite,
    load_kernelbench_dir,
    load_task_file,
    validate_task_source,
)
from kevin.tasks.profiles import ProfileError, read_profiles, render_profile

TASK = '''import torch
import torch.nn as nn


class Model(nn.Module):
    def forward(self, x):
        return x * 2  # doubled


batch_size = 128  # rows
dim = batch_size * 2


def get_inputs():
    return [torch.randn(batch_size, dim)]


def get_init_inputs():
    return []


KEVIN_PROFILES = {"cpu": {"batch_size": 4},
                  "tiny": {"batch_size": 1, "dim": 3}}
'''


def test_render_profile_rewrites_constants_and_drops_the_profiles():
    out = render_profile(TASK, "cpu")
    assert "batch_size = 4  # rows" in out and "dim = batch_size * 2" in out
    assert "KEVIN_PROFILES" not in out and "# doubled" in out
    tiny = render_profile(TASK, "tiny")
    assert "batch_size = 1  # rows" in tiny and "dim = 3\n" in tiny
    default = render_profile(TASK)
    assert "batch_size = 128" in default and "KEVIN_PROFILES" not in default
    assert render_profile(TASK, "unknown") == default  # a task without that profile keeps its own sizes


def test_rendered_profile_executes_with_its_sizes():
    namespace: dict = {}
    exec(render_profile(TASK, "cpu"), namespace)
    (x,) = namespace["get_inputs"]()
    assert tuple(x.shape) == (4, 8)


def test_bad_profiles_are_clear_errors():
    with pytest.raises(ProfileError, match="does not define"):
        render_profile(TASK.replace('"dim": 3', '"nope": 3'), "tiny")
    with pytest.raises(ProfileError, match="literal dict"):
        read_profiles("KEVIN_PROFILES = make()\n")


@pytest.mark.parametrize("source,message", [
    ("", "empty"), ("\x00\x01", "binary"), ("def f(:", "not valid Python"),
    ("import torch\ndef get_inputs():\n    return []\n", "missing Model, get_init_inputs"),
])
def test_invalid_tasks_are_rejected_with_a_reason(source, message):
    with pytest.raises(TaskError, match=message):
        validate_task_source(source)


def test_loading_never_executes_the_task(tmp_path):
    level = tmp_path / "level1"
    level.mkdir()
    (level / "1_boom.py").write_text(TASK + "\nraise SystemExit('executed at load')\n")
    (tmp_path / "marker").write_text("")
    task = load_task_file(level / "1_boom.py")
    assert task.task_id == "level1/1_boom" and task.level == 1 and task.profiles["cpu"] == {"batch_size": 4}


def test_external_kernelbench_checkout(tmp_path):
    for level, names in {1: ["1_a.py", "10_b.py", "2_c.py"], 2: ["1_fused.py"], 3: ["1_net.py"]}.items():
        d = tmp_path / "KernelBench" / f"level{level}"
        d.mkdir(parents=True)
        for name in names:
            (d / name).write_text(TASK)
    tasks = load_kernelbench_dir(tmp_path)
    assert [t.task_id for t in tasks] == ["level1/1_a", "level1/2_c", "level1/10_b", "level2/1_fused", "level3/1_net"]
    assert [t.task_id for t in load_kernelbench_dir(tmp_path, levels=(2,))] == ["level2/1_fused"]
    with pytest.raises(TaskError, match="not a KernelBench checkout"):
        load_kernelbench_dir(tmp_path / "KernelBench" / "level1")


def test_bundled_suite_size_and_shape():
    tasks = load_bundled_suite()
    level1 = [t for t in tasks if t.level == 1]
    level2 = [t for t in tasks if t.level == 2]
    assert len(level1) >= 30 and len(level2) >= 30
    assert len({t.task_id for t in tasks}) == len(tasks)
    for task in tasks:
        assert "cpu" in task.profiles, f"{task.task_id} has no cpu size profile"
        assert "KEVIN_PROFILES" not in task.render("cpu")


def test_find_task_by_id_or_name_and_a_plain_message_when_missing():
    suite = load_bundled_suite((1,))
    assert find_task(suite, "level1/01_relu") is find_task(suite, "01_relu")
    with pytest.raises(UnknownTaskError) as info:
        find_task(suite, "my_relu")
    # Both a KeyError (a failed lookup) and a TaskError, printed without KeyError's extra quotes.
    assert isinstance(info.value, KeyError) and isinstance(info.value, TaskError)
    assert str(info.value) == "no task 'my_relu'"
