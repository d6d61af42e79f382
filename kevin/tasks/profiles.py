"""Size profiles: one task file, several problem sizes.

A bundled task is a plain KernelBench-format file whose sizes are module-level constants. It may end
with a literal dict ``KEVIN_PROFILES = {"cpu": {"batch_size": 16, ...}}``; rendering a profile
rewrites those constants in the source text (keeping every comment and line of the file) and drops
the ``KEVIN_PROFILES`` assignment, so what reaches the evaluator and the policy is again a plain
KernelBench task. Nothing is executed: the dict is read with ``ast.literal_eval``.
"""

from __future__ import annotations

import ast

PROFILES_NAME = "KEVIN_PROFILES"
DEFAULT_PROFILE = "default"


class ProfileError(ValueError):
    """A task's size profiles are malformed or a requested profile is missing."""


def _top_level_assigns(tree: ast.Module) -> dict[str, ast.Assign]:
    found: dict[str, ast.Assign] = {}
    for node in tree.body:
        if isinstance(node, ast.Assign) and len(node.targets) == 1:
            target = node.targets[0]
            if isinstance(target, ast.Name):
                found[target.id] = node
    return found


def read_profiles(source: str) -> dict[str, dict[str, object]]:
    """Return ``{profile: {constant: value}}`` declared by ``KEVIN_PROFILES`` ({} when absent)."""
    tree = ast.parse(source)
    node = _top_level_assigns(tree).get(PROFILES_NAME)
    if node is None:
        return {}
    try:
        value = ast.literal_eval(node.value)
    except ValueError as exc:
        raise ProfileError(f"{PROFILES_NAME} must be a literal dict: {exc}") from exc
    if not isinstance(value, dict) or not all(
        isinstance(k, str) and isinstance(v, dict) for k, v in value.items()
    ):
        raise ProfileError(f"{PROFILES_NAME} must map profile names to dicts of constants")
    return value


def read_constants(source: str) -> dict[str, object]:
    """The module-level constants of a task whose value is a literal (``dim = 4096``), by name.

    Assignments computed from other names (``n = 2 * dim``) are left out: nothing is executed.
    """
    constants: dict[str, object] = {}
    for name, node in _top_level_assigns(ast.parse(source)).items():
        if name == PROFILES_NAME:
            continue
        try:
            constants[name] = ast.literal_eval(node.value)
        except ValueError:
            continue
    return constants


def _line_offsets(source: str) -> list[int]:
    offsets = [0]
    for line in source.splitlines(keepends=True):
        offsets.append(offsets[-1] + len(line.encode("utf-8")))
    return offsets


def render_profile(source: str, profile: str = DEFAULT_PROFILE) -> str:
    """Return the task source with the constants of ``profile`` substituted.

    ``default`` (or a profile the task does not declare, when it declares none) returns the task's
    own sizes. Asking for a declared-nowhere profile of a task that has profiles is not an error:
    the task simply has one size (external KernelBench files never have profiles).
    """
    profiles = read_profiles(source)
    tree = ast.parse(source)
    assigns = _top_level_assigns(tree)
    overrides = profiles.get(profile, {}) if profile != DEFAULT_PROFILE else {}
    missing = [name for name in overrides if name not in assigns]
    if missing:
        raise ProfileError(f"profile {profile!r} sets constants the task does not define: {missing}")

    # Edits are byte spans (ast offsets are UTF-8 byte columns), applied back to front.
    data = source.encode("utf-8")
    offsets = _line_offsets(source)
    edits: list[tuple[int, int, bytes]] = []
    for name, value in overrides.items():
        val = assigns[name].value
        start = offsets[val.lineno - 1] + val.col_offset
        end = offsets[val.end_lineno - 1] + val.end_col_offset
        edits.append((start, end, repr(value).encode("utf-8")))
    prof = assigns.get(PROFILES_NAME)
    if prof is not None:
        start = offsets[prof.lineno - 1]
        end = offsets[prof.end_lineno]
        edits.append((start, end, b""))
    for start, end, text in sorted(edits, reverse=True):
        data = data[:start] + text + data[end:]
    return data.decode("utf-8").rstrip() + "\n"
