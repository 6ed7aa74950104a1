"""LEAF's JSON layout (Caldas et al. 2018: FEMNIST as LEAF distributes it), read with json and numpy alone.

A LEAF folder holds ``train/*.json`` and ``test/*.json``; each file is ``{"users": [...], "num_samples": [...],
"user_data": {user: {"x": [...], "y": [...]}}}``: FEMNIST's x is a flat list of 784 floats in [0, 1] (a 28×28 grey
image, dark strokes on a white background 1.0, as LEAF writes it), y its class 0..61 (LEAF's relabelling of NIST's
classes: digits 0-9, then upper-case A-Z, then lower-case a-z).

What the loader returns, for ``data.partition = 'natural'`` (``fedsl.data.natural``):

- the images as uint8 [n, s, s], inverted to bright strokes on black, as EMNIST's and the font-rendered server
  sources' (FSLsyn) are: 255 - x·255 rounded (LEAF's floats are 8-bit pixels / 255, so nothing is lost; with
  standardised inputs a model sees the same images negated);
- labels int64; 28×28 images with labels in 0..61 are FEMNIST's 62 classes, named by their characters (so the
  character-drawing D0 sources, ``fslsyn`` and ``synthetic_chars``, can serve them); other data's classes are named
  by their number (0..L-1, L = the largest label + 1 over both splits);
- each training sample's user as ``ImageSet.owners``: client i is the i-th user name in sorted (string) order among
  the users with at least one training sample (``ImageSet.owner_names``); a user without training samples is
  dropped (a client with n_i = 0 has nothing to train on), its test samples too;
- the test split: every user's test samples pooled (LEAF's global test accuracy), each tagged with its user's
  client (-1 for a user with no training samples).

A user listed in several files of a split has its samples joined in file order (files sorted by name).

LEAF's Shakespeare (x a string of L = 80 characters, y the next one) is text: x becomes uint8 [n, L] indices into
LEAF's 80-character vocabulary (``fedsl.sources.shakespeare.VOCABULARY``; another character is read as a space), y
the next character's index; the classes are that vocabulary's characters, and the text models read it
(``char_lstm``, ``char_lstm_small``). A folder holds images or text, not both; every window has one length.
Decoded arrays are cached (``cached_arrays``), keyed on the files' names, sizes and modification times.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np

from fedsl.core.errors import DataError
from fedsl.sources.arrays import ArrayDataset, ImageSet, cached_arrays, folder_fingerprint
from fedsl.sources.shakespeare import VOCABULARY, encode

_CACHE_VERSION = 2
FEMNIST_CLASSES = "0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz"  # LEAF's labels 0..61
LAYOUT = "LEAF's layout train/*.json and test/*.json, each {users, num_samples, user_data: {user: {x, y}}}"


def _split_files(root: Path, split: str) -> list[Path]:
    files = sorted((root / split).glob("*.json"))
    if not files:
        raise DataError(f"data.dataset = 'leaf': no {split}/*.json under {root}; expected {LAYOUT}")
    return files


def _user_arrays(path: Path, user: str, data: object) -> tuple[np.ndarray, np.ndarray]:
    """One user's images (uint8 [k, side²]) and labels (int64 [k]) from its ``user_data`` entry."""
    if not isinstance(data, dict) or not isinstance(data.get("x"), list) or not isinstance(data.get("y"), list):
        raise DataError(f"{path}: user {user!r} has no x and y lists; expected {LAYOUT}")
    xs, ys = data["x"], data["y"]
    if len(xs) != len(ys):
        raise DataError(f"{path}: user {user!r} has {len(xs)} x but {len(ys)} y; expected one label per sample")
    if xs and isinstance(xs[0], str):
        return _text_arrays(path, user, xs, ys)
    try:
        x = np.asarray(xs, dtype=np.float64)
        y = np.asarray(ys, dtype=np.float64)
    except (TypeError, ValueError):
        raise DataError(f"{path}: user {user!r}'s x is not a list of equal-length lists of numbers; expected "
                        "FEMNIST's 784 floats in [0, 1] per sample") from None
    if len(xs) == 0:
        return np.zeros((0, 0), dtype=np.uint8), np.zeros(0, dtype=np.int64)
    if x.ndim != 2 or math.isqrt(x.shape[1]) ** 2 != x.shape[1] or x.shape[1] == 0:
        raise DataError(f"{path}: user {user!r}'s samples have shape {x.shape[1:]}; expected flat square grey "
                        "images (FEMNIST: 784 = 28×28 floats)")
    if not np.all((x >= 0) & (x <= 1)):
        raise DataError(f"{path}: user {user!r} has pixel values outside [0, 1]; expected LEAF's floats in [0, 1]")
    if not np.all((y >= 0) & (y == np.floor(y))):
        raise DataError(f"{path}: user {user!r} has labels that are not integers >= 0; expected class numbers")
    return (255 - np.rint(x * 255)).astype(np.uint8), y.astype(np.int64)  # bright strokes on black, as EMNIST's


def _text_arrays(path: Path, user: str, xs: list, ys: list) -> tuple[np.ndarray, np.ndarray]:
    """One user's windows (uint8 [k, L] character indices) and next characters (int64 [k]): LEAF's Shakespeare."""
    if not all(isinstance(x, str) for x in xs) or not all(isinstance(y, str) and len(y) == 1 for y in ys):
        raise DataError(f"{path}: user {user!r}'s samples mix text and other values; expected LEAF's Shakespeare: x "
                        "strings of L characters, y one character each")
    lengths = {len(x) for x in xs}
    if len(lengths) != 1 or 0 in lengths:
        raise DataError(f"{path}: user {user!r}'s windows have lengths {sorted(lengths)[:4]}; expected one length L "
                        "> 0 (LEAF's Shakespeare: 80)")
    x = encode("".join(xs)).reshape(len(xs), lengths.pop())
    return x, encode("".join(ys)).astype(np.int64)


def _read_split(files: list[Path], kinds: set[bool]) -> dict[str, list[tuple[np.ndarray, np.ndarray]]]:
    """Every user's (images, labels) parts of one split, in file order; ``kinds`` gains whether each user's
    non-empty samples are text."""
    users: dict[str, list[tuple[np.ndarray, np.ndarray]]] = {}
    for path in files:
        try:
            with open(path) as f:
                doc = json.load(f)
        except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
            raise DataError(f"{path}: not readable JSON ({type(e).__name__}: {e}); expected {LAYOUT}") from None
        if not isinstance(doc, dict) or not isinstance(doc.get("users"), list) or \
                not isinstance(doc.get("user_data"), dict):
            raise DataError(f"{path}: no 'users' list and 'user_data' object; expected {LAYOUT}")
        counts = doc.get("num_samples")
        if counts is not None and (not isinstance(counts, list) or len(counts) != len(doc["users"])):
            raise DataError(f"{path}: 'num_samples' does not give one count per user; expected {LAYOUT}")
        for j, user in enumerate(doc["users"]):
            user = str(user)
            if user not in doc["user_data"]:
                raise DataError(f"{path}: user {user!r} is listed but has no user_data entry")
            x, y = _user_arrays(path, user, doc["user_data"][user])
            if len(y):
                text = isinstance(doc["user_data"][user]["x"][0], str)
                if kinds and text not in kinds:
                    raise DataError(f"{path}: user {user!r}'s samples are {'text' if text else 'images'}, earlier "
                                    f"users' {'images' if text else 'text'}; expected one kind in a LEAF folder")
                kinds.add(text)
            if counts is not None and counts[j] != len(y):
                raise DataError(f"{path}: user {user!r}: num_samples says {counts[j]}, its user_data holds {len(y)}")
            users.setdefault(user, []).append((x, y))
        del doc  # a LEAF file's lists of floats take far more memory than its arrays
    return users


def _join(users: dict[str, list[tuple[np.ndarray, np.ndarray]]], order: dict[str, int],
          shape: tuple[int, ...], text: bool) -> dict[str, np.ndarray]:
    """One split's arrays: images [n, side, side] (``text``: windows [n, L]), labels and each sample's client
    (``order[user]``, -1 if absent), user after user in client order."""
    names = sorted(users, key=lambda u: (order.get(u, len(order)), u))
    size = math.prod(shape)
    xs, ys, owners = [], [], []
    for u in names:
        for x, y in users[u]:
            if len(y) and x.shape[1] != size:
                what = f"windows of {x.shape[1]} characters, others {size}; expected one window length" if text \
                    else f"images have {x.shape[1]} pixels, others {size}; expected one image size"
                raise DataError(f"data.dataset = 'leaf': user {u!r}'s {what}")
            xs.append(x.reshape(len(y), *shape))
            ys.append(y)
            owners.append(np.full(len(y), order.get(u, -1), dtype=np.int64))
    cat = lambda parts, empty: np.concatenate(parts) if parts else empty
    return {"x": cat(xs, np.zeros((0, *shape), dtype=np.uint8)), "y": cat(ys, np.zeros(0, dtype=np.int64)),
            "owners": cat(owners, np.zeros(0, dtype=np.int64))}


def _decode(root: Path) -> dict[str, np.ndarray]:
    kinds: set[bool] = set()
    train, test = _read_split(_split_files(root, "train"), kinds), _read_split(_split_files(root, "test"), kinds)
    text = kinds == {True}
    names = sorted(u for u, parts in train.items() if sum(len(y) for _, y in parts) > 0)
    if not names:
        raise DataError(f"data.dataset = 'leaf': no user under {root / 'train'} has a training sample")
    width = next(x.shape[1] for u in names for x, y in train[u] if len(y))
    shape = (width,) if text else (math.isqrt(width),) * 2
    order = {u: i for i, u in enumerate(names)}
    tr = _join({u: train[u] for u in names}, order, shape, text)
    te = _join(test, order, shape, text)
    return {"train_x": tr["x"], "train_y": tr["y"], "train_owners": tr["owners"], "test_x": te["x"],
            "test_y": te["y"], "test_owners": te["owners"], "owner_names": np.asarray(names, dtype=str)}


def load(d, root: Path) -> ArrayDataset:
    """The LEAF folder ``root`` (``train/``, ``test/``) as arrays, each sample tagged with its user's client."""
    root = Path(root)
    for split in ("train", "test"):
        _split_files(root, split)  # a missing split: one line before anything is read
    recipe = {"version": _CACHE_VERSION, "folder": str(root.resolve()),
              "files": folder_fingerprint(root, (".json",))}
    a = cached_arrays("leaf", recipe, lambda: _decode(root))
    num_classes = int(max(a["train_y"].max(initial=0), a["test_y"].max(initial=0))) + 1
    femnist = a["train_x"].shape[1:] == (28, 28) and num_classes <= len(FEMNIST_CLASSES)
    text = a["train_x"].ndim == 2  # LEAF's Shakespeare: character indices
    classes = list(VOCABULARY) if text else list(FEMNIST_CLASSES) if femnist else [str(c) for c in range(num_classes)]
    names = [str(u) for u in a["owner_names"]]
    return ArrayDataset(ImageSet(a["train_x"], a["train_y"], classes, a["train_owners"], names),
                        ImageSet(a["test_x"], a["test_y"], classes, a["test_owners"], names), classes_checked=text)
