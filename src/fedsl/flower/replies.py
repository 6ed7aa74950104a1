"""What the server accepts from a client: the checks on train and query replies (the protocol is in
docs/reference/flower-protocol.md).

Both federation modes (``federation`` in the run config) check a train reply's ArrayRecord ``arrays``: x_i with
the model's parameter names, shapes and dtype, finite values. The metrics differ:

- ``open`` (``check_open_reply``): what Flower's stock clients send. A MetricRecord ``metrics`` with the integer
  ``num-examples`` (n_i, as the client reports it, in 1..``max-examples``); any other metrics are the client's
  own. fedsl reads ``steps`` (K_i), ``round`` and a loss (``train-loss``, ``train_loss`` or ``loss``) when they
  are there, and checks what it reads.
- ``replay`` (``check_reply``): fedsl's exact replay of the simulator. ``metrics`` must carry the integers
  ``num-examples`` (n_i, the partition's size), ``steps`` (K_i), ``partition-id`` and ``round`` (both as sent),
  and may carry ``train-loss``. What the rule declares its clients send beside x_i (its spec's ``reply``) comes by
  the measure's name: a metric when it is one number (``start-loss``, F_i(x_t), which q-FedAvg reads), an
  ArrayRecord shaped like x otherwise (``start-grad``, ∇F_i(x_t), which FedCLG-S reads): ``check_declared``.

Anything else is refused with ``BadReply``: one line saying what is wrong, which the strategy logs with the node.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import numpy as np
import torch
from flwr.app import ArrayRecord, ConfigRecord, Message, MetricRecord, RecordDict

from fedsl.algorithms.spec import CLIENT_MEASURES, Measure

# The metrics a train reply must carry, each an integer.
TRAIN_METRICS = ("num-examples", "steps", "partition-id", "round")
# Optional train-reply metrics, each a finite number when present: the loss, and the client measures that are one number
OPTIONAL_METRICS = ("train-loss", *(m.record for m in CLIENT_MEASURES.values() if not m.per_parameter))
# The loss keys an open-federation reply may use, in the order fedsl reads them (fedsl's, Flower's quickstart's, plain)
LOSS_KEYS = ("train-loss", "train_loss", "loss")
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


def _metrics(content: RecordDict) -> MetricRecord:
    """A train reply's MetricRecord ``metrics``.

    Raises:
        BadReply: there is none.
    """
    metrics = content.metric_records.get("metrics")
    if metrics is None:
        raise BadReply(f"no MetricRecord 'metrics' (records: {sorted(content.keys())})")
    return metrics


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
    metrics = _metrics(content)
    missing = [k for k in TRAIN_METRICS if k not in metrics]
    if missing:
        raise BadReply(f"metric {', '.join(missing)} missing (has {sorted(metrics.keys())})")
    wrong = {k: metrics[k] for k in TRAIN_METRICS if type(metrics[k]) is not int}
    if wrong:
        raise BadReply(f"metric {', '.join(f'{k} = {v!r}' for k, v in wrong.items())}: expected an integer")
    for key in OPTIONAL_METRICS:
        _number(metrics, key)
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
    return check_arrays(content, expected), metrics["num-examples"], metrics["steps"]


def check_arrays(content: RecordDict, expected: dict[str, torch.Tensor], record: str = "arrays") -> dict:
    """The reply's ArrayRecord ``record`` (x_i: ``arrays``) as numpy arrays by name, after checking names, shapes,
    dtype and finiteness.

    Raises:
        BadReply: one line saying what is wrong.
    """
    arrays = content.array_records.get(record)
    if arrays is None:
        raise BadReply(f"no ArrayRecord {record!r} (records: {sorted(content.keys())})")
    lacking, extra = sorted(set(expected) - set(arrays.keys())), sorted(set(arrays.keys()) - set(expected))
    if lacking or extra:
        raise BadReply(f"{record} do not match the model's parameters: "
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
    return out


def _number(metrics: Mapping[str, Any], key: str) -> float | None:
    value = metrics.get(key)
    if value is not None and (type(value) not in (int, float) or not math.isfinite(value)):
        raise BadReply(f"metric {key} = {value!r}: expected a finite number")
    return value


def check_open_reply(msg: Message, expected: dict[str, torch.Tensor], t: int, max_examples: int
                     ) -> tuple[dict, int, int | None, float | None]:
    """An open-federation train reply's x_i, n_i, K_i (when it reports ``steps``) and loss, after checking them.

    Args:
        msg: the reply (without an error); the round and node are those of the message it answers.
        expected: the model's parameters (their names, shapes and dtype are what x_i must have).
        t: the round (0-based); a ``round`` metric, when there, must be t (else it is a stale reply).
        max_examples: the largest n_i the server believes (run config ``max-examples``): n_i weighs the
            update under ``algorithm.weighted`` and FSL-p, so an unbounded claim would let one client dominate.
    Returns:
        (x_i as numpy arrays by name, n_i, K_i or None, the loss or None).
    Raises:
        BadReply: one line saying what is wrong.
    """
    content = msg.content
    metrics = _metrics(content)
    n, steps, loss = check_open_metrics(metrics, t, max_examples)
    return check_arrays(content, expected), n, steps, loss


def check_open_metrics(metrics: Mapping[str, Any], t: int, max_examples: int) -> tuple[int, int | None, float | None]:
    """An open-federation reply's n_i, K_i (when it reports ``steps``) and loss (``check_open_reply``; under SecAgg+
    the metrics of the legacy FitRes, which travel in clear).

    Raises:
        BadReply: one line saying what is wrong.
    """
    n = metrics.get("num-examples")
    if n is None:
        raise BadReply(f"metric num-examples missing (has {sorted(metrics.keys())})")
    if type(n) is not int or not 1 <= n <= max_examples:
        raise BadReply(f"metric num-examples = {n!r}: expected an integer in 1..{max_examples} (run config "
                       "max-examples)")
    for key, low in (("steps", 1), ("round", 0)):
        value = metrics.get(key)
        if value is not None and (type(value) is not int or value < low):
            raise BadReply(f"metric {key} = {value!r}: expected an integer >= {low}")
    if metrics.get("round", t) != t:
        raise BadReply(f"round = {metrics['round']}: expected {t} (a stale or replayed reply)")
    loss = next((_number(metrics, k) for k in LOSS_KEYS if k in metrics), None)
    return n, metrics.get("steps"), None if loss is None else float(loss)


def train_loss(msg: Message) -> float | None:
    """The reply's ``train-loss`` metric (checked by ``check_reply``), or None."""
    metrics = msg.content.metric_records.get("metrics")
    value = None if metrics is None else metrics.get("train-loss")
    return None if value is None else float(value)


def check_declared(msg: Message, measure: Measure, expected: dict[str, torch.Tensor], algorithm: str):
    """What the reply carries of a measure its rule declares (the spec's ``reply``), by the measure's record name: a
    finite metric (a float), or an ArrayRecord shaped like x (numpy arrays by name, checked as x_i is).

    Raises:
        BadReply: it is missing or malformed.
    """
    if measure.per_parameter:
        if measure.record not in msg.content.array_records:
            raise BadReply(f"no ArrayRecord {measure.record!r}: algorithm {algorithm!r} reads each client's "
                           f"{measure.meaning}")
        return check_arrays(msg.content, expected, measure.record)
    value = _number(_metrics(msg.content), measure.record)
    if value is None:
        raise BadReply(f"metric {measure.record} missing: algorithm {algorithm!r} reads each client's "
                       f"{measure.meaning}")
    return float(value)


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
            out["configs"][name] = {k: _describe_value(v) for k, v in rec.items()}
    return out


def _describe_value(value: Any) -> Any:
    """A config value as the audit keeps it: bytes by their size (SecAgg+'s keys, shares and masked vectors)."""
    if isinstance(value, bytes):
        return f"<{len(value)} bytes>"
    if isinstance(value, list) and value and all(isinstance(v, bytes) for v in value):
        return f"<{len(value)} byte strings, {sum(len(v) for v in value)} bytes>"
    return value
