"""nvcc's host and device passes side by side (kevin/evaluation/nvcc.py): the object and the messages are nvcc's."""

from __future__ import annotations

import re
import shutil
import stat
import subprocess
from pathlib import Path

import pytest

from kevin.evaluation.nvcc import PASS_DIR, module_id, plan_passes, run_nvcc

needs_nvcc = pytest.mark.skipif(shutil.which("nvcc") is None, reason="needs nvcc")

# Kernels whose symbol names carry the module id (anonymous namespace, internal linkage) beside plain ones: if the
# two front ends read different ids, the kernels the host registers would not be the ones the device code defines.
SOURCE = r"""
namespace {
__global__ void hidden_scale(float* y, const float* x, float s, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) y[i] = s * x[i];
}
}
static __global__ void static_relu(float* y, const float* x, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) y[i] = x[i] > 0.f ? x[i] : 0.f;
}
template <typename T> __global__ void templ_add(T* y, const T* x, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) y[i] += x[i];
}
void launch_all(float* y, const float* x, int n) {
  hidden_scale<<<(n + 255) / 256, 256>>>(y, x, 2.f, n);
  static_relu<<<(n + 255) / 256, 256>>>(y, x, n);
  templ_add<float><<<(n + 255) / 256, 256>>>(y, x, n);
}
"""


def _nvcc(*extra: str) -> list[str]:
    return [shutil.which("nvcc") or "nvcc", "-gencode=arch=compute_90,code=sm_90", "--compiler-options", "-fPIC",
            *extra, "-c", "cuda.cu", "-o", "cuda.o"]


def _folder(tmp_path: Path, name: str, source: str) -> Path:
    folder = tmp_path / name
    folder.mkdir()
    (folder / "cuda.cu").write_text(source)
    return folder


def _symbols(obj: Path) -> set[str]:
    out = subprocess.run(["nm", "-P", str(obj)], capture_output=True, text=True, check=True).stdout
    return {line.split()[0] for line in out.splitlines() if line.strip()}


def _without_ids(names: set[str]) -> set[str]:
    """Symbol names with the module id (and nvcc's temporary file names) replaced by a placeholder."""
    return {re.sub(r"_[0-9a-f]{8}_\d+_cuda_cu_[0-9a-f]{8}", "<id>", re.sub(r"tmpxft_[0-9a-f_]+_\d+_", "", n)) for n in names}


def test_module_id_has_nvccs_form_and_follows_the_content():
    a = module_id("cuda.cu", "__global__ void k() {}")
    assert re.fullmatch(r"_[0-9a-f]{8}_7_cuda_cu_[0-9a-f]{8}", a)
    assert a == module_id("cuda.cu", "__global__ void k() {}")
    assert a != module_id("cuda.cu", "__global__ void k2() {}")
    assert module_id("k.cu", "x").split("_")[2:4] == ["4", "k"]


@needs_nvcc
def test_the_listing_splits_into_a_host_chain_a_device_chain_and_the_host_compile(tmp_path):
    folder = _folder(tmp_path, "plan", SOURCE)
    passes = plan_passes(_nvcc(), folder)
    assert passes is not None
    tools = [Path(c[0]).name for c in passes.host]
    assert tools[-1] == "cudafe++" and all("-E" in c for c in passes.host[:-1])
    assert "--gen_module_id_file" not in passes.host[-1]  # it reads the id we write
    assert {Path(c[0]).name for c in passes.device} >= {"cicc", "ptxas", "fatbinary"}
    assert "-c" in passes.last and passes.last[-1] == "cuda.o"
    assert passes.module_id_file.parent == folder / PASS_DIR


@needs_nvcc
def test_the_split_object_is_nvccs_and_registers_the_kernels_the_device_code_defines(tmp_path):
    plain, split = _folder(tmp_path, "plain", SOURCE), _folder(tmp_path, "split", SOURCE)
    assert run_nvcc(_nvcc(), plain, 300, split=False) == (0, "")
    assert run_nvcc(_nvcc(), split, 300, keep_passes=True) == (0, "")
    assert _without_ids(_symbols(plain / "cuda.o")) == _without_ids(_symbols(split / "cuda.o"))
    passes = split / PASS_DIR
    ident = (passes / "cuda.module_id").read_text()
    assert ident == module_id("cuda.cu", SOURCE)
    # Every kernel the host stub registers is an entry of the device code, and the id-carrying ones use our id.
    stub = (passes / "cuda.cudafe1.stub.c").read_text()
    registered = set(re.findall(r"__cudaRegisterEntry\(.*?, (_Z\w+), \(-1\)\)", stub))
    entries = set(re.findall(r"\.entry\s+(\w+)", (passes / "cuda.ptx").read_text()))
    assert len(entries) == 3 and registered == entries
    assert any(ident[1:] in name for name in entries)  # the anonymous namespace's kernel is named with our id
    # Without keep_passes the intermediate files go.
    again = _folder(tmp_path, "again", SOURCE)
    assert run_nvcc(_nvcc(), again, 300) == (0, "")
    assert not (again / PASS_DIR).exists() and (again / "cuda.o").is_file()


@needs_nvcc
@pytest.mark.parametrize("change, message, word_for_word", [
    # The front end's messages are nvcc's word for word (it names the source, not a pass file).
    (("s * x[i]", "s * undeclared_thing[i]"), 'identifier "undeclared_thing" is undefined', True),
    # The assembler names its input: nvcc's temporary file there, our pass folder here.
    (("if (i < n) y[i] += x[i];", 'if (i < n) y[i] += x[i]; asm("bogus.instr;");'),
     "Not a name of any known instruction: 'bogus'", False),
])
def test_a_failing_pass_fails_the_split_build_with_nvccs_message(tmp_path, change, message, word_for_word):
    bad = SOURCE.replace(*change)
    plain, split = _folder(tmp_path, "plain", bad), _folder(tmp_path, "split", bad)
    rc_plain, text_plain = run_nvcc(_nvcc(), plain, 300, split=False)
    rc_split, text_split = run_nvcc(_nvcc(), split, 300)
    assert rc_plain != 0 and rc_split != 0
    assert message in text_plain and message in text_split
    assert (text_split == text_plain) is word_for_word
    assert not (split / "cuda.o").exists() and not (split / PASS_DIR).exists()


def _fake_nvcc(tmp_path: Path, listing: str) -> str:
    """An 'nvcc' whose --dryrun prints ``listing`` (and that otherwise compiles nothing)."""
    script = tmp_path / "fake-nvcc"
    script.write_text("#!/bin/sh\ncat <<'EOF' >&2\n" + listing + "\nEOF\n")
    script.chmod(script.stat().st_mode | stat.S_IEXEC)
    return str(script)


GOOD_LISTING = """#$ _SPACE_= 
#$ CICC_PATH=/opt/cuda/nvvm/bin
#$ SYSTEM_INCLUDES="-isystem" "/opt/cuda/include/cccl"
#$ gcc -E -x c++ -D__CUDACC__ cuda.cu -o "nvcc-passes/cuda.cpp4.ii"
#$ cudafe++ --c++17 --gen_c_file_name "nvcc-passes/cuda.cudafe1.cpp" --gen_module_id_file --module_id_file_name "nvcc-passes/cuda.module_id" "nvcc-passes/cuda.cpp4.ii"
#$ gcc -D__CUDA_ARCH__=900 -E -x c++ cuda.cu -o "nvcc-passes/cuda.cpp1.ii"
#$ "$CICC_PATH/cicc" --c++17 --module_id_file_name "nvcc-passes/cuda.module_id" "nvcc-passes/cuda.cpp1.ii" -o "nvcc-passes/cuda.ptx"
#$ ptxas -arch=sm_90 -m64 "nvcc-passes/cuda.ptx" -o "nvcc-passes/cuda.cubin"
#$ fatbinary -64 "--image3=kind=elf,sm=90,file=nvcc-passes/cuda.cubin" --embedded-fatbin="nvcc-passes/cuda.fatbin.c"
#$ rm nvcc-passes/cuda.fatbin
#$ gcc -c -x c++ "nvcc-passes/cuda.cudafe1.cpp" -o "cuda.o\""""


def test_a_known_listing_is_planned_with_nvccs_environment(tmp_path):
    passes = plan_passes([_fake_nvcc(tmp_path, GOOD_LISTING), "-c", "cuda.cu", "-o", "cuda.o"], tmp_path)
    assert passes is not None
    assert passes.env["CICC_PATH"] == "/opt/cuda/nvvm/bin"
    assert passes.env["SYSTEM_INCLUDES"] == "-isystem /opt/cuda/include/cccl"
    assert [Path(c[0]).name for c in passes.host] == ["gcc", "cudafe++"]
    assert passes.host[-1][-1] == "nvcc-passes/cuda.cpp4.ii" and "--gen_module_id_file" not in passes.host[-1]
    assert [c[0] for c in passes.device] == ["gcc", "/opt/cuda/nvvm/bin/cicc", "ptxas", "fatbinary"]  # rm dropped
    assert passes.last[:2] == ["gcc", "-c"]
    assert passes.module_id_file == tmp_path / "nvcc-passes" / "cuda.module_id"


@pytest.mark.parametrize("change", [
    ("--gen_module_id_file ", ""),  # nobody writes the id: the order matters, run nvcc as it is
    ('"$CICC_PATH/cicc" --c++17 --module_id_file_name "nvcc-passes/cuda.module_id"', '"$CICC_PATH/cicc" --c++17'),
    ("#$ ptxas", "#$ nvlink -o x.o && ptxas"),  # a shell command
    ("#$ ptxas", "#$ mystery-tool"),  # a pass this module does not know
    ('"$CICC_PATH/cicc"', '"$UNSET_VARIABLE/cicc"'),
    ("#$ gcc -c -x c++", "#$ gcc -E -x c++"),  # the last pass compiles no object
    ("#$ cudafe++ --c++17", "#$ cudafe++ --c++17 --x\n#$ cudafe++ --c++17"),  # two front ends
])
def test_an_unknown_listing_means_plain_nvcc(tmp_path, change):
    listing = GOOD_LISTING.replace(*change)
    assert listing != GOOD_LISTING
    assert plan_passes([_fake_nvcc(tmp_path, listing), "-c", "cuda.cu", "-o", "cuda.o"], tmp_path) is None
