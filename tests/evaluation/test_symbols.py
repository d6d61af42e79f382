"""Reading what a compiled library calls from its ELF symbol table, and the native_symbols rule."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from kevin.evaluation.config import EvalConfig
from kevin.evaluation.rules import load_rules
from kevin.evaluation.symbols import aten_op_of, library_hits, read_elf_symbols, symbol_hits

pytestmark = pytest.mark.skipif(shutil.which("cc") is None, reason="needs a C compiler")

RULE = load_rules()["native_symbols"]
OPS = EvalConfig().allowed_runtime_ops


def build(tmp_path: Path, name: str, source: str, libs: tuple[str, ...] = ()) -> Path:
    """A shared library from ``source`` (its object file stays beside it, as our build leaves it)."""
    src = tmp_path / f"{name}.c"
    src.write_text(source)
    obj, out = tmp_path / f"{name}.o", tmp_path / f"{name}.so"
    subprocess.run(["cc", "-c", "-fPIC", "-O2", str(src), "-o", str(obj)], check=True, capture_output=True)
    subprocess.run(["cc", "-shared", str(obj), "-o", str(out), *libs], check=True, capture_output=True)
    return out


HONEST = "float add(float a, float b) { return a + b; }\n"
PASTED = """
#define J(a, b) a##b
extern int J(PyRun_, SimpleString)(const char*);
int evil(void) { return J(PyRun_, SimpleString)("import torch"); }
"""
THREAD = """
#include <pthread.h>
static void* run(void* p) { return p; }
int spawn(void) { pthread_t t; return pthread_create(&t, 0, run, 0); }
"""
LOADER = """
#include <dlfcn.h>
void* find(void) { return dlsym(dlopen("libcublas.so", 1), "cublasSgemm_v2"); }
"""


def test_an_honest_library_calls_nothing_forbidden(tmp_path):
    info = read_elf_symbols(build(tmp_path, "honest", HONEST))
    assert symbol_hits(info, RULE, OPS, "honest.so") == []


def test_python_api_reached_through_token_pasting_is_seen_by_its_real_name(tmp_path):
    info = read_elf_symbols(build(tmp_path, "pasted", PASTED))
    assert "PyRun_SimpleString" in info.undefined
    hits = symbol_hits(info, RULE, OPS, "pasted.so")
    assert [h.rule_id for h in hits] == ["native_symbols"] and "PyRun_SimpleString (the Python C API)" in hits[0].message


def test_threads_and_dynamic_loading_are_seen(tmp_path):
    assert any("pthread_create (threads)" in h.message for h in symbol_hits(read_elf_symbols(build(tmp_path, "t", THREAD)),
                                                                              RULE, OPS, "t.so"))
    messages = [h.message for h in symbol_hits(read_elf_symbols(build(tmp_path, "d", LOADER, ("-ldl",))), RULE, OPS, "d.so")]
    assert any("dlopen (dynamic loading)" in m for m in messages) and any("dlsym (dynamic loading)" in m for m in messages)


def test_a_library_linked_against_something_off_the_list_is_refused(tmp_path):
    info = read_elf_symbols(build(tmp_path, "z", HONEST, ("-Wl,--no-as-needed", "-lz")))
    assert "libz.so.1" in info.needed
    assert any("links libz.so.1" in h.message for h in symbol_hits(info, RULE, OPS, "z.so"))


def test_aten_operators_are_read_from_mangled_names():
    assert aten_op_of("_ZN2at4_ops19empty_memory_format4callEN3c108ArrayRefINS2_6SymIntEEE") == "empty_memory_format"
    assert aten_op_of("_ZN2at4_ops3sum4callERKNS_6TensorESt8optionalIN3c1010ScalarTypeEE") == "sum"
    assert aten_op_of("_ZN3c106detail19torchCheckFailEPKc") is None
    from kevin.evaluation.symbols import ElfSymbols

    info = ElfSymbols(undefined=["_ZN2at4_ops19empty_memory_format4callEv", "_ZN2at4_ops8to_dtype4callEv",
                                 "_ZN2at4_ops3sum4callEv", "_ZN2at4_ops14select_scatter4callEv"])
    hits = [h.message for h in symbol_hits(info, RULE, OPS, "x.so")]
    # empty (an overload of an allowed operator) and to.dtype pass; sum and select_scatter (not select) are compute
    assert hits == ["x.so calls the PyTorch operator aten::sum (PyTorch compute)",
                    "x.so calls the PyTorch operator aten::select_scatter (PyTorch compute)"]


def test_the_rule_can_be_switched_off():
    from kevin.evaluation.symbols import ElfSymbols

    off = load_rules({"native_symbols": {"enabled": False}})["native_symbols"]
    assert symbol_hits(ElfSymbols(undefined=["PyRun_SimpleString"]), off, OPS, "x.so") == []


def test_a_staging_folder_is_checked_whole_and_odd_files_are_refused(tmp_path):
    build(tmp_path, "honest", HONEST)
    (tmp_path / "fake.so").write_bytes(b"not an elf file")
    (tmp_path / "link.so").symlink_to(tmp_path / "honest.so")
    messages = [h.message for h in library_hits(tmp_path, RULE, OPS)]
    assert any("fake.so: unreadable library" in m for m in messages)
    assert any("link.so: build outputs may not be symbolic links" in m for m in messages)
    assert not any(m.startswith("honest") for m in messages)


def test_object_files_are_held_to_their_calls_and_libraries_to_what_they_link(tmp_path):
    build(tmp_path, "pasted", PASTED)  # pasted.o calls the Python C API
    messages = [h.message for h in library_hits(tmp_path, RULE, OPS)]
    assert messages == ["pasted.o calls PyRun_SimpleString (the Python C API)"]  # the .so is judged by its objects
    (tmp_path / "pasted.o").unlink()
    assert [h.message for h in library_hits(tmp_path, RULE, OPS)] == [
        "a library was left without the object files it was linked from"]


@pytest.mark.parametrize("blob", [b"\x7fELF" + b"\x02\x01" + b"\x00" * 58, b"\x7fELF\x02\x01" + b"\xff" * 100])
def test_truncated_or_corrupt_headers_are_errors_not_crashes(tmp_path, blob):
    path = tmp_path / "bad.so"
    path.write_bytes(blob)
    with pytest.raises(ValueError):
        read_elf_symbols(path)
