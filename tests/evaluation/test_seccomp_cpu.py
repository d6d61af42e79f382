"""The seccomp deny-list: the BPF program checked by running it, and the filter installed in a real process."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest

from kevin.evaluation.isolation import SandboxConfig, make_spec
from kevin.evaluation.kernel_filters import seccomp_program

EPERM_VERDICT = 0x00050001
ALLOW = 0x7FFF0000
X86_64, AARCH64, I386 = 0xC000003E, 0xC00000B7, 0x40000003


def run_bpf(prog: list[tuple[int, int, int, int]], arch: int, nr: int, arg0: int = 0) -> int:
    """A classic-BPF interpreter for the four instructions the filter uses, over seccomp_data {nr, arch, args[0]}
    (its low word, at offset 16 on little-endian)."""
    data = {0: nr, 4: arch, 16: arg0 & 0xFFFFFFFF}
    acc, pc = 0, 0
    while True:
        code, jt, jf, k = prog[pc]
        if code == 0x20:  # ld [k]
            acc = data[k]
        elif code == 0x15:  # jeq #k
            pc += jt if acc == k else jf
        elif code == 0x35:  # jge #k
            pc += jt if acc >= k else jf
        elif code == 0x06:  # ret #k
            return k
        else:
            raise AssertionError(f"unexpected BPF code {code:#x}")
        pc += 1


@pytest.mark.parametrize("machine, arch, denied, allowed", [
    # ptrace, process_vm_readv, mount, unshare, bpf | read, write, mmap, ioctl, clone, getpid, openat
    # + name_to_handle_at, kcmp, syslog, perf_event_open, io_uring_setup/enter/register, process_madvise, modify_ldt
    ("x86_64", X86_64, [101, 310, 165, 272, 321, 438, 303, 312, 103, 298, 425, 426, 427, 440, 154],
     [0, 1, 9, 16, 56, 39, 257, 202, 10, 11, 435]),
    ("aarch64", AARCH64, [117, 270, 40, 97, 280, 438, 264, 272, 116, 241, 425, 426, 427, 440],
     [63, 64, 222, 29, 220, 172, 56, 98, 226, 215, 435]),
])
def test_the_program_denies_the_list_and_allows_the_rest(machine, arch, denied, allowed):
    prog = seccomp_program(machine)
    for nr in denied:
        assert run_bpf(prog, arch, nr) == EPERM_VERDICT, nr
    for nr in allowed:
        assert run_bpf(prog, arch, nr) == ALLOW, nr


@pytest.mark.parametrize("machine, arch, nr", [("x86_64", X86_64, 135), ("aarch64", AARCH64, 92)])
def test_personality_may_be_asked_but_not_changed(machine, arch, nr):
    """personality(0xffffffff) asks for the current persona, personality(0) sets plain Linux: both harmless. Any other
    persona is refused: READ_IMPLIES_EXEC (0x0400000) would make every readable mapping executable, the heap too."""
    prog = seccomp_program(machine)
    assert run_bpf(prog, arch, nr, 0xFFFFFFFF) == ALLOW
    assert run_bpf(prog, arch, nr, 0) == ALLOW
    for persona in (0x0400000, 0x0040000, 0x0008, 1):  # READ_IMPLIES_EXEC, ADDR_NO_RANDOMIZE, PER_LINUX32, other
        assert run_bpf(prog, arch, nr, persona) == EPERM_VERDICT, hex(persona)
    assert run_bpf(prog, arch, 39 if machine == "x86_64" else 172, 0x0400000) == ALLOW  # the argument matters only there


def test_other_architectures_and_x32_are_denied():
    prog = seccomp_program("x86_64")
    assert run_bpf(prog, I386, 26) == EPERM_VERDICT  # ptrace through int 0x80 (i386 numbering)
    assert run_bpf(prog, I386, 20) == EPERM_VERDICT  # even getpid: nothing honest makes 32-bit calls
    assert run_bpf(prog, X86_64, 0x40000000 | 101) == EPERM_VERDICT  # x32 ptrace
    assert run_bpf(prog, X86_64, 0x40000000 | 39) == EPERM_VERDICT
    assert run_bpf(seccomp_program("aarch64"), X86_64, 39) == EPERM_VERDICT


def test_auto_is_on_for_both_backends():
    def spec(backend: str, seccomp: str = "auto") -> dict:
        return make_spec(SandboxConfig(seccomp=seccomp), backend, "/tmp", 0, 10, 0, [])

    assert spec("cpu")["seccomp"] and not spec("cpu")["seccomp_note"]
    assert spec("cuda")["seccomp"] and not spec("cuda")["seccomp_note"]  # CUDA ran under it on the H200
    assert spec("cuda", "on")["seccomp"]
    assert not spec("cpu", "off")["seccomp"] and not spec("cpu", "off")["seccomp_note"]
    with pytest.raises(ValueError, match="sandbox.seccomp"):
        SandboxConfig(seccomp="yes")


def test_the_layers_asked_for_are_named_in_words():
    """What a message about a process that died lists: the layers the config asks for, never one switched off."""
    assert SandboxConfig().layers() == ["network namespace", "read-only mounts", "capabilities dropped", "cgroup",
                                        "Landlock", "seccomp"]
    off = SandboxConfig(network="off", mounts="off", drop_capabilities=False, cgroup="off", filesystem="off",
                        seccomp="off")
    assert off.layers() == []
    assert SandboxConfig(network="off", seccomp="off").layers() == ["read-only mounts", "capabilities dropped",
                                                                     "cgroup", "Landlock"]


def test_landlock_auto_is_on_for_both_backends():
    """The file-system allow-list is on by default on cuda too (the GPU suite and hostile suite passed under it
    on the H200), and grants nothing of /proc beyond the process's own folder, which apply_spec adds."""
    def spec(backend: str, filesystem: str = "auto") -> dict:
        return make_spec(SandboxConfig(filesystem=filesystem), backend, "/tmp", 0, 10, 0, [])

    assert spec("cpu")["filesystem"] and spec("cuda")["filesystem"]
    assert not spec("cuda", "off")["filesystem"] and spec("cuda", "on")["filesystem"]
    assert not any(p == "/proc" or p.startswith("/proc/") for p in spec("cuda")["write_paths"])

PROBE = textwrap.dedent("""
    import ctypes, os, sys, threading
    from kevin.evaluation.kernel_filters import apply_seccomp
    libc = ctypes.CDLL(None, use_errno=True)
    def call(*args):
        rc = libc.syscall(*[ctypes.c_long(a) for a in args])
        return "ok" if rc >= 0 else os.strerror(ctypes.get_errno())
    early, gate, out = {}, threading.Event(), {}
    def waiter():  # a thread that exists BEFORE the filter: TSYNC must cover it too
        gate.wait()
        early["ptrace"] = call(PTRACE, 16, os.getppid(), 0, 0)
    t = threading.Thread(target=waiter); t.start()
    PTRACE, VM_READV, UNSHARE, GETPID, MOUNT, PERSONALITY, IO_URING, PERF = map(int, sys.argv[1:9])
    note = apply_seccomp()
    gate.set(); t.join()
    buf = ctypes.create_string_buffer(8)
    iov = (ctypes.c_void_p * 2)(ctypes.cast(buf, ctypes.c_void_p), 8)
    out["note"] = note
    out["ptrace"] = call(PTRACE, 16, os.getppid(), 0, 0)
    out["process_vm_readv"] = call(VM_READV, os.getppid(), ctypes.addressof(iov), 1, ctypes.addressof(iov), 1, 0)
    out["unshare"] = call(UNSHARE, 0x40000000)
    out["mount"] = call(MOUNT, 0, 0, 0, 0, 0)
    out["getpid"] = call(GETPID)
    out["personality_query"] = call(PERSONALITY, 0xFFFFFFFF)
    out["personality_exec"] = call(PERSONALITY, 0x0400000)
    out["io_uring_setup"] = call(IO_URING, 8, ctypes.addressof(ctypes.create_string_buffer(120)))
    out["perf_event_open"] = call(PERF, ctypes.addressof(ctypes.create_string_buffer(128)), 0, -1, -1, 0)
    out["thread_ptrace"] = early["ptrace"]
    pid = os.fork()
    if pid == 0:
        os._exit(0 if call(PTRACE, 16, os.getppid(), 0, 0) != "ok" else 3)
    out["child_denied"] = os.waitpid(pid, 0)[1] == 0
    print(repr(out))
""")


@pytest.mark.skipif(not sys.platform.startswith("linux") or os.uname().machine not in ("x86_64", "aarch64"),
                    reason="the filter is written for Linux on x86-64 and arm64")
def test_the_filter_denies_in_a_real_process_its_threads_and_children():
    numbers = {"x86_64": (101, 310, 272, 39, 165, 135, 425, 298), "aarch64": (117, 270, 97, 172, 40, 92, 425, 241)}[os.uname().machine]
    proc = subprocess.run([sys.executable, "-c", PROBE, *map(str, numbers)], capture_output=True, text=True, timeout=60,
                          cwd=os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
    assert proc.returncode == 0, proc.stderr
    out = eval(proc.stdout.strip().splitlines()[-1])  # noqa: S307  (our own probe's repr of a dict of str/bool)
    assert out["note"] == ""
    denied = os.strerror(1)
    for call in ("ptrace", "process_vm_readv", "unshare", "mount", "thread_ptrace", "personality_exec", "io_uring_setup",
                 "perf_event_open"):
        assert out[call] == denied, (call, out)
    assert out["getpid"] == "ok" and out["child_denied"] and out["personality_query"] == "ok"
