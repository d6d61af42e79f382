"""What a build is asked for, and the sources it writes: a candidate's ``load_inline`` call validated into an
``ExtensionRequest``, and the text of the translation units our build makes of it (heavy torch includes blanked,
the candidate's language standard dropped, the operator table appended). Text only: no compiler runs here.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import re
from dataclasses import dataclass
from typing import Any

from kevin.evaluation.toolchain import Toolchain, from_json_fields

# Lines that include the heavy torch headers; blanked in favour of the pre-included ones.
HEAVY_INCLUDE = re.compile(r'^[ \t]*#[ \t]*include[ \t]*[<"](?:torch/extension\.h|torch/types\.h|torch/torch\.h|'
                           r'torch/all\.h|ATen/ATen\.h)[>"][^\n]*$', re.M)
# Kernel attributes that take parentheses and may stand anywhere between ``__global__`` and the name
# (``__global__ void __launch_bounds__(256) k(...)`` is as common as the other order).
_KERNEL_ATTRIBUTE = re.compile(
    r"\b(?:__launch_bounds__|__cluster_dims__|__maxnreg__|__attribute__|__declspec|alignas)"
    r"\s*\((?:[^()]|\((?:[^()]|\([^()]*\))*\))*\)"
    r"|\[\[.*?\]\]"
)
_COMMENT = re.compile(r"//[^\n]*|/\*.*?\*/", re.S)
_GLOBAL_KERNEL = re.compile(r"__global__\s+(?:[\w:<>,\s\*&]+?\s+)?(\w+)\s*\(")
_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,99}$")
_FUNCTION = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*(?:::[A-Za-z_][A-Za-z0-9_]*)*$")


class RequestError(ValueError):
    """What a candidate passed to ``load_inline`` is not something the evaluator builds."""


def _strings(value: Any, what: str) -> list[str]:
    if value is None:
        return []
    if isinstance(value, str):
        return [value]
    if isinstance(value, (list, tuple)) and all(isinstance(v, str) for v in value):
        return list(value)
    raise RequestError(f"load_inline: {what} must be a string or a list of strings")


def _flags(value: Any, what: str) -> tuple[str, ...]:
    """Compiler flags as the argument words they stand for (``rules.split_flags``: empty strings and None
    dropped, a string of several flags split), so the compiler never sees an empty argument."""
    from kevin.evaluation.rules import split_flags

    try:
        return split_flags(value)
    except ValueError as exc:
        raise RequestError(f"load_inline: {what}: {exc}") from None


@dataclass(frozen=True)
class ExtensionRequest:
    """One ``load_inline`` call as plain data: what to build, nothing about where."""

    name: str
    cpp_sources: tuple[str, ...] = ()
    cuda_sources: tuple[str, ...] = ()
    functions: tuple[str, ...] = ()
    extra_cflags: tuple[str, ...] = ()
    extra_cuda_cflags: tuple[str, ...] = ()
    extra_ldflags: tuple[str, ...] = ()

    @classmethod
    def from_call(cls, params: dict[str, Any]) -> "ExtensionRequest":
        """Validate the keyword arguments of a ``load_inline`` call (all of them bound by name)."""
        name = params.get("name")
        if not isinstance(name, str) or not _NAME.match(name):
            raise RequestError("load_inline: name must be a plain identifier (letters, digits, _)")
        functions = params.get("functions")
        if isinstance(functions, dict):
            functions = list(functions)
        functions = _strings(functions, "functions")
        if not functions:
            raise RequestError("load_inline: list the C++ functions to call from Python in functions=[...]")
        bad = [f for f in functions if not _FUNCTION.match(f)]
        if bad:
            raise RequestError(f"load_inline: {bad[0]!r} is not a C++ function name")
        for unsupported in ("sycl_sources", "extra_include_paths", "extra_sycl_cflags"):
            if params.get(unsupported):
                raise RequestError(f"load_inline: {unsupported} is not supported")
        return cls(name=name, cpp_sources=tuple(_strings(params.get("cpp_sources"), "cpp_sources")),
                   cuda_sources=tuple(_strings(params.get("cuda_sources"), "cuda_sources")), functions=tuple(functions),
                   extra_cflags=_flags(params.get("extra_cflags"), "extra_cflags"),
                   extra_cuda_cflags=_flags(params.get("extra_cuda_cflags"), "extra_cuda_cflags"),
                   extra_ldflags=_flags(params.get("extra_ldflags"), "extra_ldflags"))

    @property
    def with_cuda(self) -> bool:
        return bool(self.cuda_sources)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "ExtensionRequest":
        return cls(**from_json_fields(data))

    def digest(self, toolchain: "Toolchain") -> str:
        """Content key: the request and everything of the toolchain that shapes the library."""
        payload = json.dumps({"request": self.to_dict(), "toolchain": toolchain.key}, sort_keys=True)
        return hashlib.sha256(payload.encode()).hexdigest()[:24]

    def dir_name(self, toolchain: "Toolchain") -> str:
        return f"{self.name}_{self.digest(toolchain)}"

    def op_namespace(self, toolchain: "Toolchain") -> str:
        """The torch.ops namespace the library registers its functions under."""
        return f"kevin_{self.digest(toolchain)}"


def blank_heavy_includes(source: str) -> str:
    """The source with heavy torch includes replaced by empty lines (line numbers unchanged)."""
    return HEAVY_INCLUDE.sub("", source)


_STD = re.compile(r"^--?std=")


def own_flags(words: tuple[str, ...]) -> list[str]:
    """A candidate's flags as our build passes them: its language standard dropped (``-std=c++17``, ``-std c++17``),
    since torch's headers and the precompiled header are built for the toolchain's own, and a solution written for
    an older torch asks for c++17 as a matter of course."""
    out: list[str] = []
    skip = False
    for i, word in enumerate(words):
        if skip:
            skip = False
        elif word in ("-std", "--std") and i + 1 < len(words):
            skip = True
        elif not _STD.match(word):
            out.append(word)
    return out


# The text names builder.py, where ``registration`` was written first; it stays as it was, since the evaluator
# finds it in sources that earlier builds wrote.
REGISTRATION_MARKER = "// kevin: the operator table (builder.registration)"
"""The first line of what the build appends to the candidate's main.cpp (the evaluator cuts it off to re-read the
candidate's own text)."""


def registration(namespace: str, functions: tuple[str, ...]) -> str:
    """The table appended to main.cpp that lists ``functions`` as operators of ``namespace`` for our
    registration object (``GLUE_SOURCE``; kevin_ops.h). Our own names are undefined first, so a macro of the
    candidate's cannot rename them."""
    ours = ("kevin_ops", "kevin_ops_table", "kevin_ops_exports", "Export", "Table", "make")
    lines = [REGISTRATION_MARKER, *(f"#undef {name}" for name in ours), "namespace {",
             "const kevin_ops::Export kevin_ops_exports[] = {"]
    for fn in functions:
        lines.append(f'    {{"{fn.split("::")[-1]}", &kevin_ops::make<&{fn}>}},')
    lines += ["};", "}  // namespace",
              f'extern "C" const kevin_ops::Table kevin_ops_table = '
              f'{{"{namespace}", kevin_ops_exports, {len(functions)}}};']
    return "\n".join(lines) + "\n"


def kernel_names(cuda_sources: list[str]) -> list[str]:
    """Names of the ``__global__`` functions defined in CUDA sources."""
    names: list[str] = []
    for source in cuda_sources:
        plain = _KERNEL_ATTRIBUTE.sub(" ", _COMMENT.sub(" ", source))
        names.extend(n for n in _GLOBAL_KERNEL.findall(plain) if n not in names)
    return names
