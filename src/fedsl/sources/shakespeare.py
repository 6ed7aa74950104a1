"""Shakespeare by speaking role: next-character prediction, one client per role (LEAF; McMahan et al. 2017).

Built from a plain text, as LEAF's preprocessing builds it from Project Gutenberg's etext #100:

- **The etext** (``data.text = 'works'``: ``100.txt``, ``pg100.txt``, ``t8.shakespeare.txt`` or
  ``complete-works-part.txt``, the first found): a play starts at a line holding "by William Shakespeare", its title
  the nearest non-empty line above; a speech starts at ``  ROLE. text`` (two spaces, a name of letters and spaces, a
  full stop) and goes on over lines indented by four spaces. The Comedy of Errors, whose indentation the etext
  lost, is read without indentation, as LEAF reads it. Every play is kept; the poems (the Sonnets, and at the
  etext's end A Lover's Complaint and the others: ``POEMS``) give no client, as in LEAF; a client is a (play,
  role) pair named ``PLAY_ROLE`` (upper case, non-alphanumerics as ``_``, LEAF's user names).
- **The tiny corpus** (``data.text = 'tiny'``: ``tinyshakespeare.txt``): blocks ``Speaker:`` then its lines,
  separated by blank lines; a client is a speaker (its plays are not marked in that file).

Samples, as LEAF's: every line a role speaks is a sequence of its own, prefixed with L = ``data.seq_length`` spaces
(80), runs of two or more spaces made one, ended by a newline; each window of L characters is a sample's x and the
character after it its y (so a line of m characters gives m + 1 samples, the last predicting the newline).
``data.stride`` = s keeps every s-th window of a line (1: all, LEAF's; larger bounds how much windows overlap).

Per role, in the order spoken: the first ⌈(1 − f)·n⌉ windows are its training samples and the windows from L − 1
further on its test samples (f = ``data.test_fraction``; the gap is LEAF's, so no test window's target lies in a
training window); a role with fewer than ``data.min_samples`` windows is dropped (LEAF's ``-k``).

Clients are the roles in a fixed shuffled order (by the SHA-256 of their names, independent of the run's seed), so
the first N of a natural partition mix the plays, and ``data.server_source = 'other_ids'`` takes D0 from the roles
after them. The vocabulary is LEAF's 80 characters (``VOCABULARY``); the few others in the etext (``<``, ``_``, ``*``,
``|``, ...: 1 character in 10,000) are read as a space. x is uint8 [n, L] of character indices, y int64.
Parsed arrays are cached (``cached_arrays``), keyed on the file's name, size and modification time and the keys above.
"""

from __future__ import annotations

import hashlib
import math
import re
from pathlib import Path

import numpy as np

from fedsl.core.errors import DataError
from fedsl.sources.arrays import ArrayDataset, ImageSet, cached_arrays, folder_fingerprint

_CACHE_VERSION = 2
# LEAF's ALL_LETTERS (models/utils/language_utils.py): the newline, the space and 78 printable characters
VOCABULARY = "\n !\"&'(),-.0123456789:;>?ABCDEFGHIJKLMNOPQRSTUVWXYZ[]abcdefghijklmnopqrstuvwxyz}"
SPACE = VOCABULARY.index(" ")
WORKS_FILES = ("100.txt", "pg100.txt", "t8.shakespeare.txt", "complete-works-part.txt")
TINY_FILE = "tinyshakespeare.txt"

# Works the etext heads "by William Shakespeare" that are poems, not plays: their indented lines would read as
# speeches ("  When your sweet issue your sweet form should bear." as role WHEN YOUR SWEET ISSUE...), so they give no
# client (LEAF's script skips the Sonnets by starting at the next header and stops before the poems at the end)
POEMS = frozenset({"THE SONNETS", "A LOVER'S COMPLAINT", "A LOVERS COMPLAINT", "THE RAPE OF LUCRECE",
                   "VENUS AND ADONIS", "THE PHOENIX AND THE TURTLE", "THE PASSIONATE PILGRIM"})

_ROLE = re.compile(r"^  ([a-zA-Z][a-zA-Z ]*)\. (.*)")
_CONTINUED = re.compile(r"^    (.*)")
_ROLE_COE = re.compile(r"^([a-zA-Z][a-zA-Z ]*)\. (.*)")  # The Comedy of Errors: its indentation is lost
_CONTINUED_COE = re.compile(r"^(.*)")
_SPEAKER = re.compile(r"^([A-Za-z][A-Za-z' ,.-]*):$")
_SPACES = re.compile(r"  +")

_TABLE = np.full(256, SPACE, dtype=np.uint8)  # byte -> character index; outside the vocabulary: the space
_TABLE[[ord(c) for c in VOCABULARY]] = np.arange(len(VOCABULARY), dtype=np.uint8)


def encode(text: str) -> np.ndarray:
    """Character indices (uint8) of ``text``; a character outside ``VOCABULARY`` is the space's index."""
    raw = np.frombuffer(text.encode("latin-1", errors="replace"), dtype=np.uint8)
    return _TABLE[raw]


def text_file(root: Path, which: str) -> Path:
    """The text file of ``data.text = which`` under ``root``; DataError naming what was looked for."""
    names = WORKS_FILES if which == "works" else (TINY_FILE,)
    for name in names:
        if (root / name).is_file():
            return root / name
    raise DataError(f"data.dataset = 'shakespeare', data.text = {which!r}: none of {', '.join(names)} in {root}; "
                    "expected Project Gutenberg's etext #100 (or its first part) for 'works', the tiny corpus for "
                    "'tiny'")


def _user_name(play: str, role: str) -> str:
    return re.sub(r"\W+", "_", f"{play}_{role}".replace(" ", "_"))


def roles_of_works(text: str) -> dict[str, list[str]]:
    """Each (play, role)'s lines in the order spoken, from the etext (LEAF's parsing; see the module docstring)."""
    lines = text.splitlines()
    roles: dict[str, list[str]] = {}
    play: str | None = None
    speaker: str | None = None
    coe = False
    for i, line in enumerate(lines):
        if "by William Shakespeare" in line:
            title = next((lines[j].strip() for j in range(i - 1, max(-1, i - 8), -1) if lines[j].strip()), "")
            if not title:
                raise DataError(f"line {i + 1}: a play starts ('by William Shakespeare') without a title in the 7 "
                                "lines above; expected the etext's layout")
            play, speaker, coe = (None if title in POEMS else title), None, title == "THE COMEDY OF ERRORS"
            continue
        if play is None:
            continue
        m = (_ROLE_COE if coe else _ROLE).match(line)
        if m:
            role = m.group(1).upper()  # some names come in two casings (SIR_Toby, SIR_TOBY)
            if coe and role.startswith("ACT "):
                speaker = None
                continue
            speaker = _user_name(play, role)
            roles.setdefault(speaker, []).append(m.group(2))
            continue
        if speaker is not None:
            m = (_CONTINUED_COE if coe else _CONTINUED).match(line)
            if m and not (coe and m.group(1).startswith("<")):
                roles[speaker].append(m.group(1))
            elif coe and m:
                speaker = None
    return roles


def roles_of_tiny(text: str) -> dict[str, list[str]]:
    """Each speaker's lines in the order spoken, from the tiny corpus (``Speaker:`` blocks)."""
    roles: dict[str, list[str]] = {}
    speaker: str | None = None
    for line in text.splitlines():
        if not line.strip():
            speaker = None
            continue
        m = _SPEAKER.match(line) if speaker is None else None
        if m:
            speaker = re.sub(r"\W+", "_", m.group(1).upper().replace(" ", "_"))
            roles.setdefault(speaker, [])
        elif speaker is not None:
            roles[speaker].append(line)
    return {k: v for k, v in roles.items() if v}


def windows(lines: list[str], length: int, stride: int) -> tuple[np.ndarray, np.ndarray]:
    """Every ``stride``-th window of ``length`` characters of each line (prefixed with ``length`` spaces, ended by a
    newline) and the character after it: x uint8 [n, length], y int64 [n]."""
    xs, ys = [], []
    for line in lines:
        codes = encode(" " * length + _SPACES.sub(" ", line) + "\n")
        starts = np.arange(0, len(codes) - length, stride)
        if len(starts):
            xs.append(np.lib.stride_tricks.sliding_window_view(codes, length)[starts])
            ys.append(codes[starts + length].astype(np.int64))
    if not xs:
        return np.zeros((0, length), dtype=np.uint8), np.zeros(0, dtype=np.int64)
    return np.concatenate(xs), np.concatenate(ys)


def split_role(n: int, test_fraction: float, gap: int) -> tuple[slice, slice]:
    """A role's n windows, in order: the first ⌈(1 − f)·n⌉ train, then (after ``gap`` windows) test."""
    train = min(n, math.ceil((1 - test_fraction) * n))
    return slice(0, train), slice(min(n, train + gap), n)


def role_order(names: list[str]) -> list[str]:
    """The clients' fixed order: by the SHA-256 of each name (seed-free; mixes the plays)."""
    return sorted(names, key=lambda u: hashlib.sha256(u.encode()).hexdigest())


def _decode(path: Path, which: str, length: int, stride: int, min_samples: int, test_fraction: float) -> dict:
    try:
        text = path.read_text(encoding="latin-1")
    except OSError as e:
        raise DataError(f"{path}: not readable ({type(e).__name__}: {e})") from None
    roles = roles_of_works(text) if which == "works" else roles_of_tiny(text)
    if not roles:
        raise DataError(f"{path}: no role's lines found; expected "
                        + ("the etext's layout ('  ROLE. text', plays headed 'by William Shakespeare')"
                           if which == "works" else "'Speaker:' blocks separated by blank lines"))
    gap = math.ceil((length - 1) / stride)
    parts = {}
    for name, lines in roles.items():
        x, y = windows(lines, length, stride)
        if len(y) >= max(1, min_samples):
            parts[name] = (x, y)
    if not parts:
        raise DataError(f"{path}: no role has data.min_samples = {min_samples} windows; expected a smaller "
                        "data.min_samples")
    names = role_order(list(parts))
    split = {"train": ([], [], []), "test": ([], [], [])}
    for i, name in enumerate(names):
        x, y = parts[name]
        for key, part in zip(("train", "test"), split_role(len(y), test_fraction, gap)):
            split[key][0].append(x[part])
            split[key][1].append(y[part])
            split[key][2].append(np.full(len(y[part]), i, dtype=np.int64))
    out = {f"{k}_{a}": np.concatenate(v[j]) for k, v in split.items() for j, a in enumerate(("x", "y", "owners"))}
    out["owner_names"] = np.asarray(names, dtype=str)
    return out


def check_config(d) -> str | None:
    if d.seq_length < 1:
        return f"data.seq_length = {d.seq_length}: expected at least 1 character"
    return None


def load(d, root: Path) -> ArrayDataset:
    """The clients' windows (train) and their test windows, each tagged with its role's client."""
    path = text_file(Path(root), d.text)
    recipe = {"version": _CACHE_VERSION, "file": path.name, "files": folder_fingerprint(path.parent, (".txt",)),
              "text": d.text, "seq_length": d.seq_length, "stride": d.stride, "min_samples": d.min_samples,
              "test_fraction": d.test_fraction}
    a = cached_arrays("shakespeare", recipe, lambda: _decode(path, d.text, d.seq_length, d.stride, d.min_samples,
                                                             d.test_fraction))
    names = [str(u) for u in a["owner_names"]]
    classes = list(VOCABULARY)
    return ArrayDataset(ImageSet(a["train_x"], a["train_y"], classes, a["train_owners"], names),
                        ImageSet(a["test_x"], a["test_y"], classes, a["test_owners"], names), classes_checked=True)
