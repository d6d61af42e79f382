"""The channel: the one buffer through which the judge hands a call its inputs and takes its outputs.

Why it exists: the candidate's process runs native code that can rewrite anything in that process, the
harness's own Python included. So nothing that process does between calls may decide how a call is
checked. The judge (a process where no candidate code runs) therefore

- writes each call's inputs, drawn from a fresh secret seed, into the channel just before the call's begin
  mark is answered, so no output can be computed before the call starts;
- copies the outputs out of the channel itself when the call's end mark arrives, so nothing the candidate's
  process copies or converts afterwards is on the way. The copy follows the mark by the time the evaluator takes
  to react, and a process that works on after its end mark can still land outputs in it; the evaluator stamps the
  call's end only when the copy is done, so such work stays inside the call's window and is scored
  (verdict.clock_ms);
- decides which calls to compare only inside its own memory (``judge.py``), so nothing in the candidate's
  process knows which calls are checked.

Two kinds, chosen per job before any candidate code exists:
- ``file``: a file in the job's folder, mapped shared by the candidate's process and the judge (the cpu backend,
  and cuda where IPC is unavailable: then the harness stages inputs to the device and outputs back inside the
  timed window, and both sides pay that copy in the calibration too);
- ``ipc`` (cuda): one device buffer the candidate's process allocates and exports as a CUDA IPC handle; the judge
  maps it and writes and reads it on the GPU. Only that buffer is shared: nothing of the judge is ever exported.

The layout (``Layout``) comes from the judge's own run of the task: each input is a tensor (dtype, shape) or a
plain value, each output a tensor. Tensors sit at 256-byte aligned offsets, inputs first.
"""

from __future__ import annotations

import math
import mmap
import os
import stat
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from kevin.evaluation.transfer import DTYPES, address_range, dtype_name, ipc_handle, ipc_open, ipc_close, device_bytes

ALIGN = 256
MAX_CHANNEL_BYTES = 1 << 36
FILE_NAME = "channel.bin"


@dataclass(frozen=True)
class TensorSpec:
    dtype: str
    shape: tuple[int, ...]

    @property
    def nbytes(self) -> int:
        return math.prod(self.shape) * torch.empty(0, dtype=DTYPES[self.dtype]).element_size()

    def to_dict(self) -> dict[str, Any]:
        return {"dtype": self.dtype, "shape": list(self.shape)}

    @classmethod
    def of(cls, t: torch.Tensor) -> "TensorSpec":
        return cls(dtype_name(t.dtype), tuple(int(s) for s in t.shape))

    @classmethod
    def from_dict(cls, d: Any) -> "TensorSpec":
        if not isinstance(d, dict) or d.get("dtype") not in DTYPES or not isinstance(d.get("shape"), list):
            raise ValueError("a tensor spec needs a known dtype and a shape")
        shape = d["shape"]
        if not all(isinstance(s, int) and not isinstance(s, bool) and 0 <= s < 1 << 40 for s in shape) or len(shape) > 16:
            raise ValueError("a tensor spec's shape must be a list of sizes")
        return cls(d["dtype"], tuple(shape))


def _json_value(value: Any) -> bool:
    if value is None or isinstance(value, (bool, int, float, str)):
        return True
    if isinstance(value, (list, tuple)):
        return all(_json_value(v) for v in value)
    return False


@dataclass(frozen=True)
class Layout:
    """What goes through the channel: the inputs (a ``TensorSpec`` or a plain value each) and the outputs."""

    inputs: tuple[TensorSpec | Any, ...]
    outputs: tuple[TensorSpec, ...]

    @classmethod
    def of(cls, inputs: list[Any], outputs: list[Any]) -> "Layout":
        """The layout of a task's inputs and its reference's outputs (ValueError for what a channel cannot carry)."""
        ins: list[Any] = []
        for j, x in enumerate(inputs):
            if isinstance(x, torch.Tensor):
                ins.append(TensorSpec.of(x))
            elif _json_value(x):
                ins.append(tuple(x) if isinstance(x, list) else x)
            else:
                raise ValueError(f"input {j} is a {type(x).__name__}: only tensors and plain values can be handed over")
        outs = []
        for j, y in enumerate(outputs):
            if not isinstance(y, torch.Tensor):
                raise ValueError(f"the reference's output {j} is a {type(y).__name__}, not a tensor")
            outs.append(TensorSpec.of(y))
        return cls(tuple(ins), tuple(outs))

    def to_dict(self) -> dict[str, Any]:
        return {"inputs": [{"tensor": x.to_dict()} if isinstance(x, TensorSpec) else {"value": x} for x in self.inputs],
                "outputs": [y.to_dict() for y in self.outputs]}

    @classmethod
    def from_dict(cls, d: Any) -> "Layout":
        if not isinstance(d, dict) or not isinstance(d.get("inputs"), list) or not isinstance(d.get("outputs"), list):
            raise ValueError("a layout has inputs and outputs")
        ins: list[Any] = []
        for item in d["inputs"][:256]:
            if isinstance(item, dict) and "tensor" in item:
                ins.append(TensorSpec.from_dict(item["tensor"]))
            elif isinstance(item, dict) and "value" in item and _json_value(item["value"]):
                ins.append(tuple(item["value"]) if isinstance(item["value"], list) else item["value"])
            else:
                raise ValueError("an input is neither a tensor nor a plain value")
        layout = cls(tuple(ins), tuple(TensorSpec.from_dict(y) for y in d["outputs"][:256]))
        if layout.total_bytes > MAX_CHANNEL_BYTES:
            raise ValueError("the channel would be too large")
        return layout

    def offsets(self) -> tuple[list[int | None], list[int], int]:
        """(offset of each input, None for plain values; offset of each output; total bytes)."""
        total, ins, outs = 0, [], []
        for x in self.inputs:
            if isinstance(x, TensorSpec):
                ins.append(total)
                total += -(-x.nbytes // ALIGN) * ALIGN
            else:
                ins.append(None)
        for y in self.outputs:
            outs.append(total)
            total += -(-y.nbytes // ALIGN) * ALIGN
        return ins, outs, max(total, ALIGN)

    @property
    def total_bytes(self) -> int:
        return self.offsets()[2]


def _views(raw: torch.Tensor, layout: Layout) -> tuple[list[Any], list[torch.Tensor]]:
    """Typed views of a flat uint8 buffer: (the inputs, plain values in place; the outputs)."""
    in_offsets, out_offsets, _ = layout.offsets()

    def view(spec: TensorSpec, offset: int) -> torch.Tensor:
        return raw[offset: offset + spec.nbytes].view(DTYPES[spec.dtype]).view(spec.shape)

    inputs = [view(x, off) if isinstance(x, TensorSpec) else (list(x) if isinstance(x, tuple) else x)
              for x, off in zip(layout.inputs, in_offsets)]
    return inputs, [view(y, off) for y, off in zip(layout.outputs, out_offsets)]


def _map_file(fd: int, size: int) -> tuple[mmap.mmap, torch.Tensor]:
    mm = mmap.mmap(fd, size, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
    return mm, torch.frombuffer(mm, dtype=torch.uint8, count=size)


# ------------------------------------------------------------------------------ the candidate's side


class HarnessChannel:
    """The candidate process's end: the input tensors a call receives and where its outputs go."""

    def __init__(self, layout: Layout, device: torch.device, kind: str, folder: Path):
        self.layout, self.device, self.kind = layout, device, kind
        size = layout.total_bytes
        self._mm: mmap.mmap | None = None
        if kind == "ipc":
            raw = torch.zeros(size, dtype=torch.uint8, device=device)
            torch.cuda.synchronize(device)
            base, _ = address_range(raw.data_ptr())
            self.describe = {"kind": "ipc", "handle": ipc_handle(base), "offset": raw.data_ptr() - base, "size": size}
            self.inputs, self._outputs = _views(raw, layout)
            self._host_inputs: list[Any] = []
            self._host_outputs: list[torch.Tensor] = []
        elif kind == "file":
            path = folder / FILE_NAME
            fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
            try:
                os.ftruncate(fd, size)
                self._mm, raw = _map_file(fd, size)
            finally:
                os.close(fd)
            self.describe = {"kind": "file", "name": FILE_NAME, "size": size}
            host_inputs, host_outputs = _views(raw, layout)
            if device.type == "cpu":
                self.inputs, self._outputs = host_inputs, host_outputs
                self._host_inputs, self._host_outputs = [], []
            else:  # staged: device copies of the inputs, filled inside the timed window
                self._host_inputs, self._host_outputs = host_inputs, host_outputs
                self.inputs = [torch.empty_like(x, device=device) if isinstance(x, torch.Tensor) else x for x in host_inputs]
                self._outputs = [torch.empty(y.shape, dtype=y.dtype, device=device) for y in host_outputs]
        else:
            raise ValueError(f"unknown channel kind {kind!r}")
        self._raw = raw

    def stage_in(self) -> None:
        """A file channel on a GPU: this call's inputs from the shared file to the device (inside the window)."""
        for dst, src in zip(self.inputs, self._host_inputs):
            if isinstance(dst, torch.Tensor):
                dst.copy_(src)

    def put(self, outputs: list[torch.Tensor]) -> str:
        """Copy a call's outputs into the channel and wait for the copy; '' or why they do not fit the layout."""
        if len(outputs) != len(self._outputs):
            return f"returned {len(outputs)} outputs, expected {len(self._outputs)}"
        for j, (got, slot) in enumerate(zip(outputs, self._outputs)):
            if got.dtype != slot.dtype:
                return f"output {j} has dtype {dtype_name(got.dtype)}, expected {dtype_name(slot.dtype)}"
            if tuple(got.shape) != tuple(slot.shape):
                return f"output {j} has shape {tuple(got.shape)}, expected {tuple(slot.shape)}"
            slot.copy_(got)
        for src, dst in zip(self._outputs, self._host_outputs):
            dst.copy_(src)
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        return ""


# ------------------------------------------------------------------------------------ the judge's side


class JudgeChannel:
    """The judge's end of one job's channel: it writes inputs and copies outputs out; it never runs candidate code."""

    def __init__(self, describe: Any, folder: Path, layout: Layout, device: torch.device):
        self.layout, self.device = layout, device
        size = layout.total_bytes
        self._mm: mmap.mmap | None = None
        self._ipc: int | None = None
        if not isinstance(describe, dict) or describe.get("size") != size:
            raise ValueError("the channel's size does not match its layout")
        kind = describe.get("kind")
        if kind == "file":
            if describe.get("name") != FILE_NAME:
                raise ValueError("the channel file has another name")
            fd = os.open(folder / FILE_NAME, os.O_RDWR | os.O_NOFOLLOW)
            try:
                info = os.fstat(fd)
                if not stat.S_ISREG(info.st_mode) or info.st_size != size:
                    raise ValueError("the channel is not a regular file of its announced size")
                self._mm, raw = _map_file(fd, size)
            finally:
                os.close(fd)
        elif kind == "ipc" and device.type == "cuda":
            handle, offset = describe.get("handle"), describe.get("offset")
            if not isinstance(handle, str) or len(handle) != 128 or not isinstance(offset, int) or isinstance(offset, bool) \
                    or offset < 0:
                raise ValueError("the channel has no valid IPC handle")
            self._ipc = ipc_open(handle)
            _, mapped = address_range(self._ipc)
            if offset + size > mapped:
                raise ValueError("the channel reaches outside its buffer")
            raw = torch.as_tensor(device_bytes(self._ipc + offset, size), device=device)
        else:
            raise ValueError(f"unknown channel kind {kind!r}")
        self.inputs, self.outputs = _views(raw, layout)

    def write_inputs(self, values: list[Any]) -> None:
        """This call's inputs into the channel (they must have the layout's shapes and plain values)."""
        if len(values) != len(self.inputs):
            raise ValueError(f"the task gave {len(values)} inputs, its layout has {len(self.inputs)}")
        for j, (slot, value) in enumerate(zip(self.inputs, values)):
            if isinstance(slot, torch.Tensor):
                if not isinstance(value, torch.Tensor) or TensorSpec.of(value) != TensorSpec.of(slot):
                    raise ValueError(f"the task's input {j} changed shape or dtype between seeds")
                slot.copy_(value)
            elif value != slot and not (isinstance(value, tuple) and list(value) == slot):
                raise ValueError(f"the task's input {j} (a plain value) changed between seeds")

    def inputs_equal(self, values: list[Any]) -> bool:
        """Whether the channel's inputs still hold ``values`` bit for bit (the call did not write its inputs)."""
        for slot, value in zip(self.inputs, values):
            if isinstance(slot, torch.Tensor) and slot.numel():
                a = slot.reshape(-1).view(torch.uint8)
                b = value.to(slot.device).reshape(-1).view(torch.uint8)
                if not torch.equal(a, b):
                    return False
        return True

    def copy_outputs(self, into: list[torch.Tensor]) -> None:
        """The outputs as the channel holds them now, into judge-owned tensors (waits for the copy)."""
        for dst, src in zip(into, self.outputs):
            dst.copy_(src)
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)

    def close(self) -> None:
        self.inputs, self.outputs = [], []
        if self._ipc is not None:
            if self.device.type == "cuda":
                torch.cuda.synchronize(self.device)
            try:
                ipc_close(self._ipc)
            except (RuntimeError, OSError):
                pass
            self._ipc = None
        if self._mm is not None:
            try:
                self._mm.close()
            except BufferError:  # a view is still alive somewhere: the mapping goes with the process
                pass
            self._mm = None
