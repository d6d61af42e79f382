"""Hostile candidates by class, for the cpu and the cuda hostile suites (test_sandbox_cpu.py, tests/gpu).

Each class is an attack on the judge that an earlier evaluator lost to, in its simplest working form:
native code in the candidate's library (reaching the Python C API through token pasting, so no forbidden
word is in the text) rewrites the interpreter it runs in, forges timings or the protocol, or writes into
the evaluator's shared caches. With the default rules the library is refused from its symbol table; the
suites run them with the rules relaxed, so what must hold is that the verdict, decided outside the
candidate's process, still scores each of them 0 and the honest candidate after it stays correct.
"""

from __future__ import annotations

from typing import Callable

PYTHON_FROM_NATIVE = r'''
#define KJ(a, b) a##b
extern "C" int KJ(PyRun_, SimpleString)(const char*);
extern "C" int KJ(PyGILState_, Ensure)();
extern "C" void KJ(PyGILState_, Release)(int);
static int kevin_hostile_run(const char* code) {
    int state = KJ(PyGILState_, Ensure)();
    int rc = KJ(PyRun_, SimpleString)(code);
    KJ(PyGILState_, Release)(state);
    return rc;
}
static int kevin_hostile_done = kevin_hostile_run(R"PY(
%s
)PY");
'''
"""A static initializer that runs Python code when the library is loaded, without a forbidden token."""

NO_INTEGRITY = "import kevin.evaluation.checks as _c\n_c.IntegritySnapshot.changed = lambda self: ''\n"
"""Switch off the harness's own in-process tampering check first, as a real attacker would."""

COPY_CPU = r"""
torch::Tensor relu_forward(torch::Tensor x) {
    auto xc = x.contiguous();
    auto y = torch::empty_like(xc);
    const float* in = xc.data_ptr<float>();
    float* out = y.data_ptr<float>();
    for (int64_t i = 0; i < xc.numel(); ++i) out[i] = in[i];
    return y;
}
"""
"""A kernel that computes nothing of the task: it copies its input."""

COPY_CUDA = r"""
__global__ void copy_kernel(const float* in, float* out, int64_t n) {
    int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x;
    if (i < n) out[i] = in[i];
}
torch::Tensor relu_forward(torch::Tensor x) {
    auto y = torch::empty_like(x);
    int64_t n = x.numel();
    copy_kernel<<<(n + 255) / 256, 256>>>(x.data_ptr<float>(), y.data_ptr<float>(), n);
    return y;
}
"""


EMPTY_TIMED_REGIONS = """
import kevin.evaluation.timing as _t
def _regions(fn, channel, device, warmup, trials, begin, end, check=None):
    samples = []
    for i in range(trials):
        begin(i)
        end(i)
        out = fn(*channel.inputs)
        channel.put(list(out) if isinstance(out, (tuple, list)) else [out])
        samples.append(0.001)
    return samples
_t.channel_calls = _regions
"""
"""Every timed region empty; each call computed after its end mark."""

READ_CHECK_PLAN = """
import json, sys
import kevin.evaluation.timing as _t
_job = json.load(open(sys.argv[1]))
_plan = {int(i) for key, value in _job.items() if 'spot' in key or 'check' in key
         for i in (value if isinstance(value, list) else []) if isinstance(i, int)}
_orig = _t.channel_calls
def _lazy(fn, channel, device, warmup, trials, begin, end, check=None):
    n = [0]
    def cheap(*args):
        i = n[0] - warmup
        n[0] += 1
        return fn(*args) if i < 0 or i in _plan else args[0].clone()
    return _orig(cheap, channel, device, warmup, trials, begin, end, check)
_t.channel_calls = _lazy
"""
"""Compute only the timed calls a plan read from the job's files names (none can be found there now)."""

WORK_IN_HANDOVER = """
import torch
import kevin.evaluation.channel as _c
_put = _c.HarnessChannel.put
def _late(self, outputs):
    for _ in range(40):
        done = [torch.relu(o) for o in outputs]
    return _put(self, done)
_c.HarnessChannel.put = _late
"""
"""The forward's real work done while its outputs are handed over."""


SHORT_CPU_TIMER = """
import time
import kevin.evaluation.timing as _t
_real, _start = time.perf_counter_ns, [0]
def _short():
    now = _real()
    if not _start[0]:
        _start[0] = now
        return now
    t0, _start[0] = _start[0], 0
    return max(t0 + 1000, now - 950000)
_t._perf_counter_ns = _short
"""
"""The cpu timer forged to report every call 0.95 ms shorter than it ran (at least 0.001 ms)."""

SHORT_CUDA_TIMER = """
import torch
_elapsed = torch.cuda.Event.elapsed_time
torch.cuda.Event.elapsed_time = lambda self, end: max(0.001, _elapsed(self, end) - 0.095)
"""
"""The CUDA events forged to report every call 0.095 ms shorter than it ran."""


def native(python: str) -> str:
    return PYTHON_FROM_NATIVE % python


def slow(body: str, times: int = 40) -> str:
    """``body``'s kernel function run ``times`` times per call, so forged timings have much to hide."""
    return body.replace("torch::Tensor relu_forward(torch::Tensor x) {",
                        f"torch::Tensor relu_once(torch::Tensor x);\ntorch::Tensor relu_forward(torch::Tensor x) {{\n"
                        f"    torch::Tensor y;\n    for (int r = 0; r < {times}; ++r) y = relu_once(x);\n    return y;\n}}\n"
                        "torch::Tensor relu_once(torch::Tensor x) {", 1)


def hostile_by_class(c: Callable[..., str], body: str, copy_body: str, backend: str, cache_dir: str,
                     other_build: str) -> dict[str, tuple]:
    """name -> (solution source, allowed status values[, speedup bound]). ``other_build``: a file of another
    candidate's build in the cache (an honest one, judged after this one).

    A speedup bound b marks a forgery of the time alone, whose outputs may be right: it may then be judged
    ``correct`` if it scores a speedup of at most b x the honest kernel's: its work was counted, so the forgery bought
    nothing."""
    forge_timer = ("import kevin.evaluation.timing as _t\n_n = [0]\n"
                   "def _fake():\n    _n[0] += 1000\n    return _n[0]\n_t._perf_counter_ns = _fake\n") if backend == "cpu" else \
        "import torch\ntorch.cuda.Event.elapsed_time = lambda self, end: 0.001\n"
    short_timer = SHORT_CPU_TIMER if backend == "cpu" else SHORT_CUDA_TIMER
    baselines = f"{cache_dir}/baselines.json"
    return {
        # The timed loop replaced: every begin/end pair wraps an empty region and the real call (8 relu passes) runs
        # after its end mark. Where the judge's copy comes first, the calls it compares are stale; where the
        # evaluator's clock sees the work in the window, the reported times disagree with it; and where that work
        # reached the copy (on a loaded machine), it was inside the window and is scored (the floor): at 8 times the
        # honest kernel's work, no faster than it.
        "native_empty_timed_regions": (c(native(NO_INTEGRITY + EMPTY_TIMED_REGIONS) + slow(body, 8), name="h_regions"),
                                       {"incorrect", "rule_violation"}, 1.0),
        # A check plan looked for in the job's own files (the old harness found the spot-checked calls there) and
        # only those calls computed; the others return a copy of the input. The plan exists only in the judge now.
        "native_read_check_plan": (c(native(NO_INTEGRITY + READ_CHECK_PLAN) + body, name="h_plan"), {"incorrect"}),
        # Work moved into the hand-over: the forward returns an uncomputed copy and the compute runs while the
        # harness puts the outputs into the channel, outside the forward's profile and the process's own clock. The
        # hand-over of a profiled trial is profiled too, so the PyTorch ops it ran are seen (torch_compute_runtime)
        # however little time they take: 40 vectorised relus, 0.8 ms a call, fitted in the cpu's 1 ms allowance on a
        # fast 2-core machine (2026-12-06), where the evaluator's clock alone could only charge them.
        "native_work_in_handover": (c(native(NO_INTEGRITY + WORK_IN_HANDOVER) + copy_body, name="h_handover"),
                                    {"rule_violation"}),
        # Interpreter objects rewritten in place: the comparison no longer runs in this process.
        "native_tamper_allclose": (c(native(NO_INTEGRITY + "import torch\ntorch.allclose = lambda *a, **k: True\n"
                                            "torch.equal = lambda *a, **k: True\ntorch.isclose = lambda a, b, **k: a == a\n")
                                     + copy_body, name="h_allclose"), {"incorrect"}),
        # The harness's own steps skipped: the evaluator expects every trial before the timing.
        "native_skip_checks": (c(native(NO_INTEGRITY + "import __main__ as _h\n"
                                        "_h.RunJob.correctness = lambda self: None\n") + body, name="h_skip"),
                               {"runtime_error"}),
        # Timing forged below the call's real time: the evaluator's clock disagrees. (On cpu 8 relu passes already
        # take milliseconds a call against 0.001 ms reported; 40 took ~75 ms a call, and a forgery is timed three
        # times plus its calibration, which pushed a 2-core CI machine past the batch's 15 s limit.)
        "native_forge_timing": (c(native(NO_INTEGRITY + forge_timer) + slow(body, 8 if backend == "cpu" else 40),
                                  name="h_timer"), {"rule_violation"}),
        # A clock forged to stay inside the allowances: each call reported shorter than it ran by just under the
        # slack (1 ms on cpu, 0.1 ms on cuda), so the reports pass. Until the score's floor this relu (~1.4 ms a call
        # on a 2-core machine) scored three times the honest kernel's speedup, and any call shorter than the slack
        # hundreds; the evaluator's own figure of each call is now the least it is scored at.
        "native_forge_timing_fast": (c(native(NO_INTEGRITY + short_timer) + body, name="h_timer_fast"),
                                     {"rule_violation"}, 2.0),
        # A verdict forged on the evaluator's pipe: the protocol refuses it.
        "native_forge_done": (c(native("import os, sys\nos.write(int(sys.argv[3]), b'{\"t\": \"done\"}\\n')\n") + body,
                                name="h_done"), {"runtime_error"}),
        # Shared caches written from native code and from Python: read-only to every candidate.
        # (write or die: a candidate whose write went through would carry on and score as an honest kernel)
        "native_write_baselines": (c(native(f"import os\ntry:\n    open({baselines!r}, 'w').write('{{}}')\n"
                                            "except OSError:\n    os._exit(17)\n") + body, name="h_wbase"), {"runtime_error"}),
        "python_write_baselines": (c(body, name="h_pbase", extra_py=f"open({baselines!r}, 'w').write('{{}}')"),
                                   {"runtime_error"}),
        "python_overwrite_other_build": (c(body, name="h_pbuild", extra_py=f"open({other_build!r}, 'wb').write(b'x')"),
                                         {"runtime_error"}),
    }
