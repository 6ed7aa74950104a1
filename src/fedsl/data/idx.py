"""The idx file format of MNIST, Fashion-MNIST and EMNIST, gzip-compressed or raw.

An idx file is a 4-byte magic number -- two zero bytes, a type code, the number of
dimensions -- then each dimension as a big-endian uint32, then the values in C order,
big-endian. ``read_idx`` checks the length exactly: a truncated download or a file with
trailing bytes is a ``DataError`` naming the file, not a silently short array.
"""

from __future__ import annotations

import gzip
import zlib
from pathlib import Path

import numpy as np

from fedsl.data.errors import DataError

# type code -> big-endian dtype, as in the format's definition (yann.lecun.com/exdb/mnist).
IDX_DTYPES: dict[int, np.dtype] = {
    0x08: np.dtype(">u1"),
    0x09: np.dtype(">i1"),
    0x0B: np.dtype(">i2"),
    0x0C: np.dtype(">i4"),
    0x0D: np.dtype(">f4"),
    0x0E: np.dtype(">f8"),
}
_CODES: dict[tuple[str, int], int] = {(dt.kind, dt.itemsize): code for code, dt in IDX_DTYPES.items()}

_GZIP_MAGIC = b"\x1f\x8b"
_CHUNK = 1 << 22


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


def read_idx(path: str | Path) -> np.ndarray:
    """The array stored in the idx file at ``path`` (gzip or raw), in native byte order."""
    path = Path(path)
    try:
        with _open(path) as f:
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
            expected = header + int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
            out = np.empty(shape, dtype=dtype)
            got = _read_exact(f, memoryview(out.reshape(-1).view(np.uint8)))
            extra = len(f.read(1 << 16)) if got == out.nbytes else 0
            if got < out.nbytes or extra:
                actual = header + got + extra
                if extra:  # count the rest without holding it in memory
                    while block := f.read(_CHUNK):
                        actual += len(block)
                what = "is truncated" if got < out.nbytes else "has trailing bytes"
                raise DataError(f"{path} {what}: its header {shape} needs {expected} bytes"
                                f"{' (uncompressed)' if isinstance(f, gzip.GzipFile) else ''}, the file has "
                                f"{actual}: delete it and download it again")
    except (EOFError, zlib.error, gzip.BadGzipFile) as e:
        raise DataError(f"{path} is a damaged gzip file ({e}): delete it and download it again") from None
    except FileNotFoundError:
        raise DataError(f"{path} does not exist") from None
    return out.astype(dtype.newbyteorder("="), copy=False) if dtype.itemsize > 1 else out.view(dtype.newbyteorder("="))


def write_idx(path: str | Path, array: np.ndarray) -> Path:
    """Write ``array`` as an idx file (gzip-compressed when the name ends with .gz).

    Types: uint8, int8, int16, int32, float32, float64; at most 255 dimensions, each below 2**32.
    The gzip header carries no time stamp, so the same array always gives the same bytes.
    """
    path = Path(path)
    a = np.asarray(array)
    code = _CODES.get((a.dtype.kind, a.dtype.itemsize))
    if code is None:
        raise ValueError(f"write_idx: dtype {a.dtype} has no idx type code "
                         "(use uint8, int8, int16, int32, float32 or float64)")
    if a.ndim > 255 or any(d >= 2**32 for d in a.shape):
        raise ValueError(f"write_idx: shape {a.shape} does not fit the idx header")
    data = (bytes([0, 0, code, a.ndim]) + np.asarray(a.shape, dtype=">u4").tobytes()
            + np.ascontiguousarray(a, dtype=IDX_DTYPES[code]).tobytes())
    path.parent.mkdir(parents=True, exist_ok=True)
    if path.name.endswith(".gz"):
        with open(path, "wb") as raw, gzip.GzipFile(filename="", mode="wb", fileobj=raw, mtime=0) as g:
            g.write(data)
    else:
        path.write_bytes(data)
    return path
