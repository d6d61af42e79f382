"""Shared fixtures: a private compile cache per test session, the bundled relu task, source builders."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


def pytest_collection_modifyitems(config, items):
    """GPU tests run only where a CUDA GPU exists (the device machine); CI skips them."""
    if _has_cuda():
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU (run on the device machine)")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


def _has_cuda() -> bool:
    return shutil.which("nvidia-smi") is not None and os.system("nvidia-smi -L >/dev/null 2>&1") == 0


@pytest.fixture(scope="session")
def cache_dir(tmp_path_factory) -> Path:
    """Compiled extensions and baselines for this test session (KEVIN_CACHE_DIR reuses one across runs).

    Under pytest-xdist every worker has a base folder of its own inside the run's: the cache goes in the run's, so
    the test processes share one, as evaluators sharing KEVIN_CACHE_DIR do (headers are prepared under a lock,
    builds and baselines are written by atomic renames). Each worker preparing its own headers cost 45 s of CPU."""
    shared = os.environ.get("KEVIN_CACHE_DIR")
    if shared:
        return Path(shared)
    base = tmp_path_factory.getbasetemp()
    folder = (base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base) / "kevin-cache"
    folder.mkdir(exist_ok=True)
    return folder


@pytest.fixture
def fresh_cache(cache_dir, tmp_path) -> Path:
    """An empty compile and baseline cache that shares the session cache's precompiled headers (hard links where
    the file system allows): preparing them again costs half a minute on 2 cores."""
    from kevin.evaluation import EvalConfig, Evaluator

    with Evaluator(EvalConfig(backend="cpu", cache_dir=str(cache_dir))) as ev:
        ev.toolchain()  # prepared once per session (here, if no test before this one compiled)

    fresh = tmp_path / "fresh-cache"
    link_tree(cache_dir / "headers", fresh / "headers")
    return fresh


def link_tree(src: Path, dst: Path) -> None:
    """Copy a folder as hard links (a gigabyte of precompiled headers in no time), copying across file systems."""
    def link(a: str, b: str) -> None:
        try:
            os.link(a, b)
        except OSError:  # another file system
            shutil.copy2(a, b)

    shutil.copytree(src, dst, copy_function=link)


@pytest.fixture(scope="session")
def relu_task():
    from kevin.tasks import load_task_file

    return load_task_file(REPO / "data" / "tasks" / "level1" / "01_relu.py")


def cpp_solution(body: str, forward: str = "return ext.relu_forward(x)", name: str = "t_ext", extra_py: str = "",
                 functions: str = '["relu_forward"]') -> str:
    """A cpu-backend solution for the relu task with the given C++ body and forward line."""
    return f'''import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline
{extra_py}
src = r"""
#include <torch/extension.h>
{body}
"""

ext = load_inline(name="{name}", cpp_sources=src, functions={functions}, verbose=False)


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x):
        {forward}
'''


def cuda_solution(body: str, forward: str = "return ext.relu_forward(x)", name: str = "t_cuda", extra_py: str = "") -> str:
    """A cuda-backend solution for the relu task with the given CUDA source body and forward line."""
    return f'''import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline
{extra_py}
cuda_src = r"""
#include <torch/extension.h>
#include <cuda_runtime.h>
{body}
"""
ext = load_inline(name="{name}", cpp_sources="torch::Tensor relu_forward(torch::Tensor x);", cuda_sources=cuda_src,
                  functions=["relu_forward"], verbose=False)


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x):
        {forward}
'''


RELU_CUDA = r"""
__global__ void relu_kernel(const float* in, float* out, int64_t n) {
    int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x;
    if (i < n) out[i] = in[i] > 0.f ? in[i] : 0.f;
}
torch::Tensor relu_forward(torch::Tensor x) {
    auto y = torch::empty_like(x);
    int64_t n = x.numel();
    relu_kernel<<<(n + 255) / 256, 256>>>(x.data_ptr<float>(), y.data_ptr<float>(), n);
    return y;
}
"""

RELU_BODY = """
torch::Tensor relu_forward(torch::Tensor x) {
    auto xc = x.contiguous();
    auto y = torch::empty_like(xc);
    const float* in = xc.data_ptr<float>();
    float* out = y.data_ptr<float>();
    for (int64_t i = 0; i < xc.numel(); ++i) out[i] = in[i] > 0.f ? in[i] : 0.f;
    return y;
}
"""


def identity_task_source(doc: str = "An identity task for loop tests.") -> str:
    """A minimal valid KernelBench-format task (the loop and step tests never evaluate it)."""
    return f'''import torch
import torch.nn as nn


class Model(nn.Module):
    """{doc}"""

    def __init__(self):
        super().__init__()

    def forward(self, x):
        return x


def get_inputs():
    return [torch.randn(4)]


def get_init_inputs():
    return []
'''


def kernelbench_task_source(factor: int, size: int = 256) -> str:
    """A tiny KernelBench-format task of our own (a scale by ``factor``), sizes as module constants."""
    return f'''import torch
import torch.nn as nn


class Model(nn.Module):
    """Scales its input by {factor}."""

    def __init__(self):
        super().__init__()

    def forward(self, x):
        return x * {factor}


batch_size = 16
dim = {size}


def get_inputs():
    return [torch.randn(batch_size, dim)]


def get_init_inputs():
    return []
'''


def write_kernelbench_dir(root: Path, counts: dict[int, int]) -> Path:
    """A folder laid out like a KernelBench checkout (``root/KernelBench/levelN/<i>_Scale<i>.py``) with our own tasks."""
    for level, n in counts.items():
        folder = root / "KernelBench" / f"level{level}"
        folder.mkdir(parents=True, exist_ok=True)
        for i in range(1, n + 1):
            (folder / f"{i}_Scale{i}.py").write_text(kernelbench_task_source(level * 100 + i))
    return root
