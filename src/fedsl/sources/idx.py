"""The idx file format of MNIST, Fashion-MNIST and EMNIST, gzip-compressed or raw, and the publishers' file pairs.

An idx file is a 4-byte magic number -- two zero bytes, a type code, the number of
dimensions -- then each dimension as a big-endian uint32, then the values in C order,
big-endian. ``read_idx`` checks the length exactly: a truncated download or a file with
trailing bytes is a ``DataError`` naming the file, not a silently short array.

The header is never trusted with memory. A raw file's size is known, so the header's claim
is checked against it before anything is allocated. A gzip file's decompressed length is
not known without decompressing it, so (1) a claim above ``GZIP_MAX_RATIO`` times the
compressed size is refused at once -- deflate cannot expand more than 1032:1, so such a
file must be truncated or not an idx file -- and (2) the values are read incrementally into
a buffer that grows with the data actually decompressed, so a header claiming 2**32 - 1
images costs only the memory of the bytes really there before the file is reported
truncated (trailing bytes past the claim are counted without being kept).

The publishers' idx file pairs (EMNIST, MNIST, Fashion-MNIST): found, decoded (cached), relabelled.

Shared by ``fedsl.sources.emnist`` and ``fedsl.sources.mnist``: files are looked for under their
official names in ``root`` itself, then in the dataset's own sub-folders of it, gzip-compressed
(``.gz``) or not; decoded arrays are cached (``fedsl.sources.arrays.cached_arrays``), keyed by the
files' sha256 and the decoding options.
"""

from __future__ import annotations

import gzip
import math
import zlib
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from fedsl.core.errors import DataError
from fedsl.sources.arrays import cached_arrays, file_fingerprint

# type code -> big-endian dtype, as in the format's definition (yann.lecun.com/exdb/mnist).
IDX_DTYPES: dict[int, np.dtype] = {
    0x08: np.dtype(">u1"),
    0x09: np.dtype(">i1"),
    0x0B: np.dtype(">i2"),
    0x0C: np.dtype(">i4"),
    0x0D: np.dtype(">f4"),
    0x0E: np.dtype(">f8"),
}
_GZIP_MAGIC = b"\x1f\x8b"
_CHUNK = 1 << 22
# deflate's largest expansion is 1032:1 (a 258-byte match in 2 bits); a few bytes of slack
# for the gzip header and tiny files
GZIP_MAX_RATIO = 1032
_GZIP_SLACK = 1 << 16


def _open(path: Path):
    """The file's bytes stream; gzip is recognised by its content, not its name."""
    with open(path, "rb") as f:
        head = f.read(2)
    return gzip.open(path, "rb") if head == _GZIP_MAGIC else open(path, "rb")


def _read_exact(stream, buf: memoryview) -> int:
    """Fill ``buf`` from ``stream``; the number of bytes read (short only at end of file)."""
    done = 0
    while done < len(buf):
        n = stream.readinto(buf[done:done + _CHUNK])
        if not n:
            break
        done += n
    return done


def _read_grown(stream, nbytes: int) -> tuple[bytearray, int]:
    """Up to ``nbytes`` bytes of ``stream`` in a buffer grown as they arrive; (buffer, bytes read).

    Memory follows the data that exist, not the header's claim (a bytearray grows in place,
    large ones by mremap, without copying what it holds).
    """
    buf = bytearray()
    while len(buf) < nbytes:
        block = stream.read(min(_CHUNK, nbytes - len(buf)))
        if not block:
            break
        buf += block
    return buf, len(buf)


def _count_rest(stream) -> int:
    """Bytes left in ``stream``, counted without keeping them."""
    n = 0
    while block := stream.read(_CHUNK):
        n += len(block)
    return n


def read_idx(path: str | Path) -> np.ndarray:
    """The array stored in the idx file at ``path`` (gzip or raw), in native byte order."""
    path = Path(path)
    try:
        with _open(path) as f:
            gz = isinstance(f, gzip.GzipFile)
            magic = f.read(4)
            if len(magic) < 4 or magic[0] != 0 or magic[1] != 0 or magic[2] not in IDX_DTYPES:
                raise DataError(f"{path} is not an idx file (magic bytes {magic.hex() or 'missing'}; expected "
                                "00 00 <type code 08/09/0b/0c/0d/0e> <ndim>): replace it with the publisher's file")
            dtype, ndim = IDX_DTYPES[magic[2]], magic[3]
            raw_dims = f.read(4 * ndim)
            if len(raw_dims) < 4 * ndim:
                raise DataError(f"{path} is truncated inside its header ({4 + len(raw_dims)} of {4 + 4 * ndim} "
                                "bytes): delete it and download it again")
            shape = tuple(int(d) for d in np.frombuffer(raw_dims, dtype=">u4"))
            header = 4 + 4 * ndim
            nbytes = math.prod(shape) * dtype.itemsize  # python ints: no overflow for any header
            expected = header + nbytes
            unc = " (uncompressed)" if gz else ""

            def wrong_size(actual: int) -> DataError:
                what = "is truncated" if actual < expected else "has trailing bytes"
                return DataError(f"{path} {what}: its header {shape} needs {expected} bytes{unc}, the file has "
                                 f"{actual}: delete it and download it again")

            size = path.stat().st_size
            if not gz and size != expected:  # checked before anything is allocated
                raise wrong_size(size)
            if gz and nbytes > GZIP_MAX_RATIO * size + _GZIP_SLACK:
                raise DataError(f"{path} is truncated or not an idx file: its header {shape} claims {expected} "
                                f"bytes uncompressed, more than a {size}-byte gzip file can hold (deflate expands "
                                f"at most {GZIP_MAX_RATIO}:1): delete it and download it again")
            try:
                if gz:
                    buf, got = _read_grown(f, nbytes)
                    flat = np.frombuffer(buf, dtype=np.uint8)
                else:
                    flat = np.empty(nbytes, dtype=np.uint8)
                    got = _read_exact(f, memoryview(flat))
            except MemoryError:
                raise DataError(f"{path}: not enough memory for the {nbytes:,} bytes of its array {shape} "
                                f"({dtype.str[1:]}): free memory or use a smaller file") from None
            extra = len(f.read(1 << 16)) if got == nbytes else 0
            if got < nbytes or extra:
                raise wrong_size(header + got + extra + (_count_rest(f) if extra else 0))
            try:
                out = flat.view(dtype).reshape(shape)
            except ValueError:  # a zero dimension beside dimensions too big for any array
                raise DataError(f"{path}: its header's shape {shape} is not a valid array shape; "
                                "delete it and download it again") from None
    except (EOFError, zlib.error, gzip.BadGzipFile) as e:
        raise DataError(f"{path} is a damaged gzip file ({e}): delete it and download it again") from None
    except FileNotFoundError:
        raise DataError(f"{path} does not exist") from None
    return out.astype(dtype.newbyteorder("="), copy=False) if dtype.itemsize > 1 else out.view(dtype.newbyteorder("="))


PARTS: tuple[str, ...] = ("train", "test")
IMAGE_SIZE: tuple[int, int] = (28, 28)


def candidates(root: Path, subfolders: Sequence[str]) -> list[Path]:
    """The folders looked in: ``root`` itself, then its ``subfolders``."""
    return [root, *(root / s for s in subfolders)]


def in_folder(folder: Path, name: str) -> Path | None:
    """``folder/name``, or its uncompressed twin (``name`` without '.gz'), whichever exists."""
    for n in (name, name.removesuffix(".gz")):
        if (folder / n).is_file():
            return folder / n
    return None


def locate_files(root: Path, subfolders: Sequence[str], names: Sequence[str]) -> list[Path] | None:
    """The first folder among ``root`` and its ``subfolders`` that holds all of ``names``."""
    for folder in candidates(root, subfolders):
        paths = [in_folder(folder, n) for n in names]
        if all(p is not None for p in paths):
            return paths  # type: ignore[return-value]
    return None


def download_dir(root: Path, subfolder: str) -> Path:
    """Where a download goes: ``root`` itself when it is already named ``subfolder``, else ``root/subfolder``."""
    return root if root.name.lower() == subfolder.lower() else root / subfolder


def missing_files(title: str, root: Path, subfolders: Sequence[str], names: Sequence[str], how: str) -> DataError:
    """The one-line error for files ``names`` found in none of the candidate folders; ``how`` says how to get them."""
    where = " or ".join(str(f) for f in candidates(root, subfolders))
    return DataError(f"{title}: cannot find {', '.join(names)} in {where}: {how}")


def decode_pair(cache_name: str, images: Path, labels: Path, *, transpose: bool) -> tuple[np.ndarray, np.ndarray]:
    """Images [n, 28, 28] uint8 (upright) and the raw label values [n] of one idx file pair, cached."""
    recipe = {"images": file_fingerprint(images), "labels": file_fingerprint(labels),
              "transpose": transpose, "size": list(IMAGE_SIZE), "v": 1}

    def build() -> dict[str, np.ndarray]:
        x = read_idx(images)
        y = read_idx(labels)
        if x.dtype != np.uint8 or x.ndim != 3 or x.shape[1:] != IMAGE_SIZE:
            raise DataError(f"{images}: holds {x.dtype} images of shape {x.shape[1:]}, expected uint8 "
                            f"{IMAGE_SIZE[0]}x{IMAGE_SIZE[1]}: replace it with the publisher's file")
        if y.ndim != 1 or len(y) != len(x):
            raise DataError(f"{labels}: holds labels of shape {y.shape}, expected {len(x)} labels "
                            f"(one per image of {images.name}): the two files do not belong together")
        if transpose:
            x = x.transpose(0, 2, 1)
        return {"x": np.ascontiguousarray(x), "y": y.astype(np.int64)}

    a = cached_arrays(cache_name, recipe, build)
    return a["x"], a["y"]


def relabel(y_raw: np.ndarray, values: Sequence[int], source: Path) -> np.ndarray:
    """Raw label values -> 0..L-1 (their position in ``values``)."""
    values = np.asarray(values, dtype=np.int64)
    lut = np.full(int(max(values.max(), y_raw.max(initial=0))) + 1, -1, dtype=np.int64)
    lut[values] = np.arange(len(values))
    y = lut[y_raw] if y_raw.min(initial=0) >= 0 else np.full_like(y_raw, -1)
    if (y < 0).any():
        bad = np.unique(y_raw[y < 0])[:10].tolist()
        raise DataError(f"{source}: labels {bad} are not among the {len(values)} classes "
                        f"{values.min()}..{values.max()}: the label file does not belong to this dataset")
    return y
