"""Decoded datasets as numpy arrays, and the on-disk cache of decoded arrays.

Every loader returns images as uint8 arrays, [n, H, W] (grey) or [n, H, W, C] (colour),
upright, with int64 labels 0..L-1 and one name per label.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterator

import numpy as np


@dataclass
class ImageSet:
    """One split: images [n, H, W(, C)] uint8, labels [n] int64, class names (label -> name).

    ``owners`` [n] int64 (files with a natural id per sample: writer, user, device): each sample's client
    0..U-1, -1 for a sample whose id has no training sample (test split); ``owner_names`` the ids by client.
    None for a dataset without ids."""

    x: np.ndarray
    y: np.ndarray
    class_names: list[str]
    owners: np.ndarray | None = None
    owner_names: list[str] | None = None

    def __len__(self) -> int:
        return len(self.y)


@dataclass
class ArrayDataset:
    """A dataset with a train and a test split (same classes). ``classes_checked``: its loader has already
    warned (``DataWarning``, naming its folders) about classes missing from a split."""

    train: ImageSet
    test: ImageSet
    classes_checked: bool = False

    @property
    def class_names(self) -> list[str]:
        return self.train.class_names


def cache_dir() -> Path:
    """Where decoded/generated arrays are cached: $FEDSL_CACHE or ~/.cache/fedsl."""
    return Path(os.environ.get("FEDSL_CACHE", Path.home() / ".cache" / "fedsl"))


class _BadEntry(Exception):
    """A cache entry that is not what ``cached_arrays`` writes."""


def _check_npz(path: Path) -> None:
    """Check every array's header in the .npz at ``path`` against its member's size, reading no data.

    numpy allocates the array a header describes before reading its bytes, so a damaged
    header (say shape (2**40,)) would ask for a terabyte; ``np.savez`` stores members
    uncompressed, so a member's size is the header plus exactly the array's bytes.
    """
    size = path.stat().st_size
    with zipfile.ZipFile(path) as zf:
        for info in zf.infolist():
            if info.compress_type != zipfile.ZIP_STORED or info.file_size > size:
                raise _BadEntry(f"{info.filename}: compressed, or larger than the file")
            with zf.open(info) as f:
                version = np.lib.format.read_magic(f)
                read_header = (np.lib.format.read_array_header_1_0 if version == (1, 0)
                               else np.lib.format.read_array_header_2_0)
                shape, _fortran, dtype = read_header(f)
                data_bytes = int(np.prod(shape, dtype=object)) * dtype.itemsize
                if dtype.hasobject or f.tell() + data_bytes != info.file_size:
                    raise _BadEntry(f"{info.filename}: header {shape} {dtype} does not match its size")


def cached_arrays(name: str, recipe: dict, build: Callable[[], dict[str, np.ndarray]]) -> dict[str, np.ndarray]:
    """Arrays for ``recipe`` (e.g. file checksums + options) from the cache, or built and stored.

    The key hashes the recipe, so a changed source file or option builds anew. Writes are
    atomic; a corrupt entry is rebuilt -- including one whose headers claim more data than it
    holds, which is found before anything is allocated; a read-only cache only costs rebuilding.
    """
    key = hashlib.sha256(json.dumps(recipe, sort_keys=True).encode()).hexdigest()[:16]
    path = cache_dir() / f"{name}-{key}.npz"
    cached = _read_entry(path)
    if cached is not None:
        return cached
    # Processes that want the same entry at once (a sweep's workers, parallel test workers) build it once:
    # the first holds the entry's lock while it builds, the others wait and then read what it wrote
    with _entry_lock(path):
        cached = _read_entry(path)
        if cached is not None:
            return cached
        arrays = build()
        try:
            tmp = path.with_name(f".{path.stem}.{os.getpid()}.tmp.npz")
            np.savez(tmp, **arrays)
            os.replace(tmp, path)
        except OSError:
            pass
    return arrays


def _read_entry(path: Path) -> dict[str, np.ndarray] | None:
    """The arrays of a sound cache entry at ``path``; None (and a corrupt entry removed) otherwise."""
    if not path.is_file():
        return None
    try:
        _check_npz(path)
        with np.load(path, allow_pickle=False) as z:
            return {k: z[k] for k in z.files}
    except (_BadEntry, OSError, ValueError, EOFError, zipfile.BadZipFile, zipfile.LargeZipFile, MemoryError):
        try:
            path.unlink(missing_ok=True)
        except OSError:  # a read-only cache: rebuilt each time
            pass
    return None


@contextlib.contextmanager
def _entry_lock(path: Path) -> Iterator[None]:
    """An exclusive lock on ``path``'s entry across processes (``flock`` on a ``.lock`` file beside it,
    released by the kernel if its holder dies); no lock where the cache cannot be written or the platform
    has no ``fcntl``: then each process builds for itself, as without the lock."""
    try:
        import fcntl
        path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(path.with_name(f".{path.stem}.lock"), os.O_RDWR | os.O_CREAT, 0o644)
    except (ImportError, OSError):
        yield
        return
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)  # closing the descriptor releases the lock


def file_fingerprint(path: str | Path) -> str:
    """The file's sha256 (what cache keys of decoded publisher files are made of)."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def folder_fingerprint(root: str | Path, suffixes: tuple[str, ...] | None = None) -> str:
    """A cache key for a folder of many files: every file's relative path, size and mtime.

    Reading tens of thousands of images just to hash them would cost about what decoding
    them does; a changed, added or removed file still changes the key. (os.walk + one
    stat per file: cheaper than Path.rglob on folders of tens of thousands of files.)
    """
    root = Path(root)
    rows = []
    for dirpath, _dirs, files in os.walk(root):
        rel = Path(dirpath).relative_to(root).parts
        for f in files:
            if suffixes is None or os.path.splitext(f)[1].lower() in suffixes:
                st = os.stat(os.path.join(dirpath, f))
                rows.append(((*rel, f), st.st_size, st.st_mtime_ns))
    h = hashlib.sha256()
    for parts, size, mtime in sorted(rows):
        h.update(f"{os.sep.join(parts)}:{size}:{mtime}\n".encode())
    return h.hexdigest()
