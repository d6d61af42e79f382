"""Share the files a fresh GPU machine needs among as few device calls as their size allows.

    python3 scripts/device_carry.py PIECES CARRY BYTES

A device call carries the working tree plus the ignored folders it names, 64 MiB in all; the learning run needs
more than that (the model, the wheels the image lacks, the run so far). Every file of PIECES is hard-linked into
one of CARRY/call_1, CARRY/call_2, ... (first fit, largest first), each holding at most BYTES; every call folder
gets the same MANIFEST (one ``call name bytes sha256`` line per file), so the machine can tell which file is
missing and which call brings it. Prints the calls, one per line.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import sys
from pathlib import Path


def plan(sizes: dict[str, int], capacity: int) -> list[list[str]]:
    """First-fit decreasing: each name into the first call with room, a new call when none has."""
    calls: list[list[str]] = []
    room: list[int] = []
    for name in sorted(sizes, key=lambda n: (-sizes[n], n)):
        if sizes[name] > capacity:
            raise SystemExit(f"{name} is {sizes[name]} bytes, more than a call carries ({capacity}): split it")
        slot = next((i for i, left in enumerate(room) if left >= sizes[name]), None)
        if slot is None:
            calls.append([])
            room.append(capacity)
            slot = len(calls) - 1
        calls[slot].append(name)
        room[slot] -= sizes[name]
    return calls


def main(pieces: Path, carry: Path, capacity: int) -> None:
    files = {p.name: p for p in sorted(pieces.iterdir()) if p.is_file()}
    calls = plan({name: path.stat().st_size for name, path in files.items()}, capacity)
    for old in carry.glob("call_*"):
        shutil.rmtree(old)
    lines = []
    for number, names in enumerate(calls, start=1):
        folder = carry / f"call_{number}"
        folder.mkdir(parents=True)
        for name in sorted(names):
            os.link(files[name], folder / name)
            digest = hashlib.sha256(files[name].read_bytes()).hexdigest()
            lines.append(f"{number} {name} {files[name].stat().st_size} {digest}")
    for number in range(1, len(calls) + 1):
        (carry / f"call_{number}" / "MANIFEST").write_text("\n".join(lines) + "\n")
    for number, names in enumerate(calls, start=1):
        total = sum(files[n].stat().st_size for n in names)
        print(f"call {number}: carry [\".carry/call_{number}\"]  {total / 2**20:.1f} MiB  {len(names)} files")


if __name__ == "__main__":
    if len(sys.argv) != 4:
        raise SystemExit(__doc__)
    main(Path(sys.argv[1]), Path(sys.argv[2]), int(sys.argv[3]))
