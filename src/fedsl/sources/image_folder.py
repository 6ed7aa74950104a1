"""Image folders ("ImageFolder" layout: one sub-folder per class) as uint8 arrays.

``load_image_folder(root)`` reads ``root/<class>/<any name>`` (any format Pillow reads;
files and folders whose name starts with "." are skipped, sub-folders of a class folder
are searched too) into an :class:`ImageSet`: [n, H, W] for grey, [n, H, W, 3] for colour,
ordered by label, then by file path.

- ``class_names`` aligns the labels to another dataset's label order (e.g. CIFAR-10's):
  a folder gets the index of its name (after ``aliases``) in ``class_names``; classes with
  no folder have no samples; a folder that is neither a class nor in ``ignore`` is an error.
- ``size=(height, width)`` resizes every image whose size differs (see ``RESAMPLE`` for the
  filter); without it all images must have one size.
- ``per_class`` keeps a seeded random subset of at most that many files per class, drawn
  before decoding (only the kept files are decoded).
- A class folder with no image is an error (it would leave a class without samples, which
  C-class partitions and class-conditional statistics do not expect); a class that has no
  folder at all is allowed only when ``class_names`` names it. ``load_image_folder_dataset``
  warns (``DataWarning``) when a split has no image of some class.
- Nothing is decoded that Pillow's decompression-bomb check (``Image.MAX_IMAGE_PIXELS``)
  refuses or warns about: such an image is a ``DataError`` naming it. Without ``size``, a
  folder whose decoded images would not fit in this machine's memory is refused before
  decoding.

Decoding runs in worker processes (decoding a 32x32 JPEG is mostly Python code in Pillow's
header parsing that holds the GIL, so threads gain little and processes scale with the
cores). The decoded arrays are cached on disk (``cached_arrays``), keyed on the
folder's file list, sizes and modification times and on the options, so the next load
of an unchanged folder only reads one .npz file.
"""

from __future__ import annotations

import contextlib
import multiprocessing
import os
import sys
import warnings
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from pathlib import Path
from typing import Iterable, Literal, Sequence

import numpy as np
from PIL import Image, ImageOps

from fedsl.core.errors import DataError, warn_missing_classes
from fedsl.core.rng import per_label
from fedsl.sources.arrays import ArrayDataset, ImageSet, cached_arrays, folder_fingerprint

Mode = Literal["L", "RGB"]

# Resampling filters by name (``resample=``). The default, LANCZOS, is Pillow's
# antialiased windowed sinc: when shrinking, Pillow widens the kernel by the scale factor,
# so every source pixel contributes (no aliasing, as with BOX), while the result stays
# sharper than BOX's plain area average, which blurs -- at 32x32 (e.g. STL-10's 96x96 ->
# CIFAR-10's 32x32) there is little detail to spare. Its slight ringing at hard edges is
# the price. "box" (exact area average for integer factors such as 96 -> 32), "bilinear"
# and "bicubic" (both antialiased in Pillow, as torchvision's Resize(antialias=True)) can
# be chosen instead.
RESAMPLE = {
    "lanczos": Image.Resampling.LANCZOS,
    "box": Image.Resampling.BOX,
    "bilinear": Image.Resampling.BILINEAR,
    "bicubic": Image.Resampling.BICUBIC,
}

# Pillow modes that hold no colour (converted to "L" when the folder is all grey).
_GREY_MODES = frozenset({"1", "L", "LA", "La", "I", "I;16", "I;16B", "I;16L", "I;16N", "F"})

# Below this many files the worker processes cost more than they save.
_PARALLEL_MIN_FILES = 512

_CACHE_VERSION = 1


# --------------------------------------------------------------------------- scanning

def _visible(name: str) -> bool:
    return not name.startswith(".")


def _class_folders(root: Path) -> list[str]:
    """Names of the visible sub-folders of ``root`` (files at the top level are not classes)."""
    if not root.is_dir():
        raise DataError(f"{root}: no such folder; give the folder that holds one sub-folder per class")
    return sorted(p.name for p in root.iterdir() if p.is_dir() and _visible(p.name))


def _has_file(folder: Path) -> bool:
    """Whether ``folder`` holds a visible file (recursively, hidden folders skipped); stops at the first."""
    for _dirpath, dirnames, filenames in os.walk(folder):
        dirnames[:] = [d for d in dirnames if _visible(d)]
        if any(_visible(f) for f in filenames):
            return True
    return False


def _check_not_empty(root: Path, mapping: dict[str, int]) -> None:
    empty = [f for f in sorted(mapping) if not _has_file(root / f)]
    if empty:
        raise DataError(f"{root / empty[0]}: class folder {empty[0]!r} holds no images"
                        f"{f' (nor do {empty[1:]})' if len(empty) > 1 else ''}; expected at least one image per "
                        f"class folder: add images, remove the folder, or skip it with ignore=[{empty[0]!r}]")


def _files_of(folder: Path) -> list[str]:
    """Every visible file under ``folder`` (recursively, hidden folders skipped), sorted."""
    out = []
    for dirpath, dirnames, filenames in os.walk(folder):
        dirnames[:] = [d for d in dirnames if _visible(d)]
        out.extend(os.path.join(dirpath, f) for f in filenames if _visible(f))
    return sorted(out)


def _label_map(root: Path, folders: Sequence[str], class_names: Sequence[str] | None,
               aliases: dict[str, str], ignore: Iterable[str]) -> tuple[list[str], dict[str, int]]:
    """(class names, {folder: label}) for the folders of ``root``."""
    ignore = set(ignore)
    kept = [f for f in folders if f not in ignore and aliases.get(f, f) not in ignore]
    if class_names is None:
        names = sorted({aliases.get(f, f) for f in kept})
    else:
        names = list(class_names)
        if len(set(names)) != len(names):
            raise DataError(f"class_names = {names}: each name must appear once")
    index = {n: i for i, n in enumerate(names)}
    mapping: dict[str, int] = {}
    taken: dict[int, str] = {}
    for folder in kept:
        name = aliases.get(folder, folder)
        if name not in index:
            raise DataError(
                f"{root / folder}: folder {folder!r} is not one of the classes ({', '.join(names)}); rename it, "
                f"map it with aliases={{{folder!r}: '<class>'}}, or skip it with ignore=[{folder!r}]")
        label = index[name]
        if label in taken:
            raise DataError(f"{root}: folders {taken[label]!r} and {folder!r} are both class {name!r}; "
                            f"rename one of them or skip it with ignore=[...]")
        taken[label] = folder
        mapping[folder] = label
    return names, mapping


def per_class_subset(labels: np.ndarray, per_class: int | None, seed: int) -> np.ndarray:
    """Sorted indices keeping at most ``per_class`` random samples of each label.

    Each label draws from its own generator (seeded with (seed, label)), so the pick for
    one class does not depend on which other classes are present.
    """
    labels = np.asarray(labels)
    if per_class is None:
        return np.arange(len(labels))
    if per_class < 0:
        raise DataError(f"per_class = {per_class}: expected a number of samples >= 0 (or None for all)")
    keep = []
    for label in np.unique(labels):
        idx = np.flatnonzero(labels == label)
        if len(idx) > per_class:
            rng = per_label(seed, int(label))
            idx = np.sort(rng.choice(idx, size=per_class, replace=False))
        keep.append(idx)
    return np.sort(np.concatenate(keep)) if keep else np.zeros(0, dtype=np.int64)


# --------------------------------------------------------------------------- decoding

def _open_error(path: str, e: Exception) -> DataError:
    if isinstance(e, (Image.DecompressionBombError, Image.DecompressionBombWarning)):
        return DataError(f"{path}: too many pixels to decode safely ({e}); expected at most "
                         f"{Image.MAX_IMAGE_PIXELS:,} pixels (Pillow's Image.MAX_IMAGE_PIXELS): shrink the image "
                         "or remove it from the class folder")
    return DataError(f"{path}: not an image Pillow can read ({type(e).__name__}: {e}); "
                     "remove it from the class folder or move it elsewhere")


# What a decoding error can be: Pillow's decompression-bomb warning is made an error
# (``_bombs_are_errors``) so that an image above Image.MAX_IMAGE_PIXELS is never decoded.
_DECODE_ERRORS = (OSError, SyntaxError, ValueError, Image.DecompressionBombError, Image.DecompressionBombWarning)


@contextlib.contextmanager
def _bombs_are_errors():
    """A context in which Pillow's DecompressionBombWarning is raised, not printed (then decoded)."""
    with warnings.catch_warnings():
        warnings.simplefilter("error", Image.DecompressionBombWarning)
        yield


def _header(path: str) -> tuple[tuple[int, int], str]:
    """(size as Pillow's (width, height) after EXIF rotation, mode) without decoding pixels."""
    try:
        with _bombs_are_errors(), Image.open(path) as im:
            w, h = im.size
            if im.getexif().get(0x0112, 1) in (5, 6, 7, 8):  # rotated by 90 degrees
                w, h = h, w
            return (w, h), im.mode
    except _DECODE_ERRORS as e:
        raise _open_error(path, e) from None


def resize_image(im: Image.Image, size_hw: tuple[int, int], resample: str = "lanczos") -> Image.Image:
    """``im`` resized to (height, width) = ``size_hw`` with the named filter (unchanged if equal)."""
    h, w = size_hw
    if im.size == (w, h):
        return im
    return im.resize((w, h), RESAMPLE[resample])


def _decode_one(path: str, size_hw: tuple[int, int] | None, mode: str | None, resample: str,
                expect: tuple[tuple[int, int], str] | None) -> tuple[np.ndarray, bool]:
    """One image as uint8 [H, W] (mode L) or [H, W, 3] (RGB, also for mode None); colour flag.

    Call it inside ``_bombs_are_errors()`` (as ``_decode_chunk`` does).
    """
    try:
        with Image.open(path) as im:
            if size_hw is not None and im.format == "JPEG":
                # Let libjpeg shrink big JPEGs by 1/2..1/8 while decoding, leaving >= 2x the
                # target for the resampling filter (a no-op for images smaller than that).
                im.draft(im.mode, (2 * size_hw[1], 2 * size_hw[0]))
            colour = im.mode not in _GREY_MODES
            if im.getexif().get(0x0112, 1) != 1:
                im = ImageOps.exif_transpose(im)
            target = mode or "RGB"
            if im.mode != target:
                im = im.convert(target)
            else:
                im.load()
            if size_hw is not None:
                im = resize_image(im, size_hw, resample)
            elif expect is not None and im.size != expect[0]:
                (w, h), (ew, eh) = im.size, expect[0]
                raise DataError(
                    f"{path} is {w}x{h} pixels (width x height) but {expect[1]} is {ew}x{eh}: images of "
                    f"different sizes need size=(height, width) to resize them all to one size")
            return np.asarray(im), colour
    except DataError:
        raise
    except _DECODE_ERRORS as e:
        raise _open_error(path, e) from None


def _decode_chunk(paths: list[str], size_hw, mode, resample, expect) -> tuple[np.ndarray, np.ndarray]:
    """Images of ``paths`` stacked, and which of them were colour (run in a worker process)."""
    arrays, colour = [], []
    with _bombs_are_errors():
        for p in paths:
            a, c = _decode_one(p, size_hw, mode, resample, expect)
            arrays.append(a)
            colour.append(c)
    return np.stack(arrays), np.asarray(colour, dtype=bool)


def _memory_bytes() -> int:
    """This machine's physical memory in bytes (0 where unknown)."""
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (AttributeError, ValueError, OSError):  # not on this platform
        return 0


def default_workers() -> int:
    """CPU cores this process may use (at most 16)."""
    try:
        n = len(os.sched_getaffinity(0))
    except AttributeError:  # macOS, Windows
        n = os.cpu_count() or 1
    return max(1, min(n, 16))


def _mp_context():
    # fork starts a worker without re-importing anything; spawn/forkserver would re-import
    # fedsl and torch in each worker. macOS and Windows keep their default (fork is unsafe there).
    if sys.platform.startswith("linux"):
        return multiprocessing.get_context("fork")
    return multiprocessing.get_context()


def decode_images(paths: Sequence[str], *, size: tuple[int, int] | None = None, mode: Mode | None = None,
                  resample: str = "lanczos", workers: int | None = None) -> np.ndarray:
    """Decode ``paths`` into one uint8 array, in parallel worker processes when it pays.

    ``size`` is (height, width); without it every image must have the first one's size.
    ``mode`` None gives [n, H, W] if every image is grey, else [n, H, W, 3].
    """
    paths = [str(p) for p in paths]
    if not paths:
        h, w = size or (0, 0)
        return np.zeros((0, h, w) if mode == "L" else (0, h, w, 3), dtype=np.uint8)
    expect = None
    if size is None:
        expect = (_header(paths[0])[0], paths[0])
    (w, h), channels = (expect[0] if size is None else size[::-1]), (1 if mode == "L" else 3)
    need, have = len(paths) * w * h * channels, _memory_bytes()
    if have and need > have:  # decoded as RGB unless mode "L"; refuse before decoding any
        raise DataError(f"{len(paths):,} images of {w}x{h} pixels (width x height) need {need / 2**30:.1f} GiB "
                        f"decoded, more than this machine's {have / 2**30:.1f} GiB of memory (first: {paths[0]}); "
                        "expected them to fit: give size=(height, width) to shrink them while decoding")
    workers = default_workers() if workers is None else max(1, int(workers))
    workers = min(workers, max(1, len(paths) // (_PARALLEL_MIN_FILES // 2)))
    args = (size, mode, resample, expect)
    parts = None
    if workers > 1 and len(paths) >= _PARALLEL_MIN_FILES:
        n_chunks = workers * 4
        step = -(-len(paths) // n_chunks)
        chunks = [paths[i:i + step] for i in range(0, len(paths), step)]
        try:
            with ProcessPoolExecutor(max_workers=workers, mp_context=_mp_context()) as ex:
                futures = [ex.submit(_decode_chunk, c, *args) for c in chunks]
                try:
                    parts = [f.result() for f in futures]
                except DataError:
                    ex.shutdown(wait=True, cancel_futures=True)
                    raise
        except (BrokenProcessPool, OSError, NotImplementedError, AssertionError):
            # No worker processes here (a sandbox without semaphores, a daemonic process, a
            # killed worker): decode in this process (a real file error is raised there).
            parts = None
    if parts is None:
        parts = [_decode_chunk(paths, *args)]
    x = np.concatenate([p[0] for p in parts])
    colour = any(bool(p[1].any()) for p in parts)
    if mode is None and not colour:
        x = np.ascontiguousarray(x[..., 0])  # grey converted to RGB repeats one channel
    return x


# --------------------------------------------------------------------------- loaders

def _check_options(size, mode, resample) -> tuple[tuple[int, int] | None, str | None]:
    if mode not in (None, "L", "RGB"):
        raise DataError(f"mode = {mode!r}: expected 'L' (grey), 'RGB' (colour) or None (as the images are)")
    if resample not in RESAMPLE:
        raise DataError(f"resample = {resample!r}: expected one of {', '.join(RESAMPLE)}")
    if size is not None:
        try:
            h, w = (int(v) for v in size)
        except (TypeError, ValueError):
            raise DataError(f"size = {size!r}: expected (height, width) in pixels") from None
        if h < 1 or w < 1:
            raise DataError(f"size = {size!r}: expected (height, width) of at least 1 pixel")
        size = (h, w)
    return size, mode


def load_image_folder(root: str | Path, *, class_names: Sequence[str] | None = None,
                      aliases: dict[str, str] | None = None, ignore: Iterable[str] = (),
                      size: tuple[int, int] | None = None, mode: Mode | None = None,
                      per_class: int | None = None, seed: int = 0, workers: int | None = None,
                      resample: str = "lanczos", cache: bool = True) -> ImageSet:
    """The images of ``root/<class>/...`` as an :class:`ImageSet` (see the module docstring).

    ``class_names``: label order to align to (default: the sorted folder names, after
    ``aliases``). ``aliases``: folder name -> class name. ``ignore``: folder (or class)
    names to skip. ``size``: (height, width) to resize to. ``mode``: "L" or "RGB" (default:
    "L" if every image is grey, else "RGB"). ``per_class``: keep at most that many images
    per class, drawn with ``seed``. ``workers``: decoding processes (default: the cores;
    1: none). ``cache``: False skips the on-disk cache.
    """
    root = Path(root)
    size, mode = _check_options(size, mode, resample)
    aliases = dict(aliases or {})
    ignore = list(ignore)
    folders = _class_folders(root)
    names, mapping = _label_map(root, folders, class_names, aliases, ignore)
    if not mapping:
        raise DataError(f"{root}: no class folders (expected one sub-folder of images per class)")
    _check_not_empty(root, mapping)

    def build() -> dict[str, np.ndarray]:
        paths: list[str] = []
        labels: list[int] = []
        for folder, label in sorted(mapping.items(), key=lambda kv: kv[1]):
            files = _files_of(root / folder)
            paths.extend(files)
            labels.extend([label] * len(files))
        y = np.asarray(labels, dtype=np.int64)
        keep = per_class_subset(y, per_class, seed)
        paths = [paths[i] for i in keep]
        if not paths:
            raise DataError(f"{root}: the class folders hold no images")
        x = decode_images(paths, size=size, mode=mode, resample=resample, workers=workers)
        return {"x": x, "y": y[keep]}

    if not cache:
        a = build()
    else:
        recipe = {"v": _CACHE_VERSION, "files": folder_fingerprint(root), "folders": mapping, "names": names,
                  "size": size, "mode": mode, "per_class": per_class, "seed": seed if per_class is not None else 0,
                  "resample": resample if size is not None else None}
        a = cached_arrays("image_folder", recipe, build)
    return ImageSet(a["x"], a["y"].astype(np.int64, copy=False), names)


def load_image_folder_dataset(root: str | Path, *, class_names: Sequence[str] | None = None,
                              aliases: dict[str, str] | None = None, ignore: Iterable[str] = (),
                              train: str = "train", test: str = "test", **kw) -> ArrayDataset:
    """``root/train/<class>/...`` and ``root/test/<class>/...`` as an :class:`ArrayDataset`.

    Both splits share one label order: ``class_names``, or else the train split's sorted
    class folders (a test folder that is not one of them is an error). Other keywords go to
    :func:`load_image_folder` (``per_class`` applies to each split). A split without any
    image of some class (no folder for it) loads with a ``DataWarning`` naming the classes.
    """
    root = Path(root)
    for split in (train, test):
        if not (root / split).is_dir():
            raise DataError(f"{root / split}: no such folder; an image folder dataset needs "
                            f"{root / train}/<class>/... and {root / test}/<class>/...")
    aliases = dict(aliases or {})
    ignore = list(ignore)
    if class_names is None:
        class_names, _ = _label_map(root / train, _class_folders(root / train), None, aliases, ignore)
    common = dict(class_names=class_names, aliases=aliases, ignore=ignore, **kw)
    tr = load_image_folder(root / train, **common)
    te = load_image_folder(root / test, **common)
    warn_missing_classes(tr.y, tr.class_names, f"training split {root / train}",
                         "no client or server learns it, and class partitions use only the classes present")
    warn_missing_classes(te.y, te.class_names, f"test split {root / test}",
                         "the accuracy does not measure it")
    if tr.x.shape[1:] != te.x.shape[1:]:
        raise DataError(f"{root}: train images are {tr.x.shape[1:]} but test images are {te.x.shape[1:]} "
                        "(height, width, channels); give size=(height, width) and mode= to make them agree")
    return ArrayDataset(tr, te, classes_checked=True)


def is_split_folder(root: Path) -> bool:
    """Whether ``root`` has the train/ and test/ sub-folders of an image folder dataset."""
    return (root / "train").is_dir() and (root / "test").is_dir()


def load(d, root: Path) -> ArrayDataset:
    """The registry's loader of ``data.dataset = 'image_folder'`` (``fedsl.data.registry``)."""
    if not is_split_folder(root):
        raise DataError(f"data.data_dir = {str(root)!r}: expected train/<class>/ and test/<class>/ sub-folders")
    return load_image_folder_dataset(root)


def server_set(d, train: ImageSet, seed: int, root: Path | None) -> ImageSet:
    """The registry's D0 source ``data.server_dataset = 'image_folder'`` (``fedsl.data.registry``): the class
    folders of ``data.server_data_dir`` named as the clients' classes, as the clients' images."""
    if not d.server_data_dir:
        raise DataError("data.server_dataset = 'image_folder' needs data.server_data_dir: "
                        "a folder of class folders")
    shape = train.x.shape[1:]
    return load_image_folder(Path(d.server_data_dir).expanduser(), class_names=train.class_names, size=shape[:2],
                             mode="L" if len(shape) == 2 else "RGB", per_class=d.server_per_class, seed=seed)
