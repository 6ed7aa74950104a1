"""fedsl on Flower: the same algorithms, with clients on separate machines.

- ``FedslStrategy`` (a subclass of Flower's message-API ``FedAvg``): samples the
  simulator's clients, aggregates with the algorithm's own server rule and runs
  server learning on D0 (Algorithm 1, line 10) inside ``aggregate_train``.
- ``make_client_app()``: a ``ClientApp`` whose ``train`` runs the engine's own LocalSGD
  (``FunctionalModel`` + executor + batch plan) on the node's partition; per-client
  state (SCAFFOLD's c_i, FedDyn's ∇L_i) lives in the ClientApp's ``context.state``.
- ``make_server_app()``: a ``ServerApp`` that holds D0 and the test set and runs the
  strategy for ``rounds`` rounds.

Both apps read the same fedsl config from Flower's run config (see ``config``), and
the node's ``partition-id`` from its node config. A run on Flower with the same seed,
partition and sampled clients gives the simulator's model (tests compare them).

It may import ``runs``, ``sweeps``, ``config`` and everything below them (the same algorithm code, config and
checkpoints as the simulator); only the command line imports it.
"""

from __future__ import annotations

try:
    import flwr  # noqa: F401
except ImportError as e:  # pragma: no cover - depends on the environment
    raise ImportError("fedsl.flower needs Flower: pip install 'fedsl[flower]'") from e

from fedsl.flower.client import make_client_app, partition_id, train_partition
from fedsl.flower.config import FlowerOptions, FlowerSetup, load_setup, parse_run_config
from fedsl.flower.server import make_server_app
from fedsl.flower.strategy import FedslStrategy

__all__ = ["FedslStrategy", "FlowerOptions", "FlowerSetup", "load_setup", "make_client_app",
           "make_server_app", "parse_run_config", "partition_id", "train_partition"]
