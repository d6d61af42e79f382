"""The process checks the harness runs in a candidate's process: what they count, here on the test's own process."""

from __future__ import annotations

import subprocess
import sys

from kevin.evaluation.checks import child_process_count


def test_a_child_process_is_counted_while_it_lives():
    before = child_process_count()
    child = subprocess.Popen([sys.executable, "-c", "import sys; sys.stdin.read()"], stdin=subprocess.PIPE)
    try:
        assert child_process_count() == before + 1  # what flags a candidate that started a process
    finally:
        child.communicate(b"")
    assert child_process_count() == before

