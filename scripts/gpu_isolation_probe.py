"""What this machine allows a candidate's process, checked in throwaway child processes (device calls).

    python scripts/gpu_isolation_probe.py [--device cuda:0]

Prints one line per layer: Landlock's ABI, a private read-only mount namespace, the seccomp filter, the
capability drop, and CUDA IPC between two processes (what the judge uses to read a candidate's outputs
without a copy), each as the harness applies it (kevin.evaluation.isolation, kernel_filters, transfer).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

CHILD = r"""
import json, os, sys, tempfile
sys.path.insert(0, sys.argv[1])
from kevin.evaluation import isolation, kernel_filters
out = {"landlock_abi": kernel_filters.landlock_abi(), "kernel": os.uname().release}
writable = tempfile.mkdtemp()
out["mount_notes"] = isolation.apply_read_only_mounts([writable])
try:
    open(os.path.join(sys.argv[1], "probe-write.txt"), "w").write("x")
    out["repo_writable_after_mounts"] = True
    os.unlink(os.path.join(sys.argv[1], "probe-write.txt"))
except OSError as exc:
    out["repo_writable_after_mounts"] = False
try:
    open(os.path.join(writable, "ok.txt"), "w").write("x")
    out["job_folder_writable"] = True
except OSError:
    out["job_folder_writable"] = False
out["caps"] = isolation.drop_capabilities() or "dropped"
out["seccomp"] = kernel_filters.apply_seccomp() or "installed"
import torch
out["cuda_after_layers"] = torch.cuda.is_available() and float(torch.ones(4, device="cuda").sum()) == 4.0
print(json.dumps(out))
"""

LANDLOCK = r"""
import json, os, sys, tempfile
sys.path.insert(0, sys.argv[1])
from kevin.evaluation import isolation, kernel_filters
variant = sys.argv[2]
work = tempfile.mkdtemp()
spec = isolation.make_spec(isolation.SandboxConfig(filesystem="on", seccomp="off"), "cuda", work, 0, 600, 0, [])
read, write = spec["read_paths"], spec["write_paths"] + [os.path.realpath("/proc/self")]  # as apply_spec does
home = os.path.expanduser("~")
extra = {"root": (["/"], ["/"]), "read_all": (["/"], None), "write_all": (None, ["/"]),
         "read_run": (read + ["/run", "/var/run"], None), "read_var": (read + ["/var"], None), "read_etc": (read + ["/etc"], None),
         "read_home": (read + [home], None), "read_tmp": (read + ["/tmp"], None),
         "write_tmp": (None, write + ["/tmp"]), "write_run": (None, write + ["/run", "/var/run"]), "write_home": (None, write + [home]),
         "write_dev_shm": (None, write + ["/dev/shm"]), "write_proc": (None, write + ["/proc"]), "write_var": (None, write + ["/var"])}
if variant in extra:
    r, w = extra[variant]
    read, write = r or read, w or write
abi, notes = kernel_filters.apply_landlock(read, write, spec["device_paths"], False, spec["list_paths"], scoped=variant != "unscoped")
try:
    import torch
    ok = float(torch.ones(4, device="cuda").sum()) == 4.0
    print(json.dumps({"variant": variant, "abi": abi, "notes": notes, "cuda": ok}))
except Exception as exc:
    print(json.dumps({"variant": variant, "abi": abi, "notes": notes, "cuda": f"{type(exc).__name__}: {exc}"[:300]}))
"""

EXPORTER = r"""
import json, sys, torch
sys.path.insert(0, sys.argv[1])
from pathlib import Path
from kevin.evaluation.channel import HarnessChannel, Layout
from kevin.evaluation.transfer import ipc_probe
device = torch.device(sys.argv[2])
torch.cuda.set_device(device)
why = ipc_probe(device)
if why:
    print("NOIPC " + why, flush=True)
    sys.exit(0)
layout = Layout.of([], [torch.empty(1 << 20, device=device)])
channel = HarnessChannel(layout, device, "ipc", Path("."))
channel.put([torch.arange(1 << 20, dtype=torch.float32, device=device)])
print("REFS " + json.dumps({"describe": channel.describe, "layout": layout.to_dict()}), flush=True)
sys.stdin.readline()  # keep the buffer alive until the reader is done
"""


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--device", default="cuda:0")
    ap.add_argument("--variants", default="spec,read_all,write_all,read_run,read_var,read_etc,read_home,read_tmp,write_tmp,"
                    "write_run,write_home,write_dev_shm,write_proc,write_var",
                    help="Landlock allow-lists to try, comma-separated ('spec' is the harness's own)")
    args = ap.parse_args()
    layers = subprocess.run([sys.executable, "-c", CHILD, str(REPO)], capture_output=True, text=True, timeout=300)
    print("isolation:", layers.stdout.strip() or layers.stderr[-2000:])
    # Which part of Landlock CUDA needs: the harness's allow-list, the same without the scoping of abstract unix
    # sockets and signals, and everything readable and writable (so only the scoping is in force).
    for variant in args.variants.split(","):
        probe = subprocess.run([sys.executable, "-c", LANDLOCK, str(REPO), variant], capture_output=True, text=True, timeout=300)
        print("landlock:", probe.stdout.strip() or probe.stderr[-1500:])
    proc = subprocess.Popen([sys.executable, "-c", EXPORTER, str(REPO), args.device], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, text=True)
    line = proc.stdout.readline().strip()
    if line.startswith("REFS "):
        import torch

        from kevin.evaluation.channel import JudgeChannel, Layout

        sent = json.loads(line[5:])
        device = torch.device(args.device)
        torch.cuda.set_device(device)
        torch.empty(1, device=device)  # a current context, as in the judge
        channel = JudgeChannel(sent["describe"], Path(tempfile.mkdtemp()), Layout.from_dict(sent["layout"]), device)
        got = [torch.empty(1 << 20, device=device)]
        channel.copy_outputs(got)
        ok = bool((got[0] == torch.arange(1 << 20, dtype=torch.float32, device=device)).all())
        channel.close()
        print("cuda ipc:", "works" if ok else "read back other values")
    else:
        print("cuda ipc:", line or "exporter failed")
    proc.stdin.write("\n")
    proc.stdin.flush()
    proc.wait(timeout=60)


if __name__ == "__main__":
    main()
