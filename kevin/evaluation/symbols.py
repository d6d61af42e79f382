"""What a candidate's compiled code may call and execute, read from its object files and library by the
trusted evaluator before anything loads them.

Static rules read the candidate's text, and text can hide a call: macros, token pasting
(``J(Py,Object)``), ``using namespace at;``, a namespace alias. The linker cannot be fooled that way: every
function an object file calls outside itself is an undefined symbol, under its real name. Our build
(``builder.py``) puts the candidate's code alone in its object files (the operator registration is an
object of ours, linked from outside the build folder), so each undefined symbol of those objects is the
candidate's own doing, and is judged three ways:

1. refused by class (``forbidden_symbols``): the Python C API, threads, processes, files, clocks, the
   dynamic loader and the loaded-object lists (``dl_iterate_phdr``, ``_r_debug``, the auxiliary vector,
   ``environ``), signal handlers, memory mapping, system control, the operator dispatcher and operator
   registration, the profiler's switches, math libraries ...;
2. a PyTorch operator (``at::_ops::<op>``, or an out-of-line ``at::Tensor::<op>``) must be on
   ``evaluation.allowed_runtime_ops`` (allocation, copies, views);
3. otherwise it must be provided by the C/C++ runtime (an export of libc, libm, libmvec, libstdc++,
   libgcc_s or libgomp, read from those libraries), match ``runtime_symbols`` (the CUDA runtime and driver,
   PyTorch's vector maths) or ``torch_api`` (the few PyTorch classes a kernel's host code needs: tensors,
   errors, parallel_for, streams, schema inference), or be defined by another of the candidate's own
   objects. Everything else PyTorch's libraries export (MKL's GEMM, the C shims, libuv, ...) is refused.

Then every executable section of every object file and library is disassembled (capstone) and a raw
system call, a far jump to another code segment or a read of the time-stamp counter is refused: inline
assembly is invisible to symbol tables.

What this does not see: code that finds functions without naming them, by scanning memory from an
address it holds (a libc function's, a return address) for a loaded library's header and symbol table,
and code that jumps into the middle of an instruction it computed. Those run inside the candidate's own
sandboxed process, where the verdict is not decided (judge.py); the seccomp filter and the run-time
checks still apply.

The symbol tables are read by ``elf.py`` (plain Python: no binutils, nothing executed); this module judges them.
"""

from __future__ import annotations

import json
import re
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable, Iterator

from kevin.evaluation.elf import ElfSymbols, mangled_scope, read_elf_symbols, runtime_exports
from kevin.evaluation.rules import RuleHit

_EM_X86_64, _EM_AARCH64 = 62, 183
INSTALL_CAPSTONE = "pip install 'capstone>=5.0,<5.1'"


def require_disassembler() -> None:
    """The native checks' dependencies, checked before an evaluator compiles anything: capstone (the
    disassembler) and the runtime libraries' exports. RuntimeError, saying how to install, when missing:
    without them a library would go unchecked, so there is no evaluation at all."""
    try:
        import capstone  # noqa: F401
    except ImportError as exc:
        raise RuntimeError(f"the evaluator disassembles every candidate build and needs the capstone disassembler: "
                           f"{INSTALL_CAPSTONE} (a kevin dependency; {exc})") from None
    runtime_exports()


# --------------------------------------------------------------------------------------------- judging


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


@dataclass
class _Rule:
    """``native_symbols`` compiled once per check."""

    forbidden: list[tuple[re.Pattern[str] | None, re.Pattern[str] | None, str, bool]]
    runtime: list[re.Pattern[str]]
    torch_api: list[re.Pattern[str]]
    needed: list[re.Pattern[str]]
    instructions: dict[str, list[tuple[set[str], re.Pattern[str] | None, str]]]
    allowed_ops: set[str]

    @classmethod
    def of(cls, rule: dict[str, Any], allowed_ops: Iterable[str]) -> "_Rule":
        forbidden = [(re.compile(p["pattern"]) if p.get("pattern") else None, re.compile(p["scope"]) if p.get("scope") else None,
                      p["what"], bool(p.get("objects_only", False))) for p in rule["forbidden_symbols"]]
        instructions = {arch: [(set(e["mnemonics"]), re.compile(e["operands"]) if e.get("operands") else None, e["what"])
                               for e in entries] for arch, entries in rule.get("forbidden_instructions", {}).items()}
        return cls(forbidden=forbidden, runtime=[re.compile(p) for p in rule.get("runtime_symbols", [])],
                   torch_api=[re.compile(p) for p in rule.get("torch_api", [])],
                   needed=[re.compile(p) for p in rule["allowed_libraries"]], instructions=instructions,
                   allowed_ops={op.split("::", 1)[-1] for op in allowed_ops})


def _forbidden_class(name: str, scope: str | None, rule: _Rule, library: bool) -> str | None:
    for pattern, scope_pattern, what, objects_only in rule.forbidden:
        if library and objects_only:
            continue
        if (pattern is not None and pattern.search(name)) or (scope_pattern is not None and scope and scope_pattern.search(scope)):
            return what
    return None


def _strict_verdict(name: str, rule: _Rule, own: set[str], runtime: frozenset[str]) -> str | None:
    """Why a candidate object may not import ``name`` (None: it may)."""
    scope = mangled_scope(name)
    what = _forbidden_class(name, scope, rule, library=False)
    if what:
        return f"calls {demangle(name)} ({what})"
    op = aten_op_of(name)
    if op is not None:
        return None if _op_allowed(op, rule.allowed_ops) else f"calls the PyTorch operator aten::{op} (PyTorch compute)"
    if name in own or name in runtime or any(p.search(name) for p in rule.runtime):
        return None
    if scope and scope.startswith("at::Tensor::"):
        # Out-of-line tensor methods (libtorch exports some, e.g. relu_): an operator by another name.
        method = scope.split("::")[2]
        base = method[:-len("_symint")] if method.endswith("_symint") else method
        return None if _op_allowed(base, rule.allowed_ops) else \
            f"calls {demangle(name)} (the PyTorch operator aten::{base}: PyTorch compute)"
    if scope and any(p.search(scope) for p in rule.torch_api):
        return None
    return (f"calls {demangle(name)}, which is neither part of the C/C++, OpenMP or CUDA runtime nor one of the "
            "PyTorch functions a kernel may call")


@dataclass(frozen=True)
class LinkBaseline:
    """What every library of one toolchain holds whatever its candidate wrote: the imports and the instructions
    our registration object, the C runtime's start files and the runtime libraries the link adds bring in
    (the CUDA runtime's static parts import ``syscall``, ``dlopen`` ...). Read off a library built from a trivial
    candidate on the trusted side (``builder.ensure_link_baseline``); a candidate adds nothing to the link
    (flags that would are refused), so at the library level only what exceeds this is the candidate's."""

    imports: frozenset[str] = frozenset()
    instructions: frozenset[str] = frozenset()
    """Mnemonics of the forbidden instructions found in the trivial library."""

    @classmethod
    def of_library(cls, path: str | Path, rule: dict[str, Any]) -> "LinkBaseline":
        info = read_elf_symbols(path, code=True)
        found = {h.message.split("`", 2)[1].split()[0] for h in instruction_hits(info, rule, Path(path).name)}
        return cls(frozenset(info.undefined), frozenset(found))

    def to_json(self) -> str:
        return json.dumps({"imports": sorted(self.imports), "instructions": sorted(self.instructions)})

    @classmethod
    def from_json(cls, text: str) -> "LinkBaseline":
        data = json.loads(text)
        return cls(frozenset(data["imports"]), frozenset(data["instructions"]))


def symbol_hits(info: ElfSymbols, rule: dict[str, Any], allowed_ops: Iterable[str], filename: str,
                calls: bool = True, own: Iterable[str] = (), baseline: LinkBaseline | None = None) -> list[RuleHit]:
    """Rule hits (rule ``native_symbols``) for a file: the calls of a candidate's object file (``calls``: judged
    strictly, see the module's docstring; ``own``: names its sibling objects define), or the forbidden classes
    a library calls beyond what every library of the toolchain calls (``baseline``), and the libraries it needs."""
    if not rule.get("enabled", True):
        return []
    compiled = _Rule.of(rule, allowed_ops)
    hits: list[RuleHit] = []
    if calls:
        runtime = runtime_exports()
        own_names = set(own) | set(info.defined)
        for name in info.undefined:
            why = _strict_verdict(name, compiled, own_names, runtime)
            if why:
                hits.append(RuleHit("native_symbols", f"{filename} {why}"))
        for name in info.strong:
            # A forbidden name defined by the candidate itself: a call to it would be its own (the build links with
            # -Bsymbolic), so this is no way in, but nothing honest is named so, and a library linked otherwise
            # would call the process's first definition instead.
            what = _forbidden_class(name, mangled_scope(name), compiled, library=False)
            if what:
                hits.append(RuleHit("native_symbols", f"{filename} defines {demangle(name)} ({what})"))
    else:
        for name in info.undefined:
            if baseline is not None and name in baseline.imports:
                continue
            what = _forbidden_class(name, mangled_scope(name), compiled, library=True)
            if what:
                hits.append(RuleHit("native_symbols", f"{filename} calls {demangle(name)} ({what})"))
    for lib in info.needed:
        if not any(p.match(lib) for p in compiled.needed):
            hits.append(RuleHit("native_symbols", f"{filename} links {lib}, which is not on the allowed list"))
    return hits


# --------------------------------------------------------------------------------------- instructions


def _disassembler(machine: int) -> Any:
    try:
        import capstone
    except ImportError as exc:
        raise RuntimeError(f"capstone is needed to check candidate builds: {INSTALL_CAPSTONE} ({exc})") from None
    if machine == _EM_X86_64:
        return capstone.Cs(capstone.CS_ARCH_X86, capstone.CS_MODE_64), "x86_64"
    if machine == _EM_AARCH64:
        return capstone.Cs(capstone.CS_ARCH_ARM64, capstone.CS_MODE_ARM), "aarch64"
    raise ValueError(f"machine {machine} is not one the evaluator disassembles (x86-64, AArch64)")


def _sweep(md: Any, code: bytes, start: int, stop_at: set[int] | None) -> Iterator[tuple[int, str, str]]:
    """(offset, mnemonic, operands) of the instructions from ``start`` in order; a byte that is no instruction is
    stepped over, so what follows it is read too. ``stop_at``: offsets already read (a resynchronised sweep ends
    there)."""
    pos = start
    while pos < len(code):
        last = pos
        for offset, size, mnemonic, operands in md.disasm_lite(code[pos:], pos):
            if stop_at is not None and offset in stop_at and offset != start:
                return
            yield offset, mnemonic, operands
            last = offset + size
        pos = last if last > pos else pos + 1


def instruction_hits(info: ElfSymbols, rule: dict[str, Any], filename: str,
                     ignore: frozenset[str] = frozenset()) -> list[RuleHit]:
    """Forbidden instructions in ``info``'s executable sections (read with ``code=True``): each section is
    disassembled from its start, and again from every function that starts where the first pass was not at an
    instruction boundary. ``ignore``: mnemonics not reported (a library's baseline; never a candidate object's)."""
    if not rule.get("enabled", True) or not info.code:
        return []
    md, arch = _disassembler(info.machine)
    checks = _Rule.of(rule, ()).instructions.get(arch, [])
    hits: list[RuleHit] = []
    for section, _, code, starts in info.code:
        boundaries: set[int] = set()
        found: dict[int, tuple[str, str, str]] = {}

        def look(offset: int, mnemonic: str, operands: str) -> None:
            for mnemonics, operand_pattern, what in checks:
                if mnemonic in mnemonics and mnemonic not in ignore and (operand_pattern is None or operand_pattern.search(operands)):
                    found.setdefault(offset, (mnemonic, operands, what))

        for offset, mnemonic, operands in _sweep(md, code, 0, None):
            boundaries.add(offset)
            look(offset, mnemonic, operands)
        for start in starts:
            if start not in boundaries:
                for offset, mnemonic, operands in _sweep(md, code, start, boundaries):
                    look(offset, mnemonic, operands)
        for offset, (mnemonic, operands, what) in sorted(found.items())[:3]:
            shown = f"{mnemonic} {operands}".strip()
            hits.append(RuleHit("native_symbols", f"{filename} contains the instruction `{shown}` at {section}+{offset:#x} ({what})"))
    return hits


# ------------------------------------------------------------------------------------------- a build


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


def library_hits(folder: Path, rule: dict[str, Any], allowed_ops: Iterable[str],
                 baseline: LinkBaseline | None = None) -> list[RuleHit]:
    """Hits for everything a compile job left in ``folder`` (its staging folder).

    Object files are the candidate's own translation units (our registration object is linked from the header
    folder, never copied here): their calls are judged strictly, a call between two of them is their own. A
    shared library is judged by the libraries it needs and the forbidden classes it calls (our registration and
    the C runtime's start files are linked into it). Every file's machine code is disassembled."""
    hits: list[RuleHit] = []
    files: list[tuple[Path, ElfSymbols]] = []
    for path in sorted(folder.rglob("*")):
        if path.is_symlink():
            hits.append(RuleHit("native_symbols", f"{path.name}: build outputs may not be symbolic links"))
            continue
        if not path.is_file() or path.suffix not in (".so", ".o"):
            continue
        try:
            files.append((path, read_elf_symbols(path, code=rule.get("enabled", True))))
        except (ValueError, OSError, struct.error) as exc:
            hits.append(RuleHit("native_symbols", f"{path.name}: unreadable library ({exc})"))
    own: dict[Path, set[str]] = {}
    for path, info in files:
        if path.suffix == ".o":
            own.setdefault(path.parent, set()).update(info.defined)
    for path, info in files:
        is_object = path.suffix == ".o"
        hits.extend(symbol_hits(info, rule, allowed_ops, path.name, calls=is_object, own=own.get(path.parent, ()),
                                baseline=baseline))
        ignore = baseline.instructions if baseline is not None and not is_object else frozenset()
        try:
            hits.extend(instruction_hits(info, rule, path.name, ignore))
        except ValueError as exc:
            hits.append(RuleHit("native_symbols", f"{path.name}: {exc}"))
    if not any(p.suffix == ".o" for p in folder.rglob("*.o")) and any(p.suffix == ".so" for p in folder.rglob("*.so")):
        hits.append(RuleHit("native_symbols", "a library was left without the object files it was linked from"))
    return hits
