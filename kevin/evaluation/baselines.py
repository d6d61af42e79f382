"""The baseline cache: PyTorch eager timings of each task, measured once and kept on disk.

Candidates' speedups are measured against these numbers, so a key names everything that shapes a timing
(task, size profile, hardware, torch version, timing protocol), and a value once known to this process is never
replaced behind its back. Measuring is the evaluator's (it owns the judges and says which one times); this module
reads a judge's answer (``reference_times``), keeps the numbers and makes sure each one is measured by one thread at
a time.
"""

from __future__ import annotations

import fcntl
import json
import logging
import os
import threading
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Callable, Iterator

from kevin.evaluation.config import EvalConfig
from kevin.tasks.task import Task

_log = logging.getLogger(__name__)

# Times of the tasks asked for, and a description of those that could not be timed ("" when none).
MeasureFn = Callable[[list[Task]], tuple[dict[str, float], str]]


@contextmanager
def _locked(path: Path) -> Iterator[None]:
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(f"{path}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def baseline_key(task: Task, config: EvalConfig, hardware: str) -> str:
    """The cache key of ``task``'s baseline: everything that shapes PyTorch eager's time of it."""
    import importlib.metadata as md

    torch_version = md.version("torch")
    c = config
    return "|".join([task.task_id, task.digest, c.resolved_profile, c.backend, hardware, torch_version,
                     f"w{c.warmup_trials}t{c.timing_trials}r{c.baseline_rounds}f{int(c.flush_l2)}"
                     f"tf32{int(not c.disable_tf32)}t{c.cpu_threads}"])


def reference_times(judge: Any, specs: list[dict[str, str]], rounds: int, timeout_s: float,
                    progress: Callable[[int, int], None] | None = None) -> tuple[dict[str, float], str]:
    """The reference times ``judge`` measures for the tasks of ``specs`` (each a task's ``task_id`` and rendered
    source; ``rounds`` each; ``progress(done, total)`` after each task), and a description of those that failed
    ("" when none)."""
    counted = [0]

    def tick(message: dict[str, Any]) -> None:  # one message per task and round
        counted[0] += 1
        if progress and counted[0] % rounds == 0:
            progress(counted[0] // rounds, len(specs))

    answer = judge.request({"t": "baselines", "tasks": specs}, "baselines", timeout=timeout_s, on_progress=tick)
    times = {str(k): float(v) for k, v in answer.get("ms", {}).items()}
    missing = [spec["task_id"] for spec in specs if spec["task_id"] not in times]
    if not missing:
        return times, ""
    errors = answer.get("errors", {})
    detail = "; ".join(f"{k}: {errors.get(k) or 'no time'}" for k in missing[:3])
    return times, f"timing the reference of {', '.join(missing)} failed: {detail}"


class BaselineCache:
    """PyTorch eager timings, measured once per task x size x hardware x torch version x protocol.

    The file is read once, when the cache is made; after that this process's own copy is what counts
    (a value read or measured is never read from the file again, except that a value another evaluator
    confirmed may lower it: ``confirm``), so a file rewritten behind its back cannot raise anything it already
    knows. Only evaluator processes write the file; candidates cannot (isolation.py).
    """

    def __init__(self, path: Path):
        self.path = path
        self._known: dict[str, float] = {k: float(v["ms"]) for k, v in self._load().items()
                                          if isinstance(v, dict) and isinstance(v.get("ms"), (int, float))}
        self._lock = threading.Lock()
        # One lock per key: a baseline is measured by one thread while the others wait for its value.
        self._key_locks: dict[str, threading.Lock] = {}
        self._confirmed: set[str] = set()  # keys this process has seen timed a second time (confirm)

    def _load(self) -> dict[str, Any]:
        try:
            data = json.loads(self.path.read_text())
            return data if isinstance(data, dict) else {}
        except (OSError, ValueError):
            return {}

    def get(self, key: str) -> float | None:
        """This process's value, else one another evaluator process measured meanwhile (read from the file, and
        kept: a value once known is never replaced by what the file says later)."""
        with self._lock:
            if key not in self._known:
                for k, v in self._load().items():
                    if k not in self._known and isinstance(v, dict) and isinstance(v.get("ms"), (int, float)):
                        self._known[k] = float(v["ms"])
            return self._known.get(key)

    def put(self, key: str, ms: float, info: dict[str, Any]) -> None:
        with self._lock:
            self._known[key] = ms
        with _locked(self.path):
            data = self._load()
            data[key] = {"ms": ms, **info}
            tmp = self.path.with_suffix(f".{os.getpid()}.tmp")
            tmp.write_text(json.dumps(data, indent=1, sort_keys=True))
            os.replace(tmp, self.path)

    def _locks_of(self, keys: list[str]) -> list[threading.Lock]:
        with self._lock:
            return [self._key_locks.setdefault(k, threading.Lock()) for k in keys]

    def prefetch(self, keyed: dict[str, Task], measure: MeasureFn) -> None:
        """Measure (``measure``, all at once) the baselines among ``keyed`` not known yet, and keep those it timed;
        the others are logged, not raised (tried again when a candidate of their task runs)."""
        missing = {k: t for k, t in keyed.items() if self.get(k) is None}
        if not missing:
            return
        locks = self._locks_of(sorted(missing))
        for lock in locks:  # sorted order, and other threads hold one at a time: no deadlock
            lock.acquire()
        try:
            todo = {k: t for k, t in missing.items() if self.get(k) is None}
            times, failure = measure(list(todo.values()))
            if failure:
                _log.warning("%s", failure)
            stamp = time.strftime("%Y-%m-%dT%H:%M:%S")
            for key, task in todo.items():
                if task.task_id in times:
                    self.put(key, times[task.task_id], {"measured": stamp})
        finally:
            for lock in locks:
                lock.release()

    def _confirmed_in_file(self, key: str) -> float | None:
        """The value another evaluator confirmed for ``key`` (None when the file holds no confirmed one)."""
        entry = self._load().get(key)
        if isinstance(entry, dict) and entry.get("confirmed") and isinstance(entry.get("ms"), (int, float)):
            return float(entry["ms"])
        return None

    def confirmed(self, key: str) -> bool:
        """Whether ``key``'s baseline has been timed a second time (by this process, or one that wrote the file)."""
        with self._lock:
            if key in self._confirmed:
                return True
        return self._confirmed_in_file(key) is not None

    def confirm(self, key: str, measure: Callable[[], float]) -> float:
        """``key``'s baseline, timed a second time now (``measure``) unless that was done before: from then on the
        faster of its timings. Work beside a timing (another process's kernels time-sliced with it, a burst of host
        load) only ever slows it, so of two timings at different moments the faster is the truer. A second timing
        that fails leaves the first in place, unconfirmed, to be tried again by the next candidate."""
        with self._locks_of([key])[0]:
            known = self.get(key)
            if known is None:
                raise KeyError(f"no baseline of {key} to confirm")
            elsewhere = self._confirmed_in_file(key)
            if elsewhere is not None:
                best = min(known, elsewhere)  # confirmed by another evaluator: never raised by what the file says
                with self._lock:
                    self._known[key] = best
                    self._confirmed.add(key)
                return best
            with self._lock:
                if key in self._confirmed:
                    return self._known[key]
            try:
                again = measure()
            except RuntimeError as exc:
                _log.warning("timing the baseline %s a second time failed (%s): the first timing stays", key, exc)
                return known
            best = min(known, again)
            self.put(key, best, {"measured": time.strftime("%Y-%m-%dT%H:%M:%S"), "confirmed": True,
                                 "timings_ms": [known, again]})
            with self._lock:
                self._confirmed.add(key)
            return best

    def get_or_measure(self, key: str, measure: Callable[[], float]) -> float:
        """The value of ``key``, measured now (``measure``, which may raise) and kept when not known yet."""
        with self._locks_of([key])[0]:
            cached = self.get(key)
            if cached is not None:
                return cached
            ms = measure()
            self.put(key, ms, {"measured": time.strftime("%Y-%m-%dT%H:%M:%S")})
            return ms


__all__ = ["BaselineCache", "MeasureFn", "baseline_key", "reference_times"]
