"""The run state on disk: one checkpoint format for the simulator, stacked runs and the Flower server.

A checkpoint (``checkpoint.pt``; the Flower server's ``final.pt`` too) is a ``torch.save`` of plain
dicts and tensors, read back with ``weights_only=True``:

    format    ``FORMAT`` ("fedsl-checkpoint/1")
    round     t, the rounds done: the state is the one after round t (0: x_0)
    params    x_t, the global model
    algo      the server rule's state (SCAFFOLD's c, FedDyn's h, optimiser moments, ...)
    gamma     γ_t of an adaptive γ schedule (None for schedules that are functions of t)
    clip      C_t of DP's adaptive clipping (None: the configured clip, or no DP; absent in older files)
    clients   the clients' states as [N, ...] tables (SCAFFOLD's c_i, FedDyn's ∇L_i) when kept: empty
              for a finished run and on a Flower server (its clients keep their own), and for a sparse store
    client_store  a sparse store's clients (``fedsl.engine.client_state``): ``ids`` [M] (int64, row order), ``rows``
              [M, D] (one client's states flattened, in the order of ``initial``), ``initial`` (one client's initial
              state, as ``clients``' tables hold it without the leading N); absent without one (a run folder written
              with one has a ``client_state`` table in its config.json, which a fedsl without stores refuses)
    extra     each runtime's own records, as JSON text: the simulator's ``wall_time``, the Flower
              server's ``history``, ``evaluations`` and ``config``

``save`` writes it atomically (``atomic_write``: a temporary file, fsync, rename), so a reader sees the
previous checkpoint or the new one, never half of one. ``load`` reads it defensively: a file cut short
(a full disk, a partial copy), not a checkpoint, or of a newer format raises ``CorruptCheckpoint``, one
line naming the file and what the user can do. Files of the two layouts written before this format
(the simulator's, without ``format``; the Flower server's "fedsl-flower-checkpoint/1") are read too.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from fedsl.algorithms.base import RunState
from fedsl.engine.client_state import ClientStore, SavedStore

FORMAT = "fedsl-checkpoint/1"
LEGACY_FLOWER = "fedsl-flower-checkpoint/1"  # the Flower server's layout before FORMAT (x, records as JSON)
# What a user can do about an unreadable checkpoint, by runtime (the end of CorruptCheckpoint's line)
RESTART_RUN = "remove it to start this run over from round 0 (`fedsl resume` then reruns it), or put back a good copy"
RESTART_SERVER_APP = ("remove it (or set resume = false) to start the run over from round 1, or put back a good "
                      "copy; then repeat the same `flwr run`")


class CorruptCheckpoint(RuntimeError):
    """A checkpoint exists but cannot be read (the message, one line, names it and what to do)."""


@dataclass
class Checkpoint:
    """What a checkpoint holds.

    Attributes:
        round: t, the rounds done (the state is the one after round t; 0: x_0).
        state: x_t, the server state, γ_t and the clients' tables (when kept).
        extra: the runtime's own records (JSON values): the simulator's ``wall_time``; the Flower
            server's ``history``, ``evaluations`` and ``config``.
    """

    round: int
    state: RunState
    extra: dict[str, Any] = field(default_factory=dict)


def atomic_write(path: Path, write: Callable[[Path], Any]) -> None:
    """``write(tmp)``, fsync, then rename over ``path``: a reader sees the old file or the new, never half,
    also after a power cut (the data is on the disk before the rename makes it the file).

    An exception (Ctrl-C, SIGTERM, a full disk) removes the temporary file; a kill -9 leaves
    it, and ``RunDir.remove_stale_tmp`` clears it at the run's next start.
    """
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        write(tmp)
        with open(tmp, "rb+") as f:
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def _cpu(group: dict) -> dict:
    """Nested dicts of tensors, each on the CPU in storage of its own."""
    def own(t: torch.Tensor) -> torch.Tensor:
        t = t.detach().cpu().contiguous()
        # a stacked run's model is a view into all stacked runs' tensor, and torch.save writes a
        # view's whole storage: without the copy each run's checkpoint held every run's model
        return t.clone() if t.untyped_storage().nbytes() > t.numel() * t.element_size() else t

    return {k: _cpu(v) if isinstance(v, dict) else own(v) for k, v in group.items()}


def save(path: str | Path, ckpt: Checkpoint) -> None:
    """Write ``ckpt`` to ``path`` in ``FORMAT``, atomically."""
    s = ckpt.state
    store = s.clients.saved() if isinstance(s.clients, ClientStore) else s.clients
    clients = {} if isinstance(store, SavedStore) else _cpu(store)
    blob = {"format": FORMAT, "round": int(ckpt.round), "params": _cpu(s.x), "algo": _cpu(s.algo),
            "gamma": s.gamma, "clip": s.clip, "clients": clients, "extra": json.dumps(ckpt.extra, default=str)}
    if isinstance(store, SavedStore):
        # the rows of a store on disk are a tensor over its file, of exactly the rows held: written from the file
        blob["client_store"] = _cpu({"ids": store.ids, "rows": store.rows, "initial": store.initial})
    atomic_write(Path(path), lambda p: torch.save(blob, p))


def load(path: str | Path, what_to_do: str = RESTART_RUN, mmap: bool = False) -> Checkpoint | None:
    """The checkpoint at ``path`` (its tensors on the CPU), or None when there is no file. ``mmap``: the tensors
    are read from the file as they are used (memory-mapped, copy on write), not into memory at once: a store on
    disk is rebuilt from its checkpoint without holding its rows in memory.

    Raises:
        CorruptCheckpoint: the file cannot be read (cut short, not a checkpoint, a newer format); its
            one line names the file and ends with ``what_to_do``.
    """
    path = Path(path)
    if not path.is_file():
        return None
    blob = _read(path, what_to_do, mmap=mmap)
    try:
        return _from_blob(blob)
    except KeyError as e:
        raise _corrupt(path, f"it lacks {e}", what_to_do) from None
    except (TypeError, ValueError, AttributeError) as e:  # ValueError: JSONDecodeError of the records
        raise _corrupt(path, str(e), what_to_do) from None


def read_round(path: str | Path, what_to_do: str = RESTART_RUN) -> int | None:
    """The round of the checkpoint at ``path`` (None: no file), read without loading the tensors (memory-mapped).

    Raises:
        CorruptCheckpoint: as ``load``.
    """
    path = Path(path)
    return int(_read(path, what_to_do, mmap=True)["round"]) if path.is_file() else None


def _corrupt(path: Path, why: str, what_to_do: str) -> CorruptCheckpoint:
    why = why.strip().splitlines()[0] if why.strip() else "unknown error"
    return CorruptCheckpoint(f"{path}: the checkpoint cannot be read ({why[:160]}); {what_to_do}")


def _read(path: Path, what_to_do: str, mmap: bool) -> dict[str, Any]:
    """The file's top-level dict, checked for a round number and a known format."""
    try:
        blob = torch.load(path, map_location="cpu", weights_only=True, mmap=mmap)
    except Exception as e:  # noqa: BLE001 — torch raises RuntimeError, pickle/unpickling and OS errors alike
        raise _corrupt(path, str(e) or type(e).__name__, what_to_do) from None
    if not isinstance(blob, dict):
        raise _corrupt(path, "it is not a fedsl checkpoint", what_to_do)
    fmt = blob.get("format")
    if fmt not in (FORMAT, LEGACY_FLOWER, None):
        newer = isinstance(fmt, str) and fmt.startswith("fedsl-checkpoint/")
        raise _corrupt(path, f"format {fmt!r}{', written by a newer fedsl' if newer else ''}; this fedsl reads "
                       f"{FORMAT!r}", "upgrade fedsl to resume it, or " + what_to_do if newer else what_to_do)
    rnd = blob.get("round")
    if not isinstance(rnd, int) or isinstance(rnd, bool) or rnd < 0:
        raise _corrupt(path, "it holds no round number", what_to_do)
    return blob


def _tensors(group: Any, what: str) -> dict:
    """``group`` checked to be (nested) dicts of tensors."""
    if not isinstance(group, dict) or not all(
            isinstance(v, torch.Tensor) or isinstance(v, dict) and _tensors(v, what) is v for v in group.values()):
        raise TypeError(f"its {what} are not tensors")
    return group


def _store(saved: Any) -> SavedStore:
    """A sparse store's entry, checked: int64 ids [M], rows [M, D], an initial state of tensors."""
    store = SavedStore(saved["ids"], saved["rows"], _tensors(saved["initial"], "clients' initial states"))
    if not isinstance(store.ids, torch.Tensor) or not isinstance(store.rows, torch.Tensor):
        raise TypeError("its client store is not tensors")
    if store.ids.dtype != torch.int64 or store.rows.dim() != 2 or store.ids.shape != (store.rows.shape[0],):
        raise ValueError(f"its client store holds {tuple(store.rows.shape)} rows for {tuple(store.ids.shape)} ids, "
                         "not one row per id")
    return store


def _from_blob(blob: dict[str, Any]) -> Checkpoint:
    """A Checkpoint from a file's dict: ``FORMAT``, or one of the two layouts before it."""
    fmt = blob.get("format")
    if fmt == FORMAT:
        extra = json.loads(blob["extra"])
        x, algo, clients = blob["params"], blob["algo"], blob["clients"]
        if "client_store" in blob:
            clients = _store(blob["client_store"])
    elif fmt == LEGACY_FLOWER:  # the Flower server's: x, and its records as JSON texts
        extra = {k: json.loads(blob[k]) for k in ("history", "evaluations", "config")}
        x, algo, clients = blob["x"], blob["algo"], {}
    else:  # the simulator's: wall_time at the top
        extra = {"wall_time": float(blob.get("wall_time", 0.0))}
        x, algo, clients = blob["params"], dict(blob.get("algo", {})), dict(blob.get("clients", {}))
        # before the clients' states had their own entry, the tables were in algo, named with an
        # ``_i`` suffix (SCAFFOLD's c_i, FedDyn's grad_i)
        for key in [k for k in algo if k.endswith("_i")]:
            clients[key] = algo.pop(key)
    if not isinstance(extra, dict):
        raise TypeError("its records are not a dict")
    gamma = blob.get("gamma")
    if gamma is not None and not isinstance(gamma, (int, float, torch.Tensor)):
        raise TypeError(f"its gamma is {type(gamma).__name__}, not a number")
    clip = blob.get("clip")
    if clip is not None and not isinstance(clip, (int, float)):
        raise TypeError(f"its clip is {type(clip).__name__}, not a number")
    if not _tensors(x, "parameters"):
        raise ValueError("it holds no parameters")
    if not isinstance(clients, SavedStore):
        clients = _tensors(clients, "clients' states")
    state = RunState(x=x, algo=_tensors(algo, "server state"), gamma=gamma, clients=clients, clip=clip)
    return Checkpoint(blob["round"], state, extra)
