"""Prompts: the base prompt, the one-shot example, and the context of later turns.

All wording is ours. The structure follows the recipe (docs/recipe.md §2): turn 0 gets the base
prompt with a one-shot example; turn t > 0 gets the base prompt without the example, the previous
attempts (kernel + summary + feedback line, their reasoning dropped), and an instruction to restart
reasoning and write complete new code. When the prompt is over its token budget the OLDEST attempts go
first: the latest feedback is what the next kernel most needs.

The rules listed in the prompt mirror ``kevin/evaluation/default_rules.yaml``; a model told the rules
up front wastes fewer samples on kernels that score 0.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Sequence

from kevin.records.generation import Messages, Prompt
from kevin.records.target import KernelTarget
from kevin.rollout.parsing import opens_reasoning
from kevin.tasks.task import Task

TokenCounter = Callable[[str], int]


def approx_tokens(text: str) -> int:
    """A rough token count (about 4 characters per token for English and code) when no tokenizer is given."""
    return (len(text) + 3) // 4


def tokenizer_counter(tokenizer: Any) -> TokenCounter:
    """Count tokens with a Hugging Face tokenizer (special tokens of the template are already in the text)."""
    return lambda text: len(tokenizer.encode(text, add_special_tokens=False))


def resolved_profile(backend: str, profile: str = "") -> str:
    """The task size profile to show: the same default the evaluator uses (EvalConfig.resolved_profile)."""
    return profile or KernelTarget.parse(backend).default_profile


# ------------------------------------------------------------------------------ prompt text

_BACKEND_TEXT = {
    "cuda": {
        "target": "custom CUDA kernels running on an NVIDIA GPU",
        "how": (
            "- Put the kernels in a CUDA source string with `__global__` functions and C++ launcher functions,\n"
            "  declare the launchers in a C++ source string, and compile both with\n"
            "  `torch.utils.cpp_extension.load_inline(name=..., cpp_sources=..., cuda_sources=..., functions=[...])`\n"
            "  at module level. `ModelNew.forward` then calls the compiled launchers.\n"
            "- Launch every kernel on the current (default) stream; inputs arrive as CUDA tensors."
        ),
        "ideas": "fusing operations into one kernel, shared-memory tiling, coalesced and vectorised memory access, "
                 "warp-level reductions and good launch configurations",
    },
    "cpu": {
        "target": "custom C++ kernels running on the CPU",
        "how": (
            "- Put the kernels in a C++ source string (plain loops over raw data pointers, e.g. `data_ptr<float>()`)\n"
            "  and compile it with `torch.utils.cpp_extension.load_inline(name=..., cpp_sources=..., functions=[...])`\n"
            "  at module level. `ModelNew.forward` then calls the compiled functions.\n"
            "- The code runs on one thread: no OpenMP, std::thread or other threading."
        ),
        "ideas": "fusing operations into one loop, cache blocking, contiguous memory access, loop ordering and "
                 "code the compiler can vectorise",
    },
}

_RULES = """\
A solution scores 0, however fast it is, if it:
- computes anything with PyTorch: no torch / torch.nn.functional calls, tensor methods such as .sum() or
  .matmul(), or nn layers in forward, and no at::/torch:: operations, cuBLAS, cuDNN or CUTLASS in C++.
  Python may only allocate outputs (torch.empty and friends), hold parameters, and call your kernels;
- contains try/except (or try/catch in C++), or a `pass` statement;
- subclasses, copies or calls the reference `Model` (ModelNew subclasses nn.Module directly);
- runs code that is not compiled inline by load_inline (no prebuilt libraries, Triton, numpy, torch.compile);
- starts threads, processes or extra streams, or patches timers, torch or the test harness
  (no monkey-patching, eval/exec, getattr tricks, global state);
- imports anything besides torch, torch.nn, torch.nn.functional, torch.utils.cpp_extension, math, os,
  typing and functools."""

_ANSWER_FORMAT = """\
Reply in this order: first your reasoning; then the complete solution file (imports, kernel sources,
the load_inline call and class ModelNew) in ONE ```python code block; then, after the code block, a short
summary of two to four sentences saying what your kernels do and what you changed."""

_RESTART = """\
Start your reasoning again from the beginning: use the feedback above to decide what to fix or what to
speed up next, then write a complete new solution file (not a patch of the previous one)."""

PROMPT_STYLES = ("full", "compact")
"""``full``: the recipe's prompt (rules, one-shot example on the first turn; ~1,300 tokens with SmolLM2's
tokenizer). ``compact``: for small models with short contexts: the task, one paragraph of instructions and the
answer format, no example (a few hundred tokens). Later turns show the same attempts and feedback either way."""

_COMPACT_HOW = {
    "cuda": "CUDA kernels (`__global__` functions and C++ launchers) compiled with "
            "`load_inline(name=..., cpp_sources=..., cuda_sources=..., functions=[...])`",
    "cpu": "a C++ function (plain loops over `data_ptr<float>()` pointers, one thread) compiled with "
           "`load_inline(name=..., cpp_sources=..., functions=[...])`",
}

_COMPACT_RULES = ("No PyTorch compute in forward or in C++ (only allocation such as torch::empty), no try/except, "
                  "no `pass`, no imports besides torch and math.")

_COMPACT_FORMAT = ("Reply with one or two sentences of reasoning, then the complete solution file in ONE ```python "
                   "block, then a one-sentence summary.")


def compact_base_prompt(task_source: str, backend: str) -> str:
    """The ``compact`` style's task statement: what to write, in one paragraph, then the reference."""
    _check_backend(backend)
    return (f"Write `ModelNew`, a faster replacement for the PyTorch `Model` below: an nn.Module with the same "
            f"constructor and forward signatures that returns the same outputs, computed by {_COMPACT_HOW[backend]}. "
            f"{_COMPACT_RULES}\n\n{_fence(task_source)}")


EXAMPLE_REFERENCE = '''\
import torch
import torch.nn as nn


class Model(nn.Module):
    """Adds two tensors elementwise."""

    def __init__(self):
        super().__init__()

    def forward(self, a, b):
        return a + b


N = 1 << 20


def get_inputs():
    return [torch.randn(N), torch.randn(N)]


def get_init_inputs():
    return []
'''

_EXAMPLE_CUDA = '''\
import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

vector_add_cuda = r"""
#include <torch/extension.h>

__global__ void vector_add_kernel(const float* __restrict__ a, const float* __restrict__ b,
                                  float* __restrict__ out, int64_t n) {
    int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) {
        out[i] = a[i] + b[i];
    }
}

torch::Tensor vector_add(torch::Tensor a, torch::Tensor b) {
    TORCH_CHECK(a.is_cuda() && b.is_cuda(), "vector_add: inputs must be CUDA tensors");
    TORCH_CHECK(a.scalar_type() == torch::kFloat32 && b.scalar_type() == torch::kFloat32, "vector_add: float32 only");
    TORCH_CHECK(a.numel() == b.numel(), "vector_add: inputs must have the same size");
    auto a_c = a.contiguous();
    auto b_c = b.contiguous();
    auto out = torch::empty_like(a_c);
    const int64_t n = a_c.numel();
    const int threads = 256;
    const int blocks = (int)((n + threads - 1) / threads);
    vector_add_kernel<<<blocks, threads>>>(a_c.data_ptr<float>(), b_c.data_ptr<float>(), out.data_ptr<float>(), n);
    return out;
}
"""

vector_add_decl = "torch::Tensor vector_add(torch::Tensor a, torch::Tensor b);"

vector_add_ext = load_inline(
    name="example_vector_add",
    cpp_sources=vector_add_decl,
    cuda_sources=vector_add_cuda,
    functions=["vector_add"],
    verbose=False,
)


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, a, b):
        return vector_add_ext.vector_add(a, b)
'''

_EXAMPLE_CPU = '''\
import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

vector_add_cpp = r"""
#include <torch/extension.h>

torch::Tensor vector_add(torch::Tensor a, torch::Tensor b) {
    TORCH_CHECK(a.scalar_type() == torch::kFloat32 && b.scalar_type() == torch::kFloat32, "vector_add: float32 only");
    TORCH_CHECK(a.numel() == b.numel(), "vector_add: inputs must have the same size");
    auto a_c = a.contiguous();
    auto b_c = b.contiguous();
    auto out = torch::empty_like(a_c);
    const float* pa = a_c.data_ptr<float>();
    const float* pb = b_c.data_ptr<float>();
    float* po = out.data_ptr<float>();
    const int64_t n = a_c.numel();
    for (int64_t i = 0; i < n; ++i) {
        po[i] = pa[i] + pb[i];
    }
    return out;
}
"""

vector_add_ext = load_inline(
    name="example_vector_add_cpu",
    cpp_sources=vector_add_cpp,
    functions=["vector_add"],
    verbose=False,
)


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, a, b):
        return vector_add_ext.vector_add(a, b)
'''

_EXAMPLE_SUMMARY = {
    "cuda": "One CUDA kernel adds the two inputs with one thread per element, reading both inputs once "
            "and writing the output once; the launcher checks dtypes and makes the inputs contiguous.",
    "cpu": "One C++ loop adds the two inputs over raw float pointers, reading both inputs once and writing "
           "the output once; the function checks dtypes and makes the inputs contiguous.",
}


def example_solution(backend: str) -> str:
    """The one-shot example's solution for ``backend`` (shown in the first turn only)."""
    _check_backend(backend)
    return _EXAMPLE_CUDA if KernelTarget.parse(backend).is_gpu else _EXAMPLE_CPU


def _check_style(style: str) -> None:
    if style not in PROMPT_STYLES:
        raise ValueError(f"prompt style must be one of {list(PROMPT_STYLES)}, got {style!r}")


def _check_backend(backend: str) -> None:
    if backend not in _BACKEND_TEXT:
        raise ValueError(f"backend must be one of {sorted(_BACKEND_TEXT)}, got {backend!r}")


def _fence(code: str) -> str:
    return f"```python\n{code.rstrip()}\n```"


def _example_section(backend: str) -> str:
    return (
        "## Example\n"
        "For this reference:\n\n"
        f"{_fence(EXAMPLE_REFERENCE)}\n\n"
        "a valid answer ends with this solution and summary:\n\n"
        f"{_fence(example_solution(backend))}\n\n"
        f"{_EXAMPLE_SUMMARY[backend]}"
    )


def base_prompt(task_source: str, backend: str, with_example: bool) -> str:
    """The task statement every turn starts with; the example only when ``with_example``."""
    _check_backend(backend)
    text = _BACKEND_TEXT[backend]
    parts = [
        f"You write {text['target']} that replace a PyTorch reference implementation.\n\n"
        "The reference below defines `Model`, `get_inputs()` (the inputs of forward) and `get_init_inputs()` "
        "(the constructor arguments). Write `ModelNew`: an nn.Module with the same constructor and forward "
        "signatures that returns the same outputs (within a small floating-point tolerance) and runs as fast "
        f"as you can make it. Worth trying: {text['ideas']}.",
        f"## How the solution must work\n{text['how']}",
        f"## Rules\n{_RULES}",
    ]
    if with_example:
        parts.append(_example_section(backend))
    parts.append(f"## The reference to speed up\n{_fence(task_source)}")
    return "\n\n".join(parts)


# ------------------------------------------------------------------------------ turn context


@dataclass(frozen=True)
class Attempt:
    """What a later turn sees of an earlier one: kernel, summary and feedback, never its reasoning."""

    turn: int
    kernel: str
    summary: str
    feedback: str


MAX_SUMMARY_CHARS = 2000  # a "summary" is meant to be a few sentences; a runaway one must not eat the budget


def _attempt_section(attempt: Attempt) -> str:
    kernel = _fence(attempt.kernel) if attempt.kernel.strip() else "(no code could be extracted from this response)"
    summary = attempt.summary.strip() or "(no summary was given)"
    if len(summary) > MAX_SUMMARY_CHARS:
        summary = summary[:MAX_SUMMARY_CHARS] + " [... summary cut]"
    return f"### Attempt {attempt.turn + 1}\n{kernel}\n\nYour summary: {summary}\n\nResult: {attempt.feedback.strip()}"


def turn_user_message(task_source: str, backend: str, attempts: Sequence[Attempt], dropped: int = 0,
                      include_example: bool = True, style: str = "full") -> str:
    """The user message of a turn: turn 0 when ``attempts`` is empty and nothing was dropped. ``style``
    ``compact`` swaps the task statement and the answer format for short ones (no example)."""
    _check_style(style)
    first_turn = not attempts and not dropped
    if style == "compact":
        parts = [compact_base_prompt(task_source, backend)]
    else:
        parts = [base_prompt(task_source, backend, with_example=first_turn and include_example)]
    if not first_turn:
        history = ["## Your previous attempts"]
        if dropped:
            history.append(f"({dropped} earlier attempt{'s are' if dropped > 1 else ' is'} left out to save space.)")
        history.extend(_attempt_section(a) for a in attempts)
        parts.append("\n\n".join(history))
        parts.append(f"## Now\n{_RESTART}")
    parts.append(_COMPACT_FORMAT if style == "compact" else _ANSWER_FORMAT)
    return "\n\n".join(parts)


@dataclass
class PromptContext:
    """One rendered prompt and how it was built."""

    messages: Messages
    text: str
    """What the policy is given: the chat template applied, or the plain message text without a tokenizer."""
    tokens: int
    attempts_kept: int
    attempts_dropped: int
    over_budget: bool = False
    """Even with every attempt dropped the prompt exceeds the budget (the task itself is too long)."""
    templated: bool = False
    """``text`` was rendered by a tokenizer's chat template."""
    reasoning_open: bool = False
    """The prompt ends inside an open ``<think>`` block: the response starts in its reasoning."""

    @property
    def prompt(self) -> Prompt:
        """The prompt record a policy backend is given (``prompt_for`` also says which trajectory asks)."""
        return Prompt(messages=self.messages, text=self.text, templated=self.templated)

    def prompt_for(self, task_id: str, trajectory: int) -> Prompt:
        """The prompt record of trajectory ``trajectory`` of task ``task_id``."""
        return Prompt(messages=self.messages, text=self.text, templated=self.templated, task_id=task_id,
                      trajectory=trajectory)


def render_messages(messages: Messages, tokenizer: Any | None = None) -> str:
    """Apply the model's chat template; without a tokenizer, the message texts joined by blank lines."""
    if tokenizer is not None:
        return tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    return "\n\n".join(m["content"] for m in messages)


@dataclass
class PromptBuilder:
    """Builds the prompt of any turn under a token budget, for one backend and one model's template."""

    backend: str
    max_prompt_tokens: int = 8192
    tokenizer: Any | None = None
    count_tokens: TokenCounter | None = None
    """Token counter for the rendered prompt; default: the tokenizer's, else about 4 characters a token."""
    profile: str = ""
    include_example: bool = True
    system_prompt: str = ""
    """An optional system message (empty: none, as reasoning models such as QwQ recommend)."""
    reasoning_open: bool | None = None
    """Whether prompts end inside an open ``<think>`` block. None: read it off each prompt the tokenizer's
    chat template renders (no tokenizer: no). Set it when a server applies a template this side cannot see."""
    style: str = "full"
    """``full`` (the recipe's prompt) or ``compact`` (short, no example: small models), ``PROMPT_STYLES``."""

    def __post_init__(self) -> None:
        _check_backend(self.backend)
        _check_style(self.style)
        if self.max_prompt_tokens < 1:
            raise ValueError("max_prompt_tokens must be a positive number of tokens")
        if self.count_tokens is None:
            self.count_tokens = tokenizer_counter(self.tokenizer) if self.tokenizer is not None else approx_tokens

    def task_source(self, task: Task) -> str:
        return task.render(resolved_profile(self.backend, self.profile))

    def messages(self, task: Task, attempts: Sequence[Attempt], dropped: int = 0) -> Messages:
        user = turn_user_message(self.task_source(task), self.backend, attempts, dropped, self.include_example,
                                 self.style)
        msgs = [{"role": "system", "content": self.system_prompt}] if self.system_prompt else []
        return msgs + [{"role": "user", "content": user}]

    def _reasoning_open(self, messages: Messages, text: str) -> bool:
        if self.reasoning_open is not None:
            return self.reasoning_open
        return self.tokenizer is not None and opens_reasoning(text, messages[-1]["content"])

    def build(self, task: Task, attempts: Sequence[Attempt] = ()) -> PromptContext:
        """The prompt for the turn after ``attempts`` (oldest first), dropping the oldest until it fits."""
        attempts = list(attempts)
        templated = self.tokenizer is not None
        for drop in range(len(attempts) + 1):
            kept = attempts[drop:]
            messages = self.messages(task, kept, dropped=drop)
            text = render_messages(messages, self.tokenizer)
            tokens = self.count_tokens(text)
            if tokens <= self.max_prompt_tokens:
                return PromptContext(messages, text, tokens, len(kept), drop, templated=templated,
                                     reasoning_open=self._reasoning_open(messages, text))
        # Nothing left to drop: return the attempt-free prompt and let the caller see it is over budget.
        return PromptContext(messages, text, tokens, 0, len(attempts), over_budget=True, templated=templated,
                             reasoning_open=self._reasoning_open(messages, text))
