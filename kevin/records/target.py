"""The kernel target: what the config's ``backend`` names (``cuda`` or ``cpu``), as one object.

The code used to branch on the plain strings; each fact those branches encoded is a named property here, so a
reader sees why the two targets differ and a third target would have one place to say how it behaves. The class
is a ``str`` enum: it compares equal to, and serialises as, the plain strings that configs, JSON and YAML hold.

Only the standard library is imported (the sandboxed harness may import this module).
"""

from __future__ import annotations

import enum

MIB = 1024 * 1024


class KernelTarget(str, enum.Enum):
    CUDA = "cuda"
    CPU = "cpu"

    def __str__(self) -> str:
        return self.value  # f-strings and paths show "cuda", not "KernelTarget.CUDA"

    @classmethod
    def parse(cls, value: str | KernelTarget) -> KernelTarget:
        """The target a config's ``backend`` string names; a clear error on anything else."""
        try:
            return cls(value)
        except ValueError:
            raise ValueError(f"kernel target must be 'cuda' or 'cpu', got {value!r}") from None

    @property
    def is_gpu(self) -> bool:
        """Kernels run on a GPU: devices are ``cuda:N``, GPU kernels are compiled, profiled and timed."""
        return self is KernelTarget.CUDA

    @property
    def default_profile(self) -> str:
        """The task size profile when none is set: the tasks' own sizes would take far too long on a CPU."""
        return "default" if self.is_gpu else "cpu"

    @property
    def default_flush_bytes(self) -> int:
        """Bytes written between timed runs to evict the caches: well past a GPU's L2 on cuda, past a CPU's
        last-level cache on cpu (a bigger flush there would only slow the runs)."""
        return (256 if self.is_gpu else 32) * MIB

    @property
    def default_clock_slack_ms(self) -> float:
        """How far the harness's clock may stray from the evaluator's before a timing is doubted: CPU timings
        carry scheduler noise of a millisecond, GPU event timings far less."""
        return 0.1 if self.is_gpu else 1.0

    @property
    def overlaps_compiles(self) -> bool:
        """Whether compiles may run beside timed runs: on cpu they would share the cores and skew the timings;
        on cuda the timed run has its GPU to itself."""
        return self.is_gpu

    @property
    def prestarts_runs(self) -> bool:
        """Whether run processes are started ahead of their turn: on cpu one started ahead would take cores
        from the run being timed."""
        return self.is_gpu

    @property
    def limits_address_space(self) -> bool:
        """Whether a candidate's memory is capped with RLIMIT_AS: on cuda the driver maps far more virtual
        memory than it uses, so the cap would break CUDA and memory is limited by cgroup or polling instead."""
        return not self.is_gpu


TARGETS: tuple[str, ...] = tuple(t.value for t in KernelTarget)
