"""What the server accepts from a client: the checks on train and query replies (the protocol is in the
README, "The Flower protocol").

A train reply must carry an ArrayRecord ``arrays`` (x_i: the model's parameter names, shapes and dtype,
finite values) and a MetricRecord ``metrics`` with the integers ``num-examples`` (n_i), ``steps`` (K_i),
``partition-id`` and ``round`` (both as sent), and may carry ``train-loss`` (a finite number). Anything
else is refused with ``BadReply``: one line saying what is wrong, which the strategy logs with the node.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import torch
from flwr.app import ArrayRecord, ConfigRecord, Message, MetricRecord, RecordDict

# The metrics a train reply must carry, each an integer.
TRAIN_METRICS = ("num-examples", "steps", "partition-id", "round")
# Optional train-reply metrics, each a finite number when present.
OPTIONAL_METRICS = ("train-loss",)
# The reason Flower gives when a ClientApp has no handler for a query message (a plain Flower client).
NO_QUERY_HANDLER = "No query function registered"


class BadReply(ValueError):
    """A reply the server cannot use; ``impostor``: it claims a partition its node was not assigned."""

    def __init__(self, reason: str, impostor: bool = False) -> None:
        super().__init__(reason)
        self.impostor = impostor


def one_line(e: BaseException) -> str:
    """``Type: first line of the message``."""
    text = str(e).strip().splitlines()
    return f"{type(e).__name__}: {text[0] if text else ''}"


def check_reply(msg: Message, expected: dict[str, torch.Tensor], partition: int, t: int,
                examples: int | None = None) -> tuple[dict, int, int]:
    """A train reply's final model x_i, n_i and K_i, after checking everything in it the server uses.

    Args:
        msg: the reply (without an error).
        expected: the model's parameters (their names, shapes and dtype are what x_i must have).
        partition: the partition the server sent this node.
        t: the round (0-based).
        examples: n_i, the partition's size, when the server knows it.
    Returns:
        (x_i as numpy arrays by name, n_i, K_i).
    Raises:
        BadReply: one line saying what is wrong.
    """
    content = msg.content
    metrics = content.metric_records.get("metrics")
    if metrics is None:
        raise BadReply(f"no MetricRecord 'metrics' (records: {sorted(content.keys())})")
    missing = [k for k in TRAIN_METRICS if k not in metrics]
    if missing:
        raise BadReply(f"metric {', '.join(missing)} missing (has {sorted(metrics.keys())})")
    wrong = {k: metrics[k] for k in TRAIN_METRICS if type(metrics[k]) is not int}
    if wrong:
        raise BadReply(f"metric {', '.join(f'{k} = {v!r}' for k, v in wrong.items())}: expected an integer")
    for key in OPTIONAL_METRICS:
        value = metrics.get(key)
        if value is not None and (type(value) not in (int, float) or not math.isfinite(value)):
            raise BadReply(f"metric {key} = {value!r}: expected a finite number")
    if metrics["partition-id"] != partition:
        raise BadReply(f"claims partition-id {metrics['partition-id']}, but the server sent it partition {partition}",
                       impostor=True)
    if metrics["round"] != t:
        raise BadReply(f"round = {metrics['round']}: expected {t} (a stale or replayed reply)")
    for key in ("num-examples", "steps"):
        if metrics[key] < 1:
            raise BadReply(f"metric {key} = {metrics[key]}: expected >= 1")
    if examples is not None and metrics["num-examples"] != examples:
        raise BadReply(f"metric num-examples = {metrics['num-examples']}: partition {partition} has {examples} samples")
    arrays = content.array_records.get("arrays")
    if arrays is None:
        raise BadReply(f"no ArrayRecord 'arrays' (records: {sorted(content.keys())})")
    lacking, extra = sorted(set(expected) - set(arrays.keys())), sorted(set(arrays.keys()) - set(expected))
    if lacking or extra:
        raise BadReply("arrays do not match the model's parameters: "
                       + "; ".join(f"{what} {names[:3]}{' ...' if len(names) > 3 else ''}"
                                   for what, names in (("missing", lacking), ("unexpected", extra)) if names))
    out = {}
    for name, ref in expected.items():
        array = arrays[name]
        want_dtype, want_shape = np.dtype(str(ref.dtype).removeprefix("torch.")), list(ref.shape)
        try:
            value = array.numpy()
        except Exception as e:  # noqa: BLE001 - whatever the bytes are, the reply is unusable
            raise BadReply(f"array {name!r} cannot be read: {one_line(e)}") from None
        # what the array says it is (Flower's metadata) and what its bytes hold
        for what, shape, dtype in (("declares", list(array.shape), str(array.dtype)),
                                   ("holds", list(value.shape), str(value.dtype))):
            if shape != want_shape:
                raise BadReply(f"array {name!r} {what} shape {shape}: expected {want_shape}")
            if dtype != str(want_dtype):
                raise BadReply(f"array {name!r} {what} dtype {dtype}: expected {want_dtype}")
        bad = int(value.size - np.count_nonzero(np.isfinite(value)))
        if bad:
            raise BadReply(f"array {name!r} has {bad} non-finite value{'s' if bad > 1 else ''} (NaN or inf)")
        out[name] = value
    return out, metrics["num-examples"], metrics["steps"]


def train_loss(msg: Message) -> float | None:
    """The reply's ``train-loss`` metric (checked by ``check_reply``), or None."""
    metrics = msg.content.metric_records.get("metrics")
    value = None if metrics is None else metrics.get("train-loss")
    return None if value is None else float(value)


def check_claim(msg: Message, num_clients: int) -> int:
    """The partition id a node claims in its reply to the ``query`` message.

    Raises:
        BadReply: no integer ``partition-id`` in 0..N-1 in its ConfigRecord ``partition``.
    """
    info = msg.content.config_records.get("partition")
    pid = None if info is None else info.get("partition-id")
    if type(pid) is not int or not 0 <= pid < num_clients:
        raise BadReply(f"its query reply has partition-id = {pid!r}: expected an integer in 0..{num_clients - 1}")
    return pid


def lacks_query_handler(msg: Message) -> bool:
    """Whether a query reply is Flower's error for a ClientApp without a ``query`` handler (a plain client)."""
    return msg.has_error() and NO_QUERY_HANDLER in (msg.error.reason or "")


def describe_content(content: RecordDict) -> dict[str, Any]:
    """What a message carries: record names and kinds, array names with shape and dtype, scalars."""
    out: dict[str, Any] = {"records": {}, "arrays": {}, "metrics": {}, "configs": {}}
    for name, rec in content.items():
        out["records"][name] = type(rec).__name__
        if isinstance(rec, ArrayRecord):
            out["arrays"][name] = {k: {"shape": list(a.shape), "dtype": a.dtype} for k, a in rec.items()}
        elif isinstance(rec, MetricRecord):
            out["metrics"][name] = dict(rec)
        elif isinstance(rec, ConfigRecord):
            out["configs"][name] = {k: (v if not isinstance(v, bytes) else f"<{len(v)} bytes>") for k, v in rec.items()}
    return out
