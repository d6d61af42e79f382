"""Copy the wheels of a download folder that the GPU machine's image lacks into a carry folder.

    python3 scripts/device_packages.py DOWNLOADED CARRY

`pip download` fetches a package with every dependency; most are in the device image already, and a call carries
at most 64 MiB. So only wheels whose distribution is not in the image's list below are copied, and never torch's
CUDA wheels (``nvidia-*-cu12``: the image's torch has its own). The list is the image's package list as the device
documentation gave it on 2026-11-17; a package it gains later is carried needlessly, one it loses fails at import
on the machine, which names it.
"""

from __future__ import annotations

import re
import shutil
import sys
from pathlib import Path

IMAGE = """
    absl-py, accelerate, aiofiles, aiohappyeyeballs, aiohttp, aiosignal, annotated-doc, anyio, attrs, botorch,
    build, certifi, charset-normalizer, chex, click, cloudpickle, cmake, colorama, contourpy, coverage, cuda-
    bindings, cuda-core, cuda-pathfinder, cuda-toolkit, cupy-cuda13x, cycler, cython, diffrax, e3nn, einops,
    equinox, etils, execnet, filelock, flatbuffers, flax, fonttools, formulaic, frozenlist, fsspec, gpytorch,
    grpcio, h11, h5py, hf-xet, httpcore, httpx, huggingface-hub, humanize, hypothesis, idna, imageio, iniconfig,
    interface-meta, jax, jax-cuda13-pjrt, jax-cuda13-plugin, jaxlib, jaxtyping, jinja2, joblib, kiwisolver, lazy-
    loader, lightning, lightning-utilities, linear-operator, lineax, llvmlite, lxml, markdown, markdown-it-py,
    markupsafe, matplotlib, mdurl, meson, ml-dtypes, mpi4py, mpmath, msgpack, multidict, multipledispatch, mypy-
    extensions, nanobind, narwhals, networkx, ninja, numba, numba-cuda, numpy, numpyro, nvidia-cublas, nvidia-cuda-
    cupti, nvidia-cuda-nvrtc, nvidia-cuda-runtime, nvidia-cudnn-cu13, nvidia-cufft, nvidia-cufile, nvidia-curand,
    nvidia-cusolver, nvidia-cusparse, nvidia-cusparselt-cu13, nvidia-ml-py, nvidia-nccl-cu13, nvidia-nvjitlink,
    nvidia-nvshmem-cu13, nvidia-nvtx, onnx, onnx-ir, onnxruntime, onnxscript, opencv-python-headless, optax, opt-
    einsum, opt-einsum-fx, optimistix, orbax-checkpoint, packaging, pandas, pathspec, patsy, peft, pillow, pip,
    pluggy, portalocker, prometheus-client, propcache, protobuf, psutil, pyarrow, pybind11, py-cpuinfo, pygments,
    pyparsing, pyproject-hooks, pyre-extensions, pytest, pytest-benchmark, pytest-cov, pytest-mock, pytest-timeout,
    pytest-xdist, python-dateutil, pytorch-lightning, pyyaml, regex, requests, rich, sacrebleu, safetensors, scikit-
    build-core, scikit-image, scikit-learn, scipy, seaborn, sentencepiece, sentence-transformers, setuptools,
    shellingham, simplejson, six, sortedcontainers, statsmodels, sympy, tabulate, tensorboard, tensorboard-data-
    server, tensorstore, threadpoolctl, tifffile, tiktoken, timm, tokenizers, toolz, torch, torchaudio, torchdiffeq,
    torch-geometric, torchmetrics, torchvision, tqdm, transformers, treescope, triton, typer, typing-extensions,
    typing-inspect, urllib3, uvloop, wadler-lindig, werkzeug, wheel, wrapt, xarray, xxhash, yarl, zipp
"""


def _name(text: str) -> str:
    return re.sub(r"[-_.]+", "-", text.strip().lower())


def image_packages() -> set[str]:
    return {_name(n) for n in IMAGE.replace("\n", " ").split(",") if n.strip()}


def wanted(wheel: str, have: set[str]) -> bool:
    name = _name(wheel.split("-", 1)[0])
    return name not in have and not re.fullmatch(r"nvidia-.*-cu12", name)


def main(src: str, dst: str) -> None:
    have = image_packages()
    Path(dst).mkdir(parents=True, exist_ok=True)
    total = 0
    for wheel in sorted(Path(src).glob("*.whl")):
        if wanted(wheel.name, have):
            shutil.copy2(wheel, Path(dst) / wheel.name)
            total += wheel.stat().st_size
    print(f"{dst}: {len(list(Path(dst).glob('*.whl')))} wheels, {total / 2**20:.1f} MiB")


if __name__ == "__main__":
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    main(sys.argv[1], sys.argv[2])
