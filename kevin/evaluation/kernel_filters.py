"""Landlock and seccomp: the two filters a candidate process asks the kernel to hold it to, for good and for
its children too, installed through raw system calls (Python wraps neither). Which paths and which layers a job
gets is decided in ``isolation.py`` (the spec and its application); this module only builds and installs them.

Nothing here runs at import: a process is restricted only when it calls ``apply_landlock`` or ``apply_seccomp``.
"""

from __future__ import annotations

import ctypes
import os
import sys

# Landlock system calls share their numbers on x86-64 and arm64 (new syscalls use the generic table).
_SYS_CREATE_RULESET, _SYS_ADD_RULE, _SYS_RESTRICT_SELF = 444, 445, 446
_CREATE_RULESET_VERSION = 1
_RULE_PATH_BENEATH, _RULE_NET_PORT = 1, 2
_PR_SET_NO_NEW_PRIVS = 38

FS_EXECUTE, FS_WRITE_FILE, FS_READ_FILE, FS_READ_DIR = 1 << 0, 1 << 1, 1 << 2, 1 << 3
FS_REMOVE_DIR, FS_REMOVE_FILE, FS_MAKE_CHAR, FS_MAKE_DIR, FS_MAKE_REG = 1 << 4, 1 << 5, 1 << 6, 1 << 7, 1 << 8
FS_MAKE_SOCK, FS_MAKE_FIFO, FS_MAKE_BLOCK, FS_MAKE_SYM, FS_REFER, FS_TRUNCATE, FS_IOCTL_DEV = (
    1 << 9, 1 << 10, 1 << 11, 1 << 12, 1 << 13, 1 << 14, 1 << 15)
NET_BIND_TCP, NET_CONNECT_TCP = 1 << 0, 1 << 1
SCOPE_ABSTRACT_UNIX_SOCKET, SCOPE_SIGNAL = 1 << 0, 1 << 1

_FILE_RIGHTS = FS_EXECUTE | FS_WRITE_FILE | FS_READ_FILE | FS_TRUNCATE | FS_IOCTL_DEV
READ = FS_EXECUTE | FS_READ_FILE | FS_READ_DIR
WRITE = READ | FS_WRITE_FILE | FS_REMOVE_DIR | FS_REMOVE_FILE | FS_MAKE_DIR | FS_MAKE_REG | FS_MAKE_SYM | \
    FS_MAKE_SOCK | FS_MAKE_FIFO | FS_REFER | FS_TRUNCATE
DEVICES = WRITE | FS_IOCTL_DEV


# ---------------------------------------------------------------------------------------- Landlock


class _RulesetAttr(ctypes.Structure):
    _fields_ = [("handled_access_fs", ctypes.c_uint64), ("handled_access_net", ctypes.c_uint64),
                ("scoped", ctypes.c_uint64)]


class _PathBeneathAttr(ctypes.Structure):
    _pack_ = 1
    _fields_ = [("allowed_access", ctypes.c_uint64), ("parent_fd", ctypes.c_int32)]


def load_libc() -> ctypes.CDLL:
    """The C library of this process, keeping errno, for the system calls Python does not wrap."""
    return ctypes.CDLL(None, use_errno=True)


def landlock_abi() -> int:
    """The kernel's Landlock ABI version, 0 when Landlock is missing or disabled."""
    if not sys.platform.startswith("linux"):
        return 0
    abi = load_libc().syscall(_SYS_CREATE_RULESET, None, ctypes.c_size_t(0), ctypes.c_uint32(_CREATE_RULESET_VERSION))
    return max(int(abi), 0)


def _handled_fs(abi: int) -> int:
    mask = (1 << 13) - 1
    if abi >= 2:
        mask |= FS_REFER
    if abi >= 3:
        mask |= FS_TRUNCATE
    if abi >= 5:
        mask |= FS_IOCTL_DEV
    return mask


def apply_landlock(read_paths: list[str], write_paths: list[str], device_paths: list[str], deny_tcp: bool,
                   list_paths: list[str] = (), scoped: bool = True) -> tuple[int, list[str]]:
    """Restrict this process (and its future children) for good; return (abi, notes)."""
    abi = landlock_abi()
    if abi <= 0:
        return 0, ["Landlock is not available in this kernel"]
    libc, notes = load_libc(), []
    handled_fs = _handled_fs(abi)
    attr = _RulesetAttr(handled_fs, (NET_BIND_TCP | NET_CONNECT_TCP) if (deny_tcp and abi >= 4) else 0,
                        (SCOPE_ABSTRACT_UNIX_SOCKET | SCOPE_SIGNAL) if (abi >= 6 and scoped) else 0)
    size = ctypes.sizeof(_RulesetAttr) if abi >= 6 else (16 if abi >= 4 else 8)
    ruleset = libc.syscall(_SYS_CREATE_RULESET, ctypes.byref(attr), ctypes.c_size_t(size), ctypes.c_uint32(0))
    if ruleset < 0:
        return 0, [f"landlock_create_ruleset failed: {os.strerror(ctypes.get_errno())}"]
    try:
        granted = ((read_paths, READ), (write_paths, WRITE), (device_paths, DEVICES), (list_paths, FS_READ_DIR))
        for paths, rights in granted:
            for path in paths:
                _add_path_rule(libc, ruleset, path, rights & handled_fs, notes)
        if libc.prctl(_PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0:
            return 0, [f"prctl(NO_NEW_PRIVS) failed: {os.strerror(ctypes.get_errno())}"]
        if libc.syscall(_SYS_RESTRICT_SELF, ctypes.c_int(ruleset), ctypes.c_uint32(0)) != 0:
            return 0, [f"landlock_restrict_self failed: {os.strerror(ctypes.get_errno())}"]
    finally:
        os.close(ruleset)
    return abi, notes


def _add_path_rule(libc: ctypes.CDLL, ruleset: int, path: str, rights: int, notes: list[str]) -> None:
    try:
        fd = os.open(path, os.O_PATH | os.O_CLOEXEC)
    except OSError:
        return  # a path that does not exist here needs no rule
    try:
        if not os.path.isdir(path):
            rights &= _FILE_RIGHTS
        rule = _PathBeneathAttr(rights, fd)
        if libc.syscall(_SYS_ADD_RULE, ctypes.c_int(ruleset), ctypes.c_int(_RULE_PATH_BENEATH), ctypes.byref(rule),
                        ctypes.c_uint32(0)) != 0:
            notes.append(f"no Landlock rule for {path}: {os.strerror(ctypes.get_errno())}")
    finally:
        os.close(fd)


# ----------------------------------------------------------------------------------------- seccomp

_AUDIT_ARCH = {"x86_64": 0xC000003E, "aarch64": 0xC00000B7}
_DENIED_SYSCALLS = {
    # name: (x86-64, aarch64). Verified against asm/unistd_64.h and asm-generic/unistd.h.
    "ptrace": (101, 117), "process_vm_readv": (310, 270), "process_vm_writev": (311, 271), "pidfd_getfd": (438, 438),
    "mount": (165, 40), "umount2": (166, 39), "pivot_root": (155, 41), "open_tree": (428, 428),
    "move_mount": (429, 429), "fsopen": (430, 430), "fsconfig": (431, 431), "fsmount": (432, 432),
    "fspick": (433, 433), "mount_setattr": (442, 442), "unshare": (272, 97), "setns": (308, 268),
    "init_module": (175, 105), "finit_module": (313, 273), "delete_module": (176, 106), "kexec_load": (246, 104),
    "kexec_file_load": (320, 294), "reboot": (169, 142), "swapon": (167, 224), "swapoff": (168, 225),
    "bpf": (321, 280), "keyctl": (250, 219), "add_key": (248, 217), "request_key": (249, 218),
    "userfaultfd": (323, 282), "open_by_handle_at": (304, 265), "acct": (163, 89), "quotactl": (179, 60),
    "settimeofday": (164, 170), "clock_settime": (227, 112), "clock_adjtime": (305, 266), "adjtimex": (159, 171),
    "sethostname": (170, 161), "setdomainname": (171, 162), "iopl": (172, None), "ioperm": (173, None),
    # Reading other processes or the kernel: file handles (a path-free way into any file), comparing another
    # process's resources, the kernel log, hardware counters (also a clock), advice on another's memory.
    "name_to_handle_at": (303, 264), "kcmp": (312, 272), "syslog": (103, 116), "perf_event_open": (298, 241),
    "process_madvise": (440, 440), "process_mrelease": (448, 448), "lookup_dcookie": (212, 18),
    "fanotify_init": (300, 262), "migrate_pages": (256, 238), "move_pages": (279, 239),
    # io_uring performs system calls from a kernel queue, where a filter on the calling thread never sees them.
    "io_uring_setup": (425, 425), "io_uring_enter": (426, 426), "io_uring_register": (427, 427),
    # Old or segment-level interfaces: 16/32-bit code segments (modify_ldt), libraries loaded by the kernel.
    "modify_ldt": (154, None), "uselib": (134, None), "vhangup": (153, 58), "nfsservctl": (180, 42),
}
# System calls allowed only with these first arguments. personality() asked for the current persona (0xffffffff)
# or for plain Linux (0) is harmless; any other persona is refused, READ_IMPLIES_EXEC above all (every later
# readable mapping, the heap included, would be executable: code written as data would run).
_ARG0_ALLOWED = {"personality": ((135, 92), (0xFFFFFFFF, 0))}
_SYS_SECCOMP = {"x86_64": 317, "aarch64": 277}
_X32_BIT = 0x40000000
_BPF_LD_W_ABS, _BPF_JEQ_K, _BPF_JGE_K, _BPF_RET_K = 0x20, 0x15, 0x35, 0x06
_RET_ALLOW, _RET_ERRNO = 0x7FFF0000, 0x00050000
_ARG0_LOW = 16  # seccomp_data: nr (4), arch (4), instruction pointer (8), then args[0]; its low word on little-endian
_EPERM = 1


class _SockFilter(ctypes.Structure):
    _fields_ = [("code", ctypes.c_uint16), ("jt", ctypes.c_uint8), ("jf", ctypes.c_uint8), ("k", ctypes.c_uint32)]


class _SockFprog(ctypes.Structure):
    _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.POINTER(_SockFilter))]


def seccomp_program(machine: str) -> list[tuple[int, int, int, int]]:
    """The classic-BPF filter as (code, jt, jf, k): EPERM for the deny-list, for other architectures' system
    calls and (x86-64) for x32 numbers, and for the listed calls with a first argument not on their list;
    everything else allowed. Pure, so it can be checked by hand."""
    column = {"x86_64": 0, "aarch64": 1}[machine]
    numbers = sorted({nr[column] for nr in _DENIED_SYSCALLS.values() if nr[column] is not None})
    checks: list[tuple[int, int]] = [(_BPF_JEQ_K, n) for n in numbers]
    if machine == "x86_64":
        checks.insert(0, (_BPF_JGE_K, _X32_BIT))
    argument_rules = [(nrs[column], values) for nrs, values in _ARG0_ALLOWED.values() if nrs[column] is not None]
    # Layout (BPF jumps only forward, relative to the next instruction):
    #   ld arch; jeq arch else DENY; ld nr; [check -> DENY]...; [jeq nr -> its block]...; ret allow;
    #   per block: ld arg0; [jeq value -> its ret allow]...; ret deny; ret allow;
    #   DENY: ret deny
    head = 3 + len(checks) + len(argument_rules) + 1
    block_starts, size = [], head
    for _, values in argument_rules:
        block_starts.append(size)
        size += 1 + len(values) + 2
    deny = size
    prog = [(_BPF_LD_W_ABS, 0, 0, 4), (_BPF_JEQ_K, 0, deny - 2, _AUDIT_ARCH[machine]), (_BPF_LD_W_ABS, 0, 0, 0)]
    for code, k in checks:
        prog.append((code, deny - (len(prog) + 1), 0, k))
    for (nr, _), start in zip(argument_rules, block_starts):
        prog.append((_BPF_JEQ_K, start - (len(prog) + 1), 0, nr))
    prog.append((_BPF_RET_K, 0, 0, _RET_ALLOW))
    for (_, values), start in zip(argument_rules, block_starts):
        allow_here = start + 1 + len(values) + 1
        prog.append((_BPF_LD_W_ABS, 0, 0, _ARG0_LOW))
        for value in values:
            prog.append((_BPF_JEQ_K, allow_here - (len(prog) + 1), 0, value))
        prog += [(_BPF_RET_K, 0, 0, _RET_ERRNO | _EPERM), (_BPF_RET_K, 0, 0, _RET_ALLOW)]
    prog.append((_BPF_RET_K, 0, 0, _RET_ERRNO | _EPERM))
    assert len(prog) == deny + 1
    return prog


def apply_seccomp() -> str:
    """Install the deny-list filter on every thread of this process (and its future children) for good;
    returns "" or why it could not."""
    machine = os.uname().machine
    if not sys.platform.startswith("linux") or machine not in _AUDIT_ARCH:
        return f"no seccomp filter for {sys.platform}/{machine}"
    prog = seccomp_program(machine)
    filters = (_SockFilter * len(prog))(*[_SockFilter(*ins) for ins in prog])
    fprog = _SockFprog(len(prog), filters)
    libc = load_libc()
    if libc.prctl(_PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0:
        return f"prctl(NO_NEW_PRIVS) failed: {os.strerror(ctypes.get_errno())}"
    set_mode_filter, flag_tsync = 1, 1  # TSYNC: threads started before the filter get it too
    rc = libc.syscall(_SYS_SECCOMP[machine], ctypes.c_uint(set_mode_filter), ctypes.c_uint(flag_tsync),
                      ctypes.byref(fprog))
    if rc != 0:
        return f"seccomp filter not installed: {os.strerror(ctypes.get_errno())}"
    return ""
