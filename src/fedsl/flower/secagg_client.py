"""The client side of secure aggregation: fedsl's ClientApp under Flower's SecAgg+ mod.

Flower 1.42's SecAgg+ speaks its legacy layout (``flwr/client/mod/secure_aggregation/secaggplus_mod.py``,
``flwr/compat/common/recorddict_compat.py``). ``secaggplus_mod`` answers the protocol's four train messages of a
round itself (setup: key pairs; share keys: Shamir shares of its secrets, encrypted for each neighbour; collect
masked vectors; unmask: the shares the server asks for) and calls the ClientApp's train handler once, in stage
"collect masked vectors", with the legacy FitIns: ``fitins.parameters`` (x_t, an array list in the model's
parameter order) and ``fitins.config``. It expects the legacy FitRes back: ``fitres.parameters`` (x_i),
``fitres.num_examples`` (the weight w_i), ``fitres.metrics`` and ``fitres.status``. It then uploads
``w_i · x_i``, clipped to [-c, c], quantised onto 0..Q and masked (Bonawitz et al., "Practical Secure Aggregation
for Privacy-Preserving Machine Learning", CCS 2017; Bell et al., "Secure Single-Server Aggregation with
(Poly)Logarithmic Overhead", CCS 2020: SecAgg+), and clears the arrays of the reply: x_i never leaves the node in
clear. The scalars of ``fitres.metrics`` (n_i, K_i, the loss) do, as they do without SecAgg+.

w_i is what the server asks for in ``secagg-weighted``: n_i (``algorithm.weighted``) or 1 (Algorithm 1's plain
mean); SecAgg+ divides the sum by Σ w_i, so the server gets the rule's mean.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import numpy as np
import torch
from flwr.app import Context, Message
from flwr.client.mod import secaggplus_mod
from flwr.clientapp.typing import ClientAppCallable, Mod
from flwr.common import Code, FitRes, Status, ndarrays_to_parameters, parameters_to_ndarrays
from flwr.common.secure_aggregation.secaggplus_constants import RECORD_KEY_CONFIGS
from flwr.compat.common import recorddict_compat as compat

from fedsl.core.types import Params

FITINS_ARRAYS = "fitins.parameters"  # the legacy FitIns' ArrayRecord (x_t): a SecAgg+ train message's model
SECAGG_CONFIG = RECORD_KEY_CONFIGS  # "secaggplus_configs": every SecAgg+ message carries its stage there


def is_secagg(msg: Message) -> bool:
    """Whether a message is one of SecAgg+'s (it carries the protocol's ConfigRecord)."""
    return SECAGG_CONFIG in msg.content.config_records


def make_secagg_mod(required: Callable[[Context], bool]) -> Mod:
    """A train mod: SecAgg+ messages go through Flower's ``secaggplus_mod``, others straight to the handler.

    Args:
        required: whether this run sends models only masked (its run config's ``secagg``); then a train message
            that is not SecAgg+'s is refused: the node would send x_i in clear.
    """
    def mod(msg: Message, context: Context, call_next: ClientAppCallable) -> Message:
        if is_secagg(msg):
            return secaggplus_mod(msg, context, call_next)
        if required(context):
            raise ValueError("run config secagg = true: this node sends its model only through SecAgg+, and this "
                             f"train message is not a SecAgg+ one (records: {sorted(msg.content.keys())})")
        return call_next(msg, context)

    return mod


def is_fitins(msg: Message) -> bool:
    """Whether a train message is in the legacy FitIns layout (what SecAgg+ hands the train handler)."""
    return FITINS_ARRAYS in msg.content.array_records


def read_fitins(msg: Message, shapes: Mapping[str, torch.Size]) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
    """x_t and the config of a legacy FitIns.

    Args:
        msg: the train message (``is_fitins``).
        shapes: the model's parameters, name -> shape, in the order the server lists them (``fm.names``).
    Returns:
        (x_t by parameter name, the config).
    Raises:
        ValueError: the arrays are not the model's (count or shapes), in one line.
    """
    fitins = compat.recorddict_to_fitins(msg.content, keep_input=True)
    arrays = parameters_to_ndarrays(fitins.parameters)
    if len(arrays) != len(shapes):
        raise ValueError(f"train message has {len(arrays)} arrays in {FITINS_ARRAYS}: expected the model's "
                         f"{len(shapes)} parameters")
    out = {}
    for (name, shape), array in zip(shapes.items(), arrays):
        if tuple(array.shape) != tuple(shape):
            raise ValueError(f"train message array {len(out)} ({name}) has shape {list(array.shape)}: expected "
                             f"{list(shape)}")
        out[name] = array
    return out, dict(fitins.config)


def fitres_reply(msg: Message, final: Params, weight: int, metrics: Mapping[str, int | float]) -> Message:
    """The legacy FitRes reply that ``secaggplus_mod`` masks: x_i in parameter order, w_i, the metrics."""
    arrays = [np.ascontiguousarray(v.detach().cpu().numpy()) for v in final.values()]
    fitres = FitRes(Status(Code.OK, "Success"), ndarrays_to_parameters(arrays), int(weight), dict(metrics))
    return Message(compat.fitres_to_recorddict(fitres, keep_input=True), reply_to=msg)


def clipped(params: Params, clipping_range: float) -> int:
    """How many entries of x_i lie outside [-c, c] (SecAgg+ clips them: the aggregate is then off)."""
    return int(sum(int((v.abs() > clipping_range).sum()) for v in params.values()))
