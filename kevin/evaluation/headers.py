"""The headers every build pre-includes, prepared once per toolchain on the trusted evaluator side, where no
candidate's process can write them: the narrow ``kevin_lite.h`` (``torch_lite.h`` with its op headers slimmed) and
the full ``kevin_full.h`` with their precompiled forms, nvcc's ``kevin_cuda_lite.h``, our registration object
(``ensure_glue``), and the list of names only the full headers declare, which decides whether a build that failed
against the narrow headers is tried again against the full ones (``fallback_needed``).
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

from kevin.evaluation.toolchain import (CUDA_LITE, GLUE_OBJECT, GLUE_SOURCE, LITE_HEADER, OPS_HEADER, OPT_FLAGS,
                                        Toolchain, run_compiler)
from kevin.records.target import KernelTarget

FULL_ONLY = "full_only_identifiers.v2.txt"
"""The listing of ``ensure_full_only``, in the header folder (v2: cuda.h's prose and the names the narrow headers
declare too left out; an older listing in a kept cache folder is not read, so it is made again once)."""

_OPS_INCLUDE = re.compile(r"^[ \t]*#[ \t]*include[ \t]*<ATen/ops/(\w+)\.h>[ \t]*$", re.M)
_INCLUDE_LINE = re.compile(r"^[ \t]*#[ \t]*(?:include\b|pragma[ \t]+once)[^\n]*$", re.M)


def lite_torch_text(include_dirs: tuple[str, ...] | list[str] = ()) -> str:
    """``torch_lite.h`` with each ``#include <ATen/ops/X.h>`` replaced by that header's own wrappers.

    ``ATen/ops/empty.h`` and its kind hold a few inline functions (``at::empty(...)`` calling
    ``at::_ops::empty_memory_format::call``) after includes of ``ATen/Context.h``, ``ATen/DeviceGuard.h``,
    ``ATen/TensorUtils.h`` and more, which the functions do not use and which are more than half of the narrow
    header's parse time, paid by gcc, cudafe++ and cicc alike (measured: nvcc on a relu kernel 23.3 s -> 11.8 s on
    two cores). Each include becomes ``ATen/ops/X_ops.h`` (the operator's declaration) plus the functions, read
    from the installed torch, so they are always that torch's own. An op header not found keeps its include."""
    def expand(match: re.Match[str]) -> str:
        name = match.group(1)
        for folder in include_dirs:
            path = Path(folder) / "ATen" / "ops" / f"{name}.h"
            if path.is_file():
                body = _INCLUDE_LINE.sub("", path.read_text(errors="replace"))
                return f"#include <ATen/ops/{name}_ops.h>\n{body}"
        return match.group(0)

    text = LITE_HEADER.read_text()
    # The wrappers take TensorOptions and call its helpers: declared by c10/core/TensorOptions.h.
    text = text.replace("#include <ATen/core/Tensor.h>\n",
                        "#include <ATen/core/Tensor.h>\n#include <c10/core/TensorOptions.h>\n", 1)
    return _OPS_INCLUDE.sub(expand, text)


def header_text(lite: bool, include_dirs: tuple[str, ...] | list[str] = ()) -> str:
    """The header pre-included into the host translation unit: narrow (lite, its op headers slimmed from
    ``include_dirs``) or full torch, plus the operator registration helpers."""
    torch_part = lite_torch_text(include_dirs) if lite else "#include <torch/all.h>\n"
    return "#pragma once\n" + torch_part + "\n" + OPS_HEADER.read_text()


def write_replacing(path: Path, text: str) -> None:
    """Write ``text`` to a temporary sibling and rename it into place: evaluators of other processes preparing the
    same folder at once never read half a file."""
    tmp = path.with_suffix(f".{os.getpid()}.tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


def ensure_headers(folder: Path, include_dirs: tuple[str, ...] | list[str] = ()) -> None:
    """Write ``kevin_lite.h``, ``kevin_full.h`` and ``kevin_cuda_lite.h`` into ``folder`` (idempotent)."""
    folder.mkdir(parents=True, exist_ok=True)
    texts = {"kevin_lite.h": header_text(True, include_dirs), "kevin_full.h": header_text(False, include_dirs),
             CUDA_LITE: "#pragma once\n" + lite_torch_text(include_dirs)}
    for name, text in texts.items():
        path = folder / name
        if not path.exists() or path.read_text() != text:
            write_replacing(path, text)


def _up_to_date(target: Path, stamp: Path, signature: str) -> bool:
    """Whether ``target`` was built with the flags ``signature`` records (its ``stamp`` says so)."""
    return target.exists() and stamp.exists() and stamp.read_text() == signature


def _compile_into(command: list[str], folder: Path, tmp: Path, target: Path, stamp: Path, signature: str) -> str | None:
    """Run ``command`` (which writes ``tmp``) in ``folder``, then move ``tmp`` to ``target`` and stamp it: None, or the
    compiler's messages. The temporary name keeps evaluators of other processes from reading a half-written file."""
    rc, text = run_compiler(command, folder, 900)
    if rc != 0:
        tmp.unlink(missing_ok=True)
        return text
    os.replace(tmp, target)
    stamp.write_text(signature)
    return None


def precompile(toolchain: Toolchain, lite: bool) -> str:
    """Precompile the narrow (``lite``) or the full header into the header folder unless it is there for these
    flags; '' or why not (builds then parse the header, slower)."""
    header = "kevin_lite.h" if lite else "kevin_full.h"
    folder = Path(toolchain.pch_dir)
    gch, stamp = folder / f"{header}.gch", folder / f"{header}.stamp"
    # The folder's own path is left out, so a cache copied elsewhere keeps its precompiled headers (gcc checks
    # the flags that shape the code itself, and parses the header instead when they do not match).
    signature = json.dumps([f.replace(str(folder), "<headers>") for f in toolchain.cxx_flags(lite)])
    if _up_to_date(gch, stamp, signature):
        return ""
    flags = [f for f in toolchain.cxx_flags(lite) if f not in ("-include", header)]
    tmp = folder / f"{header}.gch.{os.getpid()}"
    failed = _compile_into([toolchain.cxx, *flags, "-x", "c++-header", header, "-o", tmp.name], folder, tmp, gch, stamp,
                           signature)
    return "" if failed is None else f"no precompiled {header}: {failed.strip()[-500:]}"


_IDENTIFIER = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


def _identifiers(toolchain: Toolchain, lite: bool) -> set[str]:
    header = "kevin_lite.h" if lite else "kevin_full.h"
    flags = [f for f in toolchain.cxx_flags(lite) if f not in ("-include", header, *OPT_FLAGS)]
    rc, text = run_compiler([toolchain.cxx, *flags, "-E", "-P", "-x", "c++", header], Path(toolchain.pch_dir), 900)
    return set(_IDENTIFIER.findall(text)) if rc == 0 else set()


def ensure_glue(toolchain: Toolchain) -> str:
    """Compile our registration object (``GLUE_SOURCE``) into ``toolchain.pch_dir`` unless it is there for these
    flags: on the trusted evaluator side, so no candidate's process ever writes the object every library links.
    Returns '' or why it could not be built. Uses the narrow precompiled header when it exists."""
    folder = Path(toolchain.pch_dir)
    ensure_headers(folder, toolchain.include_dirs)
    target, stamp = folder / GLUE_OBJECT, folder / f"{GLUE_OBJECT}.stamp"
    flags = toolchain.cxx_flags(True)
    signature = json.dumps([GLUE_SOURCE, *(f.replace(str(folder), "<headers>") for f in flags)])
    if _up_to_date(target, stamp, signature):
        return ""
    source = folder / "kevin_glue.cpp"
    source.write_text(GLUE_SOURCE)
    tmp = folder / f"{GLUE_OBJECT}.{os.getpid()}.o"
    failed = _compile_into([toolchain.cxx, *flags, "-c", source.name, "-o", tmp.name], folder, tmp, target, stamp,
                           signature)
    return "" if failed is None else f"no registration object: {failed.strip()[-1500:]}"


def ensure_full_only(toolchain: Toolchain) -> None:
    """List the identifiers only the full headers (and, for CUDA, cuda.h) declare, once per toolchain, for
    ``fallback_needed`` (``load_full_only`` reads the listing back)."""
    listing = Path(toolchain.pch_dir) / FULL_ONLY
    if not listing.exists():
        full = _identifiers(toolchain, False)
        if KernelTarget.parse(toolchain.backend).is_gpu:
            full |= _cuda_header_identifiers(toolchain)
        # A name the narrow headers declare too (a keyword, a type: "float" in `argument of type "float *"`) is not
        # one they lack, wherever else it appears.
        write_replacing(listing, "\n".join(sorted(full - _identifiers(toolchain, True))))


def _cuda_header_identifiers(toolchain: Toolchain) -> set[str]:
    """Names from cuda.h (the driver API): in a CUDA file the full path pre-includes it, the narrow one not."""
    for folder in toolchain.include_dirs:
        path = Path(folder) / "cuda.h"
        if path.is_file():
            return cuda_header_names(path.read_text(errors="replace"))
    return set()


_C_COMMENT_OR_STRING = re.compile(r'/\*.*?\*/|//[^\n]*|"(?:\\.|[^"\\\n])*"', re.S)


def cuda_header_names(text: str) -> set[str]:
    """The names of cuda.h's text a kernel could have meant: its comments and strings left out (prose: every word
    of them, "h", "L", "C" among them, made any undefined one-letter variable send a failed build on to the full
    headers, doubling its compile time), and names of fewer than three characters too (the header declares none at
    file scope; the short ones are its prototypes' parameters and its literals' suffixes). What stays errs on the
    side of falling back: a needless full build costs seconds, a missed one would refuse an honest kernel."""
    return {name for name in _IDENTIFIER.findall(_C_COMMENT_OR_STRING.sub(" ", text)) if len(name) >= 3}


_QUOTED = re.compile(r"[\u2018'\"`]([^\u2019'\"`\n]{1,200})[\u2019'\"`]")


def fallback_needed(errors: str, full_only: set[str]) -> bool:
    """Could these compiler messages of the narrow build be the narrow headers' doing?

    True when a quoted name in them (gcc quotes with \u2018...\u2019, nvcc with "...") is one that only the
    full torch headers (or, for CUDA, cuda.h) declare: then the full build decides. Otherwise the errors
    are the candidate's own and the full build would report the same lines, so it is skipped.
    """
    for quoted in _QUOTED.findall(errors):
        if any(name in full_only for name in _IDENTIFIER.findall(quoted)):
            return True
    return False


def load_full_only(toolchain: Toolchain) -> set[str] | None:
    """The identifiers ``ensure_full_only`` listed; None when there is no listing (always fall back)."""
    try:
        return set((Path(toolchain.pch_dir) / FULL_ONLY).read_text().split())
    except OSError:
        return None
