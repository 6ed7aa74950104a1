"""Carry a folder of many small files (CIFAR-10's 60k JPEGs) to the GPU machine as one file.

The device tool copies the working tree file by file and caps it at 64 MiB; the JPEG
bytes of CIFAR-10 are 55 MB (56 MB packed), so they travel packed into one .npz and are unpacked there:

    python benchmarks/device_data.py pack ../shared/data/cifar10-jpeg .dev/cifar10.npz
    python3 benchmarks/device_data.py unpack .dev/cifar10.npz /tmp/data/cifar10-jpeg
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np


def pack(src: Path, dst: Path) -> None:
    files = sorted(p for p in src.rglob("*") if p.is_file())
    blobs = [p.read_bytes() for p in files]
    offsets = np.cumsum([0] + [len(b) for b in blobs])
    # names as bytes, compressed: as numpy's fixed-width unicode they were 6.4 MB of CIFAR-10's 61.7, and the
    # carry limit (64 MiB with the working tree) had no room left for them
    np.savez_compressed(dst, names=np.array([str(p.relative_to(src)).encode() for p in files]), offsets=offsets,
                        data=np.frombuffer(b"".join(blobs), dtype=np.uint8))
    print(f"{len(files)} files, {offsets[-1] / 1e6:.1f} MB -> {dst}")


def unpack(src: Path, dst: Path) -> None:
    a = np.load(src)
    data, offsets = a["data"], a["offsets"]
    for i, name in enumerate(a["names"]):
        p = dst / (name.decode() if isinstance(name, bytes) else str(name))
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_bytes(data[offsets[i]:offsets[i + 1]].tobytes())
    print(f"{len(a['names'])} files -> {dst}")


if __name__ == "__main__":
    {"pack": pack, "unpack": unpack}[sys.argv[1]](Path(sys.argv[2]), Path(sys.argv[3]))
