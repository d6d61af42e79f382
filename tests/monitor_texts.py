"""Realistic responses for the junk score: honest ones that repeat their code, and the junk of a collapse.

Honest: about 450 words of reasoning about a kernel, the kernel itself (a bundled reference solution, so the
code is real) written three times (a draft in the reasoning, a revision, the final file), and a summary.
Junk: repeated tokens, loops that run until the length limit, multilingual gibberish.
"""

from __future__ import annotations

import random
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

PROSE = """Okay, so I need to replace the reference convolution with a custom kernel. Let me first restate what the
reference computes: a 2D convolution over an input of shape (N, C, H, W) with a weight of shape (K, C, R, S),
stride one and no padding, followed by nothing else. The output has shape (N, K, H - R + 1, W - S + 1). The
baseline is PyTorch eager, which calls cuDNN, so beating it will be hard; but correctness comes first, and a
correct kernel already earns a reward, so I should start with something simple and make it faster later.

The simplest mapping gives each thread one output element. The thread computes its (n, k, y, x) from the flat
index, then loops over the input channels and the filter window and accumulates the products in a register.
Reads of the weight are shared by every thread of the same output channel, so they will mostly hit the cache.
Reads of the input overlap between neighbouring threads, which is where shared memory tiling would help later.

Wait, I should double check the indexing. For the input the flat offset is ((n * C + c) * H + y + r) * W + x + s,
and for the weight it is ((k * C + c) * R + r) * S + s. The output offset is ((n * K + k) * OH + y) * OW + x.
That looks right. I also need to make the tensors contiguous before taking raw pointers, otherwise a transposed
input would be read in the wrong order. The bias is optional in the reference, so I have to check whether the
module was built with one; here it was not, so I can skip it, but a guard costs nothing.

Another thing: the launch configuration. With 256 threads per block and one thread per output element the grid
is the number of outputs divided by 256, rounded up. For the default sizes that is a few thousand blocks, which
is enough to fill the GPU. The bounds check inside the kernel handles the last partial block.

Hmm, what about numerical differences? Accumulating in float32 in a different order than cuDNN gives results
that differ in the last bits, but the tolerance is 1e-4, which is far looser than that. So plain accumulation is
fine. Let me write the first version, check it against the reference mentally on a tiny example, and then think
about tiling the input into shared memory so that each block loads its patch once instead of every thread
fetching overlapping values from global memory again and again."""
SUMMARY = ("One kernel computes each output element with one thread, looping over input channels and the filter "
           "window; inputs are made contiguous and the launcher checks shapes. Next I will tile the input in shared memory.")


def fence(code: str) -> str:
    return f"```python\n{code.rstrip()}\n```"


def solution(path: str) -> str:
    """A bundled reference solution, e.g. ``cuda/level2/13_linear_groupnorm_swish``."""
    return (REPO / "data" / "solutions" / f"{path}.py").read_text(encoding="utf-8")


def honest_with_three_copies(kernel: str) -> str:
    """Reasoning with a draft, a revised copy, then the final file after the reasoning, and a summary."""
    return (f"{PROSE}\n\nA first draft:\n{fence(kernel)}\nThe bounds check looks right; the same code again with "
            f"the launch written out:\n{fence(kernel)}\n</think>\n\n{fence(kernel)}\n\n{SUMMARY}")


GIBBERISH = [
    "ocrats.gdx хорош_Sub ==( Nhật avent 女 ]] ortheast ซึ่ง 데이터 kontrol ℃ 이라 ваш isoner 并且 Brig 에서 rapidly العربية ผม",
    "Okay, so the kernel needs ایران 的话 tổ stdout Россия 저는 forward πρόσ 関数 modulo เพราะ scalar μέσα 而且 Москва tensor 해서",
    "Okay hmm.scalajs宣传 dépend_jsonhoodPIX ускор ธรรม.Attribute 수정PropertyChangedанием קוד pesquisa 统一 żeByIdčast",
]


def gibberish(words: int = 160, seed: int = 0, latin_share: float = 0.5) -> str:
    """Tokens drawn at random from a multilingual vocabulary, as a collapsed model samples them."""
    pool = " ".join(GIBBERISH).split()
    latin = [w for w in pool if w.isascii()]
    other = [w for w in pool if not w.isascii()]
    rng = random.Random(seed)
    return " ".join(rng.choice(latin) if rng.random() < latin_share else rng.choice(other) for _ in range(words))


def junk_responses() -> dict[str, str]:
    """One response per kind of collapse junk (each should score near 1)."""
    return {
        "repeated word": "Okay, so " + "the " * 200,
        "repeated token without spaces": "Okay, let me write it: " + ")" * 500,
        "repeated subword": "Okay " + "kernel" * 100,
        "sentence loop until the limit": PROSE + " " + "Wait, let me check the indexing again. " * 25,
        "code line loop until the limit": PROSE + "\n```python\n" + "    out[i] = in[i] > 0 ? in[i] : 0;\n" * 60,
        "paragraph loop until the limit": PROSE + (" " + PROSE[:400]) * 8,
        "gibberish": gibberish(),
        "gibberish after honest reasoning": PROSE + " " + gibberish(seed=1),
        "mostly-latin gibberish after honest reasoning": PROSE + " " + gibberish(seed=2, latin_share=0.7),
    }
