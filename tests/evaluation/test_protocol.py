"""The evaluator's side of the pipes and of the output hand-over: nothing a worker writes is trusted."""

from __future__ import annotations

import os
import time

import pytest
import torch

from kevin.evaluation import protocol
from kevin.evaluation.channel import FILE_NAME, HarnessChannel, JudgeChannel, Layout


def test_lines_are_stamped_and_parsed():
    r, w = os.pipe()
    reader = protocol.LineReader(r)
    before = time.monotonic_ns()
    protocol.send(w, {"t": "b", "i": 3})
    item = reader.get(5)
    assert item.message == {"t": "b", "i": 3} and item.at_ns >= before
    os.write(w, b"not json\n[1, 2]\n" + b'{"t": "x"}\n')
    assert "not JSON" in reader.get(5).error
    assert "not a message" in reader.get(5).error
    assert reader.get(5).message == {"t": "x"}
    os.close(w)
    assert reader.get(5).error == "closed" and reader.get(5).error == "closed"  # the end is seen again and again
    assert reader.join(5)


def test_a_line_longer_than_the_limit_is_refused_without_reading_it_all_into_one_message():
    r, w = os.pipe()
    reader = protocol.LineReader(r)

    def flood():
        data = b"x" * (protocol.MAX_LINE + 10)
        view = memoryview(data)
        while view:
            view = view[os.write(w, view[:65536]):]
        os.close(w)

    import threading

    threading.Thread(target=flood, daemon=True).start()
    errors = [reader.get(10).error for _ in range(2)]
    assert "longer than" in errors[0] and errors[1] == "closed"


# ------------------------------------------------------------------------------------------- channel


LAYOUT_INPUTS = [torch.randn(3, 4), 7, torch.arange(6, dtype=torch.int64).reshape(2, 3), [1, 2]]
LAYOUT_OUTPUTS = [torch.randn(5), torch.tensor(1.5, dtype=torch.bfloat16), torch.empty(0, 5)]


def test_a_layout_round_trips_and_places_tensors_at_aligned_offsets():
    layout = Layout.of(LAYOUT_INPUTS, LAYOUT_OUTPUTS)
    assert Layout.from_dict(layout.to_dict()) == layout
    ins, outs, total = layout.offsets()
    # 48 bytes -> 256; a value takes no room; 48 bytes -> 256; then the outputs: 20 -> 256, 2 -> 256, 0
    assert ins == [0, None, 256, None] and outs == [512, 768, 1024] and total == 1024
    with pytest.raises(ValueError, match="only tensors and plain values"):
        Layout.of([object()], LAYOUT_OUTPUTS)
    with pytest.raises(ValueError, match="known dtype"):
        Layout.from_dict({"inputs": [{"tensor": {"dtype": "object", "shape": [1]}}], "outputs": []})


def test_inputs_and_outputs_go_through_a_shared_file_bit_for_bit(tmp_path):
    layout = Layout.of(LAYOUT_INPUTS, LAYOUT_OUTPUTS)
    cpu = torch.device("cpu")
    mine = HarnessChannel(layout, cpu, "file", tmp_path)
    judge = JudgeChannel(mine.describe, tmp_path, layout, cpu)
    fresh = [torch.randn(3, 4), 7, torch.randint(0, 9, (2, 3)), [1, 2]]
    judge.write_inputs(fresh)
    assert torch.equal(mine.inputs[0], fresh[0]) and mine.inputs[1] == 7 and torch.equal(mine.inputs[2], fresh[2])
    assert mine.inputs[3] == [1, 2]
    assert judge.inputs_equal(fresh)
    mine.inputs[0].add_(1.0)  # a call that writes its inputs is seen by the judge
    assert not judge.inputs_equal(fresh)
    outputs = [torch.randn(5), torch.tensor(-2.0, dtype=torch.bfloat16), torch.empty(0, 5)]
    assert mine.put(outputs) == ""
    got = [torch.empty_like(o) for o in outputs]
    judge.copy_outputs(got)
    assert all(torch.equal(g, o) for g, o in zip(got, outputs))
    assert mine.put(outputs[:2]) == "returned 2 outputs, expected 3"
    assert mine.put([torch.randn(4), *outputs[1:]]) == "output 0 has shape (4,), expected (5,)"
    assert mine.put([outputs[0].double(), *outputs[1:]]) == "output 0 has dtype float64, expected float32"
    with pytest.raises(ValueError, match="changed shape"):
        judge.write_inputs([torch.randn(4, 3), 7, fresh[2], [1, 2]])
    with pytest.raises(ValueError, match="plain value"):
        judge.write_inputs([fresh[0], 8, fresh[2], [1, 2]])
    judge.close()


def test_the_judge_maps_no_link_and_no_file_of_another_size(tmp_path, tmp_path_factory):
    layout = Layout.of(LAYOUT_INPUTS, LAYOUT_OUTPUTS)
    cpu = torch.device("cpu")
    elsewhere = tmp_path_factory.mktemp("elsewhere") / "secret.bin"
    elsewhere.write_bytes(b"\0" * layout.total_bytes)
    (tmp_path / FILE_NAME).symlink_to(elsewhere)
    describe = {"kind": "file", "name": FILE_NAME, "size": layout.total_bytes}
    with pytest.raises(OSError):  # O_NOFOLLOW
        JudgeChannel(describe, tmp_path, layout, cpu)
    (tmp_path / FILE_NAME).unlink()
    (tmp_path / FILE_NAME).write_bytes(b"\0" * 8)
    with pytest.raises(ValueError, match="announced size"):
        JudgeChannel(describe, tmp_path, layout, cpu)
    for bad in ({**describe, "size": 8}, {**describe, "name": "../x"}, {**describe, "kind": "shm"}):
        with pytest.raises(ValueError):
            JudgeChannel(bad, tmp_path, layout, cpu)


def _session(checks: int):
    from kevin.evaluation.judge import _Session

    class _Channel:
        device = torch.device("cpu")
        outputs = [torch.zeros(2)]

    return _Session(None, None, _Channel(), checks)


def test_reservoir_sampling_keeps_each_timed_call_with_the_same_chance_and_allocates_nothing():
    counts = [0] * 10
    for _ in range(3000):
        s = _session(2)
        buffers = {id(s.incoming), *(id(b) for b in s.spare)}
        for call in range(10):
            s.sample(seed=call, dist="base")
            assert {id(s.incoming), *(id(k[3]) for k in s.kept), *(id(b) for b in s.spare)} == buffers
        assert len(s.kept) == 2 and len({k[0] for k in s.kept}) == 2 and all(k[1] == k[0] for k in s.kept)
        for k in s.kept:
            counts[k[0]] += 1
    # each call kept with chance 2/10: 600 of 3000 (binomial sd ~22)
    assert all(abs(c - 600) < 110 for c in counts), counts


def test_a_baseline_is_the_fastest_rounds_median_and_a_broken_task_is_reported(monkeypatch):
    """Rounds over all tasks, the fastest median kept (one slow round must not inflate a task's speedups), a
    failing task named with its error, and one progress message per task and round."""
    import json

    from kevin.evaluation.config import EvalConfig
    from kevin.evaluation.judge import _Judge

    rfd, wfd = os.pipe()
    grad, threads = torch.is_grad_enabled(), torch.get_num_threads()
    try:  # the judge sets up its own process (no autograd, the baseline's threads): not this one's to keep
        judge = _Judge(EvalConfig(backend="cpu", baseline_rounds=2).to_dict(), "cpu", wfd)
    finally:
        torch.set_grad_enabled(grad)
        torch.set_num_threads(threads)
    medians = {"a": iter([3.0, 2.0]), "b": iter([1.0, 4.0])}

    def time_reference(spec):
        if spec["task_id"] == "c":
            raise ValueError("no such input")
        return next(medians[spec["task_id"]])

    monkeypatch.setattr(judge, "time_reference", time_reference)
    answer = judge.baselines({"tasks": [{"task_id": k} for k in "abc"]})
    os.close(wfd)
    with os.fdopen(rfd) as lines:
        sent = [json.loads(line) for line in lines]
    assert answer["ms"] == {"a": 2.0, "b": 1.0}
    assert list(answer["errors"]) == ["c"] and "no such input" in answer["errors"]["c"]
    assert [m["task_id"] for m in sent if m["t"] == "progress"] == ["a", "b", "c"] * 2
