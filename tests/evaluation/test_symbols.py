"""Reading what compiled code calls and executes from its ELF file, and the native_symbols rule: forbidden classes,
the strict list a candidate's own object is held to, and the disassembly of its machine code."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

from kevin.evaluation.config import EvalConfig
from kevin.evaluation.rules import load_rules
from kevin.evaluation.elf import ElfSymbols, mangled_scope, read_elf_symbols, runtime_exports
from kevin.evaluation.symbols import LinkBaseline, aten_op_of, instruction_hits, library_hits, symbol_hits

pytestmark = pytest.mark.skipif(shutil.which("cc") is None, reason="needs a C compiler")

RULE = load_rules()["native_symbols"]
OPS = EvalConfig().allowed_runtime_ops


def build(tmp_path: Path, name: str, source: str, libs: tuple[str, ...] = (), cxx: bool = False) -> Path:
    """A shared library from ``source`` (its object file stays beside it, as our build leaves it)."""
    src = tmp_path / f"{name}.{'cpp' if cxx else 'c'}"
    src.write_text(source)
    obj, out = tmp_path / f"{name}.o", tmp_path / f"{name}.so"
    compiler = "c++" if cxx else "cc"
    subprocess.run([compiler, "-c", "-fPIC", "-O2", str(src), "-o", str(obj)], check=True, capture_output=True)
    subprocess.run([compiler, "-shared", str(obj), "-o", str(out), *libs], check=True, capture_output=True)
    return out


def obj(library: Path) -> ElfSymbols:
    """The object file a test library was linked from, as the evaluator reads a candidate's object."""
    return read_elf_symbols(library.with_suffix(".o"), code=True)


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
    library = build(tmp_path, "honest", HONEST)
    assert symbol_hits(obj(library), RULE, OPS, "honest.o") == []
    assert symbol_hits(read_elf_symbols(library), RULE, OPS, "honest.so", calls=False) == []


def test_python_api_reached_through_token_pasting_is_seen_by_its_real_name(tmp_path):
    info = obj(build(tmp_path, "pasted", PASTED))
    assert "PyRun_SimpleString" in info.undefined
    hits = symbol_hits(info, RULE, OPS, "pasted.o")
    assert [h.rule_id for h in hits] == ["native_symbols"] and "PyRun_SimpleString (the Python C API)" in hits[0].message


def test_threads_and_dynamic_loading_are_seen(tmp_path):
    assert any("pthread_create (threads)" in h.message for h in symbol_hits(obj(build(tmp_path, "t", THREAD)), RULE, OPS, "t.o"))
    messages = [h.message for h in symbol_hits(obj(build(tmp_path, "d", LOADER, ("-ldl",))), RULE, OPS, "d.o")]
    assert any("dlopen (dynamic loading)" in m for m in messages) and any("dlsym (dynamic loading)" in m for m in messages)


def test_a_library_linked_against_something_off_the_list_is_refused(tmp_path):
    info = read_elf_symbols(build(tmp_path, "z", HONEST, ("-Wl,--no-as-needed", "-lz")))
    assert "libz.so.1" in info.needed
    assert any("links libz.so.1" in h.message for h in symbol_hits(info, RULE, OPS, "z.so"))


def test_aten_operators_are_read_from_mangled_names():
    assert aten_op_of("_ZN2at4_ops19empty_memory_format4callEN3c108ArrayRefINS2_6SymIntEEE") == "empty_memory_format"
    assert aten_op_of("_ZN2at4_ops3sum4callERKNS_6TensorESt8optionalIN3c1010ScalarTypeEE") == "sum"
    assert aten_op_of("_ZN3c106detail19torchCheckFailEPKc") is None
    from kevin.evaluation.elf import ElfSymbols

    info = ElfSymbols(undefined=["_ZN2at4_ops19empty_memory_format4callEv", "_ZN2at4_ops8to_dtype4callEv",
                                 "_ZN2at4_ops3sum4callEv", "_ZN2at4_ops14select_scatter4callEv"])
    hits = [h.message for h in symbol_hits(info, RULE, OPS, "x.so")]
    # empty (an overload of an allowed operator) and to.dtype pass; sum and select_scatter (not select) are compute
    assert hits == ["x.so calls the PyTorch operator aten::sum (PyTorch compute)",
                    "x.so calls the PyTorch operator aten::select_scatter (PyTorch compute)"]


def test_the_rule_can_be_switched_off():
    from kevin.evaluation.elf import ElfSymbols

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
    # The object strictly; the library by the forbidden classes it calls (our registration object and the C
    # runtime's start files are linked into it, so it is not held to the object's list).
    assert messages == ["pasted.o calls PyRun_SimpleString (the Python C API)",
                        "pasted.so calls PyRun_SimpleString (the Python C API)"]
    (tmp_path / "pasted.o").unlink()
    assert [h.message for h in library_hits(tmp_path, RULE, OPS)] == [
        "pasted.so calls PyRun_SimpleString (the Python C API)", "a library was left without the object files it was linked from"]


@pytest.mark.parametrize("blob", [b"\x7fELF" + b"\x02\x01" + b"\x00" * 58, b"\x7fELF\x02\x01" + b"\xff" * 100])
def test_truncated_or_corrupt_headers_are_errors_not_crashes(tmp_path, blob):
    path = tmp_path / "bad.so"
    path.write_bytes(blob)
    with pytest.raises(ValueError):
        read_elf_symbols(path)



@pytest.mark.parametrize("symbol, scope", [
    ("_ZN3c106detail14torchCheckFailEPKcS2_jS2_", "c10::detail::torchCheckFail"),
    ("_ZNK2at10TensorBase8data_ptrIfEEPT_v", "at::TensorBase::data_ptr"),
    ("_ZN3c1010Dispatcher13realSingletonEv", "c10::Dispatcher::realSingleton"),
    ("_ZNK3c1010Dispatcher17findSchemaOrThrowEPKcS2_", "c10::Dispatcher::findSchemaOrThrow"),
    ("_ZNR5torch7Library4_defEOSt7variantIJN3c1012OperatorNameENS2_14FunctionSchemaEEEONS_11CppFunctionE", "torch::Library::_def"),
    ("_ZN5torch7LibraryC1ENS0_4KindENSt7__cxx1112basic_stringIcSt11char_traitsIcESaIcEEE", "torch::Library"),
    ("_ZN3c104impl26raw_local_dispatch_key_setE", "c10::impl::raw_local_dispatch_key_set"),
    ("_ZTWN3c104impl26raw_local_dispatch_key_setE", "c10::impl::raw_local_dispatch_key_set"),
    ("_ZTVN3c1010TensorImplE", "c10::TensorImpl"),
    ("_ZN3c1014DeviceTypeNameB5cxx11ENS_10DeviceTypeEb", "c10::DeviceTypeName"),
    ("_ZN3c10lsERSoRKNS_6DeviceE", "c10::operatorls"),
    ("_ZNSt6thread15_M_start_threadESt10unique_ptrINS_6_StateESt14default_deleteIS1_EEPFvvE", "std::thread::_M_start_thread"),
    ("_ZNK2at6Tensor5relu_Ev", "at::Tensor::relu_"),
    ("_Z12relu_forwardN2at6TensorE", "relu_forward"),
    ("_ZN12_GLOBAL__N_14probEv", "(anonymous namespace)::prob"),
    ("memcpy", None), ("_Z", None), ("_ZN99toolongE", None),
])
def test_the_scope_of_a_mangled_name_is_read_without_running_anything(symbol, scope):
    assert mangled_scope(symbol) == scope


def verdict(name: str) -> str:
    """'' when a candidate's object may import ``name``, else the message refusing it."""
    return "; ".join(h.message for h in symbol_hits(ElfSymbols(undefined=[name]), RULE, OPS, "x.o"))


@pytest.mark.parametrize("name, what", [
    # A: loader introspection, by class
    ("dl_iterate_phdr", "loader introspection"), ("_r_debug", "loader introspection"), ("_dl_debug_state", "loader introspection"),
    ("getauxval", "loader introspection"), ("__libc_enable_secure", "loader introspection"), ("_dl_find_object", "loader introspection"),
    ("environ", "loader introspection"), ("__environ", "loader introspection"), ("__libc_stack_end", "loader introspection"),
    ("__ehdr_start", "loader introspection"), ("backtrace", "loader introspection"), ("dlinfo", "loader introspection"),
    ("__open_2", "files"), ("open64", "files"), ("openat64", "files"), ("__openat_2", "files"), ("fdopen", "files"),
    ("fopen64", "files"), ("opendir", "files"),
    ("_ZNSt13basic_filebufIcSt11char_traitsIcEE4openEPKcSt13_Ios_Openmode", "files"),
    ("sigaction", "signal handlers"), ("siglongjmp", "signal handlers"), ("mincore", "memory mapping"),
    ("omp_get_wtime", "clocks"), ("getrusage", "clocks"), ("personality", "system control"),
    ("cuGetProcAddress", "dynamic loading"), ("cudaGetDriverEntryPoint", "dynamic loading"),
    # C: PyTorch compute under another name, its dispatcher, registration and profiler switches
    ("_ZN3c1010Dispatcher13realSingletonEv", "operator dispatcher"),
    ("_ZNK3c1010Dispatcher17findSchemaOrThrowEPKcS2_", "operator dispatcher"),
    ("_ZNK3c1014OperatorHandle10callBoxedEPSt6vectorIN3c106IValueESaIS2_EE", "operator dispatcher"),
    ("_ZN5torch7LibraryC1ENS0_4KindENSt7__cxx1112basic_stringIcSt11char_traitsIcESaIcEEE", "operator registration"),
    ("_ZNR5torch7Library5_implEPKcONS_11CppFunctionENS0_11_RegisterOrVerifyE", "operator registration"),
    ("_ZN3c1017RegisterOperators13registerOp_EONS0_7OptionsE", "operator registration"),
    ("_ZN5torch3jit17parseSchemaOrNameERKNSt7__cxx1112basic_stringIcSt11char_traitsIcESaIcEEEb", "operator registration"),
    ("_ZN2at20enableRecordFunctionEb", "profiler's recording"),
    ("_ZN2at19RecordFunctionGuardC1Eb", "profiler's recording"),
    ("_ZN3c104impl23ExcludeDispatchKeyGuardC1ENS_14DispatchKeySetE", "profiler's recording"),
    ("_ZN3c104impl26raw_local_dispatch_key_setE", "profiler's recording"),
    ("_ZN3c1020ThreadLocalDebugInfo3getENS_12DebugInfoKindE", "profiler's recording"),
    ("_ZN5torch8autograd8profiler14disableProfilerEv", "profiler's recording"),
    ("_ZNK2at6Tensor5relu_Ev", "aten::relu_"),
    ("torch_call_dispatcher", "C interface"), ("aoti_torch_cpu_mm_out", "C interface"), ("torch_library_impl", "C interface"),
    ("cblas_sgemm", "math"), ("mkl_blas_sgemm", "math"), ("cublasSgemm_v2", "math"), ("uv_spawn", "utility library"),
    # not provided by the runtime, not PyTorch's kernel API
    ("sgemm_", "neither part of"), ("nnp_convolution_output", "math"),
    ("_ZN2at5printERSoRKNS_6TensorEl", "neither part of"), ("_ZN2at6launchESt8functionIFvvEE", "threads"),
    ("_ZN2at13globalContextEv", "neither part of"), ("_Z16THPVariable_WrapRKN2at10TensorBaseE", "Python bindings"),
])
def test_a_candidates_object_may_not_import(name, what):
    message = verdict(name)
    assert what in message, (name, message)


@pytest.mark.parametrize("name", [
    "memcpy", "malloc", "free", "expf", "_ZGVdN8v_expf", "__cxa_atexit", "_Unwind_Resume", "__gxx_personality_v0",
    "_ZSt20__throw_length_errorPKc", "_Znwm", "GOMP_parallel", "omp_get_thread_num", "omp_get_num_threads",
    "__cpu_model", "__cpu_indicator_init", "atexit", "_GLOBAL_OFFSET_TABLE_", "__tls_get_addr", "__libc_single_threaded",
    "cudaLaunchKernel", "__cudaRegisterFunction", "__cudaPushCallConfiguration", "cuTensorMapEncodeTiled",
    "Sleef_expf8_u10",
    "_ZN3c106detail14torchCheckFailEPKcS2_jS2_", "_ZN3c1019UndefinedTensorImpl10_singletonE",
    "_ZNK2at10TensorBase8data_ptrIfEEPT_v", "_ZNK2at10TensorBase21__dispatch_contiguousEN3c1012MemoryFormatE",
    "_ZN2at4_ops19empty_memory_format4callEN3c108ArrayRefINS2_6SymIntEEESt8optionalINS2_10ScalarTypeEE",
    "_ZN3c106detail12infer_schema20make_function_schemaENS_8ArrayRefINS1_11ArgumentDefEEES4_",
    "_ZN5torch11CppFunctionD1Ev", "_ZN3c1010TensorType3getEv", "_ZN2at15get_num_threadsEv",
    "_ZN2at8internal21lazy_init_num_threadsEv", "_ZN3c1013ParallelGuardC1Eb", "_ZN3c104cuda20getCurrentCUDAStreamEa", "_ZN3c1021warnDeprecatedDataPtrEv", "_ZNK2at6Tensor2toEN3c1013TensorOptionsEbbSt8optionalINS1_12MemoryFormatEE",
])
def test_a_candidates_object_may_import(name):
    assert verdict(name) == ""


def test_a_forbidden_name_the_object_defines_itself_is_refused_too(tmp_path):
    """Defined (not imported) in the candidate's object: its calls stay its own (the build links with -Bsymbolic,
    test_builder.py), but no honest kernel defines dl_iterate_phdr or sgemm_-like names of a forbidden class.
    Inline code of headers (weak definitions) is not judged so."""
    source = ("int dl_iterate_phdr(void* cb, void* data) { (void)cb; (void)data; return 0; }\n"
              "static inline int twice(int v) { return 2 * v; }\nint use(int v) { return twice(v) + dl_iterate_phdr(0, 0); }\n")
    messages = [h.message for h in symbol_hits(obj(build(tmp_path, "defs", source)), RULE, OPS, "defs.o")]
    assert messages == ["defs.o defines dl_iterate_phdr (loader introspection: the loaded objects, their symbol tables or "
                        "the auxiliary vector)"]


def test_names_its_sibling_objects_define_are_its_own():
    """relu_forward declared in cpp_sources and defined in the CUDA unit: a call between the candidate's objects."""
    info = ElfSymbols(undefined=["_Z12relu_forwardN2at6TensorE"])
    assert symbol_hits(info, RULE, OPS, "main.o", own={"_Z12relu_forwardN2at6TensorE"}) == []
    assert symbol_hits(info, RULE, OPS, "main.o") != []


def test_the_runtime_is_read_from_the_libraries_themselves():
    names = runtime_exports()
    assert {"memcpy", "GOMP_parallel", "_Znwm", "expf", "dl_iterate_phdr", "getauxval"} <= names  # the last two: refused by class
    assert "sgemm_" not in names and "PyRun_SimpleString" not in names


SYSCALL = "long f(void) { long r; __asm__ volatile(\"syscall\" : \"=a\"(r) : \"a\"(39L) : \"rcx\", \"r11\"); return r; }\n"
INT80 = "void f(void) { __asm__ volatile(\"int $0x80\" ::: \"memory\"); }\n"
SYSENTER = "void f(void) { __asm__ volatile(\"sysenter\"); }\n"
RDTSC = "#include <x86intrin.h>\nunsigned long long f(void) { return __rdtsc(); }\n"
RDTSCP = "#include <x86intrin.h>\nunsigned long long f(void) { unsigned a; return __rdtscp(&a); }\n"
FAR = "void f(void) { __asm__ volatile(\"ljmp *(%rsp)\"); }\n"
# A byte that is no instruction in 64-bit mode (0x06, push %es) before the system call: the sweep steps over it.
HIDDEN = "void f(void) { __asm__ volatile(\".byte 0x06\\n\\tsyscall\"); }\n"
# In a function of its own, after data placed in the code section: found from the function's start.
AFTER_DATA = ("__attribute__((section(\".text\"))) const unsigned char blob[] = {0x0f, 0x0f, 0x0f};\n"
              "void f(void) { __asm__ volatile(\"syscall\"); }\n")


@pytest.mark.skipif(os.uname().machine != "x86_64", reason="x86-64 instructions")
@pytest.mark.parametrize("source, shown", [(SYSCALL, "`syscall`"), (INT80, "`int 0x80`"), (SYSENTER, "`sysenter`"),
                                           (RDTSC, "`rdtsc`"), (RDTSCP, "`rdtscp`"), (FAR, "`jmp ptr [rsp]`"),
                                           (HIDDEN, "`syscall`"), (AFTER_DATA, "`syscall`")])
def test_raw_system_calls_and_counter_reads_are_found_in_the_machine_code(tmp_path, source, shown):
    library = build(tmp_path, "asm", source)
    for info, name in ((obj(library), "asm.o"), (read_elf_symbols(library, code=True), "asm.so")):
        messages = [h.message for h in instruction_hits(info, RULE, name)]
        assert any(shown in m for m in messages), (name, messages)
    assert any(shown in h.message for h in library_hits(tmp_path, RULE, OPS))


def test_honest_machine_code_has_no_forbidden_instruction(tmp_path):
    honest = ("#include <math.h>\n#include <string.h>\n"
              "void f(float* y, const float* x, long n) { for (long i = 0; i < n; ++i) y[i] = expf(x[i]) + sqrtf(x[i]); }\n"
              "void g(char* d, const char* s, long n) { memcpy(d, s, (size_t)n); }\n")
    library = build(tmp_path, "ok", honest, ("-lm",))
    assert instruction_hits(obj(library), RULE, "ok.o") == []
    assert instruction_hits(read_elf_symbols(library, code=True), RULE, "ok.so") == []
    assert library_hits(tmp_path, RULE, OPS) == []


def test_without_the_disassembler_there_is_no_evaluation(monkeypatch):
    """capstone missing: the evaluator refuses to start (saying how to install it), never skips the check."""
    import sys

    from kevin.evaluation.symbols import require_disassembler

    monkeypatch.setitem(sys.modules, "capstone", None)
    with pytest.raises(RuntimeError, match="pip install 'capstone"):
        require_disassembler()
    with pytest.raises(RuntimeError, match="capstone"):
        from kevin.evaluation.toolchain import Toolchain

        Toolchain.detect("cpu", "")
    info = ElfSymbols(machine=62, code=[(".text", 0, b"\x90", [])])
    with pytest.raises(RuntimeError, match="capstone"):
        instruction_hits(info, RULE, "x.o")


@pytest.mark.skipif(os.uname().machine != "x86_64", reason="x86-64 instructions")
def test_what_a_trusted_link_input_brings_is_discounted_in_the_library_only(tmp_path):
    """A runtime archive the build links (the CUDA runtime's static part imports `syscall`) is in every library of
    the toolchain: the library level discounts what a trivial library of the same link holds, the candidate's own
    object is still held to everything."""
    runtime = tmp_path / "runtime"
    runtime.mkdir()
    (runtime / "rt.c").write_text("long rt_tid(void) { extern long syscall(long, ...); return syscall(186); }\n"
                                  "void rt_raw(void) { __asm__ volatile(\"syscall\"); }\n")
    subprocess.run(["cc", "-c", "-fPIC", "rt.c", "-o", "rt.o"], cwd=runtime, check=True, capture_output=True)
    subprocess.run(["ar", "rcs", "librt_static.a", "rt.o"], cwd=runtime, check=True, capture_output=True)

    def linked(folder: Path, source: str) -> Path:
        folder.mkdir()
        (folder / "k.c").write_text(source)
        subprocess.run(["cc", "-c", "-fPIC", "k.c", "-o", "k.o"], cwd=folder, check=True, capture_output=True)
        subprocess.run(["cc", "-shared", "k.o", "-Wl,--whole-archive", str(runtime / "librt_static.a"),
                        "-Wl,--no-whole-archive", "-o", "k.so"], cwd=folder, check=True, capture_output=True)
        return folder / "k.so"

    trivial = linked(tmp_path / "trivial", "float kevin_zero(void) { return 0.f; }\n")
    baseline = LinkBaseline.of_library(trivial, RULE)
    assert "syscall" in baseline.imports and baseline.instructions == {"syscall"}
    assert LinkBaseline.from_json(baseline.to_json()) == baseline

    honest = linked(tmp_path / "honest", HONEST).parent
    without = [h.message for h in library_hits(honest, RULE, OPS)]
    assert any("k.so calls syscall" in m for m in without) and any("`syscall`" in m for m in without)
    assert library_hits(honest, RULE, OPS, baseline) == []

    hostile = linked(tmp_path / "hostile", SYSCALL.replace("long f(", "long g(") +
                     "long h(void) { extern long syscall(long, ...); return syscall(39); }\n").parent
    messages = [h.message for h in library_hits(hostile, RULE, OPS, baseline)]
    assert any("k.o calls syscall" in m for m in messages), messages
    assert any(m.startswith("k.o contains the instruction `syscall`") for m in messages), messages
    assert not any(m.startswith("k.so") for m in messages), messages
