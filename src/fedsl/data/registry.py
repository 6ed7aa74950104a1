"""Every dataset by name: its loader, sizes, classes, channels, image size and input statistics.

The one table the rest of fedsl reads: the config's ``data.dataset`` choices and checks
(``fedsl.config.schema``), ``fedsl data list`` and the loader (``fedsl.data.datasets``).
A new dataset is one module with a loader ``load(d, root) -> ArrayDataset`` (``d``: the data
config, ``root``: the folder located for it, the data root for a generated one) and one entry in
``DATASETS`` below (a generated benchmark whose clients are made on demand gives ``federation(d, seed) ->
Federation`` instead: Synthetic(α, β)), e.g.
``fedsl.sources.toy``::

    DatasetInfo("toy", lazy("fedsl.sources.toy", "load"), train_size=160, test_size=40, num_classes=4, ...),

Loaders are imported on first use (``lazy``): some pull in heavy libraries (fonts, decoders).

The sources of a server dataset D0 other than the clients' pool (``data.server_source = 'dataset'``) are
``SERVER_SOURCES``, one entry each: the config's ``data.server_dataset`` choices and the loader
(``fedsl.data.datasets.external_server_set``) read it. They are also the sources of the server's unlabelled data
(``data.unlabelled``, FedDF's), whose labels are never read; a source without labels serves only there.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from fedsl.sources.arrays import ArrayDataset, ImageSet

Stats = tuple[tuple[float, ...], tuple[float, ...]]  # (mean, std) per channel, on the [0, 1] scale


def lazy(module: str, function: str) -> Callable[..., Any]:
    """``module.function``, imported when first called."""
    def call(*args: Any, **kwargs: Any) -> Any:
        return getattr(importlib.import_module(module), function)(*args, **kwargs)
    call.__qualname__ = call.__name__ = f"{module}:{function}"
    return call


@dataclass(frozen=True)
class DatasetInfo:
    """One dataset. Sizes are the publisher's (None where they depend on the config or the folder).

    Attributes:
        name: the ``data.dataset`` value.
        load: ``load(d, root) -> ArrayDataset``; None for a dataset that is only a source of D0 (STL-10).
        train_size, test_size: samples in the training and test splits.
        num_classes: L, the number of classes.
        channels: 1 (grey) or 3 (RGB).
        image_size: (height, width) in pixels.
        stats: fixed (mean, std) per channel for ``data.normalize = 'standardize'``; None: the training
            split's own (``datasets.input_stats``), as for every dataset the paper uses.
        note: what else ``fedsl data list`` says about its size (e.g. the EMNIST split counted).
        subdirs: sub-folders of the data root it may live in, first found wins ('.' = the root itself);
            the first is where a download puts it.
        markers: file globs whose presence says a folder holds it; empty: generated, no files.
        identify: ``identify(folder) -> bool``, whether a marked folder really holds it (MNIST and
            Fashion-MNIST share their file names); None: the markers decide.
        check_config: ``check_config(d) -> str | None``, the one-line problem of data config ``d`` for
            this dataset, or None; run at validation.
        selects_classes: its loader applies ``data.classes`` itself (EMNIST's aliases and 'paper45').
        federation: ``federation(d, seed) -> Federation``: the dataset builds its federation itself, its clients'
            samples made on demand (``Federation.on_demand``), not a pool that a partition deals out; such a dataset
            has no arrays (``load`` is None), and what needs every client's samples at once is refused for it.
        natural: its loader tags every sample with a natural id (writer, user, device: ``ImageSet.owners``), so
            ``data.partition = 'natural'`` can give one client per id (``fedsl.data.natural``).
        reads: the dataset-specific data keys it reads (``data.chars``, ``data.emnist_split``, ...). A key that some
            dataset reads is refused at validation, changed from its default, with a dataset that does not
            (``fedsl.config.schema``): it would change nothing.
    """

    name: str
    load: Callable[[Any, Path], ArrayDataset] | None
    train_size: int | None = None
    test_size: int | None = None
    num_classes: int | None = None
    channels: int | None = None
    image_size: tuple[int, int] | None = None
    stats: Stats | None = None
    note: str = ""
    subdirs: tuple[str, ...] = (".",)
    markers: tuple[str, ...] = ()
    identify: Callable[[Path], bool] | None = None
    check_config: Callable[[Any], str | None] | None = None
    selects_classes: bool = False
    federation: Callable[[Any, int], Any] | None = None
    natural: bool = False
    reads: tuple[str, ...] = ()

    @property
    def generated(self) -> bool:
        """Made by code, not read from files."""
        return not self.markers

    def describe(self) -> str:
        """The size line of ``fedsl data list``, e.g. '50,000 / 10,000, 10 classes'."""
        sizes = (f"{self.train_size:,} / {self.test_size:,}, {self.num_classes} classes"
                 if self.train_size and self.test_size and self.num_classes else "")
        if sizes and self.note:
            return f"{sizes} ({self.note})"
        return sizes or self.note


_MNIST_FILES = ("train-images-idx3-ubyte*", "t10k-images-idx3-ubyte*")

DATASETS: dict[str, DatasetInfo] = {info.name: info for info in (
    DatasetInfo("synthetic_chars", lazy("fedsl.sources.synthetic", "load"), channels=1, image_size=(28, 28),
                note="generated: data.train_per_class / test_per_class per class of data.chars",
                check_config=lazy("fedsl.sources.synthetic", "check_config"),
                reads=("chars", "train_per_class", "test_per_class")),
    DatasetInfo("cifar10", lazy("fedsl.sources.cifar10", "load"), 50_000, 10_000, 10, 3, (32, 32),
                subdirs=("cifar10", "cifar-10", "cifar10-jpeg", "."),
                markers=("cifar-10-batches-py", "cifar-10-python.tar.gz", "cifar-10-batches-bin",
                         "cifar-10-binary.tar.gz", "train/airplane")),
    DatasetInfo("emnist", lazy("fedsl.sources.emnist", "load"), 112_800, 18_800, 47, 1, (28, 28),
                note="the balanced split; other splits: see the docs", subdirs=("emnist", "."),
                markers=("emnist-*-ubyte.gz", "gzip.zip", "gzip/emnist-*"), selects_classes=True,
                check_config=lazy("fedsl.sources.emnist", "check_config"),
                reads=("emnist_split", "carve", "carve_test", "train_per_class", "test_per_class")),
    DatasetInfo("mnist", lazy("fedsl.sources.mnist", "load"), 60_000, 10_000, 10, 1, (28, 28),
                subdirs=("mnist", "MNIST", "."), markers=_MNIST_FILES,
                identify=lazy("fedsl.sources.mnist", "is_mnist")),
    DatasetInfo("fashion_mnist", lazy("fedsl.sources.mnist", "load_fashion"), 60_000, 10_000, 10, 1, (28, 28),
                subdirs=("fashion_mnist", "fashion-mnist", "FashionMNIST", "."), markers=_MNIST_FILES,
                identify=lazy("fedsl.sources.mnist", "is_fashion_mnist")),
    DatasetInfo("stl10", None, 5_000, 8_000, 10, 3, (96, 96),
                note="labelled train; 9 classes shared with CIFAR-10; a D0 source only: data.server_dataset",
                subdirs=("stl10", "stl10-subset", "stl10_binary", "."),
                markers=("stl10_binary", "stl10_binary.tar.gz", "train_X.bin", "airplane")),
    DatasetInfo("image_folder", lazy("fedsl.sources.image_folder", "load"),
                note="train/<class>/ and test/<class>/ images", markers=("train", "test")),
    DatasetInfo("leaf", lazy("fedsl.sources.leaf", "load"), channels=1,
                note="LEAF's JSON layout (FEMNIST): train/*.json and test/*.json, one client per user",
                subdirs=("leaf", "femnist/data", "femnist", "."), markers=("train/*.json",), natural=True),
    DatasetInfo("shakespeare", lazy("fedsl.sources.shakespeare", "load"), num_classes=80,
                note="next-character prediction, one client per role (LEAF): data.text 'works' (the etext's plays) "
                     "or 'tiny' (tinyshakespeare.txt)",
                subdirs=("shakespeare", "."), markers=("tinyshakespeare.txt", "complete-works-part.txt", "100.txt",
                                                       "pg100.txt", "t8.shakespeare.txt"),
                natural=True, check_config=lazy("fedsl.sources.shakespeare", "check_config"),
                reads=("text", "seq_length", "stride", "min_samples", "test_fraction")),
    DatasetInfo("hf_files", lazy("fedsl.sources.hf_files", "load"),
                note="local parquet/CSV/JSON files or an image folder read with Hugging Face datasets "
                     "(the 'natural' extra)",
                markers=("*.parquet", "*.csv", "*.json", "*.jsonl", "train", "data"), natural=True,
                check_config=lazy("fedsl.sources.hf_files", "check_config"),
                reads=("id_column", "label_column", "test_fraction")),
    DatasetInfo("arrays", lazy("fedsl.sources.array_files", "load"),
                note="your own features and labels: an .npz of x_train, y_train, x_test, y_test (data.data_dir: the "
                     "file, or a folder holding arrays.npz)",
                markers=("arrays.npz",), check_config=lazy("fedsl.sources.array_files", "check_config")),
    DatasetInfo("toy", lazy("fedsl.sources.toy", "load"), 160, 40, 4, 1, (12, 12), stats=((0.5,), (0.25,)),
                note="generated stripes, for tests and examples"),
    DatasetInfo("synthetic_fedprox", None, num_classes=10,
                note="generated on demand, any N: Synthetic(α, β) of FedProx (Li et al. 2020), 60 features",
                check_config=lazy("fedsl.data.synthetic_fedprox", "check_config"),
                federation=lazy("fedsl.data.synthetic_fedprox", "federation"),
                reads=("synthetic_alpha", "synthetic_beta", "synthetic_max_samples", "synthetic_test_clients",
                       "synthetic_server_alpha", "synthetic_server_beta")),
    DatasetInfo("synthetic_leaf", None, num_classes=5,
                note="generated on demand, any N: LEAF's synthetic data (Caldas et al. 2018), models sharing one "
                     "structure, 60 features",
                check_config=lazy("fedsl.data.synthetic_leaf", "check_config"),
                federation=lazy("fedsl.data.synthetic_leaf", "federation"),
                reads=("synthetic_max_samples", "synthetic_test_clients", "synthetic_clusters",
                       "synthetic_model_seed")),
)}


def names() -> tuple[str, ...]:
    """The ``data.dataset`` choices: every dataset with a loader or a federation of its own."""
    return tuple(name for name, info in DATASETS.items() if info.load is not None or info.federation is not None)


def readers(key: str) -> tuple[str, ...]:
    """The datasets that read dataset-specific data key ``key`` (empty: every dataset may read it)."""
    return tuple(name for name, info in DATASETS.items() if key in info.reads)


def specific_keys() -> tuple[str, ...]:
    """The data keys that only some datasets read, in the order of ``DATASETS``."""
    return tuple(dict.fromkeys(key for info in DATASETS.values() for key in info.reads))


def on_demand(name: str) -> bool:
    """Whether dataset ``name`` makes its clients' samples on demand (no pool holds them)."""
    return DATASETS[name].federation is not None


@dataclass(frozen=True)
class ServerSource:
    """One source of D0 from outside the clients' pool (``data.server_dataset``).

    Attributes:
        name: the ``data.server_dataset`` value.
        load: ``load(d, train, seed, root) -> ImageSet``: D0 labelled with the clients' classes
            (``train.class_names``), its images shaped as theirs (``train.x``); ``d``: the data config,
            ``root``: the folder of ``dataset`` located (None without one).
        note: what the config reference says of it besides its name.
        dataset: the registered dataset whose files it reads, looked for under ``data.server_data_dir``,
            else ``data.data_dir`` (STL-10); None: generated, or a folder the config names.
        per_class: its loader applies ``data.server_per_class`` itself; otherwise the first
            ``server_per_class`` images of each class are kept after loading (FSLsyn's fixed 15).
        labelled: its images have labels; False: a source of unlabelled data only (``data.unlabelled``, FedDF's
            distillation set), whose loader labels every image -1 and applies ``data.unlabelled_size`` itself.
    """

    name: str
    load: Callable[[Any, ImageSet, int, Path | None], ImageSet]
    note: str = ""
    dataset: str | None = None
    per_class: bool = True
    labelled: bool = True


SERVER_SOURCES: dict[str, ServerSource] = {source.name: source for source in (
    ServerSource("fslsyn", lazy("fedsl.sources.synthetic", "fslsyn_server"), note="paper's font characters",
                 per_class=False),
    ServerSource("synthetic_chars", lazy("fedsl.sources.synthetic", "chars_server")),
    ServerSource("stl10", lazy("fedsl.sources.stl10", "server_set"), dataset="stl10"),
    ServerSource("stl10_unlabelled", lazy("fedsl.sources.stl10", "unlabelled_set"), dataset="stl10", labelled=False,
                 note="STL-10's 100,000 unlabelled images; data.unlabelled only"),
    ServerSource("image_folder", lazy("fedsl.sources.image_folder", "server_set")),
    ServerSource("arrays", lazy("fedsl.sources.array_files", "server_set"), per_class=False,
                 note="x_train, y_train of the .npz data.server_data_dir names; with data.dataset = 'arrays'"),
)}


def server_source_names() -> tuple[str, ...]:
    """The ``data.server_dataset`` choices."""
    return tuple(SERVER_SOURCES)
