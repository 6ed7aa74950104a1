"""CIFAR-10 from the publisher's own files (python pickles or binary records).

``load_cifar10(root)`` looks in ``root`` for, in this order,

1. ``cifar-10-batches-py/``   the extracted python version,
2. ``cifar-10-python.tar.gz`` the python version as published (read from the tar, never extracted),
3. ``cifar-10-batches-bin/``  the extracted binary version,
4. ``cifar-10-binary.tar.gz`` the binary version as published,

(and, failing those, ``root`` itself holding the batch files), decodes the five training
batches and the test batch into uint8 HWC images [n, 32, 32, 3] with int64 labels, and
caches the decoded arrays (keyed by the source files' sha256). With ``download=True`` and
nothing found, the python tarball is fetched into ``root`` and its md5 checked.

The python batches are pickles. They are read with :class:`CifarUnpickler`, which resolves
only the few globals the publisher's files use (numpy's array reconstructor, ``ndarray``,
``dtype``), so a tampered file cannot run code; anything else is a :class:`DataError`.

Nothing in a file is trusted with memory: a batch or meta file (a tar member's size comes
from its header) larger than any honest one (``max_member_bytes``) is refused before it is
read, and numpy's reconstructor is allowed only as numpy's own pickles call it (an empty
int8 array, filled from the pickle's own bytes), so a few bytes of pickle cannot ask for
an array of 10**10 objects.
"""

from __future__ import annotations

import codecs
import io
import pickle
import tarfile
import zlib
from pathlib import Path, PurePosixPath
from typing import Callable

import numpy as np

from fedsl.core.errors import DataError
from fedsl.sources.arrays import ArrayDataset, ImageSet, cached_arrays, file_fingerprint

try:  # numpy >= 2 (the project's requirement)
    from numpy._core.multiarray import _reconstruct as _np_reconstruct
except ImportError:  # pragma: no cover - numpy 1.x
    from numpy.core.multiarray import _reconstruct as _np_reconstruct

CIFAR10_CLASSES = ["airplane", "automobile", "bird", "cat", "deer", "dog", "frog", "horse", "ship", "truck"]

# The publisher's files (https://www.cs.toronto.edu/~kriz/cifar.html). The md5 of the python
# tarball is the one torchvision checks (torchvision/datasets/cifar.py, CIFAR10.tgz_md5); only
# the python version is downloaded, the binary one is read when it is found.
PYTHON_URL = "https://www.cs.toronto.edu/~kriz/cifar-10-python.tar.gz"
PYTHON_TARBALL = "cifar-10-python.tar.gz"
PYTHON_MD5 = "c58f30108f718f92721af3b95e74349a"
PYTHON_FOLDER = "cifar-10-batches-py"
BINARY_TARBALL = "cifar-10-binary.tar.gz"
BINARY_FOLDER = "cifar-10-batches-bin"

TRAIN_BATCHES = 5
RECORDS_PER_BATCH = 10_000  # every batch of the real files, train and test (tests shrink it)
PIXELS = 3 * 32 * 32  # one image, CHW
RECORD_BYTES = 1 + PIXELS  # binary version: label byte + pixels
FORMAT_VERSION = 1  # of the decoded arrays: bump when decoding changes

PY_TRAIN = [f"data_batch_{i}" for i in range(1, TRAIN_BATCHES + 1)]
PY_TEST = "test_batch"
PY_META = "batches.meta"
BIN_TRAIN = [f"{n}.bin" for n in PY_TRAIN]
BIN_TEST = "test_batch.bin"
BIN_META = "batches.meta.txt"


# --- restricted unpickling ---------------------------------------------------------------

def _latin1_encode(text, encoding="latin1"):
    """``_codecs.encode`` as python 3 protocol-2 pickles use it for bytes (latin-1 only)."""
    if not isinstance(text, str) or codecs.lookup(encoding).name != "iso8859-1":
        raise pickle.UnpicklingError(f"_codecs.encode({type(text).__name__}, {encoding!r}) is not allowed")
    return text.encode("latin1")


def _empty_array(subtype, shape, dtype):
    """numpy's ``_reconstruct`` as ``ndarray.__reduce__`` calls it, and only so.

    numpy always reconstructs an empty int8 array and then fills it with ``__setstate__``
    from bytes held in the pickle (checked against the shape). Any other call would make
    numpy allocate (and, for object arrays, fill) memory the pickle only names.
    """
    if subtype is not np.ndarray or tuple(shape) != (0,) or dtype not in (b"b", "b"):
        raise pickle.UnpicklingError(f"_reconstruct({getattr(subtype, '__name__', subtype)}, {shape!r}, "
                                     f"{dtype!r}) is refused (numpy pickles call it with (0,), b'b')")
    return _np_reconstruct(subtype, shape, dtype)


# Everything the publisher's pickles (python 2, protocol 2) resolve: the batch is a dict of
# bytes keys -> ndarray / list of ints / list of bytes / bytes, and an ndarray pickles as
# _reconstruct(ndarray, (0,), b'b') + BUILD(state with a dtype and the raw bytes).
_ALLOWED_GLOBALS: dict[tuple[str, str], object] = {
    ("numpy.core.multiarray", "_reconstruct"): _empty_array,
    ("numpy._core.multiarray", "_reconstruct"): _empty_array,  # written by numpy >= 2
    ("numpy", "ndarray"): np.ndarray,
    ("numpy", "dtype"): np.dtype,
    ("_codecs", "encode"): _latin1_encode,  # bytes in pickles written by python 3 with protocol 2
}


class CifarUnpickler(pickle.Unpickler):
    """An unpickler that resolves only the globals CIFAR-10's batches need; ``name`` is for errors."""

    def __init__(self, file, name: str, src: Path | str | None = None):
        super().__init__(file, encoding="bytes")
        self.name, self.src = name, src

    def find_class(self, module: str, name: str):
        try:
            return _ALLOWED_GLOBALS[(module, name)]
        except KeyError:
            raise DataError(f"{self.name} is not a CIFAR-10 batch: its pickle calls {module}.{name}, which is "
                            f"refused (it could run code); {_fix(self.src)}") from None

    def persistent_load(self, pid):
        raise DataError(f"{self.name} is not a CIFAR-10 batch: its pickle has persistent ids; "
                        + _fix(self.src))


def unpickle(data: bytes, name: str, src: Path | str | None = None):
    """Unpickle one CIFAR batch/meta file safely; ``name`` names the file in errors, ``src`` its source."""
    try:
        return CifarUnpickler(io.BytesIO(data), name, src).load()
    except DataError:
        raise
    except MemoryError:  # e.g. a BINBYTES8 opcode claiming 2**40 bytes
        raise DataError(f"{name} is not a readable CIFAR-10 pickle: it claims an object larger than memory; "
                        f"it is corrupt: {_fix(src)}") from None
    except Exception as e:  # truncated/corrupt pickles raise all sorts (EOFError, UnpicklingError, ...)
        raise DataError(f"{name} is not a readable CIFAR-10 pickle ({type(e).__name__}: {e}); "
                        f"it is probably truncated or corrupt: {_fix(src)}") from None


# --- messages -------------------------------------------------------------------------------

def _fix(src: Path | str | None = None) -> str:
    """The fix for a damaged source (the tarball or folder ``src``): replace it with the publisher's."""
    what = f"delete {src} and " if src is not None else "delete it and "
    return (f"re-download it ({what}run `fedsl data prepare cifar10`, or set data.download = true) "
            f"or pass --data-dir pointing at a folder with the publisher's {PYTHON_TARBALL}")


def _n(k: int) -> str:
    return f"{k:,}"


# --- reading the files of one source --------------------------------------------------------

META_MAX_BYTES = 1 << 20  # batches.meta(.txt): a few hundred bytes in the real files


def max_member_bytes(name: str) -> int:
    """The most bytes file ``name`` may have before it is read: far above any honest one.

    A real batch is 30,730,000 bytes (binary) or ~31 MB (pickle); the bound, 8x the records'
    bytes plus 1 MiB, leaves room for pickles re-written with other protocols.
    """
    if name in (PY_META, BIN_META):
        return META_MAX_BYTES
    return 8 * RECORDS_PER_BATCH * RECORD_BYTES + (1 << 20)


def _check_size(size: int, name: str, where: Callable[[str], str], src: Path) -> None:
    limit = max_member_bytes(name)
    if size > limit:
        what = "a meta file" if name in (PY_META, BIN_META) else f"a batch of {_n(RECORDS_PER_BATCH)} records"
        raise DataError(f"{where(name)} is {_n(size)} bytes, more than {what} can be (expected at most "
                        f"{_n(limit)}): not the publisher's file; {_fix(src)}")


def _read_members(path: Path, folder: str, required: list[str],
                  optional: list[str]) -> tuple[dict[str, bytes], Callable[[str], str]]:
    """The named files of a tarball (one pass, nothing extracted) or of a folder.

    Returns the bytes by file name and a function naming a file for messages. A file's size
    (a member's, from its tar header) is checked against ``max_member_bytes`` before it is read.
    """
    wanted = set(required) | set(optional)
    found: dict[str, bytes] = {}
    if path.is_dir():
        def where(n: str) -> str:
            return str(path / n)
        for n in wanted:
            if (path / n).is_file():
                _check_size((path / n).stat().st_size, n, where, path)
                found[n] = (path / n).read_bytes()
    else:
        def where(n: str) -> str:
            return f"{path} (member {folder}/{n})"
        try:
            with tarfile.open(path, "r:gz") as tf:
                for m in tf:
                    p = PurePosixPath(m.name)
                    if m.isfile() and p.name in wanted and p.name not in found and \
                            (len(p.parts) < 2 or p.parts[-2] == folder):
                        _check_size(m.size, p.name, where, path)
                        found[p.name] = tf.extractfile(m).read()
        except (tarfile.TarError, EOFError, zlib.error, OSError) as e:
            raise DataError(f"{path} is not a readable .tar.gz ({type(e).__name__}: {e}); it is probably "
                            f"truncated or corrupt: {_fix(path)}") from None
    missing = [n for n in required if n not in found]
    if missing:
        raise DataError(f"{', '.join(where(n) for n in missing)}: missing (expected {', '.join(required)}); "
                        + _fix(path))
    return found, where


def _check_labels(y: np.ndarray, name: str, src: Path) -> None:
    bad = y[(y < 0) | (y >= len(CIFAR10_CLASSES))]
    if bad.size:
        raise DataError(f"{name} has labels outside 0..9 (e.g. {int(bad[0])}): not CIFAR-10's; {_fix(src)}")


def _check_count(n: int, name: str, src: Path) -> None:
    if n != RECORDS_PER_BATCH:
        raise DataError(f"{name} has {_n(n)} records, expected {_n(RECORDS_PER_BATCH)}; {_fix(src)}")


def _check_classes(names: list[str], name: str, src: Path) -> None:
    if names != CIFAR10_CLASSES:
        raise DataError(f"{name} names the classes {names}, expected CIFAR-10's {CIFAR10_CLASSES}; {_fix(src)}")


def _to_hwc(rows: np.ndarray) -> np.ndarray:
    """[n, 3072] CHW rows -> [n, 32, 32, 3]."""
    return np.ascontiguousarray(rows.reshape(-1, 3, 32, 32).transpose(0, 2, 3, 1))


def _key(d: dict, key: str):
    """d[b'key'] (python 2 pickles read with encoding='bytes'), or d['key'] for re-pickled copies."""
    if key.encode() in d:
        return d[key.encode()]
    return d[key]


def _python_batch(data: bytes, name: str, src: Path) -> tuple[np.ndarray, np.ndarray]:
    d = unpickle(data, name, src)
    if not isinstance(d, dict):
        raise DataError(f"{name} holds a {type(d).__name__}, expected a CIFAR-10 batch (a dict); {_fix(src)}")
    try:
        rows, labels = _key(d, "data"), _key(d, "labels")
    except KeyError as e:
        raise DataError(f"{name} lacks the key {e}: not a CIFAR-10 batch; {_fix(src)}") from None
    if not isinstance(rows, np.ndarray) or rows.dtype != np.uint8 or rows.ndim != 2 or rows.shape[1] != PIXELS:
        what = f"{rows.dtype} {list(rows.shape)}" if isinstance(rows, np.ndarray) else type(rows).__name__
        raise DataError(f"{name}: data is {what}, expected uint8 [{_n(RECORDS_PER_BATCH)}, {PIXELS}]; {_fix(src)}")
    try:
        y = np.asarray(labels, dtype=np.int64)
    except (TypeError, ValueError, OverflowError):
        y = None
    if y is None or y.ndim != 1:
        raise DataError(f"{name}: labels are not a list of integers; {_fix(src)}")
    if len(y) != len(rows):
        raise DataError(f"{name} has {_n(len(rows))} images but {_n(len(y))} labels; {_fix(src)}")
    _check_count(len(rows), name, src)
    _check_labels(y, name, src)
    return _to_hwc(rows), y


def _binary_batch(data: bytes, name: str, src: Path) -> tuple[np.ndarray, np.ndarray]:
    if len(data) % RECORD_BYTES:
        raise DataError(f"{name} is {_n(len(data))} bytes, not a whole number of {_n(RECORD_BYTES)}-byte records "
                        f"(expected {_n(RECORDS_PER_BATCH * RECORD_BYTES)}): truncated? {_fix(src)}")
    rec = np.frombuffer(data, dtype=np.uint8).reshape(-1, RECORD_BYTES)
    _check_count(len(rec), name, src)
    y = rec[:, 0].astype(np.int64)
    _check_labels(y, name, src)
    return _to_hwc(rec[:, 1:]), y


def _decode(kind: str, path: Path) -> dict[str, np.ndarray]:
    """Decode one source (kind 'python' or 'binary'; a tarball or a folder) into the four arrays."""
    if kind == "python":
        folder, train, test, meta, batch = PYTHON_FOLDER, PY_TRAIN, PY_TEST, PY_META, _python_batch
    else:
        folder, train, test, meta, batch = BINARY_FOLDER, BIN_TRAIN, BIN_TEST, BIN_META, _binary_batch
    files, where = _read_members(path, folder, [*train, test], [meta])
    if meta in files:
        if kind == "python":
            m = unpickle(files[meta], where(meta), path)
            try:
                names = [n.decode() if isinstance(n, bytes) else str(n) for n in _key(m, "label_names")]
            except (KeyError, TypeError, AttributeError, UnicodeDecodeError):
                raise DataError(f"{where(meta)} has no list label_names: not CIFAR-10's; {_fix(path)}") from None
        else:
            names = [ln.strip() for ln in files[meta].decode("latin1").splitlines() if ln.strip()]
        _check_classes(names, where(meta), path)
    parts = [batch(files.pop(n), where(n), path) for n in train]
    x_test, y_test = batch(files.pop(test), where(test), path)
    return {"x_train": np.concatenate([p[0] for p in parts]), "y_train": np.concatenate([p[1] for p in parts]),
            "x_test": x_test, "y_test": y_test}


def _dataset(a: dict[str, np.ndarray]) -> ArrayDataset:
    return ArrayDataset(ImageSet(a["x_train"], a["y_train"], list(CIFAR10_CLASSES)),
                        ImageSet(a["x_test"], a["y_test"], list(CIFAR10_CLASSES)))


# --- finding, downloading, caching ----------------------------------------------------------

def _has_any(folder: Path, names: list[str]) -> bool:
    return folder.is_dir() and any((folder / n).is_file() for n in names)


def find_cifar10(root: str | Path) -> tuple[str, Path] | None:
    """(kind, path) of the first source found in ``root``, in the documented order, or None."""
    root = Path(root)
    candidates = [("python", root / PYTHON_FOLDER, [*PY_TRAIN, PY_TEST]),
                  ("python", root / PYTHON_TARBALL, None),
                  ("binary", root / BINARY_FOLDER, [*BIN_TRAIN, BIN_TEST]),
                  ("binary", root / BINARY_TARBALL, None),
                  ("python", root, [*PY_TRAIN, PY_TEST]),  # root is itself an extracted folder
                  ("binary", root, [*BIN_TRAIN, BIN_TEST])]
    for kind, path, names in candidates:
        if (names is None and path.is_file()) or (names is not None and _has_any(path, names)):
            return kind, path
    return None


def _recipe(kind: str, path: Path) -> dict:
    recipe = {"format": kind, "v": FORMAT_VERSION, "records_per_batch": RECORDS_PER_BATCH}
    if path.is_dir():
        names = [*PY_TRAIN, PY_TEST, PY_META] if kind == "python" else [*BIN_TRAIN, BIN_TEST, BIN_META]
        required = names[:-1]
        missing = [n for n in required if not (path / n).is_file()]
        if missing:
            raise DataError(f"{', '.join(str(path / n) for n in missing)}: missing (expected {', '.join(required)} "
                            f"in {path}); {_fix(path)}")
        recipe["files"] = {n: file_fingerprint(path / n) for n in names if (path / n).is_file()}
    else:
        recipe["files"] = {path.name: file_fingerprint(path)}
    return recipe


def load_cifar10(root: str | Path, *, download: bool = False) -> ArrayDataset:
    """CIFAR-10 from the publisher's files in ``root`` (downloaded there if asked), decoded once and cached."""
    root = Path(root)
    source = find_cifar10(root)
    if source is None and download:
        from fedsl.sources.download import fetch
        fetch(PYTHON_URL, root / PYTHON_TARBALL, f"md5:{PYTHON_MD5}")
        source = ("python", root / PYTHON_TARBALL)
    if source is None:
        part = root / (PYTHON_TARBALL + ".part")
        partial = f" ({part} is a partial download: downloading resumes it)" if part.is_file() else ""
        raise DataError(f"CIFAR-10 not found in {root}: looked for {PYTHON_FOLDER}/, {PYTHON_TARBALL}, "
                        f"{BINARY_FOLDER}/, {BINARY_TARBALL}{partial}; download it with `fedsl data prepare cifar10` "
                        f"(or set data.download = true), or pass --data-dir pointing at the folder holding them")
    kind, path = source
    arrays = cached_arrays("cifar10", _recipe(kind, path), lambda: _decode(kind, path))
    return _dataset(arrays)


def load(d, root: Path) -> ArrayDataset:
    """The registry's loader of ``data.dataset = 'cifar10'`` (``fedsl.data.registry``): the publisher's
    python or binary version, or the same images as an image folder (train/<class>/, test/<class>/)."""
    from fedsl.sources.image_folder import is_split_folder, load_image_folder_dataset
    if is_split_folder(root):
        return load_image_folder_dataset(root, class_names=CIFAR10_CLASSES, size=(32, 32), mode="RGB")
    return load_cifar10(root, download=d.download)
