"""Checks on tensors and on the harness's own process: output comparison (run by the judge), output
types, tampering and thread counts (run inside the candidate's process, where they can only report).

Each check is a small function returning a message or a result record, never raising.
"""

from __future__ import annotations

import builtins
import math
import os
import sys
import time
import types
from dataclasses import dataclass
from typing import Any, Iterable

import torch


# ------------------------------------------------------------------------------ output comparison


@dataclass
class Comparison:
    ok: bool
    message: str = ""
    max_abs_error: float = 0.0
    max_rel_error: float = 0.0


def _flatten_output(value: Any) -> list[Any] | None:
    if isinstance(value, (tuple, list)):
        return list(value)
    return [value]


def output_problem(value: Any, device: torch.device) -> str:
    """Why an output is not a plain dense tensor (or tuple of them) on ``device``; '' if it is."""
    items = _flatten_output(value)
    for item in items or []:
        if type(item) is not torch.Tensor:  # subclasses can compute lazily or lie about their data
            return f"output is {type(item).__module__}.{type(item).__qualname__}, expected a plain torch.Tensor"
        if item.layout != torch.strided:
            return f"output layout {item.layout} is not a dense strided tensor"
        if item.device.type != device.type:
            return f"output is on {item.device}, expected {device.type}"
        if item.requires_grad:
            return "output requires grad (it was computed with autograd-tracked PyTorch ops)"
    return ""


def compare_outputs(candidate: list[torch.Tensor], reference: Any, atol: dict[str, float], rtol: dict[str, float]) -> Comparison:
    """KernelBench-style allclose per output tensor, with exact shape and dtype."""
    ref_items = _flatten_output(reference)
    if len(candidate) != len(ref_items):
        return Comparison(False, f"returned {len(candidate)} outputs, expected {len(ref_items)}")
    worst_abs = worst_rel = 0.0
    for i, (got, want) in enumerate(zip(candidate, ref_items)):
        want = want.detach()
        if got.shape != want.shape:
            return Comparison(False, f"output {i} has shape {tuple(got.shape)}, expected {tuple(want.shape)}")
        if got.dtype != want.dtype:
            return Comparison(False, f"output {i} has dtype {got.dtype}, expected {want.dtype}")
        name = str(want.dtype).replace("torch.", "")
        a_tol, r_tol = atol.get(name, 0.0), rtol.get(name, 0.0)
        if not want.is_floating_point():
            if not torch.equal(got, want):
                mismatched = int((got != want).sum())
                return Comparison(False, f"output {i}: {mismatched} of {want.numel()} values differ")
            continue
        g, w = got.double(), want.double()
        diff = (g - w).abs()
        if diff.numel():
            finite = torch.isfinite(diff)
            abs_err = float(diff[finite].max()) if bool(finite.any()) else math.inf
            if not bool(finite.all()):
                abs_err = math.inf
            rel_err = float((diff / w.abs().clamp_min(1e-12)).nan_to_num(nan=math.inf).max())
            worst_abs, worst_rel = max(worst_abs, abs_err), max(worst_rel, rel_err)
        if not torch.allclose(got, want, atol=a_tol, rtol=r_tol):
            bad = int((~torch.isclose(got, want, atol=a_tol, rtol=r_tol)).sum())
            return Comparison(False, f"output {i}: {bad} of {want.numel()} values outside atol={a_tol:g} rtol={r_tol:g} "
                              f"(max abs error {worst_abs:.3g})", worst_abs, worst_rel)
    return Comparison(True, "", worst_abs, worst_rel)


def nearly_constant(value: Any) -> bool:
    """True when every output tensor is (nearly) one value: a task a constant answer could pass."""
    for item in _flatten_output(value) or []:
        if not isinstance(item, torch.Tensor) or not item.is_floating_point() or item.numel() < 2:
            return False
        x = item.detach().double()
        if float(x.std()) > 1e-6 * (float(x.abs().mean()) + 1e-12):
            return False
    return True


def all_finite(value: Any) -> bool:
    return all(
        bool(torch.isfinite(t).all()) for t in (_flatten_output(value) or []) if isinstance(t, torch.Tensor) and t.is_floating_point()
    )


# ------------------------------------------------------------------------------------- tampering


def _namespaces(extra: Iterable[tuple[str, Any]]) -> list[tuple[str, Any]]:
    import torch.nn.functional as F

    spaces = [
        ("time", time), ("builtins", builtins), ("sys", sys), ("os", os), ("torch", torch), ("torch.cuda", torch.cuda),
        ("torch.nn.functional", F), ("torch.Tensor", torch.Tensor), ("torch.nn.Module", torch.nn.Module),
        ("torch.profiler", torch.profiler), ("torch.cuda.Event", torch.cuda.Event), ("math", math),
    ]
    return spaces + list(extra)


def _identities(namespace: Any) -> dict[str, int]:
    """id() of every callable, class or module reachable as an attribute of ``namespace``."""
    try:
        items = vars(namespace).items() if not isinstance(namespace, dict) else namespace.items()
    except TypeError:
        return {}
    return {
        key: id(value)
        for key, value in list(items)
        if callable(value) or isinstance(value, (types.ModuleType, type, staticmethod, classmethod, property))
    }


def aten_registrations() -> dict[str, str]:
    """Each ``aten`` operator's dispatcher entry as the dispatcher describes it: its kernels per dispatch key and
    where each was registered (``torch._C._dispatch_dump``)."""
    dump = torch._C._dispatch_dump
    return {name: dump(name) for name in torch._C._dispatch_get_all_op_names() if name.startswith("aten::")}


def changed_registrations(before: dict[str, str], after: dict[str, str]) -> list[str]:
    """The operators whose entries differ (added, removed or changed), sorted."""
    return sorted(name for name in before.keys() | after.keys() if before.get(name) != after.get(name))


class IntegritySnapshot:
    """Identities of the functions the harness and the reference rely on, taken before candidate code.

    Replacing any of them (timers, synchronisation, torch functions, the reference's methods, the
    builtins) is tampering. New attributes are ignored: PyTorch adds submodules lazily.
    """

    def __init__(self, extra: Iterable[tuple[str, Any]] = ()):
        self._spaces = _namespaces(extra)
        self._ids = {name: _identities(ns) for name, ns in self._spaces}
        self._modules = {name: id(mod) for name, mod in list(sys.modules.items()) if name in ("time", "torch", "builtins", "math")}
        self._registrations = aten_registrations()

    def registrations_changed(self) -> str:
        """'' or which ``aten`` operators' dispatcher entries changed since the snapshot (a kernel registered for a
        PyTorch operator replaces PyTorch's silently: the hand-over's copy, or any op the evaluator relies on, would
        run the candidate's code). About 0.15 s, so it runs after loading and after timing, not per call."""
        changed = changed_registrations(self._registrations, aten_registrations())
        if not changed:
            return ""
        more = f" and {len(changed) - 3} more" if len(changed) > 3 else ""
        return f"the dispatcher's entries of {', '.join(changed[:3])}{more} changed (a PyTorch operator re-registered)"

    def changed(self) -> str:
        for name, namespace in self._spaces:
            now = _identities(namespace)
            for key, ident in self._ids[name].items():
                if now.get(key) != ident:
                    return f"{name}.{key} was replaced or removed"
        for name, ident in self._modules.items():
            if id(sys.modules.get(name)) != ident:
                return f"sys.modules[{name!r}] was replaced"
        if sys.gettrace() is not None or sys.getprofile() is not None:
            return "a trace or profile hook was installed"
        if torch._C._len_torch_function_stack() or torch._C._len_torch_dispatch_stack():
            return "a torch function/dispatch mode was left active"
        return ""


def _thread_cpu_ns() -> dict[str, int]:
    """CPU time (ns) of each thread of this process but the calling one (Linux /proc)."""
    me = str(threading_native_id())
    out = {}
    try:
        tids = os.listdir("/proc/self/task")
    except OSError:
        return out
    for tid in tids:
        if tid == me:
            continue
        try:
            with open(f"/proc/self/task/{tid}/schedstat") as handle:
                out[tid] = int(handle.read().split()[0])
        except (OSError, ValueError, IndexError):
            try:  # no schedstat: utime + stime in clock ticks
                with open(f"/proc/self/task/{tid}/stat") as handle:
                    fields = handle.read().rsplit(")", 1)[1].split()
                out[tid] = (int(fields[11]) + int(fields[12])) * (1_000_000_000 // os.sysconf("SC_CLK_TCK"))
            except (OSError, ValueError, IndexError):
                continue
    return out


def threading_native_id() -> int:
    import threading

    return threading.get_native_id()


def busy_after_return_ms(window_s: float = 0.05) -> float:
    """CPU time (ms) the process's other threads use during ``window_s`` after a call returned.

    OpenMP keeps its worker threads after a parallel region, asleep (OMP_WAIT_POLICY=passive); PyTorch's
    pool does the same. Threads that still compute after the call returned are work the timing did not see.
    """
    before = _thread_cpu_ns()
    time.sleep(window_s)
    after = _thread_cpu_ns()
    return sum(max(0, after[t] - before.get(t, 0)) for t in after) / 1e6


def thread_count() -> int:
    """Native threads of this process (Linux), falling back to Python's own count."""
    try:
        return len(os.listdir("/proc/self/task"))
    except OSError:
        import threading

        return threading.active_count()


def child_process_count() -> int:
    """Live child processes of this process (Linux /proc), compilers included while they run."""
    count = 0
    try:
        for task in os.listdir(f"/proc/{os.getpid()}/task"):
            with open(f"/proc/{os.getpid()}/task/{task}/children") as handle:
                count += len(handle.read().split())
    except OSError:
        return 0
    return count
