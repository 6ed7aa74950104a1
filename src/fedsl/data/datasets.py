"""Datasets by name (``fedsl.data.registry``), as arrays, and the federation built from a data config.

Where files are looked for: ``data.data_dir`` (``--data-dir``), else the environment
variable ``FEDSL_DATA_DIR``, else ``~/.cache/fedsl/data``; inside it, a dataset's own
sub-folder (e.g. ``cifar10/``, ``cifar10-jpeg/``, ``emnist/``) or the folder itself.
Each loader reads the publisher's format (and the one-folder-per-class layout);
downloads happen only with ``data.download = true``.
"""

from __future__ import annotations

import contextlib
import math
import os
import stat
import warnings
from pathlib import Path

import numpy as np
import torch

from fedsl.core.errors import DataError, DataWarning, warn_missing_classes
from fedsl.core.rng import SERVER_DATA, TEST_SUBSET, UNLABELLED, VALIDATION, rng
from fedsl.core.threads import one_thread
from fedsl.data import natural, partition, server_data
from fedsl.data.clients import ClientIndex
from fedsl.data.federation import Federation
from fedsl.data.registry import DATASETS, SERVER_SOURCES
from fedsl.sources.arrays import ArrayDataset, ImageSet


def data_root(data_dir: str | None) -> Path:
    """data_dir, else $FEDSL_DATA_DIR, else ~/.cache/fedsl/data."""
    if data_dir:
        return Path(data_dir).expanduser()
    env = os.environ.get("FEDSL_DATA_DIR")
    return Path(env).expanduser() if env else Path.home() / ".cache" / "fedsl" / "data"


def _marked(name: str, data_dir: str | None, *, identify: bool) -> Path | None:
    info = DATASETS[name]
    root = data_root(data_dir)
    for sub in info.subdirs:
        folder = root / sub
        if folder.is_dir() and any(any(folder.glob(m)) for m in info.markers):
            if identify and info.identify is not None and not info.identify(folder):
                continue  # e.g. MNIST's file names, but Fashion-MNIST's files
            return folder.resolve()
    return None


def locate(name: str, data_dir: str | None) -> Path | None:
    """The folder holding dataset ``name`` (first candidate sub-folder with its files), or None.
    MNIST's and Fashion-MNIST's files share their names: a folder whose files are told to be
    the other one's (the registry's ``identify``, ``mnist.identify_mnist_like``) is skipped."""
    return _marked(name, data_dir, identify=True)


def dataset_dir(name: str, data_dir: str | None) -> Path:
    """Where dataset ``name`` is (``locate``), else where a download would put it. A folder holding
    the other MNIST-like dataset's files is returned too, for the loader to say so."""
    return (locate(name, data_dir) or _marked(name, data_dir, identify=False)
            or data_root(data_dir) / DATASETS[name].subdirs[0])


def _subset(ds: ArrayDataset, names: list[str], setting: str = "data.classes") -> ArrayDataset:
    """Keep classes ``names`` (relabelled 0..k-1 in that order)."""
    missing = [c for c in names if c not in ds.class_names]
    if missing:
        raise DataError(f"{setting}: {missing} are not classes of this dataset; expected names from {ds.class_names}")
    old = np.array([ds.class_names.index(c) for c in names])

    ids = None  # natural ids: those left with a training sample keep their order, renumbered 0..U'-1
    if ds.train.owners is not None:
        present = np.unique(ds.train.owners[np.isin(ds.train.y, old)])
        ids = np.full(int(ds.train.owners.max(initial=-1)) + 2, -1, dtype=np.int64)  # [-1] stays -1
        ids[present] = np.arange(len(present))

    def pick(s: ImageSet) -> ImageSet:
        keep = np.isin(s.y, old)
        remap = np.full(len(ds.class_names), -1, dtype=np.int64)
        remap[old] = np.arange(len(old))
        if ids is None or s.owners is None:
            return ImageSet(s.x[keep], remap[s.y[keep]], list(names))
        owner_names = None if s.owner_names is None else [s.owner_names[i] for i in present]
        return ImageSet(s.x[keep], remap[s.y[keep]], list(names), ids[s.owners[keep]], owner_names)

    return ArrayDataset(pick(ds.train), pick(ds.test))


# The last datasets loaded in this process, and their float tensors: a sweep prepares many
# runs of one dataset, and re-reading CIFAR-10 (stat of 60k files, decode cache, uint8 ->
# float) cost seconds per run. Entries are shared, never written to.
_LOADED: dict[tuple, ArrayDataset] = {}
_TENSORS: dict[tuple, tuple[np.ndarray, torch.Tensor]] = {}
_STATS: dict[int, tuple[np.ndarray, tuple[list[float], list[float]]]] = {}
# Pixels per piece when counting or converting a pool: pieces that fit in a core's cache
_CHUNK_PIXELS = 1 << 16


def load_arrays(d) -> ArrayDataset:
    """The dataset of data config ``d`` (train and test splits); memoised per process."""
    key = (d.dataset, d.chars, d.train_per_class, d.test_per_class, d.data_dir, d.download, d.carve, d.carve_test,
           d.emnist_split, tuple(d.classes) if isinstance(d.classes, list) else d.classes, d.id_column,
           d.label_column, d.test_fraction, d.text, d.seq_length, d.stride, d.min_samples, _file_stamp(d.data_dir))
    if key not in _LOADED:
        if len(_LOADED) >= 2:
            _LOADED.pop(next(iter(_LOADED)))
            _TENSORS.clear()
            _STATS.clear()
        _LOADED[key] = _load_arrays(d)
    return _LOADED[key]


def _file_stamp(data_dir: str | None) -> tuple[int, int] | None:
    """(size, modification time) of the file ``data.data_dir`` names (an .npz of ``arrays``), None for a folder:
    a file written anew in the same session (a notebook) is read anew, not taken from the memo."""
    if not data_dir:
        return None
    try:
        st = Path(data_dir).expanduser().stat()
    except OSError:  # absent: the loader says so
        return None
    return None if stat.S_ISDIR(st.st_mode) else (st.st_size, st.st_mtime_ns)


def _load_arrays(d) -> ArrayDataset:
    ds, checked = _read_dataset(d)
    if not checked:  # image folders warn themselves, naming their folders
        warn_missing_classes(ds.train.y, ds.class_names, f"data.dataset = {d.dataset!r}: the training split",
                             "no client or server learns it, and class partitions use only the classes present")
        warn_missing_classes(ds.test.y, ds.class_names, f"data.dataset = {d.dataset!r}: the test split",
                             "the accuracy does not measure it")
    return ds


@contextlib.contextmanager
def _quiet_if(quiet: bool):
    """Hold back the loader's DataWarnings (when a class subset follows: the split is checked after it)."""
    with warnings.catch_warnings():
        if quiet:
            warnings.simplefilter("ignore", DataWarning)
        yield


def _read_dataset(d) -> tuple[ArrayDataset, bool]:
    """The dataset of ``d`` (its registry entry's loader), and whether its loader already warned about
    classes missing from a split."""
    info = DATASETS[d.dataset]
    if info.load is None and info.federation is not None:
        raise DataError(f"data.dataset = {d.dataset!r} makes each client's samples on demand: it has no arrays to "
                        "show or cache (`fedsl data partition` shows its clients)")
    if info.load is None:  # the config's Literal makes this unreachable
        raise DataError(f"data.dataset = {d.dataset!r}: unknown dataset")
    subset = isinstance(d.classes, list) and not info.selects_classes
    root = data_root(d.data_dir) if info.generated else dataset_dir(d.dataset, d.data_dir)
    with _quiet_if(subset):
        ds = info.load(d, root)
    if subset:
        ds = _subset(ds, d.classes)
    return ds, ds.classes_checked


def external_server_set(d, train: ImageSet, seed: int) -> ImageSet:
    """D0 from another source (``registry.SERVER_SOURCES``), with labels aligned to the clients' classes and
    images to their shape."""
    shape = train.x.shape[1:]
    source = SERVER_SOURCES[d.server_dataset]
    root = dataset_dir(source.dataset, d.server_data_dir or d.data_dir) if source.dataset else None
    s = source.load(d, train, seed, root)
    if s.x.shape[1:] != shape:
        raise DataError(f"server images have shape {s.x.shape[1:]}, the clients' {shape}")
    if d.server_per_class and not source.per_class:  # FSLsyn's fixed 15 per class, cut here
        keep = np.concatenate([np.flatnonzero(s.y == c)[: d.server_per_class] for c in np.unique(s.y)])
        s = ImageSet(s.x[np.sort(keep)], s.y[np.sort(keep)], s.class_names)
    return s


def external_unlabelled_set(d, train: ImageSet, seed: int) -> ImageSet:
    """U from another source (``data.unlabelled``, a name of ``registry.SERVER_SOURCES``): its images shaped as the
    clients'; their labels are never read (-1 for a source without labels). ``data.server_per_class`` is D0's and
    does not cut it."""
    source = SERVER_SOURCES[d.unlabelled]
    root = dataset_dir(source.dataset, d.server_data_dir or d.data_dir) if source.dataset else None
    s = source.load(d.model_copy(update={"server_per_class": None}), train, seed, root)
    if s.x.shape[1:] != train.x.shape[1:]:
        raise DataError(f"data.unlabelled = {d.unlabelled!r}: its images have shape {s.x.shape[1:]}, the clients' "
                        f"{train.x.shape[1:]}")
    return s


def unlabelled_subset(n: int, size: int, seed: int) -> np.ndarray:
    """Positions of ``data.unlabelled_size`` = ``size`` of U's n images (0: all), drawn once from (seed,
    ``UNLABELLED``), sorted; a source that draws them itself (STL-10's unlabelled images) draws the same ones."""
    if not size or size == n:
        return np.arange(n)
    if size > n:
        raise partition.PartitionError(f"data.unlabelled_size = {size}: the unlabelled data (data.unlabelled) has "
                                       f"only {n} images")
    return np.sort(rng(seed, UNLABELLED).permutation(n)[:size])


def channel_stats(images: np.ndarray) -> tuple[list[float], list[float]]:
    """Per-channel mean and (population) std of uint8 images [n, H, W(, C)], on the [0, 1] scale.

    Exact (from a 256-bin histogram per channel, so no float copy of a 50k-image pool).
    """
    images = np.asarray(images)
    pixels = images.reshape(-1, 1 if images.ndim == 3 else images.shape[-1])  # one row per pixel, a column per channel
    hist = [np.zeros(256, dtype=np.int64) for _ in range(pixels.shape[1])]
    for i in range(0, len(pixels), _CHUNK_PIXELS):  # counted piece by piece: no copy of a whole channel
        block = pixels[i:i + _CHUNK_PIXELS]
        for c in range(len(hist)):
            part = np.bincount(block[:, c], minlength=256)
            if len(part) > len(hist[c]):
                hist[c] = np.concatenate([hist[c], np.zeros(len(part) - len(hist[c]), dtype=np.int64)])
            hist[c][:len(part)] += part
    mean, std = [], []
    for counts in (h.astype(np.float64) for h in hist):
        v = np.arange(len(counts), dtype=np.float64) / 255.0
        m = float((counts * v).sum() / counts.sum())
        var = float((counts * (v - m) ** 2).sum() / counts.sum())
        mean.append(m)
        std.append(math.sqrt(var) if var > 0 else 1.0)  # a constant channel is only centred
    return mean, std


def feature_stats(x: np.ndarray) -> tuple[list[float], list[float]]:
    """Mean and (population) std of each feature of float features ``x`` [n, F, ...]: axis 1 is the feature (a
    column of [n, d], a channel of [n, C, H, W]), averaged over the samples and any further axes, in float64 and
    piece by piece (no float64 copy of the pool). A constant feature's std is 1: it is only centred."""
    x = np.asarray(x)
    if x.ndim < 2 or x.dtype.kind != "f":
        raise DataError(f"features of shape {x.shape} and dtype {x.dtype}: expected float features [n, F, ...]")
    axes = (0, *range(2, x.ndim))
    count = len(x) * math.prod(x.shape[2:])
    rows = max(1, _CHUNK_PIXELS // max(1, math.prod(x.shape[1:])))
    total = np.zeros(x.shape[1])
    for i in range(0, len(x), rows):
        total += x[i:i + rows].sum(axis=axes, dtype=np.float64)
    mean = total / max(count, 1)
    shape = (1, x.shape[1]) + (1,) * (x.ndim - 2)
    squares = np.zeros(x.shape[1])
    for i in range(0, len(x), rows):  # squared deviations from the mean: no cancellation of E[x²] − E[x]²
        squares += ((x[i:i + rows].astype(np.float64) - mean.reshape(shape)) ** 2).sum(axis=axes)
    std = np.sqrt(squares / max(count, 1))
    return mean.tolist(), [float(s) if s > 0 else 1.0 for s in std]


def is_text(x: np.ndarray | torch.Tensor) -> bool:
    """Whether samples ``x`` (an array or a tensor) are text: uint8 [n, L] character indices (images have 3 or 4
    dimensions)."""
    return x.ndim == 2 and str(x.dtype).endswith("uint8")


def to_tensor(images: np.ndarray, stats: tuple[list[float], list[float]] | None = None) -> torch.Tensor:
    """uint8 [n, H, W(, C)] -> float32 [n, C, H, W]: pixels / 255, then (x - mean) / std per channel when
    ``stats`` = (mean, std) are given (``channel_stats``). One tensor per loaded array and stats, shared between
    runs. Text, uint8 [n, L] character indices, stays as it is (the array's memory, no copy): the model embeds the
    indices. Float features [n, F, ...] (the ``arrays`` dataset's, or your own from Python) keep their shape and
    values, as float32 in a tensor of their own (the array is never changed), then (x - mean) / std per feature
    (axis 1) when ``stats`` are given (``feature_stats``).

    Raises:
        DataError: an array that is neither uint8 images or text nor float features (integer features: convert
            them, ``x.astype(np.float32)``)."""
    if is_text(images):
        return torch.from_numpy(np.ascontiguousarray(images))
    images = np.asarray(images)
    features = images.dtype.kind == "f"
    if not features and (images.dtype != np.uint8 or images.ndim not in (3, 4)):
        raise DataError(f"inputs of dtype {images.dtype} and shape {images.shape}: expected uint8 images "
                        "[n, H, W(, C)] or float features [n, F, ...] (x.astype(np.float32))")
    key = (id(images), None if stats is None else (tuple(stats[0]), tuple(stats[1])))
    hit = _TENSORS.get(key)
    if hit is not None and hit[0] is images:
        return hit[1]
    src = torch.from_numpy(np.ascontiguousarray(images))
    if not features:
        src = src.unsqueeze(1) if src.dim() == 3 else src.permute(0, 3, 1, 2)  # a view: [n, C, H, W]
    t = torch.empty(src.shape, dtype=torch.float32)
    if stats is not None:
        shape = (1, len(stats[0])) + (1,) * (src.dim() - 2)
        mean, std = torch.tensor(stats[0]).view(shape), torch.tensor(stats[1]).view(shape)
    # converted piece by piece, each piece's every step while it is in cache: the same operations on the same
    # values as on the whole pool at once (each is element by element), so the same numbers; on one thread, since
    # thousands of small parallel regions in a row spent most of their time waiting on each other
    rows = max(1, _CHUNK_PIXELS // max(1, math.prod(src.shape[1 if features else 2:])))
    with one_thread():
        for i in range(0, len(t), rows):
            part = t[i:i + rows]
            part.copy_(src[i:i + rows])
            if not features:  # pixels to [0, 1]; features keep their scale
                part.div_(255.0)
            if stats is not None:
                part.sub_(mean).div_(std)
    if any(images is ds.train.x or images is ds.test.x for ds in _LOADED.values()):
        _TENSORS[key] = (images, t)  # the array is held, so its id is not reused
    return t


def input_stats(d, ds: ArrayDataset) -> tuple[list[float], list[float]] | None:
    """The (mean, std) per channel that standardise every input of the run, or None (``normalize = 'unit'``).
    Float features (``arrays``): per feature, on their own scale (``feature_stats``).

    Taken from the training split the clients draw from (all of it, not only the samples
    dealt out: a function of the dataset alone, so every seed and run of a sweep shares one
    standardised pool). D0 — also from STL-10 or fonts — and the test set use the same
    statistics: the server's model must see inputs on the clients' scale.
    """
    if d.normalize == "unit" or is_text(ds.train.x):  # character indices are not scaled
        return None
    fixed = DATASETS[d.dataset].stats
    if fixed is not None:
        return list(fixed[0]), list(fixed[1])
    key = id(ds.train.x)
    hit = _STATS.get(key)
    if hit is None or hit[0] is not ds.train.x:
        stats = feature_stats(ds.train.x) if ds.train.x.dtype.kind == "f" else channel_stats(ds.train.x)
        hit = _STATS[key] = (ds.train.x, stats)
    return hit[1]


def build_federation(d, seed: int) -> Federation:
    """Load the dataset, partition it over N clients, pick D0 and U, then set aside the validation set
    (``data.validation``: ``hold_out_validation``), all from ``seed`` (a dataset that makes its clients on demand
    builds its federation itself: its registry entry's ``federation``)."""
    make = DATASETS[d.dataset].federation
    if make is not None:
        return make(d, seed)
    ds = load_arrays(d)
    train = ds.train
    labels = train.y
    n_train = len(labels)
    images, y = [train.x], labels  # the pool's images: the training split, then any source appended to it

    server = np.zeros(0, dtype=np.int64)
    pool = np.arange(n_train)
    if d.partition == "natural":  # the first N ids' samples: D0 and the clients draw from them only
        pool = natural.pool(train, d.num_clients, d.dataset)
    if d.server_source == "iid" and d.server_size:
        if d.server_size > len(pool):
            raise partition.PartitionError(f"data.server_size = {d.server_size}: expected at most the "
                                           f"{len(pool)} training samples")
        server = (pool[server_data.uniform_subset(len(pool), d.server_size, seed, stream=(SERVER_DATA, 3))]
                  if is_text(train.x) else  # windows: a uniform draw (per next character would distort them)
                  server_data.iid_per_class(labels, d.server_size, seed, class_names=train.class_names,
                                            pool=pool if d.partition == "natural" else None))
        if not d.server_overlap:
            pool = np.setdiff1d(pool, server)

    clients = _partition(d, labels, pool, seed, train.class_names, train)

    if d.server_source == "clients":
        server = server_data.from_clients(clients, d.server_clients, d.server_samples_per_client, seed)
    elif d.server_source == "other_ids":
        server = natural.other_ids(train, d.num_clients, d.server_clients, d.dataset)
    elif d.server_source == "dataset":
        if is_text(train.x):
            raise DataError(f"data.server_source = 'dataset' reads images ({d.server_dataset!r}), but "
                            f"data.dataset = {d.dataset!r} is text: expected 'other_ids', 'iid' or 'clients'")
        ext = external_server_set(d, train, seed)
        server = n_train + np.arange(len(ext))  # appended to the pool; no client draws from it
        images, y = [*images, ext.x], np.concatenate([y, ext.y])
    if d.server_source != "iid" and d.server_size:
        server = server[server_data.uniform_subset(len(server), d.server_size, seed) if is_text(train.x)
                        else server_data.balanced_subset(y[server], d.server_size, seed)]
    if d.unlabelled == "server":  # U: D0's images, labels ignored
        unlabelled = server
    else:  # U: another source's images, appended to the pool; no client or D0 draws from them
        if is_text(train.x):
            raise DataError(f"data.unlabelled = {d.unlabelled!r} reads images, but data.dataset = {d.dataset!r} is "
                            "text: expected 'server' (D0's windows)")
        ext = external_unlabelled_set(d, train, seed)
        unlabelled = len(y) + np.arange(len(ext))
        images, y = [*images, ext.x], np.concatenate([y, ext.y])
    unlabelled = unlabelled[unlabelled_subset(len(unlabelled), d.unlabelled_size, seed)]
    clients, validation = hold_out_validation(ClientIndex.from_arrays(clients), d.validation, seed,
                                              np.union1d(server, unlabelled), by_position=is_text(train.x))

    stats = input_stats(d, ds)
    test = ds.test
    if d.partition == "natural" and (keep := natural.evaluated(test, d.num_clients, d.dataset)) is not None:
        test = ImageSet(test.x[keep], test.y[keep], test.class_names)  # the federation's ids' test samples
    x_test, y_test = to_tensor(test.x, stats), torch.from_numpy(test.y).long()
    if d.test_size is not None:
        keep = torch.from_numpy(test_subset(test.y, d.test_size, uniform=is_text(test.x)))
        x_test, y_test = x_test[keep], y_test[keep]
    # each part converted on its own (the training split's tensor is shared between runs), then joined
    x = torch.cat([to_tensor(part, stats) for part in images]) if len(images) > 1 else to_tensor(images[0], stats)
    return Federation(x, torch.from_numpy(y).long(), clients, server, x_test, y_test,
                      num_classes=len(ds.class_names), class_names=list(ds.class_names), input_stats=stats,
                      unlabelled=unlabelled, validation=validation)


def hold_out_validation(clients: ClientIndex, fraction: float, seed: int, exclude: np.ndarray,
                        by_position: bool = False) -> tuple[ClientIndex, np.ndarray]:
    """The clients less their validation samples, and the validation set (``data.validation`` = f).

    Client i gives k_i = ⌊f·n_i⌋ of its n_i samples (at most n_i − 1: at least one stays with it) to the validation
    set, uniformly among those not in ``exclude`` (D0 and U, which the server trains or distils on: a sample there
    is never a validation sample; a client with fewer such samples gives them all). The picks are one draw from
    (seed, ``VALIDATION``): a uniform key per sample, client i's k_i smallest; the clients keep the rest in their
    order, and the validation set is the picks' pool indices, sorted. f = 0: ``clients`` as given and an empty set,
    nothing drawn, so a federation without the key is the one built before it existed.

    ``by_position`` (text): client i's last k_i eligible samples in its order instead of a draw. Text windows overlap
    (a window shifted by one character is its neighbour's input with the next character appended), so a uniform
    draw would score windows whose targets the clients train on; the last ones share only their first L − 1
    characters' worth of neighbours with the training part.

    Raises:
        PartitionError: f > 0 sets aside nothing (every ⌊f·n_i⌋ is 0).
    """
    if fraction <= 0:
        return clients, np.zeros(0, dtype=np.int64)
    sizes, idx = clients.own_sizes, clients.indices
    owners = clients.owners()
    # a client's k_i smallest keys are picked: a uniform draw, or (by position) its last samples first
    keys = -np.arange(len(idx), dtype=np.float64) if by_position else rng(seed, VALIDATION).random(len(idx))
    eligible = ~np.isin(idx, exclude)
    keys[~eligible] = np.inf  # after every other key: never among a client's k_i smallest
    k = np.minimum((fraction * sizes.astype(np.float64)).astype(np.int64), np.maximum(sizes - 1, 0))
    k = np.minimum(k, np.bincount(owners[eligible], minlength=len(sizes)))
    if not k.sum():
        raise partition.PartitionError(
            f"data.validation = {fraction}: sets aside no sample (⌊f·n_i⌋ = 0 for every client, the largest n_i is "
            f"{int(sizes.max(initial=0))}): expected a larger fraction")
    order = np.lexsort((keys, owners))  # client by client, each client's samples by key
    rank = np.arange(len(idx)) - clients.offsets[owners[order]]
    picked = np.zeros(len(idx), dtype=bool)
    picked[order[rank < k[owners[order]]]] = True
    kept = ClientIndex(np.concatenate([[0], np.cumsum(sizes - k)]).astype(np.int64), idx[~picked])
    return kept, np.sort(idx[picked])


def test_subset(labels: np.ndarray, size: int, uniform: bool = False) -> np.ndarray:
    """Positions of the ``data.test_size`` test samples evaluated: class-balanced (``uniform``: drawn uniformly,
    as text windows are), drawn once from a fixed stream (not the run's seed), so every run and seed of a
    comparison is measured on the same samples."""
    if uniform:
        return server_data.uniform_subset(len(labels), size, 0, stream=(TEST_SUBSET,), setting="data.test_size",
                                          source="the test split")
    return server_data.balanced_subset(labels, size, 0, stream=(TEST_SUBSET,), setting="data.test_size",
                                       source="the test split")


def _partition(d, labels: np.ndarray, pool: np.ndarray, seed: int,
               class_names: list[str] | None = None, train: ImageSet | None = None) -> list[np.ndarray]:
    if d.partition == "natural":
        return natural.clients(train, pool, d.num_clients, d.dataset)
    n_i = d.samples_per_client or len(pool) // d.num_clients
    if n_i < 1:
        raise partition.PartitionError(
            f"data.num_clients = {d.num_clients}: more clients than the {len(pool)} samples available")
    if d.partition == "classes":
        return partition.by_classes(labels, d.num_clients, d.classes_per_client, n_i, seed, pool,
                                    class_names=class_names)
    if d.partition == "dirichlet":
        return partition.dirichlet(labels, d.num_clients, d.dirichlet_alpha, seed, pool)
    if d.partition == "shards":
        return partition.shards(labels, d.num_clients, d.shards_per_client, seed, pool)
    if d.quantity_skew is not None:
        sizes = partition.skewed_sizes(min(len(pool), n_i * d.num_clients), d.num_clients, d.quantity_skew, seed)
        return partition.iid_sizes(len(labels), sizes, seed, pool)
    return partition.iid(len(labels), d.num_clients, n_i, seed, pool)
