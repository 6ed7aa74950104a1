"""STL-10, as "other source" server data for CIFAR-10 (the FSL paper's FSLsyn setting).

STL-10 (Coates, Lee, Ng, AISTATS 2011; https://cs.stanford.edu/~acoates/stl10/) has 96x96
colour images of 10 classes: airplane bird car cat deer dog horse monkey ship truck. Nine
are CIFAR-10 classes ("car" is CIFAR-10's "automobile"), monkey is not, and CIFAR-10's
frog has no STL-10 counterpart. :func:`load_stl10_as_cifar10` gives the 9 shared classes
with CIFAR-10's label indices, resized to CIFAR-10's 32x32.

The official binary release, ``stl10_binary.tar.gz``, holds ``stl10_binary/train_X.bin``,
``train_y.bin``, ``test_X.bin``, ``test_y.bin``, ``unlabeled_X.bin``, ``class_names.txt`` and
``fold_indices.txt``. The publisher's page says the X files are tightly packed uint8 images
"stored in column-major order, one channel at a time. That is, the first 96*96 values are
the red channel, the next 96*96 are green, and the last are blue. The labels are in the
range 1 to 10." So one image is stored as [channel][column][row]; the official Python
loader linked from that page (github.com/mttk/STL10, stl10_input.py) turns it upright
with ``np.reshape(x, (-1, 3, 96, 96)).transpose(0, 3, 2, 1)`` (-> [n, row, column,
channel]), and torchvision's ``STL10`` with ``transpose(0, 1, 3, 2)`` (-> [n, channel, row,
column]): the same reading.

The files have no header, so their sizes are checked before they are read: an X file must
hold whole images and at most ``MAX_IMAGES`` of them (the release's largest file), its y file
one byte per image, class_names.txt at most ``TEXT_MAX_BYTES``; extraction refuses a member
whose tar header claims more than that, before writing a byte of it.
"""

from __future__ import annotations

import os
import tarfile
from pathlib import Path

import numpy as np
from PIL import Image

from fedsl.core.errors import DataError, download_hint
from fedsl.core.rng import UNLABELLED, rng
from fedsl.sources.arrays import ImageSet, cached_arrays, file_fingerprint
from fedsl.sources.download import fetch
from fedsl.sources.image_folder import RESAMPLE, load_image_folder, per_class_subset, resize_image

# STL-10's label order (labels 1..10 in the *_y.bin files are 1 + an index in this list).
STL10_CLASSES: list[str] = ["airplane", "bird", "car", "cat", "deer", "dog", "horse", "monkey", "ship", "truck"]

# CIFAR-10's label order (as in its batches.meta). Defined here rather than imported from
# fedsl.sources.cifar10 so the STL-10 loader does not depend on the CIFAR-10 one; the two
# lists must stay equal.
CIFAR10_CLASSES: list[str] = ["airplane", "automobile", "bird", "cat", "deer", "dog", "frog", "horse", "ship",
                              "truck"]

# STL-10 class name -> CIFAR-10 class name; monkey has no CIFAR-10 class and is dropped.
STL10_TO_CIFAR10: dict[str, str] = {
    "airplane": "airplane", "bird": "bird", "car": "automobile", "cat": "cat", "deer": "deer",
    "dog": "dog", "horse": "horse", "ship": "ship", "truck": "truck",
}

URL = "http://ai.stanford.edu/~acoates/stl10/stl10_binary.tar.gz"
# The archive's md5, as torchvision's STL10 dataset (torchvision/datasets/stl10.py, tgz_md5) checks it.
MD5 = "91f7769df0f17e558f3565bffb0c7dfb"
ARCHIVE = "stl10_binary.tar.gz"
FOLDER = "stl10_binary"

SIDE = 96
IMAGE_BYTES = 3 * SIDE * SIDE
# The members read (unlabeled_X.bin, 2.6 GB, is extracted only for the unlabelled source, ``unlabelled_set``).
_MEMBERS = ("train_X.bin", "train_y.bin", "test_X.bin", "test_y.bin", "class_names.txt", "fold_indices.txt")
UNLABELLED_FILE = "unlabeled_X.bin"
_SPLITS = ("train", "test")
_CACHE_VERSION = 1
MAX_IMAGES = 100_000  # the release's largest file, unlabeled_X.bin (the labelled splits: 5,000 and 8,000)
TEXT_MAX_BYTES = 1 << 20  # class_names.txt, fold_indices.txt (~100 bytes and ~30 kB in the release)


def _member_limit(name: str) -> int:
    """The most bytes the release's file ``name`` may have."""
    if name.endswith("_X.bin"):
        return MAX_IMAGES * IMAGE_BYTES
    if name.endswith("_y.bin"):
        return MAX_IMAGES
    return TEXT_MAX_BYTES


def _binary_dir(root: Path) -> Path | None:
    """The folder holding the .bin files: ``root/stl10_binary`` or ``root`` itself."""
    for d in (root / FOLDER, root):
        if (d / "train_X.bin").is_file() or (d / "test_X.bin").is_file():
            return d
    return None


def stl10_images_from_binary(raw: np.ndarray) -> np.ndarray:
    """The publisher's column-major uint8 bytes -> upright images [n, 96, 96, 3]."""
    return np.ascontiguousarray(raw.reshape(-1, 3, SIDE, SIDE).transpose(0, 3, 2, 1))


def _read_class_names(d: Path) -> list[str]:
    path = d / "class_names.txt"
    if not path.is_file():
        return list(STL10_CLASSES)
    size = path.stat().st_size
    if size > TEXT_MAX_BYTES:
        raise DataError(f"{path} is {size:,} bytes: expected a short text file, one class name a line "
                        f"(at most {TEXT_MAX_BYTES:,} bytes); extract it again from {ARCHIVE}")
    try:
        text = path.read_bytes().decode("utf-8")
    except UnicodeDecodeError as e:
        raise DataError(f"{path} is not UTF-8 text ({e.reason} at byte {e.start}): expected one class name a line "
                        f"(STL-10: {' '.join(STL10_CLASSES)}); extract it again from {ARCHIVE}") from None
    names = [line.strip() for line in text.splitlines() if line.strip()]
    if not names:
        raise DataError(f"{path} is empty: expected one class name a line (STL-10: {' '.join(STL10_CLASSES)})")
    return names


def read_stl10_binary(root: str | Path, splits: tuple[str, ...] = _SPLITS) -> dict:
    """The labelled STL-10 splits from the publisher's binary files.

    ``root`` is the folder holding ``stl10_binary/`` (or that folder itself). Returns
    ``{"<split>_x": uint8 [n, 96, 96, 3] upright, "<split>_y": int64 [n] labels 0..9,
    "class_names": [...]}`` for each split in ``splits`` ("train", "test"); the labels are
    the files' 1..10 minus 1, indexing ``class_names`` (from class_names.txt).
    """
    root = Path(root)
    d = _binary_dir(root)
    if d is None:
        raise DataError(f"{root / FOLDER}: no STL-10 binary files (train_X.bin, ...); put {ARCHIVE} or its "
                        f"extracted {FOLDER}/ folder in {root}, or {download_hint()}")
    names = _read_class_names(d)
    out: dict = {"class_names": names}
    for split in splits:
        if split not in _SPLITS:
            raise DataError(f"split = {split!r}: expected 'train' or 'test'")
        xp, yp = d / f"{split}_X.bin", d / f"{split}_y.bin"
        for p in (xp, yp):
            if not p.is_file():
                raise DataError(f"{p}: missing; extract it from the publisher's {ARCHIVE} (or delete {d} "
                                f"and {download_hint()})")
        n_bytes, n_labels = xp.stat().st_size, yp.stat().st_size  # sizes checked before reading
        if n_bytes % IMAGE_BYTES:
            raise DataError(f"{xp} has {n_bytes} bytes, not a multiple of one 3x96x96 image ({IMAGE_BYTES} bytes): "
                            f"the file is truncated or corrupt; extract it again from {ARCHIVE}")
        n = n_bytes // IMAGE_BYTES
        if n > MAX_IMAGES:
            raise DataError(f"{xp} holds {n:,} images: expected at most {MAX_IMAGES:,} (STL-10's largest file); "
                            f"it is not STL-10's; extract it again from {ARCHIVE}")
        if n_labels != n:
            raise DataError(f"{yp} has {n_labels} labels but {xp} has {n} images: one of them is truncated or "
                            f"from another release; extract both again from {ARCHIVE}")
        y = np.fromfile(yp, dtype=np.uint8)
        if n and (y.min() < 1 or y.max() > len(names)):
            raise DataError(f"{yp}: labels {int(y.min())}..{int(y.max())}, expected 1..{len(names)} "
                            f"(one for each line of class_names.txt); the file is corrupt")
        out[f"{split}_x"] = stl10_images_from_binary(np.fromfile(xp, dtype=np.uint8))
        out[f"{split}_y"] = y.astype(np.int64) - 1
    return out


def extract_stl10(archive: str | Path, dest: str | Path, members: tuple[str, ...] = _MEMBERS) -> Path:
    """Extract ``members`` of ``stl10_binary.tar.gz`` into ``dest/stl10_binary`` (default: the labelled ones;
    ``unlabeled_X.bin``, 2.6 GB, only when asked for). Each file is written under a temporary name and
    renamed, so an interrupted extraction leaves no half file under the final name.
    """
    archive, out = Path(archive), Path(dest) / FOLDER
    out.mkdir(parents=True, exist_ok=True)
    wanted = set(members)
    try:
        with tarfile.open(archive, "r|gz") as tf:  # one pass over the stream
            for member in tf:
                name = os.path.basename(member.name)
                if not member.isfile() or name not in wanted:
                    continue
                if member.size > _member_limit(name):
                    raise DataError(f"{archive}: member {member.name} claims {member.size:,} bytes, expected at "
                                    f"most {_member_limit(name):,}: it is not the STL-10 binary release ({URL}); "
                                    "delete it and download it again")
                src = tf.extractfile(member)
                part = out / f".{name}.part"
                with open(part, "wb") as f:
                    while block := src.read(1 << 20):
                        f.write(block)
                os.replace(part, out / name)
                wanted.discard(name)
                if not wanted:
                    break
    except (tarfile.TarError, EOFError, OSError) as e:
        raise DataError(f"{archive}: cannot extract it ({e}); delete it and download it again") from None
    missing = wanted - {"fold_indices.txt"}
    if missing:
        raise DataError(f"{archive} has no {', '.join(sorted(missing))}: it is not the STL-10 binary release "
                        f"({URL})")
    return out


def _image_folder_of(root: Path, split: str) -> Path | None:
    """``root/<split>`` or (train only) ``root`` if it holds class folders named as STL-10/CIFAR-10 classes."""
    known = set(STL10_CLASSES) | set(CIFAR10_CLASSES)

    def has_classes(d: Path) -> bool:
        return d.is_dir() and any(p.is_dir() and p.name in known for p in d.iterdir())

    if has_classes(root / split):
        return root / split
    if split == "train" and has_classes(root):
        return root
    return None


def _stl_to_cifar_labels(names: list[str], where: Path) -> np.ndarray:
    """For each STL-10 label, its CIFAR-10 index (-1: dropped)."""
    table = []
    for name in names:
        if name in STL10_TO_CIFAR10:
            table.append(CIFAR10_CLASSES.index(STL10_TO_CIFAR10[name]))
        elif name == "monkey":
            table.append(-1)
        else:
            raise DataError(f"{where}: class {name!r} is not an STL-10 class ({' '.join(STL10_CLASSES)})")
    return np.asarray(table, dtype=np.int64)


def resize_images(x: np.ndarray, size: tuple[int, int] | None, resample: str = "lanczos") -> np.ndarray:
    """uint8 images [n, H, W(, C)] resized to (height, width) = ``size`` with Pillow."""
    if size is None or tuple(x.shape[1:3]) == tuple(size):
        return x
    out = np.empty((len(x), size[0], size[1], *x.shape[3:]), dtype=np.uint8)
    for i, img in enumerate(x):
        out[i] = np.asarray(resize_image(Image.fromarray(img), size, resample))
    return out


def load_stl10_as_cifar10(root: str | Path, *, split: str = "train", size: tuple[int, int] | None = (32, 32),
                          per_class: int | None = None, seed: int = 0, download: bool = False,
                          resample: str = "lanczos", workers: int | None = None) -> ImageSet:
    """STL-10's 9 CIFAR-10 classes, labelled with CIFAR-10 indices, resized to ``size``.

    ``root`` holds one of (looked for in this order):

    - ``stl10_binary/`` with the publisher's .bin files (or ``root`` is that folder);
    - ``stl10_binary.tar.gz`` (checked against its md5, then its labelled files are
      extracted to ``root/stl10_binary``);
    - an image folder ``root/<split>/<class>/*`` or, for ``split="train"``, ``root/<class>/*``
      (class folders named as STL-10's or CIFAR-10's classes; "monkey" is skipped);
    - nothing, with ``download=True``: the archive is downloaded from the publisher.

    ``class_names`` of the result is CIFAR-10's list (frog has no samples); ``per_class``
    keeps at most that many images per class, drawn with ``seed``; ``size`` is (height,
    width), None keeps 96x96.
    """
    root = Path(root)
    if split not in _SPLITS:
        raise DataError(f"split = {split!r}: expected 'train' or 'test'")
    if resample not in RESAMPLE:
        raise DataError(f"resample = {resample!r}: expected one of {', '.join(RESAMPLE)}")
    size = None if size is None else (int(size[0]), int(size[1]))
    d = _binary_dir(root)
    if d is None and (download or (root / ARCHIVE).is_file()):
        if _image_folder_of(root, split) is None or (root / ARCHIVE).is_file():
            archive = fetch(URL, root / ARCHIVE, f"md5:{MD5}")
            d = extract_stl10(archive, root)
    if d is None:
        folder = _image_folder_of(root, split)
        if folder is None:
            hint = f"{root}/<class>/ or " if split == "train" else ""
            raise DataError(f"{root}: no STL-10 data for split {split!r}; expected {root / FOLDER}/ (binary), "
                            f"{root / ARCHIVE}, or image folders {hint}{root / split}/<class>/; "
                            f"or {download_hint()}")
        return load_image_folder(folder, class_names=CIFAR10_CLASSES, aliases={"car": "automobile"},
                                 ignore=["monkey"], size=size, mode="RGB", per_class=per_class, seed=seed,
                                 workers=workers, resample=resample)

    xp, yp = d / f"{split}_X.bin", d / f"{split}_y.bin"
    for p in (xp, yp):
        if not p.is_file():
            raise DataError(f"{p}: missing; extract it from the publisher's {ARCHIVE}")
    names = _read_class_names(d)
    recipe = {"v": _CACHE_VERSION, "x": file_fingerprint(xp), "y": file_fingerprint(yp), "names": names,
              "size": size, "per_class": per_class, "seed": seed if per_class is not None else 0,
              "resample": resample if size is not None else None}

    def build() -> dict[str, np.ndarray]:
        raw = read_stl10_binary(d, splits=(split,))
        table = _stl_to_cifar_labels(raw["class_names"], d / "class_names.txt")
        y = table[raw[f"{split}_y"]]
        keep = np.flatnonzero(y >= 0)
        keep = keep[per_class_subset(y[keep], per_class, seed)]
        return {"x": resize_images(raw[f"{split}_x"][keep], size, resample), "y": y[keep]}

    a = cached_arrays("stl10_cifar10", recipe, build)
    return ImageSet(a["x"], a["y"].astype(np.int64, copy=False), list(CIFAR10_CLASSES))


def server_set(d, train: ImageSet, seed: int, root: Path | None) -> ImageSet:
    """The registry's D0 source ``data.server_dataset = 'stl10'`` (``fedsl.data.registry``): STL-10's labelled
    training images on CIFAR-10's labels, resized to the clients' images; ``root``: the STL-10 folder located."""
    if d.dataset != "cifar10":
        raise DataError(f"data.server_dataset = 'stl10' maps STL-10 onto CIFAR-10's labels; "
                        f"data.dataset is {d.dataset!r}")
    return load_stl10_as_cifar10(root, size=train.x.shape[1:3], per_class=d.server_per_class, seed=seed,
                                 download=d.download)


def unlabelled_set(d, train: ImageSet, seed: int, root: Path | None) -> ImageSet:
    """The registry's unlabelled source ``data.unlabelled = 'stl10_unlabelled'`` (``fedsl.data.registry``): STL-10's
    unlabelled images (``unlabeled_X.bin`` of the publisher's binary release, 100,000 of them), resized to the
    clients' colour images; every label -1 (there are none). ``data.unlabelled_size`` of them (0: all), drawn once
    from (seed, ``UNLABELLED``) before any is decoded; ``root``: the STL-10 folder located.

    With ``data.download`` (or the archive in ``root``) the archive's ``unlabeled_X.bin`` is extracted.
    """
    shape = train.x.shape[1:]
    if len(shape) != 3 or shape[2] != 3:
        raise DataError(f"data.unlabelled = 'stl10_unlabelled' has colour images, and data.dataset = {d.dataset!r} "
                        "has grey ones: expected a dataset of RGB images")
    root = Path(root) if root is not None else Path(".")
    path = next((p / UNLABELLED_FILE for p in (root / FOLDER, root) if (p / UNLABELLED_FILE).is_file()), None)
    if path is None and (d.download or (root / ARCHIVE).is_file()):
        path = extract_stl10(fetch(URL, root / ARCHIVE, f"md5:{MD5}"), root, (UNLABELLED_FILE,)) / UNLABELLED_FILE
    if path is None:
        raise DataError(f"{root / FOLDER / UNLABELLED_FILE}: STL-10's unlabelled images not found; put "
                        f"{ARCHIVE} (its {UNLABELLED_FILE}, 2.6 GB, is extracted) or the extracted file there, or "
                        f"{download_hint()}")
    n_bytes = path.stat().st_size
    if n_bytes % IMAGE_BYTES or n_bytes // IMAGE_BYTES > MAX_IMAGES:
        raise DataError(f"{path} has {n_bytes:,} bytes: expected whole 3x96x96 images ({IMAGE_BYTES} bytes each), at "
                        f"most {MAX_IMAGES:,}; extract it again from {ARCHIVE}")
    n = n_bytes // IMAGE_BYTES
    size = d.unlabelled_size or n
    if size > n:
        raise DataError(f"data.unlabelled_size = {size}: {path} holds only {n:,} images")
    pick = np.sort(rng(seed, UNLABELLED).permutation(n)[:size]) if size < n else np.arange(n)
    # the file's identity by size and time, not a checksum: hashing 2.6 GB would cost more than the decoding it saves
    stat = path.stat()
    recipe = {"v": 1, "file": [str(path.resolve()), n_bytes, stat.st_mtime_ns], "size": size,
              "seed": seed if size < n else 0, "side": [int(shape[0]), int(shape[1])]}

    def build() -> dict[str, np.ndarray]:
        raw = np.memmap(path, dtype=np.uint8, mode="r", shape=(n, IMAGE_BYTES))
        return {"x": resize_images(stl10_images_from_binary(np.asarray(raw[pick])), (shape[0], shape[1]))}

    x = cached_arrays("stl10_unlabelled", recipe, build)["x"]
    return ImageSet(x, np.full(len(x), -1, dtype=np.int64), list(train.class_names))
