"""CUDA IPC and dtype helpers for the channel (channel.py): the candidate's process exports one device buffer, the
judge maps it. Plain ctypes over the driver API (libcuda), so no extension is built for it.
"""

from __future__ import annotations

import ctypes
from typing import Any

import torch

DTYPES = {
    "float32": torch.float32, "float64": torch.float64, "float16": torch.float16, "bfloat16": torch.bfloat16,
    "int64": torch.int64, "int32": torch.int32, "int16": torch.int16, "int8": torch.int8, "uint8": torch.uint8,
    "bool": torch.bool, "complex64": torch.complex64, "complex128": torch.complex128,
}


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


def device_bytes(ptr: int, nbytes: int) -> _DeviceBytes:
    """``nbytes`` of device memory at ``ptr``, for ``torch.as_tensor(..., device=...)``."""
    return _DeviceBytes(ptr, nbytes)


def ipc_probe(device: torch.device) -> str:
    """'' when CUDA IPC works here (checked before any candidate code), else why not."""
    try:
        probe = torch.empty(1 << 20, dtype=torch.uint8, device=device)
        base, _ = address_range(probe.data_ptr())
        ipc_handle(base)
        del probe
        return ""
    except Exception as exc:  # no driver API, no IPC support (e.g. some sandboxed drivers)
        return f"{type(exc).__name__}: {exc}"
