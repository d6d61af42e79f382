"""Every static rule fires on its hack and stays quiet on honest solutions."""

from __future__ import annotations

import pytest

from kevin.evaluation.rules import RuleHit, bad_flags, cpp_rule_hits, flag_hits, load_rules, split_flags, static_hits
from kevin.tasks import bundled_solutions_dir, load_bundled_suite
from tests.conftest import RELU_BODY, cpp_solution

RULES = load_rules()
HONEST = cpp_solution(RELU_BODY)


def ids(hits: list[RuleHit]) -> set[str]:
    return {h.rule_id for h in hits}


def hits_for(source: str, backend: str = "cpu", reference: str | None = None) -> set[str]:
    return ids(static_hits(source, backend, RULES, reference))


def test_honest_solution_has_no_hits():
    assert hits_for(HONEST) == set()


@pytest.mark.parametrize("backend", ["cpu", "cuda"])
def test_every_bundled_reference_solution_passes_the_static_rules(backend):
    tasks = load_bundled_suite()
    checked = 0
    for task in tasks:
        path = bundled_solutions_dir(backend) / f"level{task.level}" / f"{task.name}.py"
        if path.exists():
            hits = static_hits(path.read_text(), backend, RULES, task.render())
            assert hits == [], f"{path}: {[h.describe() for h in hits]}"
            checked += 1
    assert checked >= 1


PYTHON_CASES = {
    "forbidden_import": ["import threading", "import subprocess", "import time", "import gc", "import ctypes",
                         "import numpy as np", "from os import system", "import inspect"],
    "torch_compute": ["torch.relu(x)", "F.relu(x)", "x.sum()", "x @ x", "torch.matmul(x, x)", "x.t()",
                      "torch.nn.functional.gelu(x)"],
    "torch_namespaces": ["torch.ops.aten.relu(x)", "torch._C._nn.gelu(x)", "torch.library.Library('x', 'DEF')"],
    "dynamic_code": ["eval('x')", "exec('y = 1')", "getattr(torch, 'relu')(x)", "__import__('gc')", "x.__class__",
                     "globals()", "open('/etc/passwd')", "vars(torch)"],
    "patching": ["torch.cuda.synchronize = print", "torch.relu = None", "setattr_target.attr = 1"],
}


@pytest.mark.parametrize("rule_id,snippet", [(r, s) for r, snippets in PYTHON_CASES.items() for s in snippets])
def test_python_rule_fires(rule_id, snippet):
    if snippet.startswith(("import", "from")):
        source = HONEST.replace("import torch\n", f"import torch\n{snippet}\n", 1)
    else:
        source = HONEST.replace("return ext.relu_forward(x)", f"y = {snippet}\n        return ext.relu_forward(x)")
        if "=" in snippet and "(" not in snippet.split("=")[0] and not snippet.startswith("y"):
            source = HONEST.replace("return ext.relu_forward(x)", f"{snippet}\n        return ext.relu_forward(x)")
    source = source.replace("import torch.nn as nn\n", "import torch.nn as nn\nimport torch.nn.functional as F\n", 1)
    assert rule_id in hits_for(source), f"{snippet!r} should break {rule_id}"


def test_try_except_and_pass():
    src = HONEST.replace("return ext.relu_forward(x)", "try:\n            return ext.relu_forward(x)\n        except Exception:\n            return x")
    assert "try_except" in hits_for(src)
    src = HONEST.replace("super().__init__()", "super().__init__()\n        pass")
    assert "pass_statement" in hits_for(src)


def test_global_state_is_patching():
    src = HONEST.replace("return ext.relu_forward(x)", "global cache\n        return ext.relu_forward(x)")
    assert "patching" in hits_for(src)


def test_reference_inheritance_and_copy(relu_task):
    sub = HONEST + "\n\nclass Model(nn.Module):\n    def forward(self, x):\n        return x\n"
    assert "reference_inheritance" in hits_for(sub)
    inherit = HONEST.replace("class ModelNew(nn.Module):", "class ModelNew(Model):")
    assert "reference_inheritance" in hits_for(inherit)
    copy = HONEST.replace("return ext.relu_forward(x)", "return torch.relu(x)")
    assert "reference_inheritance" in hits_for(copy, reference=relu_task.render())


def test_calling_a_pytorch_layer_in_forward_is_compute_but_holding_it_is_not():
    held = HONEST.replace("super().__init__()", "super().__init__()\n        self.conv = nn.Conv2d(3, 3, 3)")
    assert hits_for(held) == set()
    called = held.replace("return ext.relu_forward(x)", "return ext.relu_forward(self.conv(x))")
    assert "torch_compute" in hits_for(called)


def test_allocation_and_queries_are_allowed():
    src = HONEST.replace("return ext.relu_forward(x)", "out = torch.empty_like(x)\n        n = x.shape[0] * x.size(1)\n        return ext.relu_forward(x)")
    assert hits_for(src) == set()


def test_inline_kernel_required():
    no_ext = "import torch\nimport torch.nn as nn\n\nclass ModelNew(nn.Module):\n    def forward(self, x):\n        return x\n"
    assert "inline_kernel_required" in hits_for(no_ext)
    assert "inline_kernel_required" in hits_for(HONEST, backend="cuda")  # no __global__ kernel


CPP_CASES = {
    "cpp_torch_compute": ["return torch::matmul(x, x);", "return at::relu(x);", "cublasSgemm(h);",
                          "#include <cudnn.h>", "#include <ATen/ops/matmul.h>", "return at::native::relu(x);",
                          "namespace Q = at;\nreturn Q::relu(x);", "namespace T = ::torch;\nreturn T::matmul(x, x);",
                          "namespace N = at::native;\nreturn N::relu(x);"],
    "cpp_forbidden_calls": ["std::thread t([]{});", "pthread_create(0,0,0,0);",
                            "cudaStreamCreate(&s);", "fork();", "system(\"ls\");", "exit(0);", "dlopen(\"x\", 0);",
                            "#include <Python.h>", "PyObject* o = 0;", "py::module m;", "auto t = std::chrono::steady_clock::now();",
                            "FILE* f = fopen(\"/etc/passwd\", \"r\");", "abort();"],
    "try_except": ["try { f(); } catch (...) {}"],
}


@pytest.mark.parametrize("rule_id,line", [(r, s) for r, lines in CPP_CASES.items() for s in lines])
def test_cpp_rule_fires(rule_id, line):
    source = f"#include <torch/extension.h>\ntorch::Tensor f(torch::Tensor x) {{\n{line}\nreturn x;\n}}\n"
    assert rule_id in ids(cpp_rule_hits([source], RULES))


def test_cpp_allowed_symbols_and_comments():
    source = """
#include <torch/extension.h>
#include <ATen/cuda/CUDAContext.h>
// unlike cuBLAS we do it by hand; at::matmul would be cheating
torch::Tensor f(torch::Tensor x) {
    auto y = torch::empty_like(x);
    auto z = torch::zeros({x.size(0)}, x.options().dtype(torch::kFloat32));
    auto s = at::cuda::getCurrentCUDAStream();
    TORCH_CHECK(x.is_contiguous(), "x must be contiguous");
    const float m = std::numeric_limits<float>::max();
    return y;
}
"""
    assert cpp_rule_hits([source], RULES) == []


def test_flags_allow_list():
    assert flag_hits(["-O3", "--use_fast_math", "-arch=sm_90"], RULES) == []
    assert ids(flag_hits(["-lcublas"], RULES)) == {"load_inline_flags"}
    assert ids(flag_hits(["--default-stream=per-thread"], RULES)) == {"load_inline_flags"}


@pytest.mark.parametrize("value, words", [
    (None, ()), ("", ()), ([""], ()), ([" ", "\t"], ()), ([None, "-O3"], ("-O3",)), ("-O3", ("-O3",)),
    ("-O3 --use_fast_math", ("-O3", "--use_fast_math")), (["-O3", "-O3"], ("-O3", "-O3")),
    (("-Xcompiler", "-O3"), ("-Xcompiler", "-O3")), (["-DNAME=\"a b\""], ("-DNAME=a b",)),
])
def test_flag_lists_are_read_as_their_argument_words(value, words):
    """KernelBench's solutions write extra_cflags=[""], None or one string: none of those is a flag."""
    assert split_flags(value) == words


@pytest.mark.parametrize("value", [3, [3], ["-O3", b"-O2"], {"-O3": 1}])
def test_flag_lists_of_other_types_are_errors(value):
    with pytest.raises(ValueError):
        split_flags(value)


FLAGS = load_rules()["load_inline_flags"]
ACCEPTED = [
    "", " ", "-O3", "-O2", "-O0", "-Os", "-Ofast", "-O", "--use_fast_math", "-use_fast_math", "-std=c++17", "--std=c++20",
    "-lineinfo", "-g", "-v", "-w", "-Wall", "-Wno-unused-variable", "-Werror=return-type", "-DNDEBUG", "-DBLOCK=256",
    "-D TILE=32", "-UDEBUG", "-U__CUDA_NO_HALF_OPERATORS__", "-D__CUDA_NO_HALF2_OPERATORS__", "-fopenmp", "-ffast-math",
    "-funroll-loops", "-fno-strict-aliasing", "-ftree-vectorize", "-march=native", "-mtune=native", "-mavx2", "-mfma",
    "-mavx512f", "-msse4.2", "--param=l1-cache-line-size=64", "-lgomp", "-lcuda", "-lcudart", "-lm",
    "-arch=sm_90", "-arch sm_90a", "--gpu-architecture=compute_90", "-gencode=arch=compute_90,code=sm_90",
    "-gencode arch=compute_80,code=[sm_80,compute_80]", "-code=sm_90", "-maxrregcount=64", "--maxrregcount 128",
    "--expt-relaxed-constexpr", "--expt-extended-lambda", "--extended-lambda", "-Xcompiler -O3",
    "-Xcompiler=-fopenmp,-O3", "--compiler-options -march=native", "-Xptxas -v", "-Xptxas=-O3,-v",
    "--ptxas-options=-v", "-Xptxas --warn-on-spills", "--ftz=true", "--prec-div=false", "--fmad=true",
    "-Xcudafe --diag_suppress=177", "--diag-suppress=550", "-t 4", "--threads=2", "-res-usage", "-O3 -DNDEBUG -Wall",
]
REJECTED = [
    "-lcublas", "-lcudnn", "-lpthread", "-L/tmp", "-Wl,-rpath,/tmp", "-Wl,--wrap=malloc", "-Xlinker --wrap=malloc",
    "-shared", "-static", "-nostdlib", "-include /etc/passwd", "-imacros x.h", "-I/etc", "-isystem /etc", "-iquote /etc",
    "-idirafter /etc", "-DTORCH_CHECK=assert", "-D_GLIBCXX_USE_CXX11_ABI=0", "-DC10_MOBILE", "-Dkevin_ops_table=x",
    "-UTORCH_API", "--compiler-bindir=/tmp", "-ccbin /tmp/gcc", "-B/tmp", "-specs=/tmp/x", "-fplugin=/tmp/p.so",
    "-fplugin-arg-x-y", "-fprofile-generate", "-fsanitize=address", "-finstrument-functions", "-flto", "-save-temps",
    "-o /tmp/x", "-c", "-S", "-E", "-x cu", "-Wa,--defsym,x=1", "-Wp,-include,/etc/passwd", "-Xnvlink -x",
    "-rdc=true", "-dc", "--keep", "--options-file /tmp/f", "-optf /tmp/f", "-Xcompiler -fplugin=/tmp/p.so",
    "-Xcompiler=-O3,-B/tmp", "-Xptxas --options-file=/tmp/f", "--default-stream per-thread", "-Xlinker", "-dlto",
]


@pytest.mark.parametrize("flags", ACCEPTED)
def test_harmless_flags_are_accepted(flags):
    assert bad_flags(split_flags(flags), FLAGS) == [], flags
    assert flag_hits([flags], RULES) == []


@pytest.mark.parametrize("flags", REJECTED)
def test_flags_that_change_what_is_built_or_loaded_are_rejected(flags):
    assert bad_flags(split_flags(flags), FLAGS), flags
    assert ids(flag_hits([flags], RULES)) == {"load_inline_flags"}


def test_kernelbench_style_requests_build_with_clean_argument_lists():
    """The request a build gets holds the words only: g++ and nvcc never see an empty argument."""
    from kevin.evaluation.build_sources import ExtensionRequest

    req = ExtensionRequest.from_call({"name": "ext", "functions": ["f"], "cpp_sources": "int f();", "extra_cflags": [""],
                                      "extra_cuda_cflags": ["-O3 --use_fast_math", None], "extra_ldflags": None})
    assert (req.extra_cflags, req.extra_cuda_cflags, req.extra_ldflags) == ((), ("-O3", "--use_fast_math"), ())


def test_honest_utilities_pass_the_text_rule():
    """at::parallel_for and its kind, at::vec and dtype constants are no PyTorch compute; only the symbol check
    decides compute, exactly, once compiled. A method name (v.exp(), acc.add()) says nothing about its object."""
    source = """
#include <torch/extension.h>
#include <ATen/cpu/vec/vec.h>
struct Acc { float s = 0; void add(float v) { s += v; } float sum() const { return s; } };
torch::Tensor f(torch::Tensor x) {
    using Vec = at::vec::Vectorized<float>;
    auto v = Vec::loadu(x.data_ptr<float>()).exp();
    at::vec::map([](Vec a) { return a.abs(); }, x.data_ptr<float>(), x.data_ptr<float>(), 8);
    int64_t t = at::get_num_threads() + at::get_thread_num();
    at::parallel_for(0, x.numel(), 1024, [&](int64_t b, int64_t e) { Acc a; for (int64_t i = b; i < e; ++i) a.add(1.f); });
    TORCH_CHECK(x.scalar_type() == at::ScalarType::Float && t > 0);
    auto y = at::empty_like(x, x.options().dtype(at::kFloat));
    return y;
}
"""
    assert cpp_rule_hits([source], RULES) == []


def test_rules_are_data():
    relaxed = load_rules({"try_except": {"enabled": False}})
    src = HONEST.replace("return ext.relu_forward(x)", "try:\n            return ext.relu_forward(x)\n        except Exception:\n            return x")
    assert "try_except" not in ids(static_hits(src, "cpu", relaxed))
    tightened = load_rules({"forbidden_import": {"allowed_modules": ["torch", "torch.nn"]}})
    assert "forbidden_import" in ids(static_hits(HONEST, "cpu", tightened))
    with pytest.raises(ValueError, match="unknown rule id"):
        load_rules({"no_such_rule": {}})


def test_openmp_is_allowed_in_cpp_and_as_a_flag():
    source = ("#include <torch/extension.h>\ntorch::Tensor f(torch::Tensor x) {\n#pragma omp parallel for\n"
              "for (int i = 0; i < 4; ++i) {}\nreturn x;\n}\n")
    assert cpp_rule_hits([source], RULES) == []
    assert flag_hits(["-fopenmp", "-O3"], RULES) == [] and flag_hits(["-lgomp"], RULES) == []
