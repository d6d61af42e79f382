"""Messages between the evaluator and its worker processes: one JSON object per line over a pipe.

A candidate's process can write anything to its end, so the reading side never trusts a line: a line
longer than ``MAX_LINE`` or one that is not a JSON object ends the job as a protocol violation, and
every field a reader uses is checked (``field``). The evaluator stamps each line with its own monotonic
clock when it arrives; the timing corroboration (verdict.py) compares those stamps with the times the
candidate's process reports.
"""

from __future__ import annotations

import json
import os
import queue
import threading
import time
from dataclasses import dataclass
from typing import Any

MAX_LINE = 1 << 20
SETUP_FAILED_EXIT = 4
"""Exit code of a job started ahead of its turn whose set-up failed before its turn (it is run again)."""
BAD_START_EXIT = 3
"""Exit code of a job that was told to start without its job token (someone else wrote to its pipe)."""


class ProtocolError(Exception):
    """A worker sent something that is not a well-formed message."""


def encode(message: dict[str, Any]) -> bytes:
    return json.dumps(message, separators=(",", ":")).encode() + b"\n"


def send(fd: int, message: dict[str, Any]) -> None:
    """Write one message (the whole line, retrying short writes)."""
    data = memoryview(encode(message))
    while data:
        written = os.write(fd, data)
        data = data[written:]


def field(message: dict[str, Any], name: str, kind: type | tuple[type, ...]) -> Any:
    """``message[name]``, which must be of ``kind`` (bool is not accepted as int)."""
    value = message.get(name)
    if not isinstance(value, kind) or (isinstance(value, bool) and bool not in (kind if isinstance(kind, tuple) else (kind,))):
        raise ProtocolError(f"message {message.get('t', '?')!r}: field {name!r} is missing or not {kind}")
    return value


@dataclass
class Received:
    """One message and the evaluator's monotonic clock (ns) when its line arrived."""

    at_ns: int
    message: dict[str, Any] | None
    error: str = ""
    """Why the line was not a message (then ``message`` is None)."""


class LineReader:
    """Reads JSON lines from a file descriptor in a thread; each is stamped when it arrives.

    ``get(timeout)`` returns the next ``Received`` or None when nothing came in time; after the writer
    closed its end it returns a ``Received`` with ``message=None`` and ``error='closed'`` for ever.
    """

    def __init__(self, fd: int, name: str = "reader"):
        self._fd = fd
        self._queue: queue.Queue[Received] = queue.Queue()
        self._closed = False
        self._thread = threading.Thread(target=self._pump, name=name, daemon=True)
        self._thread.start()

    def _pump(self) -> None:
        buffer = b""
        try:
            while True:
                chunk = os.read(self._fd, 1 << 16)
                now = time.monotonic_ns()
                if not chunk:
                    break
                buffer += chunk
                while b"\n" in buffer:
                    line, buffer = buffer.split(b"\n", 1)
                    self._queue.put(self._parse(line, now))
                if len(buffer) > MAX_LINE:
                    self._queue.put(Received(now, None, f"a line longer than {MAX_LINE} bytes"))
                    buffer = b""
        except OSError:
            pass
        finally:
            self._closed = True
            self._queue.put(Received(time.monotonic_ns(), None, "closed"))
            try:
                os.close(self._fd)
            except OSError:
                pass

    @staticmethod
    def _parse(line: bytes, now: int) -> Received:
        if len(line) > MAX_LINE:
            return Received(now, None, f"a line longer than {MAX_LINE} bytes")
        try:
            message = json.loads(line)
        except ValueError:
            return Received(now, None, f"not JSON: {line[:80]!r}")
        if not isinstance(message, dict) or not isinstance(message.get("t"), str):
            return Received(now, None, f"not a message: {line[:80]!r}")
        return Received(now, message)

    def join(self, timeout: float) -> bool:
        """Wait for the writer's end; True once the reader thread has finished."""
        self._thread.join(timeout)
        return not self._thread.is_alive()

    def get(self, timeout: float | None) -> Received | None:
        try:
            item = self._queue.get(timeout=timeout if timeout is None else max(timeout, 0.0))
        except queue.Empty:
            return None
        if item.error == "closed":
            self._queue.put(item)  # every later call sees the end too
        return item


def blocking_lines(fd: int):
    """Messages read from ``fd`` in this thread (the worker side: it waits for one answer at a time)."""
    buffer = b""
    while True:
        while b"\n" not in buffer:
            chunk = os.read(fd, 1 << 16)
            if not chunk:
                return
            buffer += chunk
            if len(buffer) > MAX_LINE:
                raise ProtocolError("line too long")
        line, buffer = buffer.split(b"\n", 1)
        message = json.loads(line)
        if not isinstance(message, dict):
            raise ProtocolError("not a message")
        yield message
