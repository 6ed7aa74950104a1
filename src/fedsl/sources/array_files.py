"""Your own features and labels from one ``.npz`` file: ``data.dataset = 'arrays'``.

The layout: one ``.npz`` (``np.savez`` or ``np.savez_compressed``) holding exactly

- ``x_train`` [n, ...]: the training features, one row per sample, of any shape per sample: [n, d] (tabular),
  [n, C, H, W] (images laid out as torch lays them out), ...; any real dtype (float, integer, bool), kept as
  float32, every value finite;
- ``y_train`` [n]: their labels, integers 0..K-1;
- ``x_test`` [m, ...] (each sample shaped as ``x_train``'s) and ``y_test`` [m]: the test split;
- optionally ``class_names`` [K]: the classes' names (strings); K is their number. Without it K is the largest
  label + 1 and the classes are named '0'..'K-1'.

``data.data_dir`` names the file, or a folder holding ``arrays.npz`` (else ``$FEDSL_DATA_DIR``, else
``~/.cache/fedsl/data``, as for every dataset), relative to the working directory. Nothing is unpickled:
the file is read with ``allow_pickle=False``, and an array of Python objects is refused before any data is read.
Every bad file is refused in one line naming the file, the key and what is expected.

Inputs (``data.normalize``): 'standardize' (the default) takes each feature's mean and std over the training split
(axis 1 is the feature: a column of [n, d], a channel of [n, C, H, W]) and standardises the clients' samples, D0 and
the test set with them; 'unit' leaves the features as they are (there are no pixels to divide by 255). The
partitions ('classes', 'dirichlet', 'shards', 'iid') and D0's sources 'iid' and 'clients' read only the labels, as
for every dataset; D0 (or the unlabelled data U) from another file is ``data.server_dataset = 'arrays'`` with
``data.server_data_dir`` naming it (``server_set``): its ``x_train`` and ``y_train``.
"""

from __future__ import annotations

import zipfile
from pathlib import Path

import numpy as np

from fedsl.core.errors import DataError
from fedsl.sources.arrays import ArrayDataset, ImageSet

FILE = "arrays.npz"  # the file looked for in a folder
KEYS = ("x_train", "y_train", "x_test", "y_test")
OPTIONAL = ("class_names",)
LAYOUT = "an .npz of x_train [n, ...], y_train [n], x_test [m, ...], y_test [m] (np.savez)"


def check_config(d) -> str | None:
    """The registry's config check of ``data.dataset = 'arrays'`` (one line), or None: D0 and U from another
    source must be features too, from an .npz of their own."""
    for key, source, used in (("server_dataset", d.server_dataset, d.server_source == "dataset"),
                              ("unlabelled", d.unlabelled, d.unlabelled != "server")):
        if used and source != "arrays":
            return (f"data.{key} = {source!r} gives images, but data.dataset = 'arrays' gives features: expected "
                    f"data.{key} = 'arrays' (another .npz, named by data.server_data_dir)"
                    + (" or data.server_source 'iid' or 'clients'" if key == "server_dataset" else " or 'server'"))
        if used and not d.server_data_dir:
            return (f"data.{key} = 'arrays' reads an .npz of its own: expected data.server_data_dir = its path "
                    "(its x_train and y_train are read)")
    return None


def npz_path(root: Path) -> Path:
    """The file at ``root``: ``root`` itself, or ``root/arrays.npz`` when ``root`` is a folder."""
    return root / FILE if root.is_dir() else root


def _headers(path: Path, setting: str) -> dict[str, tuple[tuple[int, ...], np.dtype]]:
    """Each array's (shape, dtype) in the .npz at ``path``, from its header alone: no data read, no object
    unpickled, nothing allocated that a damaged header asks for."""
    if not path.is_file():
        raise DataError(f"{setting} = {str(path)!r}: no such file: expected {LAYOUT}, or a folder holding {FILE}")
    out = {}
    try:
        with zipfile.ZipFile(path) as zf:
            for info in zf.infolist():
                name = info.filename.removesuffix(".npy")
                with zf.open(info) as f:
                    version = np.lib.format.read_magic(f)
                    read = (np.lib.format.read_array_header_1_0 if version == (1, 0)
                            else np.lib.format.read_array_header_2_0)
                    shape, _fortran, dtype = read(f)
                    if not dtype.hasobject and info.compress_type == zipfile.ZIP_STORED and \
                            f.tell() + int(np.prod(shape, dtype=object)) * dtype.itemsize != info.file_size:
                        raise ValueError(f"{name}'s header says {shape} {dtype}, more or less than it holds")
                out[name] = (tuple(shape), dtype)
    except (zipfile.BadZipFile, ValueError, OSError, EOFError) as e:
        raise DataError(f"{setting} = {str(path)!r} is not a readable .npz ({type(e).__name__}: {e}): expected "
                        f"{LAYOUT}") from None
    return out


def _check_header(where: str, name: str, shape: tuple[int, ...], dtype: np.dtype) -> None:
    """Array ``name``'s dtype and shape, as the layout wants them (``where``: the file or source, for the
    message)."""
    where = f"{where}: {name}"
    if dtype.hasobject:
        raise DataError(f"{where} holds Python objects (dtype object: a pickle, never loaded): expected numbers "
                        "(np.asarray(..., dtype=np.float32) before np.savez)")
    if name.startswith("x_"):
        if dtype.kind not in "fiub":
            raise DataError(f"{where} has dtype {dtype}: expected real numbers (float, integer or bool features)")
        if len(shape) < 2:
            raise DataError(f"{where} has shape {shape}: expected one row per sample, [n, d] features or "
                            "[n, C, H, W] (a single feature is [n, 1])")
    elif name.startswith("y_"):
        if dtype.kind not in "iu":
            raise DataError(f"{where} has dtype {dtype}: expected integer labels 0..K-1 (e.g. "
                            "y.astype(np.int64))")
        if len(shape) != 1:
            raise DataError(f"{where} has shape {shape}: expected [n], one integer label per sample")
    elif name == "class_names" and (dtype.kind != "U" or len(shape) != 1):
        raise DataError(f"{where} has dtype {dtype} and shape {shape}: expected [K] strings, one name per class "
                        "(np.array(['cat', 'dog']))")


def read(root: Path, setting: str = "data.data_dir", keys: tuple[str, ...] = KEYS) -> dict[str, np.ndarray]:
    """The arrays ``keys`` (and ``class_names``, when there) of the .npz at ``root`` (``npz_path``), their
    headers checked first; ``setting`` names where the path came from, for the messages. Keys of ``KEYS`` that
    are not asked for may be absent; any other key is refused."""
    path = npz_path(Path(root).expanduser())
    headers = _headers(path, setting)
    unknown = [k for k in headers if k not in (*KEYS, *OPTIONAL)]
    if unknown:
        raise DataError(f"{setting} = {str(path)!r} holds {', '.join(map(repr, unknown))}: expected only the keys "
                        f"{', '.join(KEYS + OPTIONAL)}")
    missing = [k for k in keys if k not in headers]
    if missing:
        raise DataError(f"{setting} = {str(path)!r} has no {', '.join(map(repr, missing))} (it holds "
                        f"{', '.join(map(repr, headers)) or 'nothing'}): expected {LAYOUT}")
    for name, (shape, dtype) in headers.items():
        _check_header(f"{setting} = {str(path)!r}", name, shape, dtype)
    wanted = [k for k in (*keys, *OPTIONAL) if k in headers]
    try:
        with np.load(path, allow_pickle=False) as z:
            return {k: z[k] for k in wanted}
    except (ValueError, OSError, EOFError, zipfile.BadZipFile) as e:
        raise DataError(f"{setting} = {str(path)!r} is not a readable .npz ({type(e).__name__}: {e}): expected "
                        f"{LAYOUT}") from None


def _split(x: np.ndarray, y: np.ndarray, names: list[str], where: str, split: str) -> ImageSet:
    """One split, checked: as many labels as samples, at least one, labels 0..K-1 (K = ``len(names)``), features
    finite; features as C-contiguous float32, labels as int64."""
    if len(x) != len(y):
        raise DataError(f"{where}: x_{split} has {len(x)} samples and y_{split} {len(y)} labels: expected one "
                        "label per sample")
    if not len(y):
        raise DataError(f"{where}: x_{split} has no sample: expected at least one")
    if y.min() < 0 or y.max() >= len(names):
        bad = int(y.min()) if y.min() < 0 else int(y.max())
        raise DataError(f"{where}: y_{split} holds label {bad}: expected labels 0..{len(names) - 1} "
                        f"(K = {len(names)} classes)")
    x = np.ascontiguousarray(x, dtype=np.float32)
    bad_values = ~np.isfinite(x)
    if bad_values.any():
        row = int(np.flatnonzero(bad_values.reshape(len(x), -1).any(axis=1))[0])
        raise DataError(f"{where}: x_{split} holds {int(bad_values.sum())} NaN or infinite values (the first in "
                        f"sample {row}): expected finite features (drop or impute those samples first)")
    return ImageSet(x, y.astype(np.int64), list(names))


def from_arrays(x_train, y_train, x_test, y_test, class_names=None, where: str = "arrays") -> ArrayDataset:
    """The dataset of numpy arrays (``LAYOUT``), checked: features [n, ...] of real numbers, all finite, as
    float32; labels [n] integers 0..K-1, as int64 (K = ``len(class_names)``, else the largest label + 1); the test
    split's samples shaped as the training split's. ``where`` names the source in the messages (e.g. the file).

    Raises:
        DataError: one line naming the array and what is expected.
    """
    arrays = {k: np.asarray(v) for k, v in
              {"x_train": x_train, "y_train": y_train, "x_test": x_test, "y_test": y_test}.items()}
    for name, a in arrays.items():
        _check_header(where, name, a.shape, a.dtype)
    if arrays["x_test"].shape[1:] != arrays["x_train"].shape[1:]:
        raise DataError(f"{where}: x_test's samples have shape {arrays['x_test'].shape[1:]}, x_train's "
                        f"{arrays['x_train'].shape[1:]}: expected the same")
    if class_names is not None:
        names = [str(c) for c in np.asarray(class_names).tolist()]
        if not names or len(set(names)) != len(names) or not all(names):
            raise DataError(f"{where}: class_names = {names[:10]}: expected distinct, non-empty names, one per "
                            "class")
    else:  # K from the labels; a negative one is refused by _split
        top = max(int(arrays["y_train"].max(initial=0)), int(arrays["y_test"].max(initial=0)))
        names = [str(c) for c in range(top + 1)]
    return ArrayDataset(_split(arrays["x_train"], arrays["y_train"], names, where, "train"),
                        _split(arrays["x_test"], arrays["y_test"], names, where, "test"))


def load(d, root: Path) -> ArrayDataset:
    """The registry's loader of ``data.dataset = 'arrays'``: the .npz at ``root`` (``data.data_dir``: the file, or a
    folder holding ``arrays.npz``), checked (``from_arrays``)."""
    z = read(root)
    return from_arrays(z["x_train"], z["y_train"], z["x_test"], z["y_test"], z.get("class_names"),
                       where=f"data.data_dir = {str(npz_path(Path(root).expanduser()))!r}")


def server_set(d, train: ImageSet, seed: int, root: Path | None) -> ImageSet:
    """The registry's D0 source ``data.server_dataset = 'arrays'``: ``x_train`` and ``y_train`` of the .npz that
    ``data.server_data_dir`` names, labelled with the clients' classes (its ``class_names``, if any, must be
    theirs; its labels index them); ``x_test`` and ``y_test`` there are not read and may be absent."""
    if not d.server_data_dir:
        raise DataError("data.server_dataset = 'arrays' reads an .npz of its own: expected data.server_data_dir = "
                        "its path (its x_train and y_train are read)")
    if train.x.dtype.kind != "f":
        raise DataError("data.server_dataset = 'arrays' gives features, but the clients' data are images or text: "
                        "expected data.dataset = 'arrays'")
    path = npz_path(Path(d.server_data_dir).expanduser())
    where = f"data.server_data_dir = {str(path)!r}"
    z = read(path, "data.server_data_dir", keys=("x_train", "y_train"))
    if "class_names" in z and [str(c) for c in z["class_names"].tolist()] != list(train.class_names):
        raise DataError(f"{where}: class_names = {z['class_names'].tolist()[:10]}: expected the clients' "
                        f"{list(train.class_names)[:10]}, in their order")
    if z["x_train"].shape[1:] != train.x.shape[1:]:
        raise DataError(f"{where}: x_train's samples have shape {z['x_train'].shape[1:]}, the clients' "
                        f"{train.x.shape[1:]}: expected the same")
    return _split(z["x_train"], z["y_train"], list(train.class_names), where, "train")
