"""The client side: fedsl's client update (LocalSGD of Algorithm 1) inside a Flower ClientApp.

The update is the algorithm's client half (``client_init``, a ``client_step`` per batch,
``client_final``; ``fedsl.algorithms.base``) run by the simulator's own executor over a batch plan
for this one client drawn from ``rng(seed, round, CLIENT_BATCHES, i)`` (so it needs nothing but
its id), with step size η_l. Stateful clients keep their state (SCAFFOLD's c_i, FedDyn's ∇L_i) in
the ClientApp's ``context.state``; ``client_final`` gives the new one, exactly as it gives the
simulator row i of its table.

What goes back to the server is parameters only: the final model x_i (and as metrics the
number of samples n_i, the steps K_i, the loss of x_i on D_i and, for a rule that reads it (q-FedAvg), the loss
of x_t on D_i before training), never samples or labels.
The messages and replies: README, "The Flower protocol".
"""

from __future__ import annotations

import math
import time
from collections.abc import Mapping
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import torch
from flwr.app import ConfigRecord, Context, Message, MetricRecord, RecordDict
from flwr.clientapp import ClientApp

from fedsl.algorithms.algorithm import Algorithm
from fedsl.algorithms.base import LocalTraining, State
from fedsl.algorithms.spec import CLIENT_MEASURES
from fedsl.core.types import Params
from fedsl.engine.functional import evaluate
from fedsl.engine.simulator import Simulator
from fedsl.flower.config import load_setup
from fedsl.flower.records import from_record, local_keys, state_from_record, to_record
from fedsl.flower.secagg_client import clipped, fitres_reply, is_fitins, make_secagg_mod, read_fitins

STATE_PREFIX = "fedsl."  # context.state keys of the per-client rows, e.g. "fedsl.c_i"


def partition_id(node_config: Mapping[str, Any], num_clients: int) -> int:
    """The node's client id i (its partition D_i) from the node config, checked against N.

    Raises:
        ValueError: one line naming the missing or bad value.
    """
    hint = f"start the SuperNode with --node-config 'partition-id=I' where 0 <= I < data.num_clients = {num_clients}"
    if "partition-id" not in node_config:
        raise ValueError(f"node config has no partition-id (keys: {sorted(node_config)}): {hint}")
    pid = node_config["partition-id"]
    if isinstance(pid, bool) or not isinstance(pid, int):
        raise ValueError(f"node config partition-id = {pid!r}: expected an integer; {hint}")  # noqa: TRY004 - a bad value
    if not 0 <= pid < num_clients:
        raise ValueError(f"node config partition-id = {pid}: out of range, expected 0 <= partition-id < "
                         f"data.num_clients = {num_clients}")
    parts = node_config.get("num-partitions")
    if parts is not None and parts != num_clients:
        raise ValueError(f"node config num-partitions = {parts!r}: expected data.num_clients = {num_clients} "
                         "(the federation is partitioned over data.num_clients clients)")
    return pid


def train_partition(sim: Simulator, params: Params, t: int, cid: int, server_state: State | None = None,
                    rows: State | None = None, local: LocalTraining | None = None,
                    alg: Algorithm | None = None) -> tuple[Params, int, State]:
    """Client ``cid``'s update of round ``t``: the algorithm's client half from x_t, as the simulator runs it.

    Args:
        sim: the engine (executor, data layout, client data D_i or D_i ∪ D0 for DS).
        params: x_t, the model the server sent.
        t: the round (0-based, as in the simulator).
        cid: the client id i (the node's partition id).
        server_state: what the server sent besides x_t (the spec's ``sends``: SCAFFOLD's c).
        rows: this client's state (SCAFFOLD's c_i, FedDyn's ∇L_i); missing entries start as the
            rule's ``init_client_state``.
        local: η_l, B, E and K to train with (default: the algorithm's, ``sim.alg.local``).
        alg: the algorithm (default ``sim.alg``; ``message_algorithm`` gives one with the message's
            local-step hyper-parameters).
    Returns:
        (x_i, K_i, the client's new state).
    """
    alg = alg or sim.alg
    loc, rule = local or alg.local, alg.rule
    params = sim.layout(params)

    def here(group: Params) -> Params:
        return {n: v.to(device=sim.device, dtype=sim.dtype) for n, v in group.items()}

    state = {**rule.init_client_state(params), **{k: here(v) for k, v in (rows or {}).items()}}
    sent = {k: here(v) for k, v in (server_state or {}).items()}
    plan = sim.plan_clients([cid], t, loc)  # from rng(seed, t, CLIENT_BATCHES, i): the simulator's batches
    # the simulator's own client phase, for one client (its state as a table of one row)
    # the rule's client half with the clients' momentum and weight decay (the run config's), as the simulator runs it
    finals, new = sim.executor.train(loc.client(rule), [params], plan, sim.fed.x, sim.fed.y, loc.lr,
                                     {k: {n: v.unsqueeze(0) for n, v in g.items()} for k, g in state.items()}, [sent])
    return {n: v[0] for n, v in finals.items()}, plan.steps[0], {k: {n: v[0] for n, v in g.items()}
                                                                 for k, g in new.items()}


def _load_rows(context: Context) -> State:
    rows: State = {}
    for key in list(context.state.array_records.keys()):
        if key.startswith(STATE_PREFIX):
            rows[key[len(STATE_PREFIX):]] = from_record(context.state.array_records[key])
    return rows


def _int(config: Mapping[str, Any], key: str, low: int = 1) -> int | None:
    value = config.get(key)
    if value is None:
        return None
    if type(value) is not int or value < low:
        raise ValueError(f"train message config {key} = {value!r}: expected an integer >= {low}")
    return value


def message_round(config: Mapping[str, Any]) -> int:
    """The round t (0-based) of a train or evaluate message: fedsl's ``round``, else Flower's ``server-round`` - 1.

    Raises:
        ValueError: neither key, or not an integer, in one line.
    """
    if "round" in config:
        return _int(config, "round", 0)
    if "server-round" in config:
        return _int(config, "server-round", 1) - 1
    raise ValueError(f"message config has neither round nor server-round (keys: {sorted(config)})")


def message_local(local: LocalTraining, config: Mapping[str, Any]) -> LocalTraining:
    """η_l, E, B and K from the message's config (``lr``, ``local-epochs``, ``batch-size``, ``local-steps``)
    where it has them, else the ClientApp's own (its fedsl config).

    Raises:
        ValueError: a key present with a bad value, in one line.
    """
    lr = config.get("lr", local.lr)
    if isinstance(lr, bool) or not isinstance(lr, (int, float)) or not math.isfinite(lr) or lr <= 0:
        raise ValueError(f"train message config lr = {lr!r}: expected a number > 0")
    epochs, batch, steps = (_int(config, k) for k in ("local-epochs", "batch-size", "local-steps"))
    return replace(local, lr=float(lr), epochs=local.epochs if epochs is None else epochs,
                   batch_size=local.batch_size if batch is None else batch,
                   steps=local.steps if steps is None else steps)


def message_algorithm(alg: Algorithm, config: Mapping[str, Any]) -> Algorithm:
    """``alg`` with the local-step hyper-parameters the message carries (``proximal-mu``, ``alpha``,
    ``rho``: the spec's ``local_keys``), so a strategy can set them.

    Raises:
        ValueError: a key present with a bad value, in one line.
    """
    given = {}
    for attr, key in local_keys(alg.spec).items():
        if key in config:
            value = config[key]
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value < 0:
                raise ValueError(f"train message config {key} = {value!r}: expected a number >= 0")
            given[attr] = float(value)
    if not given or all(getattr(alg.rule, k, None) == v for k, v in given.items()):
        return alg
    return replace(alg, rule=replace(alg.rule, **given))


def _partition(msg: Message, context: Context, num_clients: int, config: Mapping[str, Any] | None = None) -> int:
    pid = partition_id(context.node_config, num_clients)
    config = (msg.content.config_records.get("config") or {}) if config is None else config
    if "partition-id" in config and config["partition-id"] != pid:
        raise ValueError(f"{msg.metadata.message_type} message for partition-id {config['partition-id']!r} reached "
                         f"node partition-id {pid}")
    return pid


def _arrays(msg: Message, sim: Simulator) -> Params:
    if "arrays" not in msg.content.array_records:
        raise ValueError(f"{msg.metadata.message_type} message has no ArrayRecord 'arrays' "
                         f"(records: {sorted(msg.content.keys())})")
    return from_record(msg.content.array_records["arrays"], sim.device, sim.dtype, names=sim.fm.names)


def _on(sim: Simulator, params: Params, idx) -> tuple[float, float]:
    """(accuracy, mean cross-entropy) of ``params`` on the pool samples ``idx`` (without dropout)."""
    rows = torch.as_tensor(idx, dtype=torch.long, device=sim.fed.x.device)
    return evaluate(sim.fm, sim.layout(params), sim.fed.x[rows], sim.fed.y[rows], sim.eval_batch_size,
                    source=sim.norm_source)


def make_client_app(app_dir: str | Path | None = None) -> ClientApp:
    """A Flower ClientApp running fedsl's client update on the node's partition (its node config's
    ``partition-id``).

    ``app_dir``: folder a relative ``config-file`` in the run config is resolved against.
    Handles ``train`` (one client update: η_l, E, B, K from the message's config when there, else the
    fedsl config; the round from ``round`` or Flower's ``server-round``), ``evaluate`` (accuracy and loss
    of the sent model on the partition) and ``query`` (the node's partition id and n_i, so that
    ``FedslStrategy`` can address the clients the simulator would sample). It runs under
    ``FedslStrategy`` and under Flower's own strategies (``FedAvg``, ``FedAvgM``, ...). Train messages of
    Flower's SecAgg+ go through its ``secaggplus_mod`` (run config ``secagg``; ``fedsl.flower.secagg_client``):
    the model goes back masked, in SecAgg+'s legacy layout; with ``secagg = true`` a plain train message is refused.
    """
    app = ClientApp()

    @app.query()
    def query(msg: Message, context: Context) -> Message:
        setup = load_setup(context.run_config, app_dir, client=True)
        pid = partition_id(context.node_config, setup.num_clients)
        info = ConfigRecord({"partition-id": pid, "num-examples": len(setup.sim.client_data[pid])})
        return Message(RecordDict({"partition": info}), reply_to=msg)

    def secagg_required(context: Context) -> bool:
        return load_setup(context.run_config, app_dir, client=True).options.secagg

    @app.train(mods=[make_secagg_mod(secagg_required)])
    def train(msg: Message, context: Context) -> Message:
        setup = load_setup(context.run_config, app_dir, client=True)
        sim = setup.sim
        legacy = is_fitins(msg)  # SecAgg+'s stage "collect masked vectors": the legacy FitIns layout
        if legacy:
            arrays, config = read_fitins(msg, {n: p.shape for n, p in sim.fm.params().items()})
        else:
            config = msg.content.config_records.get("config") or {}
        pid = _partition(msg, context, setup.num_clients, config)
        t = message_round(config)
        if "algorithm" in config and config["algorithm"] != setup.algorithm.name:
            raise ValueError(f"train message algorithm = {config['algorithm']!r}: this ClientApp's run config has "
                             f"algorithm.name = {setup.algorithm.name!r}")
        local = message_local(sim.alg.local, config)
        alg = message_algorithm(sim.alg, config)
        if setup.options.client_delay:
            time.sleep(setup.options.client_delay)
        if legacy:
            params = {n: torch.from_numpy(np.array(a, copy=True)).to(device=sim.device, dtype=sim.dtype)
                      for n, a in arrays.items()}
        else:
            params = _arrays(msg, sim)
        server_state = {}
        if "server-state" in msg.content.array_records:
            server_state = state_from_record(msg.content.array_records["server-state"], sim.device, sim.dtype)
        # what the rule declares its clients measure at x_t (q-FedAvg's F_i(x_t), FedCLG's ∇F_i(x_t)): the simulator's
        # own numbers; its client half reads its ``measures`` beside what the server sent, the server its ``reply``
        sp = alg.spec
        measured = {k: sim.client_measure(k, params, pid) for k in (sp.client_measures if sp is not None else ())}
        server_state = {**server_state, **{k: measured[k] for k in (sp.measures if sp is not None else ())}}
        final, steps, rows = train_partition(sim, params, t, pid, server_state, _load_rows(context), local, alg)
        for key, row in rows.items():
            context.state[STATE_PREFIX + key] = to_record(row)
        _, loss = _on(sim, final, sim.client_data[pid])
        n_i = len(sim.client_data[pid])
        metrics = {"num-examples": n_i, "steps": steps, "partition-id": pid, "round": t, "train-loss": loss}
        replied = {CLIENT_MEASURES[k]: measured[k] for k in (sp.reply if sp is not None else ())}
        metrics.update({m.record: v for m, v in replied.items() if not m.per_parameter})
        if legacy:  # SecAgg+ masks w_i · x_i: w_i = n_i for a weighted mean, else 1 (Algorithm 1's plain mean)
            weight = n_i if config.get("secagg-weighted", False) else 1
            if "secagg-clipping-range" in config:
                metrics["secagg-clipped"] = clipped(final, float(config["secagg-clipping-range"]))
            return fitres_reply(msg, {n: final[n] for n in sim.fm.names}, weight, metrics)
        content = RecordDict({"arrays": to_record(final), "metrics": MetricRecord(metrics)})
        for m, v in replied.items():
            if m.per_parameter:
                content[m.record] = to_record(v)
        return Message(content, reply_to=msg)

    @app.evaluate()
    def evaluate_(msg: Message, context: Context) -> Message:
        setup = load_setup(context.run_config, app_dir, client=True)
        sim = setup.sim
        pid = _partition(msg, context, setup.num_clients)
        accuracy, loss = _on(sim, _arrays(msg, sim), sim.client_data[pid])
        metrics = MetricRecord({"accuracy": accuracy, "loss": loss, "num-examples": len(sim.client_data[pid])})
        return Message(RecordDict({"metrics": metrics}), reply_to=msg)

    return app
