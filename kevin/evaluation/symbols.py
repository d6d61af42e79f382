"""What a candidate's compiled library may call: its undefined symbols and needed libraries, read from the
ELF file by the trusted evaluator before anything loads it.

Static rules read the candidate's text, and text can hide a call: macros, token pasting
(``J(Py,Object)``), ``using namespace at;``. The linker cannot be fooled that way: every function the
library calls outside itself is an undefined symbol in its dynamic symbol table, under its real name.
Our build (``builder.py``) links no Python binding, so a Python C API symbol, a thread or process
call, a library GEMM or an ATen compute operator in that table is the candidate's own doing.

What this does not see: code that finds functions without naming them (scanning memory for a symbol
table, raw system calls from inline assembly). Those run inside the candidate's own sandboxed process,
where the verdict is not decided (judge.py), and the seccomp filter and run-time checks still apply.

The reader is plain Python over the ELF64 format (no binutils, nothing executed), bounded in what it reads.
"""

from __future__ import annotations

import re
import struct
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable

from kevin.evaluation.rules import RuleHit

_SHT_SYMTAB, _SHT_DYNAMIC, _SHT_DYNSYM = 2, 6, 11
_DT_NEEDED = 1
MAX_LIBRARY_BYTES = 1 << 30
MAX_SYMBOLS = 2_000_000


@dataclass
class ElfSymbols:
    """The parts of a shared library or object file that say what it calls."""

    undefined: list[str] = field(default_factory=list)
    """Names the file uses but does not define (resolved against other libraries when it is loaded)."""
    needed: list[str] = field(default_factory=list)
    """DT_NEEDED entries: the libraries loading it pulls in."""


def _cstr(table: bytes, offset: int) -> str:
    if offset >= len(table):
        raise ValueError("string offset outside its table")
    end = table.find(b"\0", offset)
    return table[offset: end if end >= 0 else len(table)].decode("utf-8", "replace")


def read_elf_symbols(path: str | Path) -> ElfSymbols:
    """Undefined symbols and needed libraries of an ELF64 little-endian file; ValueError if it is not one."""
    data = Path(path).read_bytes()
    if len(data) > MAX_LIBRARY_BYTES:
        raise ValueError(f"{Path(path).name}: larger than {MAX_LIBRARY_BYTES >> 20} MiB")
    if data[:4] != b"\x7fELF" or len(data) < 64 or data[4] != 2 or data[5] != 1:
        raise ValueError(f"{Path(path).name}: not a 64-bit little-endian ELF file")
    shoff, = struct.unpack_from("<Q", data, 0x28)
    shentsize, shnum, _ = struct.unpack_from("<HHH", data, 0x3A)
    if shentsize < 64 or shoff + shnum * shentsize > len(data):
        raise ValueError(f"{Path(path).name}: section headers outside the file")
    sections = []
    for i in range(shnum):
        _, sh_type, _, _, offset, size, link, _, _, entsize = struct.unpack_from("<IIQQQQIIQQ", data, shoff + i * shentsize)
        if offset + size > len(data) and sh_type != 8:  # SHT_NOBITS (.bss) occupies no file bytes
            raise ValueError(f"{Path(path).name}: a section lies outside the file")
        sections.append((sh_type, offset, size, link, entsize))

    def strtab(index: int) -> bytes:
        if index >= len(sections):
            raise ValueError("string table index out of range")
        _, offset, size, _, _ = sections[index]
        return data[offset: offset + size]

    out = ElfSymbols()
    seen: set[str] = set()
    for sh_type, offset, size, link, entsize in sections:
        if sh_type in (_SHT_SYMTAB, _SHT_DYNSYM):
            names = strtab(link)
            count = size // 24
            if count > MAX_SYMBOLS:
                raise ValueError("too many symbols")
            for j in range(count):
                st_name, _, _, st_shndx, _, _ = struct.unpack_from("<IBBHQQ", data, offset + j * 24)
                if st_shndx == 0 and st_name:
                    name = _cstr(names, st_name)
                    if name not in seen:
                        seen.add(name)
                        out.undefined.append(name)
        elif sh_type == _SHT_DYNAMIC:
            names = strtab(link)
            for j in range(size // 16):
                tag, value = struct.unpack_from("<qQ", data, offset + j * 16)
                if tag == 0:
                    break
                if tag == _DT_NEEDED:
                    out.needed.append(_cstr(names, value))
    return out


_ATEN_OP = re.compile(r"^_ZN2at4_ops(\d+)")


def aten_op_of(symbol: str) -> str | None:
    """``at::_ops::<op>::call`` (mangled) -> ``<op>`` (with its overload suffix), else None."""
    match = _ATEN_OP.match(symbol)
    if not match:
        return None
    length = int(match.group(1))
    start = match.end()
    return symbol[start: start + length] or None


# Overload suffixes of allowed operators (``empty_memory_format``, ``to_dtype``, ``select_int`` ...). Only these
# count: ``select_scatter`` or ``to_padded_tensor`` are other operators, and compute.
_OVERLOADS = {"memory_format", "names", "dtype", "device", "dtype_layout", "other", "int", "dim", "dims", "out",
              "symint", "using_ints", "self", "src", "float", "default", "generator"}


def _op_allowed(op: str, allowed: set[str]) -> bool:
    """Whether ``op`` (an ATen operator name with its overload suffix) is an allowed operator."""
    if op in allowed:
        return True
    for base in allowed:
        if op.startswith(base + "_"):
            suffix = op[len(base) + 1:]
            if suffix in _OVERLOADS or suffix[:1].isupper():
                return True
    return False


def symbol_hits(info: ElfSymbols, rule: dict[str, Any], allowed_ops: Iterable[str], filename: str,
                calls: bool = True) -> list[RuleHit]:
    """Rule hits (rule ``native_symbols``) for a file's undefined symbols (``calls``) and needed libraries."""
    if not rule.get("enabled", True):
        return []
    forbidden = [(re.compile(p["pattern"]), p["what"]) for p in rule["forbidden_symbols"]]
    allowed_needed = [re.compile(p) for p in rule["allowed_libraries"]]
    allowed = {op.split("::", 1)[-1] for op in allowed_ops}
    hits: list[RuleHit] = []
    for name in info.undefined if calls else []:
        op = aten_op_of(name)
        if op is not None and not _op_allowed(op, allowed):
            hits.append(RuleHit("native_symbols", f"{filename} calls the PyTorch operator aten::{op} (PyTorch compute)"))
            continue
        for pattern, what in forbidden:
            if pattern.search(name):
                hits.append(RuleHit("native_symbols", f"{filename} calls {demangle(name)} ({what})"))
                break
    for lib in info.needed:
        if not any(p.match(lib) for p in allowed_needed):
            hits.append(RuleHit("native_symbols", f"{filename} links {lib}, which is not on the allowed list"))
    return hits


def demangle(name: str) -> str:
    """A readable form of a C++ symbol for messages (the mangled name if c++filt is missing)."""
    if not name.startswith("_Z"):
        return name
    import shutil
    import subprocess

    tool = shutil.which("c++filt")
    if not tool:
        return name
    try:
        out = subprocess.run([tool, name], capture_output=True, text=True, timeout=5).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return name
    return out[:200] or name


def library_hits(folder: Path, rule: dict[str, Any], allowed_ops: Iterable[str]) -> list[RuleHit]:
    """Hits for everything a compile job left in ``folder`` (its staging folder): the calls of every object file
    (the candidate's own translation units and our registration), and the libraries each shared library needs.

    A shared library's own calls are not held against the candidate: the link may add the toolkit's code
    (e.g. a static CUDA runtime, which loads the driver with dlopen), and the object files are exactly what
    was compiled from the candidate's sources."""
    hits: list[RuleHit] = []
    for path in sorted(folder.rglob("*")):
        if path.is_symlink():
            hits.append(RuleHit("native_symbols", f"{path.name}: build outputs may not be symbolic links"))
            continue
        if not path.is_file() or path.suffix not in (".so", ".o"):
            continue
        try:
            info = read_elf_symbols(path)
        except (ValueError, OSError, struct.error) as exc:
            hits.append(RuleHit("native_symbols", f"{path.name}: unreadable library ({exc})"))
            continue
        hits.extend(symbol_hits(info, rule, allowed_ops, path.name, calls=path.suffix == ".o"))
    if not any(p.suffix == ".o" for p in folder.rglob("*.o")) and any(p.suffix == ".so" for p in folder.rglob("*.so")):
        hits.append(RuleHit("native_symbols", "a library was left without the object files it was linked from"))
    return hits
