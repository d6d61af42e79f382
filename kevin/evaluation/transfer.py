"""Handing a candidate's raw outputs to the judge, which compares them where no candidate code runs.

Two transports, chosen per job before any candidate code exists:
- ``file``: the candidate's process writes each output's bytes into its own job folder; the judge reads
  them back (no symlinks followed, exact sizes). Works everywhere; costs a copy through host memory.
- ``ipc`` (cuda): the candidate's process copies its outputs into one device buffer and hands over a CUDA
  IPC handle; the judge maps that buffer and compares on the GPU without copying. Only the candidate's
  buffer is shared: nothing of the judge (inputs, reference outputs) is ever exported to a candidate.

A reference ("ref") is plain JSON: kind, dtype, shape, nbytes and where the bytes are. The reader checks
every number against the reference output it expects before it touches any memory.
"""

from __future__ import annotations

import ctypes
import os
import re
import stat
from pathlib import Path
from typing import Any

import torch

DTYPES = {
    "float32": torch.float32, "float64": torch.float64, "float16": torch.float16, "bfloat16": torch.bfloat16,
    "int64": torch.int64, "int32": torch.int32, "int16": torch.int16, "int8": torch.int8, "uint8": torch.uint8,
    "bool": torch.bool, "complex64": torch.complex64, "complex128": torch.complex128,
}
_FILE_NAME = re.compile(r"^[A-Za-z0-9_.-]{1,64}$")


def dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).replace("torch.", "")


# ------------------------------------------------------------------------------------ CUDA driver


class _IpcHandle(ctypes.Structure):
    _fields_ = [("reserved", ctypes.c_char * 64)]


_DRIVER: Any = None


def _driver() -> Any:
    global _DRIVER
    if _DRIVER is None:
        _DRIVER = ctypes.CDLL("libcuda.so.1")
    return _DRIVER


def _call(name: str, *args: Any) -> None:
    lib = _driver()
    fn = getattr(lib, f"{name}_v2", None) or getattr(lib, name)
    rc = fn(*args)
    if rc != 0:
        raise RuntimeError(f"{name} failed with CUDA error {rc}")


def address_range(ptr: int) -> tuple[int, int]:
    """(base, size) of the device allocation holding ``ptr``."""
    base, size = ctypes.c_uint64(), ctypes.c_size_t()
    _call("cuMemGetAddressRange", ctypes.byref(base), ctypes.byref(size), ctypes.c_uint64(ptr))
    return base.value, size.value


def ipc_handle(base: int) -> str:
    handle = _IpcHandle()
    _call("cuIpcGetMemHandle", ctypes.byref(handle), ctypes.c_uint64(base))
    # All 64 bytes: reading the char array as a field would stop at its first zero byte.
    return ctypes.string_at(ctypes.addressof(handle), 64).hex()


def ipc_open(handle_hex: str) -> int:
    raw = bytes.fromhex(handle_hex)
    if len(raw) != 64:
        raise ValueError("an IPC handle has 64 bytes")
    handle = _IpcHandle()
    ctypes.memmove(ctypes.addressof(handle), raw, 64)  # into the struct itself (the field reads as a copy)
    ptr = ctypes.c_uint64()
    _call("cuIpcOpenMemHandle", ctypes.byref(ptr), handle, ctypes.c_uint(1))  # CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS
    return ptr.value


def ipc_close(ptr: int) -> None:
    _call("cuIpcCloseMemHandle", ctypes.c_uint64(ptr))


class _DeviceBytes:
    """A raw device range as a uint8 array, for ``torch.as_tensor`` (zero copy, not owned)."""

    def __init__(self, ptr: int, nbytes: int):
        self.__cuda_array_interface__ = {"shape": (nbytes,), "typestr": "|u1", "data": (ptr, False), "version": 3,
                                         "strides": None, "stream": None}


# ------------------------------------------------------------------------------------- the sender


class Exporter:
    """The candidate's side: turns output tensors into refs the judge can read."""

    def __init__(self, folder: Path, device: torch.device, transport: str):
        self.folder, self.device, self.transport = folder, device, transport
        self._buffer: torch.Tensor | None = None  # ipc: kept alive until the next export

    @staticmethod
    def probe(device: torch.device) -> str:
        """'' when CUDA IPC works here (checked before any candidate code), else why not."""
        try:
            probe = torch.empty(1 << 20, dtype=torch.uint8, device=device)
            base, _ = address_range(probe.data_ptr())
            ipc_handle(base)
            del probe
            return ""
        except Exception as exc:  # no driver API, no IPC support (e.g. some sandboxed drivers)
            return f"{type(exc).__name__}: {exc}"

    def export(self, tensors: list[torch.Tensor], tag: str) -> list[dict[str, Any]]:
        """Refs to ``tensors``, valid until the next export."""
        return self.export_groups({tag: tensors})[tag]

    def export_groups(self, groups: dict[str, list[torch.Tensor]]) -> dict[str, list[dict[str, Any]]]:
        """Refs to several outputs at once (the spot-checked timed calls), all valid until the next export.

        One export call per group would not do over IPC: each call releases the previous call's buffer, and
        the caching allocator hands the same memory to the next one, so an earlier ref would read a later
        group's values."""
        groups = {tag: [t.detach().contiguous() for t in tensors] for tag, tensors in groups.items()}
        if self.transport == "ipc":
            flat = [t for tensors in groups.values() for t in tensors]
            refs = iter(self._export_ipc(flat))
            return {tag: [next(refs) for _ in tensors] for tag, tensors in groups.items()}
        return {tag: [self._export_file(t, f"{tag}_{j}.bin") for j, t in enumerate(tensors)] for tag, tensors in groups.items()}

    def _export_file(self, t: torch.Tensor, name: str) -> dict[str, Any]:
        raw = t.reshape(-1).view(torch.uint8) if t.numel() else torch.empty(0, dtype=torch.uint8)
        raw.cpu().numpy().tofile(self.folder / name)
        return {"kind": "file", "name": name, "dtype": dtype_name(t.dtype), "shape": list(t.shape),
                "nbytes": t.numel() * t.element_size()}

    def _export_ipc(self, tensors: list[torch.Tensor]) -> list[dict[str, Any]]:
        sizes = [t.numel() * t.element_size() for t in tensors]
        offsets, total = [], 0
        for n in sizes:
            offsets.append(total)
            total += (n + 255) // 256 * 256
        self._buffer = None
        buffer = torch.empty(max(total, 256), dtype=torch.uint8, device=self.device)
        for t, off, n in zip(tensors, offsets, sizes):
            if n:
                buffer[off: off + n].copy_(t.reshape(-1).view(torch.uint8))
        torch.cuda.synchronize(self.device)
        base, _ = address_range(buffer.data_ptr())
        handle = ipc_handle(base)
        start = buffer.data_ptr() - base
        self._buffer = buffer
        return [{"kind": "ipc", "handle": handle, "offset": start + off, "dtype": dtype_name(t.dtype), "shape": list(t.shape),
                 "nbytes": n} for t, off, n in zip(tensors, offsets, sizes)]


# ----------------------------------------------------------------------------------- the receiver


def _claimed(ref: Any) -> tuple[str, list[int], int]:
    if not isinstance(ref, dict):
        raise ValueError("an output reference is not an object")
    dtype, shape, nbytes = ref.get("dtype"), ref.get("shape"), ref.get("nbytes")
    if dtype not in DTYPES or not isinstance(shape, list) or not all(isinstance(s, int) and not isinstance(s, bool) and s >= 0 for s in shape):
        raise ValueError("an output reference has no valid dtype and shape")
    numel = 1
    for s in shape:
        numel *= s
    if not isinstance(nbytes, int) or nbytes != numel * torch.empty(0, dtype=DTYPES[dtype]).element_size():
        raise ValueError("an output reference's size does not match its shape")
    return dtype, shape, nbytes


class Importer:
    """The judge's side: reads the refs of one candidate's job. ``close()`` unmaps IPC buffers."""

    def __init__(self, folder: Path, device: torch.device):
        self.folder, self.device = folder, device
        self._mapped: dict[str, int] = {}

    def read(self, ref: Any, expect_dtype: torch.dtype, expect_shape: tuple[int, ...]) -> torch.Tensor | str:
        """The candidate's output as a tensor on the judge's device, or why it cannot be compared."""
        try:
            dtype, shape, nbytes = _claimed(ref)
        except ValueError as exc:
            return str(exc)
        if DTYPES[dtype] != expect_dtype:
            return f"has dtype {dtype}, expected {dtype_name(expect_dtype)}"
        if tuple(shape) != tuple(expect_shape):
            return f"has shape {tuple(shape)}, expected {tuple(expect_shape)}"
        if nbytes == 0:
            return torch.empty(expect_shape, dtype=expect_dtype, device=self.device)
        kind = ref.get("kind")
        if kind == "file":
            raw = self._read_file(ref.get("name"), nbytes)
        elif kind == "ipc" and self.device.type == "cuda":
            raw = self._read_ipc(ref, nbytes)
        else:
            return "an output reference of an unknown kind"
        if isinstance(raw, str):
            return raw
        return raw.view(expect_dtype).reshape(expect_shape)

    def _read_file(self, name: Any, nbytes: int) -> torch.Tensor | str:
        if not isinstance(name, str) or not _FILE_NAME.match(name):
            return "an output file name is not allowed"
        try:
            fd = os.open(self.folder / name, os.O_RDONLY | os.O_NOFOLLOW)
        except OSError as exc:
            return f"its output file could not be opened ({exc.strerror})"
        try:
            info = os.fstat(fd)
            if not stat.S_ISREG(info.st_mode) or info.st_size != nbytes:
                return "its output file is not a regular file of the announced size"
            with os.fdopen(fd, "rb", closefd=False) as handle:
                data = bytearray(handle.read(nbytes))
        finally:
            os.close(fd)
        if len(data) != nbytes:
            return "its output file is shorter than announced"
        return torch.frombuffer(data, dtype=torch.uint8).to(self.device)

    def _read_ipc(self, ref: dict[str, Any], nbytes: int) -> torch.Tensor | str:
        handle, offset = ref.get("handle"), ref.get("offset")
        if not isinstance(handle, str) or not re.fullmatch(r"[0-9a-f]{128}", handle) or not isinstance(offset, int) or offset < 0:
            return "an output reference has no valid IPC handle"
        try:
            if handle not in self._mapped:
                self._mapped[handle] = ipc_open(handle)
            base = self._mapped[handle]
            _, size = address_range(base)
        except (RuntimeError, OSError, ValueError) as exc:
            return f"its output buffer could not be mapped ({exc})"
        if offset + nbytes > size:
            return "an output reference points outside its buffer"
        return torch.as_tensor(_DeviceBytes(base + offset, nbytes), device=self.device)

    def close(self) -> None:
        if self.device.type == "cuda" and self._mapped:
            torch.cuda.synchronize(self.device)
        for ptr in self._mapped.values():
            try:
                ipc_close(ptr)
            except (RuntimeError, OSError):
                pass
        self._mapped.clear()
