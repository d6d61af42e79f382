"""Our extension build: requests, the operator registration, the narrow/full header paths, compiler messages."""

from __future__ import annotations

import pytest
import torch

from kevin.evaluation.build_sources import ExtensionRequest, RequestError, registration
from kevin.evaluation.builder import CompileFailure, build_extension, find_library
from kevin.evaluation.headers import cuda_header_names, fallback_needed
from kevin.evaluation.config import EvalConfig
from kevin.evaluation.rules import load_rules
from kevin.evaluation.symbols import library_hits


@pytest.fixture(scope="module")
def toolchain(cache_dir):
    from kevin.evaluation import Evaluator

    ev = Evaluator(EvalConfig(backend="cpu", cache_dir=str(cache_dir)))
    yield ev.toolchain()
    ev.close()


def request(**kwargs):
    return ExtensionRequest.from_call({"name": "ext", "functions": ["f"], **kwargs})


def test_requests_are_validated_like_a_careful_load_inline():
    assert request(cpp_sources="int f();").cpp_sources == ("int f();",)
    assert request(functions={"f": "doc"}).functions == ("f",)
    for bad, message in [({"name": "a b"}, "plain identifier"), ({"functions": []}, r"functions=\[\.\.\.\]"),
                         ({"functions": ["f(); evil"]}, r"not a C\+\+ function name"), ({"extra_include_paths": ["/etc"]}, "not supported"),
                         ({"cpp_sources": 3}, "string or a list of strings")]:
        with pytest.raises(RequestError, match=message):
            request(**bad)


def test_the_operator_table_names_every_function_and_registers_nothing():
    """The candidate's translation unit ends with a table of its functions; the registration itself (torch::Library)
    is our own object, so nothing in the candidate's object needs the registration API."""
    text = registration("kevin_abc", ("relu", "ns::gelu"))
    assert '    {"relu", &kevin_ops::make<&relu>},\n    {"gelu", &kevin_ops::make<&ns::gelu>},\n' in text
    assert text.endswith('extern "C" const kevin_ops::Table kevin_ops_table = {"kevin_abc", kevin_ops_exports, 2};\n')
    assert "#undef kevin_ops_table\n" in text  # a macro of the candidate's cannot rename our table
    assert "TORCH_LIBRARY" not in text and "Library" not in text


def test_the_full_headers_decide_only_for_names_the_narrow_ones_lack():
    full_only = {"Slice", "conv2d"}
    assert fallback_needed("main.cpp:5:3: error: \u2018Slice\u2019 is not a member of \u2018torch::indexing\u2019", full_only)
    assert fallback_needed('cuda.cu(7): error: identifier "conv2d" is undefined', full_only)
    assert not fallback_needed("main.cpp:9:12: error: \u2018y\u2019 was not declared in this scope", full_only)
    assert not fallback_needed("main.cpp:9:12: error: expected \u2018;\u2019 before \u2018}\u2019 token", full_only)


CUDA_H_EXCERPT = r"""
/**
 * \file cuda.h
 * \brief Header file for the CUDA Toolkit application programming interface. If h is given, L bytes are copied.
 */
#define CUDA_VERSION 13000
#define CU_LAUNCH_PARAM_END ((void*)0x00)
typedef int CUdevice; // C handle
typedef enum CUjit_option_enum { CU_JIT_MAX_REGISTERS = 0 } CUjit_option;
typedef unsigned long long cuuint64_t;
CUresult CUDAAPI cuMemAlloc(CUdeviceptr *dptr, size_t bytesize); /* see "Memory Management" */
CUresult CUDAAPI cuCtxSetLimit(CUlimit limit, size_t value) __attribute__((deprecated("use x")));
extern "C" { const unsigned long long mask = 0x10UL; }
"""


def test_cuda_h_contributes_the_names_it_declares_not_its_prose():
    """A failed cuda build goes on to the full headers only when a name the errors quote is one they declare. cuda.h's
    comments once counted: any one-letter variable a policy forgot ("h", "L") sent its failed build through the full
    headers too, twice the compile time (35 s instead of 15-20 s on the H100), for the same errors."""
    names = cuda_header_names(CUDA_H_EXCERPT)
    for declared in ("CUDA_VERSION", "CU_LAUNCH_PARAM_END", "CUdevice", "CUjit_option", "CU_JIT_MAX_REGISTERS",
                     "cuuint64_t", "cuMemAlloc", "cuCtxSetLimit", "CUDAAPI"):
        assert declared in names, declared
    for prose in ("h", "L", "C", "UL", "brief", "Toolkit", "bytes", "copied", "handle", "Memory", "Management", "use"):
        assert prose not in names, prose
    # Kept on the cautious side: a prototype's parameter names stay (a needless fallback costs seconds, a missed one
    # would refuse an honest kernel).
    assert {"dptr", "bytesize", "limit"} <= names
    assert not fallback_needed('cuda.cu(12): error: identifier "L" is undefined', names)
    assert fallback_needed('cuda.cu(3): error: identifier "cuMemAlloc" is undefined', names)


SIGNATURES = r"""
#include <torch/extension.h>
#include <string>
#include <tuple>
#include <vector>

#define CHECK_CPU(x) TORCH_CHECK(!x.is_cuda(), #x " must be a CPU tensor")
#define CHECK_INPUT(x) CHECK_CPU(x); TORCH_CHECK(x.is_contiguous(), #x " must be contiguous")

template <typename scalar_t>
static void scale_loop(const scalar_t* in, scalar_t* out, int64_t n, scalar_t s) {
    for (int64_t i = 0; i < n; ++i) out[i] = in[i] * s;
}

torch::Tensor scale(const torch::Tensor& x, float s, int repeat, bool negate) {
    CHECK_INPUT(x);
    auto y = torch::empty_like(x);
    AT_DISPATCH_FLOATING_TYPES(x.scalar_type(), "scale", [&] {
        scale_loop<scalar_t>(x.data_ptr<scalar_t>(), y.data_ptr<scalar_t>(), x.numel(),
                             static_cast<scalar_t>(negate ? -s * repeat : s * repeat));
    });
    return y;
}

std::tuple<torch::Tensor, int64_t> with_count(torch::Tensor x, std::vector<int64_t> dims, std::optional<torch::Tensor> bias) {
    int64_t total = 0;
    for (auto d : dims) total += d;
    return {bias.has_value() ? *bias : x, total};
}

std::pair<double, std::string> describe(std::vector<double> values, std::string label) {
    double sum = 0;
    for (double v : values) sum += v;
    return {sum, label + "!"};
}

void fill_in_place(torch::Tensor& out, double value) {
    float* p = out.data_ptr<float>();
    for (int64_t i = 0; i < out.numel(); ++i) p[i] = (float)value;
}

std::vector<torch::Tensor> split_two(torch::Tensor x) { return {x, x}; }
int answer() noexcept { return 42; }
"""


def test_every_common_signature_is_callable_through_the_operator_registration(toolchain, tmp_path):
    req = ExtensionRequest.from_call({"name": "sigs", "cpp_sources": SIGNATURES,
                                      "functions": ["scale", "with_count", "describe", "fill_in_place", "split_two", "answer"]})
    result = build_extension(req, toolchain, tmp_path)
    assert result.path == "lite"
    library = find_library(tmp_path, req, toolchain)
    assert library is not None and library.name == "sigs.so"
    hits = library_hits(tmp_path, load_rules()["native_symbols"], EvalConfig().allowed_runtime_ops)
    assert hits == [], [h.message for h in hits]  # no Python, no pybind11: the library is only the candidate's code
    torch.ops.load_library(str(library))
    ops = getattr(torch.ops, req.op_namespace(toolchain))
    x = torch.arange(4, dtype=torch.float32)
    assert torch.equal(ops.scale(x, 0.5, 2, True), -x)  # float, int and bool converted from the schema's types
    out, total = ops.with_count(x, [1, 2, 3], None)
    assert torch.equal(out, x) and total == 6
    assert torch.equal(ops.with_count(x, [], x + 1)[0], x + 1)
    assert ops.describe([1.0, 2.5], "sum") == (3.5, "sum!")
    buffer = torch.zeros(3)
    assert ops.fill_in_place(buffer, 7.0) is None and torch.equal(buffer, torch.full((3,), 7.0))  # a Tensor& parameter
    assert len(ops.split_two(x)) == 2 and ops.answer() == 42


def test_compiler_messages_keep_the_candidates_line_numbers(toolchain, tmp_path):
    source = "#include <torch/extension.h>\n\ntorch::Tensor f(torch::Tensor x) {\n    return undeclared_thing;\n}\n"
    with pytest.raises(CompileFailure) as info:
        build_extension(request(cpp_sources=source), toolchain, tmp_path)
    assert "main.cpp:4:12: error:" in info.value.text and "undeclared_thing" in info.value.text
    assert "/tmp" not in info.value.text.split("error:")[0]  # relative file names: no machine paths


def test_a_source_that_needs_the_full_headers_is_built_with_them(toolchain, tmp_path):
    source = ("#include <torch/extension.h>\n"
              "torch::Tensor f(torch::Tensor x) { auto s = torch::indexing::Slice(0, 1); (void)s; return x; }\n")
    result = build_extension(request(cpp_sources=source), toolchain, tmp_path)
    assert result.path == "full" and (tmp_path / request(cpp_sources=source).dir_name(toolchain) / "full" / "ext.so").is_file()


def test_a_copied_header_folder_keeps_its_precompiled_headers(toolchain, tmp_path):
    """A cache copied to another place (another checkout, a test's own cache) uses the precompiled headers it holds
    instead of spending half a minute making them again."""
    import dataclasses
    import subprocess
    from pathlib import Path

    from kevin.evaluation.builder import prepare_headers
    from tests.conftest import link_tree

    copy = tmp_path / "headers"
    link_tree(Path(toolchain.pch_dir), copy)
    moved = dataclasses.replace(toolchain, pch_dir=str(copy))
    before = {p.name: p.stat().st_mtime_ns for p in copy.glob("*.gch")}
    assert sorted(before) == ["kevin_full.h.gch", "kevin_lite.h.gch"]
    assert prepare_headers(moved) == ""
    assert {p.name: p.stat().st_mtime_ns for p in copy.glob("*.gch")} == before  # not precompiled again
    (tmp_path / "t.cpp").write_text("torch::Tensor f(torch::Tensor x) { return x.contiguous(); }\n")
    # -H lists the headers gcc reads; a precompiled one it uses is marked with '!'.
    done = subprocess.run([moved.cxx, *moved.cxx_flags(True), "-Winvalid-pch", "-H", "-fsyntax-only", "t.cpp"],
                          cwd=tmp_path, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-2000:]
    assert f"! {copy / 'kevin_lite.h.gch'}" in done.stderr, done.stderr[-2000:]


def test_the_narrow_header_takes_the_op_wrappers_without_their_heavy_includes(toolchain, tmp_path):
    """torch_lite.h's op headers (ATen/ops/empty.h ...) are replaced by their own inline wrappers and declarations:
    none of the includes they carry (ATen/Context.h, DeviceGuard.h ...) is parsed, yet every allocation function a
    kernel's host code calls is there, taken from the installed torch."""
    from kevin.evaluation.headers import lite_torch_text
    from kevin.evaluation.toolchain import CUDA_LITE, LITE_HEADER

    slim = lite_torch_text(toolchain.include_dirs)
    assert "#include <ATen/ops/empty.h>" in LITE_HEADER.read_text() and "#include <ATen/ops/empty.h>" not in slim
    for name in ("empty", "empty_like", "zeros", "full_like"):
        assert f"#include <ATen/ops/{name}_ops.h>" in slim
    assert "inline at::Tensor empty(at::IntArrayRef size, at::TensorOptions options={}" in slim
    assert "ATen/Context.h" not in slim and "ATen/DeviceGuard.h" not in slim
    ops_lines = [line for line in LITE_HEADER.read_text().splitlines() if line.startswith("#include <ATen/ops/")]
    assert len(ops_lines) >= 9 and all(line in lite_torch_text(()).splitlines() for line in ops_lines)  # none found: kept
    # The pre-included headers of a build are the slim ones, nvcc's included.
    from pathlib import Path

    folder = toolchain.pch_dir
    assert (Path(folder) / CUDA_LITE).read_text() == "#pragma once\n" + slim
    assert slim in (Path(folder) / "kevin_lite.h").read_text()
    source = ("torch::Tensor f(torch::Tensor x) { auto z = torch::full({2}, 1.5f); auto e = torch::empty({2, 3}, x.options());\n"
              "  (void)z; (void)e; return torch::zeros_like(x); }\n")
    result = build_extension(request(cpp_sources=source), toolchain, tmp_path)
    assert result.path == "lite"


def test_nvcc_pre_includes_the_slim_header_once_it_is_written(tmp_path):
    import dataclasses

    from kevin.evaluation.toolchain import CUDA_LITE, LITE_HEADER, Toolchain

    tc = Toolchain(backend="cuda", cxx="c++", nvcc="nvcc", std="c++17", include_dirs=(), lib_dirs=(), define_flags=(),
                   nvcc_flags=(), arch_flags=(), torch_version="x", pch_dir=str(tmp_path))
    assert tc.nvcc_command(True, [])[-6:-4] == ["-include", str(LITE_HEADER)]
    (tmp_path / CUDA_LITE).write_text("#pragma once\n")
    assert tc.nvcc_command(True, [])[-6:-4] == ["-include", str(tmp_path / CUDA_LITE)]
    assert "torch/all.h" in dataclasses.replace(tc).nvcc_command(False, [])


def test_a_library_calls_its_own_definitions_not_the_processes_first(toolchain, tmp_path):
    """A candidate that defines a function of the interpreter's (or MKL's) itself and calls it must get its own: its
    object then imports nothing, so without -Bsymbolic the dynamic linker would bind the call to the first definition
    in the process (the interpreter's own Py_IsInitialized returns 1)."""
    source = ('extern "C" int Py_IsInitialized(void) { return 7; }\n'
              "torch::Tensor f(torch::Tensor x) { return torch::full({1}, (float)Py_IsInitialized()); }\n")
    req = request(cpp_sources=source, name="own_defs")
    build_extension(req, toolchain, tmp_path)
    assert "-Wl,-Bsymbolic" in toolchain.link_command(["main.o"], "x", [])
    torch.ops.load_library(str(find_library(tmp_path, req, toolchain)))
    assert getattr(torch.ops, req.op_namespace(toolchain)).f(torch.zeros(1)).item() == 7.0
    # The symbol check refuses the definition all the same: nothing honest defines such a name.
    messages = [h.message for h in library_hits(tmp_path, load_rules()["native_symbols"], EvalConfig().allowed_runtime_ops)]
    assert messages == ["main.o defines Py_IsInitialized (the Python C API)"]
