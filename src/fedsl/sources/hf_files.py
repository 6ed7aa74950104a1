"""Local files read with Hugging Face ``datasets`` (parquet, CSV, JSON lines, an image folder), no hub access.

``data.dataset = 'hf_files'``, ``data.data_dir`` = a folder that ``datasets.load_dataset(folder)`` reads: files or
sub-folders named for their split (``train.parquet`` + ``test.parquet``, ``train/*.csv``, ``train/<class>/*.png``
with a ``metadata.csv`` giving each image's columns, ...). An optional extra: ``pip install 'fedsl[natural]'``
(datasets and flwr-datasets; nothing else imports them).

- Labels: ``data.label_column`` (default 'label'); a ``ClassLabel`` column keeps its names, other values are
  classes named by their value, sorted.
- Inputs: the first image column (decoded to uint8, grey or RGB, one size), else every other column (or one
  column of lists) as the pixels of a square grey image: floats in [0, 1] (× 255) or integers 0..255.
- Ids (``data.id_column``): each training sample's client from flwr-datasets' ``NaturalIdPartitioner`` over that
  column: ids sorted, client i the i-th (``ImageSet.owners`` / ``owner_names``); a test sample whose id has no
  training sample is tagged -1. ``data.partition = 'natural'`` then gives one client per id
  (``fedsl.data.natural``); the label-skew partitions ('classes', 'dirichlet', 'shards', 'iid') are fedsl's own,
  as for every other dataset.
- The test split: the files' 'test' split; without one, ⌊f·n_u⌋ of each id's samples (f = ``data.test_fraction``,
  every sample one id without ``data.id_column``), drawn once from a fixed stream, not the run's seed, so every
  seed and run is measured on the same samples.
"""

from __future__ import annotations

import contextlib
import importlib.util
import math
from pathlib import Path

import numpy as np

from fedsl.core.errors import DataError
from fedsl.core.rng import NATURAL_HELD_OUT, rng
from fedsl.sources.arrays import ArrayDataset, ImageSet, cache_dir

INSTALL = "pip install 'fedsl[natural]'"


def missing() -> str | None:
    """The packages of the ``natural`` extra that are not installed, or None."""
    absent = [p for p, m in (("datasets", "datasets"), ("flwr-datasets", "flwr_datasets"))
              if importlib.util.find_spec(m) is None]
    return ", ".join(absent) or None


def check_config(d) -> str | None:
    """The registry's config check of ``data.dataset = 'hf_files'`` (one line), or None."""
    if (absent := missing()) is not None:
        return (f"data.dataset = 'hf_files' reads local files with Hugging Face datasets and flwr-datasets "
                f"({absent} not installed here): {INSTALL}")
    if d.partition == "natural" and d.id_column is None:
        return ("data.partition = 'natural' with data.dataset = 'hf_files': expected data.id_column, the column "
                "of each sample's id (writer, user, device)")
    return None


@contextlib.contextmanager
def _quiet():
    """No progress bars from datasets or flwr-datasets (a run prints its own progress)."""
    import datasets
    from tqdm import tqdm

    was = datasets.is_progress_bar_enabled()
    datasets.disable_progress_bars()
    init = tqdm.__init__

    def silent(self, *args, **kwargs):
        kwargs["disable"] = True
        init(self, *args, **kwargs)

    tqdm.__init__ = silent
    try:
        yield
    finally:
        tqdm.__init__ = init
        if was:
            datasets.enable_progress_bars()


def _read(root: Path):
    import datasets

    if not root.is_dir():
        raise DataError(f"data.dataset = 'hf_files': {root} is not a folder; expected data.data_dir = a folder of "
                        "parquet/CSV/JSON files or images, named for their split (train, test)")
    try:
        dd = datasets.load_dataset(str(root), cache_dir=str(cache_dir() / "hf-datasets"))
    except Exception as e:  # datasets raises many kinds (FileNotFoundError, ValueError, its own DatasetGenerationError)
        first = str(e).strip().splitlines()[0] if str(e).strip() else ""
        raise DataError(f"data.dataset = 'hf_files': Hugging Face datasets cannot read {root} "
                        f"({type(e).__name__}: {first}); expected parquet/CSV/JSON files or an image folder "
                        "named for their split (train, test)") from None
    if "train" not in dd:
        raise DataError(f"data.dataset = 'hf_files': {root} has no 'train' split (it has {sorted(dd)}); expected "
                        "files or folders named for their split (train, test)")
    return dd["train"], dd.get("test")


def _column(ds, name: str, setting: str):
    if name not in ds.column_names:
        raise DataError(f"{setting} = {name!r}: the files have no such column; expected one of {ds.column_names}")
    return list(ds[name])  # datasets 4 gives a lazy Column


def _labels(train, test, column: str) -> tuple[np.ndarray, np.ndarray | None, list[str]]:
    import datasets

    feature = train.features.get(column)
    y_train = _column(train, column, "data.label_column")
    y_test = None if test is None else _column(test, column, "data.label_column")
    if isinstance(feature, datasets.ClassLabel):
        return (np.asarray(y_train, dtype=np.int64), None if y_test is None else np.asarray(y_test, dtype=np.int64),
                list(feature.names))
    values = sorted(set(y_train) | set(y_test or []), key=lambda v: (isinstance(v, str), v))
    code = {v: i for i, v in enumerate(values)}
    as_codes = lambda ys: np.fromiter((code[v] for v in ys), dtype=np.int64, count=len(ys))
    return as_codes(y_train), None if y_test is None else as_codes(y_test), [str(v) for v in values]


def _images(ds, exclude: tuple[str, ...], where: str) -> np.ndarray:
    """uint8 [n, H, W(, C)]: the first image column, else the other columns as a square grey image's pixels."""
    import datasets

    image_cols = [c for c, f in ds.features.items() if isinstance(f, datasets.Image) and c not in exclude]
    if image_cols:
        images = list(ds[image_cols[0]])
        mode = "L" if all(im.mode in ("1", "L", "LA", "I", "I;16", "F") for im in images) else "RGB"
        arrays = [np.asarray(im.convert(mode), dtype=np.uint8) for im in images]
        if len({a.shape for a in arrays}) > 1:
            raise DataError(f"data.dataset = 'hf_files': {where}'s images have sizes "
                            f"{sorted({a.shape[:2] for a in arrays})[:3]}; expected one size")
        return np.stack(arrays) if arrays else np.zeros((0, 1, 1), dtype=np.uint8)
    cols = [c for c in ds.column_names if c not in exclude]
    try:
        raw = [np.asarray(ds.with_format("numpy")[c]) for c in cols]
        floats = any(r.dtype.kind == "f" for r in raw)
        parts = [r.astype(np.float64) for r in raw]
        x = parts[0].reshape(len(ds), -1) if len(parts) == 1 else np.stack(parts, axis=1)
    except (TypeError, ValueError, IndexError):
        raise DataError(f"data.dataset = 'hf_files': {where}'s columns {cols} are not numbers; expected an image "
                        "column, or pixel columns (one per pixel, or one column of lists)") from None
    side = math.isqrt(x.shape[1]) if x.ndim == 2 else 0
    if side == 0 or side * side != x.shape[1]:
        shown = f"{cols[:5]}{'...' if len(cols) > 5 else ''}"
        raise DataError(f"data.dataset = 'hf_files': {where} has {x.shape[1] if x.ndim == 2 else 0} pixel values "
                        f"per sample (columns {shown}); expected a square grey image")
    if floats and len(x) and x.max() <= 1 and x.min() >= 0:
        x = np.rint(x * 255)  # floats in [0, 1]
    if len(x) and (x.min() < 0 or x.max() > 255 or not np.all(x == np.floor(x))):
        raise DataError(f"data.dataset = 'hf_files': {where}'s pixel values are outside 0..255 (or [0, 1]); "
                        "expected 8-bit pixels")
    return x.astype(np.uint8).reshape(len(x), side, side)


def _owners(train, test, column: str) -> tuple[np.ndarray, np.ndarray | None, list[str]]:
    """Each sample's client by flwr-datasets' NaturalIdPartitioner over ``column`` (ids sorted), test samples
    mapped to the same clients (-1: an id without training samples)."""
    from flwr_datasets.partitioner import NaturalIdPartitioner

    _column(train, column, "data.id_column")
    partitioner = NaturalIdPartitioner(partition_by=column)
    partitioner.dataset = train
    partitioner.load_partition(0)  # builds its id -> indices map; only its private field exposes all of it
    owners = np.full(len(train), -1, dtype=np.int64)
    for pid, indices in partitioner._partition_id_to_indices.items():
        owners[np.asarray(indices, dtype=np.int64)] = pid
    ids = partitioner.partition_id_to_natural_id
    names = [str(ids[i]) for i in range(len(ids))]
    test_owners = None
    if test is not None:
        by_id = {v: k for k, v in ids.items()}
        test_ids = _column(test, column, "data.id_column")
        test_owners = np.fromiter((by_id.get(v, -1) for v in test_ids), dtype=np.int64, count=len(test_ids))
    return owners, test_owners, names


def held_out(owners: np.ndarray, fraction: float) -> np.ndarray:
    """Which samples are held out as test samples: ⌊f·n_u⌋ of each id u (owners 0..U-1), drawn once from the fixed
    stream (0, ``NATURAL_HELD_OUT``): every id keeps ⌈(1 - f)·n_u⌉ >= 1 training samples."""
    n = len(owners)
    sizes = np.bincount(owners)
    order = np.lexsort((rng(0, NATURAL_HELD_OUT).random(n), owners))  # grouped by id, random within
    rank = np.empty(n, dtype=np.int64)
    rank[order] = np.arange(n) - np.repeat(np.cumsum(sizes) - sizes, sizes)
    return rank < np.floor(fraction * sizes).astype(np.int64)[owners]


def load(d, root: Path) -> ArrayDataset:
    """The files of ``root`` as arrays, each sample tagged with its id's client when ``data.id_column`` is set."""
    if (absent := missing()) is not None:
        raise DataError(f"data.dataset = 'hf_files' needs Hugging Face datasets and flwr-datasets ({absent} not "
                        f"installed here): {INSTALL}")
    with _quiet():
        train, test = _read(Path(root))
        if d.id_column:
            _column(train, d.id_column, "data.id_column")
        exclude = tuple(c for c in (d.label_column, d.id_column) if c)
        y, y_test, classes = _labels(train, test, d.label_column)
        x = _images(train, exclude, "the train split")
        x_test = None if test is None else _images(test, exclude, "the test split")
        owners = owner_test = names = None
        if d.id_column:
            owners, owner_test, names = _owners(train, test, d.id_column)
    if test is None:  # a held-out fraction of each id (of everything without ids)
        held = held_out(owners if owners is not None else np.zeros(len(y), dtype=np.int64), d.test_fraction)
        x_test, y_test = x[held], y[held]
        owner_test = None if owners is None else owners[held]
        x, y = x[~held], y[~held]
        owners = None if owners is None else owners[~held]
    if x.shape[1:] != x_test.shape[1:]:
        raise DataError(f"data.dataset = 'hf_files': train images have shape {x.shape[1:]}, test {x_test.shape[1:]}; "
                        "expected one shape")
    return ArrayDataset(ImageSet(x, y, classes, owners, names), ImageSet(x_test, y_test, classes, owner_test, names))
