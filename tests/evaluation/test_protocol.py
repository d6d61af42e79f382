"""The evaluator's side of the pipes and of the output hand-over: nothing a worker writes is trusted."""

from __future__ import annotations

import os
import time

import pytest
import torch

from kevin.evaluation import protocol
from kevin.evaluation.transfer import Exporter, Importer


def test_lines_are_stamped_parsed_and_timing_marks_answered_at_once():
    r, w = os.pipe()
    ack_r, ack_w = os.pipe()
    reader = protocol.LineReader(r, ack_fd=ack_w)
    before = time.monotonic_ns()
    protocol.send(w, {"t": "b", "i": 3})
    item = reader.get(5)
    assert item.message == {"t": "b", "i": 3} and item.at_ns >= before
    acks = protocol.blocking_lines(ack_r)
    assert next(acks) == {"t": "ack", "k": "b", "i": 3}
    protocol.send(w, {"t": "e", "i": 3})
    assert reader.get(5).message == {"t": "e", "i": 3} and next(acks) == {"t": "ack", "k": "e", "i": 3}
    os.write(w, b"not json\n[1, 2]\n" + b'{"t": "x"}\n')
    assert "not JSON" in reader.get(5).error
    assert "not a message" in reader.get(5).error
    assert reader.get(5).message == {"t": "x"}
    os.close(w)
    assert reader.get(5).error == "closed" and reader.get(5).error == "closed"  # the end is seen again and again
    assert reader.join(5)
    os.close(ack_w)


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


def test_an_answer_to_a_forged_begin_mark_carries_only_its_index():
    r, w = os.pipe()
    ack_r, ack_w = os.pipe()
    reader = protocol.LineReader(r, ack_fd=ack_w)
    protocol.send(w, {"t": "b", "i": "not an index"})
    reader.get(5)
    protocol.send(w, {"t": "b", "i": 1})
    reader.get(5)
    assert next(protocol.blocking_lines(ack_r)) == {"t": "ack", "k": "b", "i": 1}  # the malformed one got no answer
    os.close(w)
    os.close(ack_w)


# ------------------------------------------------------------------------------------------ transfer


@pytest.fixture
def folder(tmp_path):
    return tmp_path


def test_outputs_round_trip_through_files_bit_for_bit(folder):
    outputs = [torch.randn(3, 4), torch.arange(6, dtype=torch.int64).reshape(2, 3), torch.tensor(1.5, dtype=torch.bfloat16),
               torch.empty(0, 5)]
    refs = Exporter(folder, torch.device("cpu"), "file").export(outputs, "trial0")
    importer = Importer(folder, torch.device("cpu"))
    for ref, want in zip(refs, outputs):
        got = importer.read(ref, want.dtype, tuple(want.shape))
        assert isinstance(got, torch.Tensor) and torch.equal(got, want) and got.dtype == want.dtype


def test_groups_exported_together_each_read_back_their_own_values(folder):
    groups = {"spot3": [torch.full((5,), 3.0)], "spot8": [torch.full((5,), 8.0), torch.arange(4)]}
    refs = Exporter(folder, torch.device("cpu"), "file").export_groups(groups)
    importer = Importer(folder, torch.device("cpu"))
    assert sorted(refs) == ["spot3", "spot8"] and [len(r) for r in refs.values()] == [1, 2]
    for tag, tensors in groups.items():
        for ref, want in zip(refs[tag], tensors):
            assert torch.equal(importer.read(ref, want.dtype, tuple(want.shape)), want)


def test_a_ref_is_checked_against_the_reference_before_anything_is_read(folder):
    ref = Exporter(folder, torch.device("cpu"), "file").export([torch.randn(4)], "t")[0]
    importer = Importer(folder, torch.device("cpu"))
    assert importer.read(ref, torch.float64, (4,)) == "has dtype float32, expected float64"
    assert importer.read(ref, torch.float32, (2, 2)) == "has shape (4,), expected (2, 2)"
    assert "size does not match" in importer.read({**ref, "nbytes": 8}, torch.float32, (4,))
    assert "not allowed" in importer.read({**ref, "name": "../outside.bin"}, torch.float32, (4,))
    assert "no valid dtype" in importer.read({**ref, "dtype": "object"}, torch.float32, (4,))
    assert "unknown kind" in importer.read({**ref, "kind": "shm"}, torch.float32, (4,))


def test_an_output_file_that_is_a_link_or_of_the_wrong_size_is_not_read(folder, tmp_path_factory):
    secret = tmp_path_factory.mktemp("elsewhere") / "secret.bin"
    secret.write_bytes(b"\x00" * 16)
    (folder / "trial0_0.bin").symlink_to(secret)
    ref = {"kind": "file", "name": "trial0_0.bin", "dtype": "float32", "shape": [4], "nbytes": 16}
    importer = Importer(folder, torch.device("cpu"))
    assert "could not be opened" in importer.read(ref, torch.float32, (4,))  # O_NOFOLLOW
    (folder / "short_0.bin").write_bytes(b"\x00" * 8)
    assert "announced size" in importer.read({**ref, "name": "short_0.bin"}, torch.float32, (4,))


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
