"""The device shared by generation and the evaluator's timings: which runs time baselines first and hold the device."""

from __future__ import annotations

import threading
from contextlib import contextmanager
from types import SimpleNamespace

import pytest

from kevin.experiment.device_share import device_name, generation_hold, time_baselines_first


class Evaluator:
    """The two hooks of the local evaluator, recorded."""

    def __init__(self, devices=("cuda:0",)):
        self._devices = list(devices)
        self.prefetched = []
        self.held = []
        self.lock = threading.Lock()

    def devices(self):
        return self._devices

    def prefetch_baselines(self, tasks, device=None, progress=None):
        self.prefetched.append([t.task_id for t in tasks])

    def hold_device(self, device):
        self.held.append(device)
        return self.lock


def tasks(*ids):
    return [SimpleNamespace(task_id=t) for t in ids]


def test_with_waves_a_steps_baselines_are_timed_before_it_generates():
    ev = Evaluator()
    assert time_baselines_first(ev, tasks("level1/03_sigmoid", "level1/01_relu"), waves=2)
    assert ev.prefetched == [["level1/03_sigmoid", "level1/01_relu"]]  # the step's tasks, in its order
    assert not time_baselines_first(ev, tasks("level1/01_relu"), waves=1)  # one wave: a batch times its own
    assert not time_baselines_first(object(), tasks("level1/01_relu"), waves=2)  # the cluster's: on its machines
    assert ev.prefetched == [["level1/03_sigmoid", "level1/01_relu"]]
    # The run's record of the phase is entered only around work done (no empty "baselines" entry with one wave).
    entered = []

    @contextmanager
    def span():
        entered.append(len(ev.prefetched))
        yield
        entered.append(len(ev.prefetched))

    assert not time_baselines_first(ev, tasks("level1/01_relu"), waves=1, span=span()) and entered == []
    assert time_baselines_first(ev, tasks("level1/01_relu"), waves=3, span=span()) and entered == [1, 2]


def test_device_names_match_the_evaluators():
    torch = pytest.importorskip("torch")
    assert device_name(torch.device("cuda", 1)) == "cuda:1"
    assert device_name(torch.device("cpu")) == "cpu"
    assert device_name("cuda:2") == "cuda:2" and device_name("cpu") == "cpu"


def test_the_policy_holds_the_device_it_generates_on_only_when_waves_overlap_timings_there():
    ev = Evaluator(devices=["cuda:0", "cuda:1"])
    with generation_hold(ev, "cuda:1", waves=2, policy_backend="embedded"):
        assert ev.lock.locked()  # the evaluator's own lock: its runs and baseline timings wait
    assert not ev.lock.locked() and ev.held == ["cuda:1"]
    for args in (("cuda:1", 1, "embedded"),  # one wave: nothing overlaps
                 ("cuda:1", 2, "openai"),  # a served policy: its device is not known here
                 ("cuda:3", 2, "hf"),  # a device the evaluator does not time on
                 (None, 2, "hf")):
        with generation_hold(ev, *args):
            assert not ev.lock.locked()
    with generation_hold(object(), "cuda:0", waves=2, policy_backend="hf"):  # an evaluator without the hook
        pass
    assert ev.held == ["cuda:1"]
