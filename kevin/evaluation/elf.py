"""The symbol tables of the candidate's compiled files, read by the trusted evaluator before anything loads them:
what an ELF object file or library calls and defines, the libraries it needs, its executable sections; the
qualified C++ name a mangled symbol stands for; and every name the C/C++ runtime libraries export. Reading only:
what is allowed is judged in ``symbols.py``.

The ELF reader is plain Python (no binutils, nothing executed), bounded in what it reads.
"""

from __future__ import annotations

import os
import re
import struct
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path

_SHT_PROGBITS, _SHT_SYMTAB, _SHT_DYNAMIC, _SHT_NOBITS, _SHT_DYNSYM = 1, 2, 6, 8, 11
_SHF_EXECINSTR = 0x4
_DT_NEEDED = 1
_STB_GLOBAL, _STB_WEAK, _STB_GNU_UNIQUE = 1, 2, 10
_STT_FUNC = 2
MAX_LIBRARY_BYTES = 1 << 30
MAX_SYMBOLS = 2_000_000


@dataclass
class ElfSymbols:
    """The parts of a shared library or object file that say what it calls and holds."""

    undefined: list[str] = field(default_factory=list)
    """Names the file uses but does not define (resolved against other libraries when it is loaded)."""
    needed: list[str] = field(default_factory=list)
    """DT_NEEDED entries: the libraries loading it pulls in."""
    defined: list[str] = field(default_factory=list)
    """Global and weak names the file defines (another object of the same build may call them)."""
    strong: list[str] = field(default_factory=list)
    """The global (not weak) ones: the file's own functions and data, not inline code of headers it included."""
    machine: int = 0
    """e_machine (62: x86-64, 183: AArch64)."""
    code: list[tuple[str, int, bytes, list[int]]] = field(default_factory=list)
    """Executable sections: (name, address, bytes, offsets of the functions that start in it)."""


def _cstr(table: bytes, offset: int) -> str:
    if offset >= len(table):
        raise ValueError("string offset outside its table")
    end = table.find(b"\0", offset)
    return table[offset: end if end >= 0 else len(table)].decode("utf-8", "replace")


def read_elf_symbols(path: str | Path, code: bool = False) -> ElfSymbols:
    """Undefined and defined symbols, needed libraries and (``code``) the executable sections of an ELF64
    little-endian file; ValueError if it is not one."""
    data = Path(path).read_bytes()
    name = Path(path).name
    if len(data) > MAX_LIBRARY_BYTES:
        raise ValueError(f"{name}: larger than {MAX_LIBRARY_BYTES >> 20} MiB")
    if data[:4] != b"\x7fELF" or len(data) < 64 or data[4] != 2 or data[5] != 1:
        raise ValueError(f"{name}: not a 64-bit little-endian ELF file")
    machine, = struct.unpack_from("<H", data, 0x12)
    sections, shstrndx = _section_headers(data, name)
    out = ElfSymbols(machine=machine)
    functions: dict[int, list[int]] | None = {} if code else None
    for sh_type, offset, size, link, _, _, _ in sections:
        if sh_type in (_SHT_SYMTAB, _SHT_DYNSYM):
            _read_symbol_table(data, (offset, size), _string_table(data, sections, link), out, functions, len(sections))
        elif sh_type == _SHT_DYNAMIC:
            _read_needed(data, (offset, size), _string_table(data, sections, link), out)
    if functions is not None:
        section_names = _string_table(data, sections, shstrndx) if shstrndx < len(sections) else b""
        _read_code(data, sections, section_names, functions, out)
    return out


# (type, offset, size, link, flags, address, name offset) of one section header.
_Section = tuple[int, int, int, int, int, int, int]


def _section_headers(data: bytes, name: str) -> tuple[list[_Section], int]:
    """The section headers, and the index of the section holding their names; ValueError when a header or a
    section lies outside the file."""
    shoff, = struct.unpack_from("<Q", data, 0x28)
    shentsize, shnum, shstrndx = struct.unpack_from("<HHH", data, 0x3A)
    if shentsize < 64 or shoff + shnum * shentsize > len(data):
        raise ValueError(f"{name}: section headers outside the file")
    sections = []
    for i in range(shnum):
        header = struct.unpack_from("<IIQQQQIIQQ", data, shoff + i * shentsize)
        sh_name, sh_type, flags, addr, offset, size, link, _, _, _ = header
        if offset + size > len(data) and sh_type != _SHT_NOBITS:  # .bss occupies no file bytes
            raise ValueError(f"{name}: a section lies outside the file")
        sections.append((sh_type, offset, size, link, flags, addr, sh_name))
    return sections, shstrndx


def _string_table(data: bytes, sections: list[_Section], index: int) -> bytes:
    if index >= len(sections):
        raise ValueError("string table index out of range")
    _, offset, size, _, _, _, _ = sections[index]
    return data[offset: offset + size]


def _read_symbol_table(data: bytes, span: tuple[int, int], names: bytes, out: ElfSymbols,
                       functions: dict[int, list[int]] | None, section_count: int) -> None:
    """Add one symbol table's undefined names (each once over all tables) and defined names to ``out``;
    ``functions`` (when reading code): the values of the functions, by the index of their section."""
    offset, size = span
    count = size // 24
    if count > MAX_SYMBOLS:
        raise ValueError("too many symbols")
    seen = set(out.undefined)
    for j in range(count):
        st_name, st_info, _, st_shndx, st_value, _ = struct.unpack_from("<IBBHQQ", data, offset + j * 24)
        if not st_name:
            continue
        if st_shndx == 0:
            symbol = _cstr(names, st_name)
            if symbol not in seen:
                seen.add(symbol)
                out.undefined.append(symbol)
        elif st_info >> 4 in (_STB_GLOBAL, _STB_WEAK, _STB_GNU_UNIQUE):
            out.defined.append(_cstr(names, st_name))
            if st_info >> 4 == _STB_GLOBAL:
                out.strong.append(out.defined[-1])
        if functions is not None and st_info & 0xF == _STT_FUNC and 0 < st_shndx < section_count:
            functions.setdefault(st_shndx, []).append(st_value)


def _read_needed(data: bytes, span: tuple[int, int], names: bytes, out: ElfSymbols) -> None:
    """Add the DT_NEEDED entries of the dynamic section to ``out``."""
    offset, size = span
    for j in range(size // 16):
        tag, value = struct.unpack_from("<qQ", data, offset + j * 16)
        if tag == 0:
            break
        if tag == _DT_NEEDED:
            out.needed.append(_cstr(names, value))


def _read_code(data: bytes, sections: list[_Section], section_names: bytes, functions: dict[int, list[int]],
               out: ElfSymbols) -> None:
    """Add the executable sections to ``out``, each with the offsets of the functions that start in it."""
    for index, (sh_type, offset, size, _, flags, addr, sh_name) in enumerate(sections):
        if sh_type == _SHT_PROGBITS and flags & _SHF_EXECINSTR and size:
            label = _cstr(section_names, sh_name) if sh_name < len(section_names) else f"section {index}"
            # In an object file a function's value is its offset in the section; in a library, its address.
            starts = sorted({v - addr if v >= addr else v for v in functions.get(index, [])})
            out.code.append((label, addr, data[offset: offset + size], [s for s in starts if 0 <= s < size]))


# ------------------------------------------------------------------------------------ mangled names

_SPECIAL = {"Sa": "std::allocator", "Sb": "std::basic_string", "Ss": "std::string", "Si": "std::istream",
            "So": "std::ostream", "Sd": "std::iostream"}
_SOURCE_NAME = re.compile(r"(\d+)")


def mangled_scope(symbol: str) -> str | None:
    """The qualified name of a C++ symbol without its parameters or template arguments, read from the mangled
    name (``_ZN3c106detail14torchCheckFailEPKc...`` -> ``c10::detail::torchCheckFail``; a vtable or typeinfo
    gives its class, a thread-local wrapper its variable, a local static its function). None when ``symbol`` is
    not a mangled name this reader knows (then it is judged as a plain name)."""
    if not symbol.startswith("_Z"):
        return None
    rest = symbol[2:]
    for _ in range(4):  # special names wrap another name: vtables, thunks, guard variables, local entities
        if rest[:2] in ("TV", "TI", "TS", "TT", "TW", "TH", "GV", "GR"):
            rest = rest[2:]
        elif rest[:2] in ("Th", "Tv"):
            match = re.match(r"T[hv](?:n?\d+_){1,2}", rest)
            if not match:
                return None
            rest = rest[match.end():]
        elif rest[:1] == "Z":  # a local entity: judged by the function it belongs to
            rest = rest[1:]
        elif rest[:1] == "L":  # internal linkage
            rest = rest[1:]
        else:
            break
    parts: list[str] = []
    nested = rest.startswith("N")
    pos = 1 if nested else 0
    if nested:
        while pos < len(rest) and rest[pos] in "rVKRO":  # cv- and ref-qualifiers of a member function
            pos += 1
    while pos < len(rest):
        two = rest[pos:pos + 2]
        if rest[pos].isdigit():
            match = _SOURCE_NAME.match(rest, pos)
            length = int(match.group(1))
            start = match.end()
            if length <= 0 or start + length > len(rest):
                return None
            ident = rest[start:start + length]
            parts.append("(anonymous namespace)" if ident.startswith("_GLOBAL__N") else ident)
            pos = start + length
            while rest[pos:pos + 1] == "B":  # ABI tags ([abi:cxx11]) belong to the name before them
                match = _SOURCE_NAME.match(rest, pos + 1)
                if not match:
                    return None
                pos = match.end() + int(match.group(1))
            if not nested:
                break
        elif two == "St" and not parts:
            parts.append("std")
            pos += 2
        elif two in _SPECIAL and not parts:
            parts.extend(_SPECIAL[two].split("::"))
            pos += 2
        elif len(two) == 2 and two.isalpha() and two.islower() and two not in ("cv", "li") and parts:
            parts.append(f"operator{two}")  # an operator's code (ls: <<, eq: ==, ...): it ends the name
            break
        else:
            break  # template arguments, constructors, destructors, substitutions: the scope is read
    return "::".join(parts) if parts else None


# ----------------------------------------------------------------------------------- runtime exports

_RUNTIME_LIBRARIES = ("libc.so.6", "libm.so.6", "libmvec.so.1", "libstdc++.so.6", "libgcc_s.so.1", "libgomp")
"""The C/C++ and OpenMP runtime: what every library may call, once the forbidden classes are taken out."""
_REQUIRED = ("libc.so.6", "libm.so.6", "libstdc++.so.6", "libgcc_s.so.1")


def _loaded_libraries() -> dict[str, str]:
    """basename -> path of the shared libraries mapped into this (the evaluator's) process."""
    found: dict[str, str] = {}
    try:
        with open("/proc/self/maps") as maps:
            for line in maps:
                path = line.split(maxsplit=5)[-1].strip()
                if path.startswith("/") and ".so" in path:
                    found.setdefault(os.path.basename(path), path)
    except OSError:
        pass
    return found


def _library_paths() -> dict[str, str]:
    """The runtime libraries' files: the copies this process has loaded (torch loads them all but libmvec),
    else where the C compiler finds them, else torch's own libgomp."""
    import shutil
    import subprocess

    loaded = _loaded_libraries()
    paths: dict[str, str] = {}
    for name in _RUNTIME_LIBRARIES:
        match = next((p for base, p in loaded.items()
                      if base == name or (name == "libgomp" and base.startswith("libgomp"))), None)
        if match is None:
            wanted = "libgomp.so.1" if name == "libgomp" else name
            compiler = shutil.which(os.environ.get("CC", "cc")) or shutil.which("c++")
            if compiler:
                try:
                    printed = subprocess.run([compiler, f"-print-file-name={wanted}"], capture_output=True, text=True,
                                             timeout=30).stdout.strip()
                except (OSError, subprocess.SubprocessError):
                    printed = ""
                if os.path.isabs(printed) and os.path.isfile(printed):
                    match = printed
        if match is None and name == "libgomp":
            try:
                import torch

                match = next((str(p) for p in Path(torch.__file__).parent.joinpath("lib").glob("libgomp*.so*")), None)
            except ImportError:
                match = None
        if match:
            paths[name] = os.path.realpath(match)
    return paths


@lru_cache(maxsize=1)
def runtime_exports() -> frozenset[str]:
    """Every name the C/C++ and OpenMP runtime libraries export (read once per evaluator process).

    RuntimeError when libc, libm, libstdc++ or libgcc_s cannot be found: every honest kernel would then be
    refused, so the evaluator must not run."""
    paths = _library_paths()
    missing = [name for name in _REQUIRED if name not in paths]
    if missing:
        raise RuntimeError(f"the C/C++ runtime libraries {missing} were not found; "
                           "the symbol check needs their exports")
    names: set[str] = set()
    for path in paths.values():
        names.update(read_elf_symbols(path).defined)
    return frozenset(names)
