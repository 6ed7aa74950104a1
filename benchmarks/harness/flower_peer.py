"""Flower's simulation engine (``flwr.simulation.run_simulation``, Ray backend) as a peer.

A ServerApp runs ``flwr.serverapp.strategy.FedAvg`` (S of N nodes train per round, no
federated evaluation) with centralised evaluation of the global model on the test set
after every round when the workload evaluates (``plain_evaluate``, in the ServerApp's
process). The ClientApp does the plain loop's local training (``plain_local_train``) on
its client's data, which it regenerates from its partition id (``client_tensors``).

Timing: the strategy calls ``evaluate_fn`` before round 1 and after every round; we
stamp the clock there. A simulation of ``1 + rounds`` rounds is started per call: the
first round (actors starting, imports, first-touch allocations) is not timed; start-up
(``run_simulation`` called -> first round begins) is reported separately.
"""

from __future__ import annotations

import logging
import time

import torch

from harness.peers import Peer, plain_evaluate, plain_local_train, plain_model
from harness.workloads import Data, Workload, client_tensors

_FIELDS = ("model", "num_clients", "samples_per_client", "clients_per_round", "batch_size", "epochs", "test_size",
           "lr")


def _workload(cfg) -> Workload:
    return Workload("flower", **{k: cfg[k] for k in _FIELDS})


def _peak_rss_mb() -> float:
    from harness.machine import peak_rss_mb
    return peak_rss_mb()


def make_client_app():
    """The ClientApp: ``@app.train()`` loads the global arrays, trains like the plain loop,
    returns the arrays, ``num-examples`` and the actor's peak RSS."""
    from flwr.app import ArrayRecord, Context, Message, MetricRecord, RecordDict
    from flwr.clientapp import ClientApp

    app = ClientApp()

    @app.train()
    def train(msg: Message, context: Context) -> Message:
        cfg = msg.content["config"]
        torch.set_num_threads(int(cfg["threads"]))
        w = _workload(cfg)
        cid = int(context.node_config["partition-id"])
        x, y = client_tensors(w, cid, int(cfg["seed"]))
        device = torch.device(str(cfg["device"]))
        model = plain_model(w, 0, device)
        model.load_state_dict(msg.content["arrays"].to_torch_state_dict())
        local = plain_local_train(model, x, y, w, device)
        metrics = MetricRecord({"num-examples": len(x), "peak_rss_mb": _peak_rss_mb()})
        return Message(content=RecordDict({"arrays": ArrayRecord(local.state_dict()), "metrics": metrics}),
                       reply_to=msg)

    return app


def _max_metrics(records, weighting_key: str):
    from flwr.app import MetricRecord
    peaks = [float(r["metrics"]["peak_rss_mb"]) for r in records]
    return MetricRecord({"peak_rss_mb": max(peaks)})


class FlowerPeer(Peer):
    """FedAvg in Flower 1.42's simulation engine, Ray backend with ``actors`` actors of
    ``cpus_per_actor`` CPUs each (each actor's torch uses that many threads)."""

    name = "flower"

    def __init__(self, w: Workload, data: Data, device: torch.device, actors: int = 2, cpus_per_actor: int = 1,
                 seed: int = 0) -> None:
        super().__init__()
        self.w, self.data, self.device = w, data, device
        self.actors, self.cpus = actors, cpus_per_actor
        self.seed = seed
        self.startups: list[float] = []
        self.actor_peak = 0.0
        import importlib.util
        try:

            from harness.machine import optional_version
            self.version = optional_version("flwr") or "?"
            if importlib.util.find_spec("ray") is None:
                raise ImportError("ray is missing")
        except Exception as e:
            self.available = False
            self.why_not = (f"Flower's simulation not importable ({type(e).__name__}: {e}); install the bench "
                            "extra: pip install -e '.[bench]'")
        if w.seeds > 1:
            self.available = False
            self.why_not = "one Flower simulation per seed: 8x its single-seed row"
        if not w.train:
            self.available = False
            self.why_not = "Flower's centralised evaluation is the plain loop's evaluate"
        if w.server_samples:
            self.available = False
            self.why_not = "FedAvg only here (FSL's server steps would be the plain loop's, in its ServerApp)"

    def setup(self) -> None:
        # quiet while timed; ``close`` gives the loggers back their levels (a test run goes on after)
        self._levels = {name: logging.getLogger(name).level for name in ("flwr", "ray")}
        for name in self._levels:
            logging.getLogger(name).setLevel(logging.WARNING)
        self.settings = (f"flwr {self.version}, Ray, {self.actors} actors x {self.cpus} CPU, "
                         f"{self.cpus} torch thread(s) per actor, server eval batch 500")

    def close(self) -> None:
        for name, level in getattr(self, "_levels", {}).items():
            logging.getLogger(name).setLevel(level)

    def run(self, rounds: int) -> list[float]:
        from flwr.app import ArrayRecord, ConfigRecord, Context, MetricRecord
        from flwr.serverapp import Grid, ServerApp
        from flwr.serverapp.strategy import FedAvg
        from flwr.simulation import run_simulation

        w, data, device = self.w, self.data, self.device
        stamps: list[float] = []
        out: dict[str, float] = {}
        server = ServerApp()

        @server.main()
        def main(grid: Grid, context: Context) -> None:
            model = plain_model(w, self.seed, device)
            strategy = FedAvg(fraction_train=w.clients_per_round / w.num_clients, fraction_evaluate=0.0,
                              min_train_nodes=w.clients_per_round, min_available_nodes=w.num_clients,
                              train_metrics_aggr_fn=_max_metrics)
            cfg = {k: getattr(w, k) for k in _FIELDS}
            cfg.update(threads=self.cpus, seed=self.seed, device=str(device))

            def evaluate_fn(server_round: int, arrays: ArrayRecord) -> MetricRecord:
                if server_round > 0 and w.evaluate:
                    model.load_state_dict(arrays.to_torch_state_dict())
                    acc, loss = plain_evaluate(model, data.x_test, data.y_test, device)
                    out["accuracy"] = acc
                stamps.append(time.perf_counter())
                return MetricRecord({"round": server_round})

            result = strategy.start(grid=grid, initial_arrays=ArrayRecord(model.state_dict()), num_rounds=rounds + 1,
                                    train_config=ConfigRecord(cfg), evaluate_fn=evaluate_fn)
            peaks = [float(m["peak_rss_mb"]) for m in result.train_metrics_clientapp.values()]
            out["actor_peak_mb"] = max(peaks) if peaks else float("nan")

        backend = {"client_resources": {"num_cpus": self.cpus, "num_gpus": 0.0},
                   "init_args": {"num_cpus": self.actors * self.cpus, "include_dashboard": False,
                                 "logging_level": logging.ERROR, "log_to_driver": False}}
        t0 = time.perf_counter()
        run_simulation(server_app=server, client_app=make_client_app(), num_supernodes=w.num_clients,
                       backend_config=backend)
        if len(stamps) < rounds + 2:
            raise RuntimeError(f"Flower simulation finished {len(stamps) - 1} of {rounds + 1} rounds")
        timed = [b - a for a, b in zip(stamps[1:], stamps[2:])]
        # start-up: everything but the timed rounds (Ray and actors up, the untimed first round, shut-down)
        self.startups.append(time.perf_counter() - t0 - sum(timed))
        self.actor_peak = max(self.actor_peak, out.get("actor_peak_mb", 0.0))
        self.extra = {"startup_s": sum(self.startups) / len(self.startups), "actor_peak_mb": self.actor_peak,
                      "actors": self.actors}
        return timed
