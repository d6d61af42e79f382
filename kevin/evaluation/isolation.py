"""Isolation layers for candidate processes: what each covers, what it does not, and how it degrades.

The harness applies every layer to itself as its very first action, before it imports torch or reads
any candidate code (no ``preexec_fn``: the batch evaluator is multi-threaded and forking Python code
between fork and exec can deadlock). The parent prepares what needs privileges outside the child
(cgroups) and passes a plain-dict spec in the job.

| layer | covers | does not cover | when unavailable |
| --- | --- | --- | --- |
| rlimits | core dumps, open files, file size, CPU seconds, address space (cpu backend) | GPU memory; RSS on cuda (see cgroup) | always available on Linux |
| network namespace (`unshare(CLONE_NEWNET)`, root) | every socket: only a down loopback exists | nothing network-related is left | Landlock TCP rules (bind/connect; not UDP), else a warning |
| Landlock (kernel >= 5.13) | file reads and writes outside an allow-list (system and Python dirs read-only; the job's own folder, its own /proc folder and /dev writable; the solution's built library and the precompiled headers read-only); ptrace and /proc/<pid>/environ of other processes; signals and abstract unix sockets outside the sandbox (ABI >= 6) | reading what the allow-list grants (e.g. /etc/passwd, the Python tree); pathname unix sockets | a warning; the job still runs |
| cgroup (v1 or v2 pids/memory, root) | fork bombs (`pids.max`), resident memory on cuda | GPU memory (the caching allocator's OOM is a runtime error) | parent-side RSS polling and process-group kill |
| read-only mounts (a private mount namespace, root) | writing anywhere but the job's own folder: the shared caches (builds, baselines, the precompiled headers), the repository, other jobs' files; a private, empty /dev/shm | reading (that is Landlock's part) | a warning (Landlock's write rules still apply where it exists) |
| capabilities dropped, evaluator not dumpable | a root candidate attaching to, or reading the memory of, the evaluator or the judge (ptrace, process_vm_readv, /proc/<pid>/mem need CAP_SYS_PTRACE for a non-dumpable process) | processes that are dumpable (other candidates: see the sibling row) | nothing to drop for a non-root user |
| environment allow-list (sandbox.py) | secrets in environment variables | secrets in readable files outside Landlock | n/a |
| separate user | not done: candidates run as the evaluator's user (root on the lent machines); Landlock and the namespace contain them | | |
| sibling processes (other candidates' compile jobs, run processes waiting for their turn) | with Landlock (ABI >= 6): signals, ptrace and /proc of processes outside the candidate's own domain | without Landlock (a kernel older than 5.13, or `filesystem: off`), a root candidate can signal or trace siblings: a waiting run process that dies before its turn is started again, and a forged hand-over (no job token) is refused, but memory tampering is not prevented | |
| seccomp deny-list (`apply_seccomp`), both backends | system calls that act on other processes or on the machine, answered EPERM: ptrace, process_vm_readv/writev, pidfd_getfd (reading or writing a sibling's memory or files, also as root without Landlock), mount and the new mount API, unshare/setns, module loading, kexec, reboot, swap, bpf, keyrings, userfaultfd, clock setting, iopl/ioperm, file handles (name_to_handle_at/open_by_handle_at), kcmp, the kernel log, perf_event_open, io_uring (its calls would bypass the filter), modify_ldt, process_madvise/migrate_pages/move_pages; personality() other than a query or plain Linux (READ_IMPLIES_EXEC would make the heap executable); 32-bit and x32 system calls on x86-64 (the classic way around a filter) | kill/tgkill (Landlock's signal scope covers those), anything not on the list; it is a deny-list, not an allow-list, so honest code keeps working | a warning |

This module holds the policy and its application: which layers a job gets (``SandboxConfig``), the spec the
parent hands the child (``make_spec``), the layers a process applies to itself in order (``apply_spec``) and the
parent's cgroups. Landlock and the seccomp filter themselves are built and installed by ``kernel_filters.py``.
"""

from __future__ import annotations

import ctypes
import errno
import os
import resource
import sys
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any

from kevin.evaluation.kernel_filters import apply_landlock, apply_seccomp, load_libc
from kevin.records.target import KernelTarget

_PR_SET_DUMPABLE = 4
_PR_CAPBSET_DROP = 24
_PR_CAP_AMBIENT, _PR_CAP_AMBIENT_CLEAR_ALL = 47, 4
_CLONE_NEWNET = 0x40000000
_CLONE_NEWNS = 0x00020000
_MS_RDONLY, _MS_NOSUID, _MS_NODEV, _MS_NOEXEC = 1, 2, 4, 8
_MS_REMOUNT, _MS_BIND, _MS_REC, _MS_PRIVATE = 32, 4096, 16384, 1 << 18
_MS_NOATIME, _MS_NODIRATIME, _MS_RELATIME = 1024, 2048, 1 << 21
_SYS_CAPSET = {"x86_64": 126, "aarch64": 91}


@dataclass
class SandboxConfig:
    """Which isolation layers candidate processes get (see the table in this module's docstring)."""

    network: str = "auto"
    """`auto`/`on`: no network (namespace as root, else Landlock TCP rules); `off`: inherit the network."""

    filesystem: str = "auto"
    """`auto`/`on`: Landlock file-system allow-list on both backends (where the kernel has no Landlock, a
    warning says so); CUDA needs its process's own /proc folder writable, which the allow-list grants
    (validated with the whole GPU suite on the H200: docs/gpu_runs.md); `off`: no file-system isolation.
    Read-only mounts stop writes outside the job's folder either way."""

    seccomp: str = "auto"
    """`auto`/`on`: the seccomp deny-list (on both backends; CUDA runs under it); `off`: no filter."""

    cgroup: str = "auto"
    """`auto`/`on`: a pids/memory cgroup per candidate where the cgroup tree is writable; `off`: none."""

    mounts: str = "auto"
    """`auto`/`on`: a private mount namespace in which every file system is read-only except the job's own
    folder (as root; a warning where it cannot be made); `off`: none."""

    drop_capabilities: bool = True
    """Drop every capability in candidate processes (after the namespaces are made), so a root candidate
    cannot trace or read the memory of the evaluator and the judge, which are made non-dumpable."""

    max_processes: int = 512
    """pids.max of the candidate's cgroup: processes AND threads (compilers and torch's pools fit)."""

    max_open_files: int = 4096
    """RLIMIT_NOFILE of the candidate process."""

    max_file_bytes: int = 2 << 30
    """RLIMIT_FSIZE: the largest file the candidate (or its compiler) may write."""

    extra_read_paths: list[str] = field(default_factory=list)
    """More read-only paths for Landlock (e.g. a CUDA toolkit outside /usr and /opt)."""

    def __post_init__(self) -> None:
        for name in ("network", "filesystem", "seccomp", "cgroup", "mounts"):
            if getattr(self, name) not in ("auto", "on", "off"):
                raise ValueError(f"sandbox.{name} must be auto, on or off, got {getattr(self, name)!r}")
        if self.max_processes < 16:
            raise ValueError("sandbox.max_processes must be >= 16 (compilers and torch start several)")

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "SandboxConfig":
        """From params (``evaluation.sandbox``): unknown keys are an error, never silently ignored."""
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(data) - known)
        if unknown:
            raise ValueError(f"unknown evaluation.sandbox settings: {unknown}; known: {sorted(known)}")
        return cls(**dict(data))

    def layers(self) -> list[str]:
        """The isolation layers asked for, in words (for messages about a process that died)."""
        layers = [name for name, value in (("network namespace", self.network != "off"),
                                           ("read-only mounts", self.mounts != "off"),
                                           ("capabilities dropped", self.drop_capabilities), ("cgroup", self.cgroup != "off"))
                  if value]
        if self.filesystem != "off":
            layers.append("Landlock")
        if self.seccomp != "off":
            layers.append("seccomp")
        return layers


# ------------------------------------------------------------------------------------ spec (parent)


_ETC_FILES = ("ld.so.cache", "ld.so.conf", "ld.so.conf.d", "passwd", "group", "nsswitch.conf", "localtime", "alternatives",
              "os-release", "hosts", "resolv.conf", "gai.conf", "host.conf", "nvidia", "OpenCL", "vulkan", "glvnd")


def read_only_paths(extra: list[str]) -> list[str]:
    """System, Python and toolchain directories a compile or a run needs to read and execute."""
    import site
    import sysconfig

    paths = {"/usr", "/lib", "/lib32", "/lib64", "/bin", "/sbin", "/opt", "/proc", "/sys", "/run/nvidia-persistenced"}
    paths |= {f"/etc/{name}" for name in _ETC_FILES}
    paths |= {sys.prefix, sys.base_prefix, sys.exec_prefix, os.path.dirname(os.path.realpath(sys.executable))}
    paths |= {p for p in sysconfig.get_paths().values() if p}
    try:
        paths |= set(site.getsitepackages()) | {site.getusersitepackages()}
    except AttributeError:  # virtualenv's old site module
        pass
    for var in ("CUDA_HOME", "CUDA_PATH"):
        if os.environ.get(var):
            paths.add(os.environ[var])
    package = Path(__file__).resolve().parents[1]  # the kevin package: importable, nothing else of the repo
    paths.add(str(package))
    paths |= set(extra)
    return sorted(p for p in paths if p and os.path.exists(p))


def make_spec(cfg: SandboxConfig, backend: str, workdir: str, memory_bytes: int, cpu_seconds: int, nice: int,
              cgroups: list[str], read_only: list[str] = (), writable: list[str] = ()) -> dict[str, Any]:
    """Everything a harness process needs to isolate itself, as JSON-ready data.

    ``workdir`` (the job's own folder) and ``writable`` stay writable; ``read_only`` (e.g. the solution's
    built library in the cache, the precompiled headers) is readable on top of the system paths.
    """
    filesystem = cfg.filesystem != "off"  # on cuda too: validated on the H200 (docs/gpu_runs.md, 2026-12-01)
    seccomp = cfg.seccomp != "off"  # validated with CUDA on the H200 (docs/gpu_runs.md, 2026-12-01)
    repo = str(Path(__file__).resolve().parents[2])
    return {
        "nice": nice,
        "rlimits": {
            "RLIMIT_CORE": 0,
            "RLIMIT_NOFILE": cfg.max_open_files,
            "RLIMIT_FSIZE": cfg.max_file_bytes,
            "RLIMIT_CPU": cpu_seconds,
            **({"RLIMIT_AS": memory_bytes} if KernelTarget.parse(backend).limits_address_space and memory_bytes else {}),
        },
        "network": cfg.network != "off",
        "mounts": cfg.mounts != "off",
        "drop_capabilities": cfg.drop_capabilities,
        "filesystem": filesystem,
        "seccomp": seccomp,
        "seccomp_note": "",
        "read_paths": read_only_paths([*cfg.extra_read_paths, *read_only]),
        "list_paths": [repo],  # the import system lists the repo root to find `kevin`; its files stay unreadable
        "write_paths": [workdir, *writable],
        "device_paths": ["/dev"],
        "cgroups": cgroups,
    }


def protect_process() -> str:
    """Make this process non-dumpable: a process without CAP_SYS_PTRACE (a candidate, which drops its
    capabilities) can then neither trace it nor read its memory or /proc files. '' or why not."""
    if not sys.platform.startswith("linux"):
        return "not dumpable: only on Linux"
    if load_libc().prctl(_PR_SET_DUMPABLE, 0, 0, 0, 0) != 0:
        return f"could not make the process non-dumpable: {os.strerror(ctypes.get_errno())}"
    return ""


def drop_capabilities() -> str:
    """Drop every capability of this process for good (bounding, ambient, effective, permitted, inheritable)."""
    machine = os.uname().machine
    if machine not in _SYS_CAPSET:
        return f"capabilities not dropped on {machine}"
    libc = load_libc()
    for cap in range(64):
        if libc.prctl(_PR_CAPBSET_DROP, cap, 0, 0, 0) != 0 and ctypes.get_errno() == errno.EINVAL:
            break  # past the last capability this kernel knows
    libc.prctl(_PR_CAP_AMBIENT, _PR_CAP_AMBIENT_CLEAR_ALL, 0, 0, 0)
    header = (ctypes.c_uint32 * 2)(0x20080522, 0)  # _LINUX_CAPABILITY_VERSION_3, this process
    data = (ctypes.c_uint32 * 6)()  # two {effective, permitted, inheritable} words, all zero
    if libc.syscall(_SYS_CAPSET[machine], ctypes.byref(header), ctypes.byref(data)) != 0:
        return f"capabilities not dropped: {os.strerror(ctypes.get_errno())}"
    return ""


def _mount_points() -> list[tuple[str, str]]:
    """(mount point, per-mount options) of this process's mounts, from /proc/self/mountinfo."""
    points = []
    with open("/proc/self/mountinfo") as handle:
        for line in handle:
            parts = line.split()
            if len(parts) > 5:
                point = parts[4].encode().decode("unicode_escape")
                points.append((point, parts[5]))
    return points


def _under(path: str, roots: tuple[str, ...]) -> bool:
    return any(path == r or path.startswith(r.rstrip("/") + "/") for r in roots)


def apply_read_only_mounts(writable: list[str]) -> list[str]:
    """A private mount namespace with every file system read-only except ``writable`` (and /proc, /sys,
    /dev, which hold no files of the evaluator), and an empty private /dev/shm. Returns warnings."""
    libc = load_libc()
    if libc.unshare(ctypes.c_int(_CLONE_NEWNS)) != 0:
        return [f"no private mount namespace ({os.strerror(ctypes.get_errno())}): caches and the repository stay writable "
                "where Landlock is unavailable"]
    if libc.mount(b"none", b"/", None, _MS_REC | _MS_PRIVATE, None) != 0:
        return [f"mounts not made private ({os.strerror(ctypes.get_errno())}): file systems stay writable"]
    keep = tuple(os.path.realpath(p) for p in writable if os.path.exists(p))
    for path in keep:
        if libc.mount(path.encode(), path.encode(), None, _MS_BIND | _MS_REC, None) != 0:
            return [f"could not keep {path} writable ({os.strerror(ctypes.get_errno())}): no read-only mounts"]
    failed = []
    for point, options in _mount_points():
        if _under(point, keep) or _under(point, ("/proc", "/sys", "/dev")):
            continue
        flags = _MS_REMOUNT | _MS_BIND | _MS_RDONLY
        for name, bit in (("nosuid", _MS_NOSUID), ("nodev", _MS_NODEV), ("noexec", _MS_NOEXEC), ("noatime", _MS_NOATIME),
                          ("nodiratime", _MS_NODIRATIME), ("relatime", _MS_RELATIME)):
            if name in options.split(","):
                flags |= bit
        if libc.mount(None, point.encode(), None, flags, None) != 0:
            failed.append(f"{point} ({os.strerror(ctypes.get_errno())})")
    warnings = [f"could not make read-only: {', '.join(failed[:5])}"] if failed else []
    if os.path.isdir("/dev/shm"):
        if libc.mount(b"tmpfs", b"/dev/shm", b"tmpfs", _MS_NOSUID | _MS_NODEV, b"size=268435456") != 0:
            warnings.append(f"no private /dev/shm ({os.strerror(ctypes.get_errno())})")
    return warnings


# ----------------------------------------------------------------------------------- apply (child)


def apply_spec(spec: dict[str, Any]) -> list[str]:
    """Isolate the current process as ``spec`` says; return warnings for layers that are unavailable."""
    warnings: list[str] = []
    for path in spec.get("cgroups", []):
        try:
            with open(path, "w") as handle:
                handle.write(str(os.getpid()))
        except OSError as exc:
            warnings.append(f"could not join cgroup {path}: {exc.strerror}")
    if spec.get("nice"):
        os.nice(int(spec["nice"]))
    for name, value in spec.get("rlimits", {}).items():
        limit = getattr(resource, name)
        soft, hard = resource.getrlimit(limit)
        value = int(value)
        if hard != resource.RLIM_INFINITY:
            value = min(value, hard)
        resource.setrlimit(limit, (value, value))
    net_isolated = False
    if spec.get("network"):
        libc = load_libc()
        if libc.unshare(ctypes.c_int(_CLONE_NEWNET)) == 0:
            net_isolated = True
        else:
            warnings.append(f"no network namespace ({os.strerror(ctypes.get_errno())}); falling back to Landlock TCP rules")
    if spec.get("mounts"):
        warnings.extend(apply_read_only_mounts(spec.get("write_paths", [])))
    if spec.get("drop_capabilities"):
        note = drop_capabilities()
        if note:
            warnings.append(note)
    deny_tcp = bool(spec.get("network")) and not net_isolated
    if spec.get("filesystem") or deny_tcp:
        read = spec.get("read_paths", []) if spec.get("filesystem") else ["/"]
        # The process's own /proc folder is writable: the CUDA driver writes there as it starts (seen on an H200:
        # with /proc read-only, CUDA's initialisation fails with "OS call failed", error 304). Other processes'
        # /proc folders stay read-only, and those need CAP_SYS_PTRACE besides, which the candidate dropped.
        own_proc = [os.path.realpath("/proc/self")] if spec.get("filesystem") else []
        write = [*spec.get("write_paths", []), *own_proc] if spec.get("filesystem") else ["/"]
        abi, notes = apply_landlock(read, write, spec.get("device_paths", []), deny_tcp, spec.get("list_paths", []))
        warnings.extend(notes)
        if abi == 0:
            warnings.append("Landlock unavailable: no file-system isolation" + ("; no network isolation" if deny_tcp else ""))
        elif deny_tcp and abi < 4:
            warnings.append("Landlock ABI < 4: no network isolation")
    # Last: the filter denies unshare, which the network layer above needed.
    if spec.get("seccomp_note"):
        warnings.append(spec["seccomp_note"])
    if spec.get("seccomp"):
        note = apply_seccomp()
        if note:
            warnings.append(note)
    return warnings


# ------------------------------------------------------------------------------------ cgroups (parent)


class CgroupJob:
    """A pids (and, on cuda, memory) cgroup for one candidate, made by the parent and removed after.

    Works with cgroup v1 (``/sys/fs/cgroup/pids``, ``/sys/fs/cgroup/memory``) and v2 (unified). Where
    the tree is not writable (no root, no delegation) ``procs_files`` is empty and ``note`` says why.
    """

    ROOT = Path("/sys/fs/cgroup")

    def __init__(self, name: str, max_pids: int, memory_bytes: int):
        self.dirs: list[Path] = []
        self.procs_files: list[str] = []
        self.note = ""
        self.limits_pids = self.limits_memory = False
        try:
            if (self.ROOT / "cgroup.controllers").exists():
                self._make(self.ROOT / "kevin" / name, {"pids.max": max_pids, **({"memory.max": memory_bytes} if memory_bytes else {})})
            else:
                self._make(self.ROOT / "pids" / "kevin" / name, {"pids.max": max_pids})
                if memory_bytes:
                    self._make(self.ROOT / "memory" / "kevin" / name, {"memory.limit_in_bytes": memory_bytes})
        except OSError as exc:
            self.note = f"no cgroup for the candidate ({exc.strerror}): process count and memory are polled instead"
            self.remove()
            self.procs_files, self.limits_pids, self.limits_memory = [], False, False

    def _make(self, path: Path, limits: dict[str, int]) -> None:
        if path.parent.name == "kevin" and path.parent.parent == self.ROOT and (self.ROOT / "cgroup.controllers").exists():
            path.parent.mkdir(exist_ok=True)
            # v2: a child can use a controller only if its parent delegates it.
            (self.ROOT / "cgroup.subtree_control").write_text("+pids +memory")
            (path.parent / "cgroup.subtree_control").write_text("+pids +memory")
        path.mkdir(parents=True, exist_ok=True)
        self.dirs.append(path)
        for key, value in limits.items():
            (path / key).write_text(str(value))
            self.limits_pids |= key == "pids.max"
            self.limits_memory |= key.startswith("memory.")
        self.procs_files.append(str(path / "cgroup.procs"))

    def kill_all(self) -> None:
        import signal

        for path in self.dirs:
            try:
                pids = [int(p) for p in (path / "cgroup.procs").read_text().split()]
            except OSError:
                continue
            for pid in pids:
                try:
                    os.kill(pid, signal.SIGKILL)
                except OSError:
                    pass

    def remove(self) -> None:
        import time

        for path in reversed(self.dirs):
            for _ in range(50):  # rmdir succeeds once the killed tasks are reaped
                try:
                    path.rmdir()
                    break
                except OSError:
                    self.kill_all()
                    time.sleep(0.02)
        self.dirs = []
