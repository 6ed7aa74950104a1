"""The publishers' idx file pairs (EMNIST, MNIST, Fashion-MNIST): found, decoded (cached), relabelled.

Shared by ``fedsl.data.emnist`` and ``fedsl.data.mnist``: files are looked for under their
official names in ``root`` itself, then in the dataset's own sub-folders of it, gzip-compressed
(``.gz``) or not; decoded arrays are cached (``fedsl.data.arrays.cached_arrays``), keyed by the
files' sha256 and the decoding options.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np

from fedsl.data.arrays import cached_arrays, file_fingerprint
from fedsl.data.errors import DataError
from fedsl.data.idx import read_idx

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
