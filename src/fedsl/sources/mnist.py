"""MNIST and Fashion-MNIST from their publishers' idx files, and telling the two apart.

Files are looked for under their official names in ``root`` itself, then in the dataset's
own sub-folder of it (``mnist``, ``fashion-mnist``; torchvision's ``MNIST/raw`` and
``FashionMNIST/raw`` too), gzip-compressed (``.gz``) or not (``fedsl.sources.idx``). With
``download=True`` missing files are downloaded, with md5 checks, into that sub-folder (into
``root`` itself when it is already named so). The two datasets share every file name, shape
and label range: ``identify_mnist_like`` tells them apart by checksum, else by content.
"""

from __future__ import annotations

import string
from collections.abc import Sequence
from pathlib import Path
from typing import NamedTuple

import numpy as np

from fedsl.core.errors import DataError, download_hint
from fedsl.sources.arrays import ArrayDataset, ImageSet
from fedsl.sources.download import fetch, file_digest
from fedsl.sources.idx import (
    IMAGE_SIZE,
    PARTS,
    decode_pair,
    download_dir,
    in_folder,
    locate_files,
    missing_files,
    read_idx,
    relabel,
)

MNIST_FILES: dict[str, tuple[str, str]] = {
    "train": ("train-images-idx3-ubyte.gz", "train-labels-idx1-ubyte.gz"),
    "test": ("t10k-images-idx3-ubyte.gz", "t10k-labels-idx1-ubyte.gz"),
}
# Mirrors and md5s as in torchvision/datasets/mnist.py (classes MNIST and FashionMNIST);
# yann.lecun.com often refuses downloads, so the S3 mirror comes first.
MNIST_MIRRORS: tuple[str, ...] = ("https://ossci-datasets.s3.amazonaws.com/mnist/", "http://yann.lecun.com/exdb/mnist/")
MNIST_MD5: dict[str, str] = {
    "train-images-idx3-ubyte.gz": "md5:f68b3c2dcbeaaa9fbdd348bbdeb94873",
    "train-labels-idx1-ubyte.gz": "md5:d53e105ee54ea40749a09fcbcd1e9432",
    "t10k-images-idx3-ubyte.gz": "md5:9fb629c4189551a2d022fa330f9573f3",
    "t10k-labels-idx1-ubyte.gz": "md5:ec29112dd5afa0611ce80d1b7f02629c",
}
FASHION_MNIST_MIRRORS: tuple[str, ...] = ("http://fashion-mnist.s3-website.eu-central-1.amazonaws.com/",)
FASHION_MNIST_MD5: dict[str, str] = {
    "train-images-idx3-ubyte.gz": "md5:8d4fb7e6c68d591d4c3dfef9ec88bf0d",
    "train-labels-idx1-ubyte.gz": "md5:25c81989df183df01b3e8a0aad5dffbe",
    "t10k-images-idx3-ubyte.gz": "md5:bef4ecab320f06d8554ea6380940ec79",
    "t10k-labels-idx1-ubyte.gz": "md5:bb300cfdad3c16e7a12a480ee83cd310",
}
MNIST_CLASSES: list[str] = list(string.digits)
FASHION_MNIST_CLASSES: list[str] = ["T-shirt/top", "Trouser", "Pullover", "Dress", "Coat",
                                    "Sandal", "Shirt", "Sneaker", "Bag", "Ankle boot"]


class MnistIdentity(NamedTuple):
    """Whose idx files a folder holds: ``dataset`` is 'mnist', 'fashion_mnist', 'mixed' (files of
    both) or None (neither checksums nor content tell); ``evidence`` says how it was told."""

    dataset: str | None
    evidence: str

    @property
    def title(self) -> str:
        return MNIST_LIKE.get(self.dataset or "", (str(self.dataset),))[0]


MNIST_LIKE: dict[str, tuple[str, dict[str, str]]] = {"mnist": ("MNIST", MNIST_MD5),
                                                     "fashion_mnist": ("Fashion-MNIST", FASHION_MNIST_MD5)}
# The content check. MNIST digits were scaled into a 20x20 box and centred by their centre of mass
# in 28x28 (LeCun et al.), so a digit's non-zero pixels span at most ~21 rows and columns;
# Fashion-MNIST's products were trimmed and their longest edge resized to 28 (Xiao et al. 2017),
# so nearly every image spans 26-28 pixels one way. A span of 25 or more is Fashion-MNIST's.
WIDE_SPAN = 25
CONTENT_MIN_IMAGES = 100     # fewer images (hand-made test files) decide nothing: the name is trusted
CONTENT_SAMPLE = 2000        # images looked at
FASHION_MIN_WIDE = 0.5       # at least this share of wide images: Fashion-MNIST
MNIST_MAX_WIDE = 0.02        # at most this share: MNIST; in between: undecided


def identify_mnist_like(folder: str | Path) -> MnistIdentity:
    """Tell MNIST's idx files from Fashion-MNIST's in ``folder`` (they share every file name).

    First the md5s of the gzip files against both publishers' (cheap, and decisive for the
    official files); when none matches (uncompressed or re-compressed copies), the images'
    extent (``WIDE_SPAN``) over the first ``CONTENT_SAMPLE`` test (else train) images.
    """
    folder = Path(folder)
    matched: dict[str, list[str]] = {}
    for name in (n for part in PARTS for n in MNIST_FILES[part]):
        if not (folder / name).is_file():
            continue  # an uncompressed twin has no published checksum
        digest = "md5:" + file_digest(folder / name, "md5")
        for key, (_, sums) in MNIST_LIKE.items():
            if sums[name] == digest:
                matched.setdefault(key, []).append(name)
    if len(matched) == 2:
        return MnistIdentity("mixed", "; ".join(f"{', '.join(v)} {MNIST_LIKE[k][0]}'s" for k, v in matched.items()))
    if matched:
        key, files = next(iter(matched.items()))
        return MnistIdentity(key, f"the md5 of {files[0]} is {MNIST_LIKE[key][0]}'s published one")
    images = in_folder(folder, MNIST_FILES["test"][0]) or in_folder(folder, MNIST_FILES["train"][0])
    if images is None:
        return MnistIdentity(None, "no image file")
    try:
        x = read_idx(images)
    except DataError as e:
        return MnistIdentity(None, f"unreadable: {e}")
    if x.dtype != np.uint8 or x.ndim != 3 or x.shape[1:] != IMAGE_SIZE or len(x) < CONTENT_MIN_IMAGES:
        return MnistIdentity(None, f"{len(x)} images of shape {x.shape[1:]}: too few or not 28x28 to tell")
    wide = _spans(x[:CONTENT_SAMPLE] > 0) >= WIDE_SPAN
    share = float(wide.mean())
    how = (f"{share:.0%} of the first {len(wide)} images in {images.name} span {WIDE_SPAN}+ pixels: "
           "Fashion-MNIST's products fill the frame, MNIST's digits fit in 20x20")
    if share >= FASHION_MIN_WIDE:
        return MnistIdentity("fashion_mnist", how)
    if share <= MNIST_MAX_WIDE:
        return MnistIdentity("mnist", how)
    return MnistIdentity(None, how)


def _spans(mask: np.ndarray) -> np.ndarray:
    """Per image [n, H, W], the larger of the heights and widths spanned by its True pixels (0 if none)."""
    def extent(any_: np.ndarray) -> np.ndarray:  # [n, L] -> last - first + 1
        first = any_.argmax(axis=1)
        last = any_.shape[1] - 1 - any_[:, ::-1].argmax(axis=1)
        return np.where(any_.any(axis=1), last - first + 1, 0)
    return np.maximum(extent(mask.any(axis=2)), extent(mask.any(axis=1)))


def _load_mnist_like(root: str | Path, *, title: str, subfolders: Sequence[str], key: str,
                     mirrors: Sequence[str], md5: dict[str, str], class_names: list[str],
                     download: bool) -> ArrayDataset:
    """``key``: the dataset's name ('mnist', 'fashion_mnist'), also the name of its cache entries."""
    root = Path(root)
    names = [n for part in PARTS for n in MNIST_FILES[part]]
    if locate_files(root, subfolders, names) is None and download:
        dest = download_dir(root, subfolders[0])
        for name in names:
            if in_folder(dest, name) is not None:
                continue
            errors = []
            for mirror in mirrors:
                try:
                    fetch(mirror + name, dest / name, md5[name])
                    break
                except DataError as e:
                    if (dest / name).is_file():
                        raise
                    errors.append(str(e))
            else:
                raise DataError(" / ".join(errors))
    paths = locate_files(root, subfolders, names)
    if paths is None:
        raise missing_files(title, root, subfolders, names,
                       f"{download_hint(key)} to fetch them from {mirrors[0]}, or put the publisher's files there "
                       f"(MNIST and Fashion-MNIST share these names: keep each in its own folder)")
    # Same names, shapes and labels: only the bytes tell which of the two this is (see identify_mnist_like).
    found = identify_mnist_like(paths[0].parent)
    if found.dataset == "mixed":
        raise DataError(f"{paths[0].parent} holds a mix of MNIST's and Fashion-MNIST's idx files "
                        f"({found.evidence}): expected {title}'s four files; keep each dataset in its own folder")
    if found.dataset is not None and found.dataset != key:
        raise DataError(f"{paths[0].parent} holds {found.title}'s idx files, not {title}'s ({found.evidence}): "
                        f"expected {title}'s files there; keep each dataset in its own folder, or set "
                        f"data.dataset = {found.dataset!r}")
    sets = []
    for k, part in enumerate(PARTS):
        x, y_raw = decode_pair(f"{key}-{part}", paths[2 * k], paths[2 * k + 1], transpose=False)
        sets.append(ImageSet(x, relabel(y_raw, range(len(class_names)), paths[2 * k + 1]), list(class_names)))
    return ArrayDataset(*sets)


def load_mnist(root: str | Path, *, download: bool = False) -> ArrayDataset:
    """MNIST (60k train, 10k test, classes '0'..'9') from the official idx files."""
    return _load_mnist_like(root, title="MNIST", subfolders=("mnist", "MNIST/raw"), key="mnist",
                            mirrors=MNIST_MIRRORS, md5=MNIST_MD5, class_names=MNIST_CLASSES, download=download)


def load_fashion_mnist(root: str | Path, *, download: bool = False) -> ArrayDataset:
    """Fashion-MNIST (60k train, 10k test, 10 clothing classes) from the official idx files."""
    return _load_mnist_like(root, title="Fashion-MNIST", subfolders=("fashion-mnist", "FashionMNIST/raw"),
                            key="fashion_mnist", mirrors=FASHION_MNIST_MIRRORS, md5=FASHION_MNIST_MD5,
                            class_names=FASHION_MNIST_CLASSES, download=download)


def load(d, root: Path) -> ArrayDataset:
    """The registry's loader of ``data.dataset = 'mnist'`` (``fedsl.data.registry``)."""
    return load_mnist(root, download=d.download)


def load_fashion(d, root: Path) -> ArrayDataset:
    """The registry's loader of ``data.dataset = 'fashion_mnist'`` (``fedsl.data.registry``)."""
    return load_fashion_mnist(root, download=d.download)


def is_mnist(folder: Path) -> bool:
    """The registry's ``identify`` of MNIST: ``folder``'s files are not told to be another dataset's."""
    return identify_mnist_like(folder).dataset in (None, "mnist")


def is_fashion_mnist(folder: Path) -> bool:
    """The registry's ``identify`` of Fashion-MNIST: ``folder``'s files are not told to be another dataset's."""
    return identify_mnist_like(folder).dataset in (None, "fashion_mnist")
