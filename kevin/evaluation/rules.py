"""Static rules: read a candidate's Python and C++/CUDA text, never run it.

The rule data (allow-lists, patterns) lives in ``default_rules.yaml`` and can be overridden from
params.yaml; this module is the code that applies it. Static rules catch the plain forms of each
reward hack early, with a message the policy can learn from; obfuscated forms (``getattr`` tricks,
strings built at run time, tensor arithmetic operators) are caught again at run time by the harness
(``kevin.evaluation.harness``), which re-applies the C++ rules to the exact sources handed to
``load_inline`` and watches which PyTorch ops and GPU kernels the forward really runs.
"""

from __future__ import annotations

import ast
import copy
import re
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any, Iterator

import yaml

from kevin.records.target import KernelTarget

RULES_FILE = Path(__file__).with_name("default_rules.yaml")


@dataclass(frozen=True)
class RuleHit:
    """One rule violation: which rule, what was seen, and where (1-based line, 0 if unknown)."""

    rule_id: str
    message: str
    line: int = 0

    def describe(self) -> str:
        where = f" (line {self.line})" if self.line else ""
        return f"[{self.rule_id}] {self.message}{where}"


@lru_cache(maxsize=1)
def _default_rules_text() -> str:
    return RULES_FILE.read_text()


def load_rules(overrides: dict[str, Any] | None = None) -> dict[str, dict[str, Any]]:
    """Default rule data merged with ``overrides`` ({rule_id: {key: value}}); unknown ids are errors."""
    rules = yaml.safe_load(_default_rules_text())
    for rule in rules.values():
        rule.setdefault("enabled", True)
    for rule_id, values in (overrides or {}).items():
        if rule_id not in rules:
            raise ValueError(f"unknown rule id {rule_id!r}; known: {', '.join(sorted(rules))}")
        if not isinstance(values, dict):
            raise ValueError(f"rule {rule_id!r}: override must be a mapping, got {type(values).__name__}")
        rules[rule_id] = {**rules[rule_id], **copy.deepcopy(values)}
    return rules


def _enabled(rules: dict[str, dict[str, Any]], rule_id: str) -> bool:
    return bool(rules.get(rule_id, {}).get("enabled", True))


# --------------------------------------------------------------------------------------- Python


def _dotted(node: ast.AST) -> list[str] | None:
    """``a.b.c`` -> ['a', 'b', 'c'] for Name/Attribute chains; None for anything else."""
    parts: list[str] = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if isinstance(node, ast.Name):
        parts.append(node.id)
        return parts[::-1]
    return None


def _import_aliases(tree: ast.Module) -> dict[str, str]:
    """Local name -> full dotted module/object path, from every import in the file."""
    aliases: dict[str, str] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.asname:
                    aliases[alias.asname] = alias.name
                else:
                    root = alias.name.split(".")[0]
                    aliases[root] = root
        elif isinstance(node, ast.ImportFrom) and node.module:
            for alias in node.names:
                aliases[alias.asname or alias.name] = f"{node.module}.{alias.name}"
    return aliases


def _resolve(node: ast.AST, aliases: dict[str, str]) -> str | None:
    parts = _dotted(node)
    if parts is None:
        return None
    head = aliases.get(parts[0], parts[0])
    return ".".join([head, *parts[1:]])


def _enclosing_functions(tree: ast.Module) -> dict[int, str]:
    """id(node) -> name of the innermost enclosing function ('' at module level)."""
    owner: dict[int, str] = {}

    def visit(node: ast.AST, current: str) -> None:
        for child in ast.iter_child_nodes(node):
            name = child.name if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)) else current
            owner[id(child)] = name
            visit(child, name)

    visit(tree, "")
    return owner


def _check_imports(tree: ast.Module, rule: dict[str, Any], aliases: dict[str, str]) -> Iterator[RuleHit]:
    allowed = set(rule["allowed_modules"])
    os_allowed = set(rule.get("allowed_os_attributes", []))
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and aliases.get(node.value.id) == "os":
            if node.attr not in os_allowed:
                yield RuleHit("forbidden_import", f"os.{node.attr} is not allowed (os is for os.environ build settings)", node.lineno)
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name not in allowed:
                    yield RuleHit("forbidden_import", f"import of {alias.name!r} is not allowed", node.lineno)
        elif isinstance(node, ast.ImportFrom):
            module = "." * node.level + (node.module or "")
            if module not in allowed:
                yield RuleHit("forbidden_import", f"import from {module!r} is not allowed", node.lineno)
            elif module == "os":
                yield RuleHit("forbidden_import", "use `import os` and os.environ only", node.lineno)


def _layer_attributes(tree: ast.Module, aliases: dict[str, str], containers: set[str]) -> set[str]:
    """Names of ``self.<attr>`` assigned a torch.nn layer (a compute module) anywhere in the file."""
    layers: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Assign) and isinstance(node.value, ast.Call):
            path = _resolve(node.value.func, aliases) or ""
            if path.startswith("torch.nn.") and path.split(".")[-1] not in containers:
                for target in node.targets:
                    parts = _dotted(target)
                    if parts and parts[0] == "self" and len(parts) == 2:
                        layers.add(parts[1])
    return layers


def _check_torch_compute(tree: ast.Module, rules: dict[str, Any], aliases: dict[str, str]) -> Iterator[RuleHit]:
    rule = rules["torch_compute"]
    allowed = set(rule["allowed_torch_calls"])
    init_prefixes = tuple(rule["init_only_prefixes"])
    methods = set(rule["tensor_compute_methods"])
    containers = {a.split(".")[-1] for a in allowed}
    owner = _enclosing_functions(tree)
    layers = _layer_attributes(tree, aliases, containers)
    for node in ast.walk(tree):
        if isinstance(node, ast.BinOp) and isinstance(node.op, ast.MatMult):
            yield RuleHit("torch_compute", "the @ operator is PyTorch compute", node.lineno)
        if not isinstance(node, ast.Call):
            continue
        path = _resolve(node.func, aliases)
        func_owner = owner.get(id(node), "")
        if path and (path == "torch" or path.startswith("torch.")):
            rel = path[len("torch.") :] if path != "torch" else ""
            if rel in allowed or rel.split(".")[-1] == "load_inline":
                continue
            in_init = func_owner in ("__init__", "")
            if in_init and rel.startswith(init_prefixes) and not rel.startswith("nn.functional"):
                continue
            yield RuleHit("torch_compute", f"call to torch.{rel} is PyTorch compute", node.lineno)
            continue
        parts = _dotted(node.func)
        if parts and parts[0] == "self" and len(parts) == 2 and parts[1] in layers and func_owner != "__init__":
            yield RuleHit("torch_compute", f"self.{parts[1]}(...) runs a PyTorch layer", node.lineno)
            continue
        if isinstance(node.func, ast.Attribute) and node.func.attr in methods:
            root = _dotted(node.func.value)
            root_path = aliases.get(root[0], "") if root else ""
            if root_path and not root_path.startswith("torch"):
                continue  # math.exp(x), functools..., scalar maths on an imported module
            yield RuleHit("torch_compute", f".{node.func.attr}() is a PyTorch compute method", node.lineno)


def _check_torch_namespaces(tree: ast.Module, rule: dict[str, Any], aliases: dict[str, str]) -> Iterator[RuleHit]:
    forbidden = set(rule["forbidden_attributes"])
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute):
            path = _resolve(node, aliases)
            if path and path.startswith("torch."):
                parts = path.split(".")
                if len(parts) > 1 and parts[1] in forbidden:
                    yield RuleHit("torch_namespaces", f"torch.{parts[1]} is not allowed", node.lineno)
        elif isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("torch."):
            if node.module.split(".")[1] in forbidden:
                yield RuleHit("torch_namespaces", f"import from {node.module} is not allowed", node.lineno)


def _check_try(tree: ast.Module) -> Iterator[RuleHit]:
    try_nodes = tuple(t for t in (getattr(ast, "Try", None), getattr(ast, "TryStar", None)) if t)
    for node in ast.walk(tree):
        if isinstance(node, try_nodes):
            yield RuleHit("try_except", "try/except is not allowed (no fallbacks)", node.lineno)


def _check_pass(tree: ast.Module) -> Iterator[RuleHit]:
    for node in ast.walk(tree):
        if isinstance(node, ast.Pass):
            yield RuleHit("pass_statement", "`pass` is not allowed", node.lineno)


def _normalised_forward(tree: ast.Module, class_name: str) -> str | None:
    for node in tree.body:
        if isinstance(node, ast.ClassDef) and node.name == class_name:
            for item in node.body:
                if isinstance(item, ast.FunctionDef) and item.name == "forward":
                    body = [s for s in item.body if not (isinstance(s, ast.Expr) and isinstance(s.value, ast.Constant))]
                    return ast.dump(ast.Module(body=body, type_ignores=[]), annotate_fields=False)
    return None


def _check_inheritance(tree: ast.Module, aliases: dict[str, str], reference: ast.Module | None) -> Iterator[RuleHit]:
    for node in ast.walk(tree):
        if not isinstance(node, ast.ClassDef):
            continue
        if node.name == "Model":
            yield RuleHit("reference_inheritance", "the solution must not define a class named Model", node.lineno)
        if node.name == "ModelNew":
            for base in node.bases:
                path = _resolve(base, aliases)
                if path not in ("torch.nn.Module", "torch.nn.modules.module.Module"):
                    shown = path or ast.unparse(base)
                    yield RuleHit("reference_inheritance", f"ModelNew must subclass nn.Module only, not {shown}", node.lineno)
    if reference is not None:
        ours, theirs = _normalised_forward(tree, "ModelNew"), _normalised_forward(reference, "Model")
        if ours is not None and ours == theirs:
            yield RuleHit("reference_inheritance", "ModelNew.forward is a copy of the reference forward")


def _check_dynamic(tree: ast.Module, rule: dict[str, Any]) -> Iterator[RuleHit]:
    calls = set(rule["forbidden_calls"])
    dunders = set(rule["allowed_dunders"])
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in calls:
            yield RuleHit("dynamic_code", f"{node.func.id}() is not allowed", node.lineno)
        elif isinstance(node, ast.Attribute) and node.attr.startswith("__") and node.attr not in dunders:
            yield RuleHit("dynamic_code", f"attribute {node.attr} is not allowed", node.lineno)
        elif isinstance(node, ast.Name) and node.id.startswith("__") and node.id not in dunders:
            yield RuleHit("dynamic_code", f"name {node.id} is not allowed", node.lineno)


def _assign_targets(node: ast.AST) -> list[ast.AST]:
    if isinstance(node, ast.Assign):
        return list(node.targets)
    if isinstance(node, (ast.AugAssign, ast.AnnAssign)):
        return [node.target]
    if isinstance(node, ast.Delete):
        return list(node.targets)
    return []


def _flatten_targets(targets: list[ast.AST]) -> Iterator[ast.AST]:
    for target in targets:
        if isinstance(target, (ast.Tuple, ast.List)):
            yield from _flatten_targets(list(target.elts))
        elif isinstance(target, ast.Starred):
            yield from _flatten_targets([target.value])
        else:
            yield target


def _check_patching(tree: ast.Module, aliases: dict[str, str]) -> Iterator[RuleHit]:
    for node in ast.walk(tree):
        if isinstance(node, (ast.Global, ast.Nonlocal)):
            yield RuleHit("patching", "global/nonlocal state is not allowed", node.lineno)
        for target in _flatten_targets(_assign_targets(node)):
            if isinstance(target, ast.Subscript) and _resolve(target.value, aliases) == "os.environ":
                continue  # setting build variables such as TORCH_CUDA_ARCH_LIST is ordinary
            base = target
            while isinstance(base, (ast.Attribute, ast.Subscript)):
                inner = base.value
                if isinstance(base, ast.Attribute) and not isinstance(inner, (ast.Attribute, ast.Subscript)):
                    if not (isinstance(inner, ast.Name) and inner.id == "self"):
                        yield RuleHit("patching", f"assignment to {ast.unparse(target)} (only self.<attr> may be set)", node.lineno)
                base = inner


def _string_constants(tree: ast.Module) -> list[str]:
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            out.append(node.value)
    return out


def _looks_like_cpp(text: str) -> bool:
    return ("{" in text and ";" in text) or "#include" in text or "__global__" in text


def _check_inline_required(tree: ast.Module, aliases: dict[str, str], backend: str) -> Iterator[RuleHit]:
    calls = [n for n in ast.walk(tree) if isinstance(n, ast.Call) and (_resolve(n.func, aliases) or "").endswith("load_inline")]
    if not calls:
        yield RuleHit("inline_kernel_required", "no load_inline call: the compute must be an inline kernel")
        return
    if KernelTarget.parse(backend).is_gpu and not any("__global__" in s for s in _string_constants(tree)):
        yield RuleHit("inline_kernel_required", "no __global__ CUDA kernel in the sources")


def python_rule_hits(
    source: str, backend: str, rules: dict[str, dict[str, Any]], reference_source: str | None = None
) -> list[RuleHit]:
    """All Python-side rule hits for a solution that already parses (raise SyntaxError otherwise)."""
    tree = ast.parse(source)
    aliases = _import_aliases(tree)
    reference = None
    if reference_source:
        try:
            reference = ast.parse(reference_source)
        except SyntaxError:
            reference = None
    checks: list[tuple[str, Iterator[RuleHit]]] = [
        ("forbidden_import", _check_imports(tree, rules["forbidden_import"], aliases)),
        ("dynamic_code", _check_dynamic(tree, rules["dynamic_code"])),
        ("patching", _check_patching(tree, aliases)),
        ("try_except", _check_try(tree)),
        ("pass_statement", _check_pass(tree)),
        ("reference_inheritance", _check_inheritance(tree, aliases, reference)),
        ("torch_namespaces", _check_torch_namespaces(tree, rules["torch_namespaces"], aliases)),
        ("torch_compute", _check_torch_compute(tree, rules, aliases)),
        ("inline_kernel_required", _check_inline_required(tree, aliases, backend)),
    ]
    hits: list[RuleHit] = []
    for rule_id, found in checks:
        if _enabled(rules, rule_id):
            hits.extend(found)
    return hits


# ------------------------------------------------------------------------------------------ C++

_COMMENTS = re.compile(r"//[^\n]*|/\*.*?\*/", re.DOTALL)
_STRINGS = re.compile(r'"(?:\\.|[^"\\\n])*"')
_NAMESPACE_ALIAS = re.compile(r"\bnamespace\s+(\w+)\s*=\s*(?:::\s*)?(at|torch)\s*((?:::\s*\w+\s*)*);")
_ATEN_OPS_INCLUDE = re.compile(r'#\s*include\s*[<"]ATen/ops/(\w+)\.h[>"]')


def strip_cpp_comments(text: str) -> str:
    """Drop // and /* */ comments so prose about cuBLAS in a comment is not a violation."""
    return _COMMENTS.sub(" ", text)


def _line_of(text: str, index: int) -> int:
    return text.count("\n", 0, index) + 1


def _namespaced(code: str) -> Iterator[tuple[re.Match[str], str]]:
    """``at::``/``torch::`` names in ``code`` as (match, the name below at/torch), also through a namespace alias
    (``namespace Q = at;  Q::relu(x)``): an alias is another spelling, so it is judged as the name it stands for."""
    roots = {"at": "", "torch": ""}
    for alias in _NAMESPACE_ALIAS.finditer(code):
        roots[alias.group(1)] = re.sub(r"\s+", "", alias.group(3)).lstrip(":")
    pattern = re.compile(r"\b(" + "|".join(map(re.escape, roots)) + r")::((?:\w+::)*\w+)")
    for match in pattern.finditer(code):
        below = roots[match.group(1)]
        yield match, f"{below}::{match.group(2)}" if below else match.group(2)


def _torch_name_allowed(symbol: str, allowed: set[str], namespaces: tuple[str, ...]) -> bool:
    """An ``at::``/``torch::`` name the text rule lets through: on the list itself, or a member of an allowed
    class or namespace (``ScalarType::Float``, ``vec::Vectorized``). Everything else is for the symbol check to
    judge exactly once compiled; this rule only gives an early message for plain compute calls."""
    parts = symbol.split("::")
    return (symbol in allowed or parts[-1] in allowed or parts[0] in allowed
            or any(symbol == ns or symbol.startswith(ns + "::") for ns in namespaces))


def cpp_rule_hits(sources: list[str], rules: dict[str, dict[str, Any]]) -> list[RuleHit]:
    """Rule hits in C++/CUDA sources (the strings a candidate passes to load_inline).

    Tensor methods (``x.sum()``) are not judged here: a method name says nothing about the object it is called
    on (``Vectorized<float>::exp``, a helper class's ``add``), and every tensor method compiles to a call of a
    PyTorch operator that the symbol check judges exactly (``symbols.py``)."""
    hits: list[RuleHit] = []
    compute = rules["cpp_torch_compute"]
    allowed_symbols = set(compute["allowed_torch_symbols"])
    allowed_namespaces = tuple(compute.get("allowed_torch_namespaces", []))
    tokens = [t.lower() for t in compute["forbidden_tokens"]]
    allowed_op_includes = set(compute["allowed_aten_op_includes"])
    patterns = [re.compile(p) for p in rules["cpp_forbidden_calls"]["forbidden_patterns"]]
    try_pattern = re.compile(r"\btry\s*\{|\bcatch\s*\(")
    for raw in sources:
        text = strip_cpp_comments(raw)
        code = _STRINGS.sub('""', text)  # string literals are data, not calls
        lowered = code.lower()
        if _enabled(rules, "cpp_torch_compute"):
            for match in _ATEN_OPS_INCLUDE.finditer(code):
                op = re.sub(r"_(native|ops|cuda_dispatch|cpu_dispatch)$", "", match.group(1))
                if op not in allowed_op_includes:
                    hits.append(RuleHit("cpp_torch_compute", f"#include of ATen op {match.group(1)}", _line_of(code, match.start())))
            for token in tokens:
                if token == "aten/ops/":
                    continue  # handled above with its allow-list
                idx = lowered.find(token)
                if idx >= 0:
                    hits.append(RuleHit("cpp_torch_compute", f"{token!r} is not allowed", _line_of(code, idx)))
            for match, symbol in _namespaced(code):
                if not _torch_name_allowed(symbol, allowed_symbols, allowed_namespaces):
                    hits.append(RuleHit("cpp_torch_compute", f"{match.group(0)} is PyTorch compute", _line_of(code, match.start())))
        if _enabled(rules, "cpp_forbidden_calls"):
            for pattern in patterns:
                match = pattern.search(code)
                if match:
                    hits.append(RuleHit("cpp_forbidden_calls", f"{match.group(0).strip()!r} is not allowed", _line_of(code, match.start())))
        if _enabled(rules, "try_except"):
            match = try_pattern.search(code)
            if match:
                hits.append(RuleHit("try_except", "try/catch is not allowed in C++ (no fallbacks)", _line_of(code, match.start())))
    return hits


def split_flags(value: Any) -> tuple[str, ...]:
    """The argument words of a ``load_inline`` flag list as KernelBench's solutions write it: None, one string or a
    list of them; empty and blank strings are dropped (``extra_cflags=[""]`` means no flag), a string holding
    several flags is split as a shell would (``"-O3 --use_fast_math"``). ValueError for anything else."""
    import shlex

    if value is None:
        return ()
    items = [value] if isinstance(value, str) else value
    if not isinstance(items, (list, tuple)):
        raise ValueError("flags must be a string or a list of strings")
    words: list[str] = []
    for item in items:
        if item is None:
            continue
        if not isinstance(item, str):
            raise ValueError(f"flags must be strings, not {type(item).__name__}")
        words.extend(shlex.split(item))
    return tuple(words)


def _flag_units(words: list[str], value_options: set[str]) -> Iterator[str]:
    """Flags as single words: an option whose value is the next word (``-Xcompiler -O3``, ``-gencode arch=...``)
    is joined to it with '=' (``-D NAME`` without), so each flag is judged whole."""
    i = 0
    while i < len(words):
        word = words[i]
        if word in value_options and i + 1 < len(words):
            yield word + ("" if word in ("-D", "-U") else "=") + words[i + 1]
            i += 2
        else:
            yield word
            i += 1


def bad_flags(words: list[str] | tuple[str, ...], rule: dict[str, Any]) -> list[str]:
    """The flags of ``words`` that are not harmless: each must match its tool's allow-list; the flags nvcc passes on
    to another tool (``-Xcompiler=-O3,-fopenmp``) are judged one by one by that tool's list."""
    allowed = {tool: [re.compile(p) for p in patterns] for tool, patterns in rule["allowed"].items()}
    passed = dict(rule.get("passed_flags", {}))
    bad = []
    for flag in _flag_units(list(words), set(rule.get("value_options", []))):
        option, _, value = flag.partition("=")
        if option in passed and value:
            tool = passed[option]
            if any(not any(p.match(part) for p in allowed[tool]) for part in value.split(",") if part):
                bad.append(flag)
        elif not any(p.match(flag) for p in allowed["flags"]):
            bad.append(flag)
    return bad


def flag_hits(flags: list[str] | tuple[str, ...], rules: dict[str, dict[str, Any]], words: bool = False) -> list[RuleHit]:
    """Extra compiler/linker flags passed to load_inline: harmless ones only (optimisation, architecture, warnings,
    OpenMP, macros of the candidate's own); anything that changes what is built, linked or loaded, or makes the
    compiler read files, is refused. ``flags`` may still hold empty strings or several flags in one string, unless
    ``words`` (already the argument words, as an ExtensionRequest holds them: not split again)."""
    if not _enabled(rules, "load_inline_flags"):
        return []
    listed = tuple(flags) if words else split_flags(list(flags))
    return [RuleHit("load_inline_flags", f"compiler flag {flag!r} is not allowed")
            for flag in bad_flags(listed, rules["load_inline_flags"])]


def static_hits(
    source: str, backend: str, rules: dict[str, dict[str, Any]], reference_source: str | None = None
) -> list[RuleHit]:
    """Every static hit: Python rules, then C++ rules over string constants that look like code."""
    hits = python_rule_hits(source, backend, rules, reference_source)
    cpp_like = [s for s in _string_constants(ast.parse(source)) if _looks_like_cpp(s)]
    hits.extend(cpp_rule_hits(cpp_like, rules))
    return hits
