"""The peers that run a workload: fedsl's engine, a plain PyTorch loop, Flower's simulation.

Every peer has ``setup()`` (build, warm up: one untimed round), ``run(rounds)`` returning
the seconds of each timed round (training of S clients + FedAvg, + FSL's server steps on D0 in an FSL
workload, + evaluation on the test set when the workload evaluates), ``settings`` (what it ran with)
and ``close()``. The benchmark calls them interleaved (engine, loop, Flower, engine, ...), so that noise from
other work on the machine hits all alike.
"""

from __future__ import annotations

import copy
import statistics
import time
from dataclasses import replace

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from fedsl.core import rng
from harness.machine import sync
from harness.workloads import Data, Workload


class Peer:
    name = "peer"
    available = True
    why_not = ""  # why the peer is not available

    def __init__(self) -> None:
        self.settings = ""
        self.extra: dict[str, float] = {}  # e.g. Flower's start-up seconds, its actors' memory

    def setup(self) -> None:
        pass

    def run(self, rounds: int) -> list[float]:
        raise NotImplementedError

    def close(self) -> None:
        pass


def _federation(w: Workload, data: Data, device: torch.device):
    from fedsl.data.federation import Federation
    x, y, server = data.x, data.y, np.zeros(0, dtype=np.int64)
    if data.x_server is not None:  # D0 as rows of the pool after the clients'
        x, y = torch.cat([x, data.x_server]), torch.cat([y, data.y_server])
        server = np.arange(len(data.x), len(x))
    fed = Federation(x, y, data.clients, server, data.x_test, data.y_test,
                     w.num_classes, [str(c) for c in range(w.num_classes)]).to(device, torch.float32)
    if device.type == "cpu" and fed.x.dim() == 4:
        # The simulator makes its own channels-last copy on CPU; handing it channels-last
        # tensors makes that a no-op, so several simulators (a seed sweep) share one copy.
        from dataclasses import replace
        fed = replace(fed, x=fed.x.contiguous(memory_format=torch.channels_last),
                      x_test=fed.x_test.contiguous(memory_format=torch.channels_last))
    return fed


def _simulators(w: Workload, data: Data, device: torch.device, executor: str, eval_batch_size: int):
    """One ``fedsl.engine.Simulator`` per seed: FedAvg with η_g = 1 (the plain mean of the
    other peers), the workload's S, B, E and η_l, on one shared federation; with server data (FSL workloads)
    FSL with η_g = 1, γ = 1, η0 = η_l, E_s and B0 = B (the loops' server steps; speed does not depend on the
    step sizes)."""
    from fedsl.algorithms import LocalTraining, ServerLearning, make_algorithm
    from fedsl.engine.executors import make_executor
    from fedsl.engine.functional import FunctionalModel
    from fedsl.engine.simulator import Simulator
    from fedsl.models import build_model

    fed = _federation(w, data, device)
    local = LocalTraining(w.lr, w.batch_size, w.epochs)
    alg = (make_algorithm("fsl", local, 1.0, ServerLearning(1.0, w.lr, w.batch_size, w.server_epochs))
           if w.server_samples else make_algorithm("fedavg", local, 1.0, None))
    sims = []
    for seed in range(w.seeds):
        fm = FunctionalModel(build_model(w.model, w.num_classes, w.input_shape, seed=seed))
        fm.module.to(device)
        sims.append(Simulator(fm, fed, alg, make_executor(executor, fm, device), w.clients_per_round, seed,
                              eval_batch_size))
    return sims


class EnginePeer(Peer):
    """fedsl's engine: ``Simulator.round`` (+ ``Simulator.evaluate``) for each seed in turn."""

    name = "fedsl"

    def __init__(self, w: Workload, data: Data, device: torch.device, executor: str = "auto",
                 eval_batch_size: int = 100) -> None:
        super().__init__()
        self.w, self.data, self.device, self.executor, self.eval_bs = w, data, device, executor, eval_batch_size
        self.t = 0

    def setup(self) -> None:
        self.sims = _simulators(self.w, self.data, self.device, self.executor, self.eval_bs)
        self.states = [s.initial_state() for s in self.sims]
        s = self.sims[0]
        layout = "channels-last" if s.channels_last else "contiguous"
        self.settings = (f"Simulator, {s.executor.name} executor, {layout}, eval batch {self.eval_bs}, "
                         f"{torch.get_num_threads()} threads" + (f", {len(self.sims)} simulators in turn"
                                                                 if len(self.sims) > 1 else ""))
        self.run(1)  # warm-up

    def run(self, rounds: int) -> list[float]:
        times = []
        for _ in range(rounds):
            t0 = time.perf_counter()
            for j, sim in enumerate(self.sims):
                if self.w.train:
                    self.states[j], _ = sim.round(self.states[j], self.t)
                if self.w.evaluate:
                    sim.evaluate(self.states[j].x)
            sync(self.device)
            times.append(time.perf_counter() - t0)
            self.t += 1
        return times

    def params(self, seed: int = 0) -> dict[str, torch.Tensor]:
        return self.states[seed].x

    def close(self) -> None:
        for sim in getattr(self, "sims", []):  # the process pool's workers
            getattr(sim.executor, "close", lambda: None)()


class ProcessesPeer(EnginePeer):
    """fedsl's engine with the process-pool executor (``fedsl.engine.pool``): the round's clients
    split over one worker process per usable core, one torch thread each. Its workers start in
    ``setup`` (the warm-up round), not counted, like Flower's start-up."""

    name = "fedsl processes"

    def __init__(self, w: Workload, data: Data, device: torch.device, executor: str = "processes",
                 eval_batch_size: int = 100) -> None:
        super().__init__(w, data, device, "processes", eval_batch_size)

    def setup(self) -> None:
        super().setup()
        self.settings += (f", {self.sims[0].executor.workers} worker processes x 1 thread (started in the "
                          "warm-up round, not counted)")


class VectorisedPeer(EnginePeer):
    """fedsl's engine with the vectorised executor (``torch.func.vmap`` over the round's clients), whatever
    ``--executor`` says: beside the ``fedsl`` row (the CPU's default, sequential) in one interleaved run. A
    char-LSTM runs its plain-operations LSTM under vmap (``nn.LSTM``'s fused kernel has no batching rule)."""

    name = "fedsl vectorised"

    def __init__(self, w: Workload, data: Data, device: torch.device, executor: str = "vectorised",
                 eval_batch_size: int = 100) -> None:
        super().__init__(w, data, device, "vectorised", eval_batch_size)


class StackedPeer(Peer):
    """``fedsl.engine.stacked.StackedSimulator`` over the seeds' simulators (all seeds per call)."""

    name = "fedsl stacked"

    def __init__(self, w: Workload, data: Data, device: torch.device, executor: str = "auto",
                 eval_batch_size: int = 100) -> None:
        super().__init__()
        self.w, self.data, self.device, self.executor, self.eval_bs = w, data, device, executor, eval_batch_size
        self.t = 0

    def setup(self) -> None:
        from fedsl.engine.stacked import StackedSimulator
        self.stack = StackedSimulator(_simulators(self.w, self.data, self.device, self.executor, self.eval_bs))
        self.states = self.stack.initial_states()
        self.settings = f"StackedSimulator of {self.w.seeds} simulators, {torch.get_num_threads()} threads"
        self.run(1)

    def run(self, rounds: int) -> list[float]:
        times = []
        for _ in range(rounds):
            t0 = time.perf_counter()
            if self.w.train:
                self.states, _ = self.stack.round(self.states, self.t)
            if self.w.evaluate:
                self.stack.evaluate([s.x for s in self.states])
            sync(self.device)
            times.append(time.perf_counter() - t0)
            self.t += 1
        return times


def plain_model(w: Workload, seed: int, device: torch.device) -> nn.Module:
    """The workload's model as an ordinary module (torch's own dropout), initialised from ``seed``."""
    from fedsl.models import build_model
    return build_model(w.model, w.num_classes, w.input_shape, seed=seed).to(device)


def to_channels_last(t: torch.Tensor) -> torch.Tensor:
    """A 4-D tensor in ``torch.channels_last`` memory format (no copy when it is already); others as they are."""
    return t.contiguous(memory_format=torch.channels_last) if t.dim() == 4 else t


def plain_evaluate(model: nn.Module, x: torch.Tensor, y: torch.Tensor, device: torch.device,
                   batch_size: int = 500, channels_last: bool = False) -> tuple:
    """The common research loop's test: a DataLoader at batch 500, ``torch.no_grad``, eval mode.

    ``channels_last``: each batch is put in channels-last format, as PyTorch's channels-last
    tutorial does (the DataLoader's collation stacks samples into a contiguous batch).
    """
    model.eval()
    correct, loss = 0, 0.0
    with torch.no_grad():
        for xb, yb in DataLoader(TensorDataset(x, y), batch_size=batch_size):
            xb, yb = xb.to(device), yb.to(device)
            if channels_last:
                xb = to_channels_last(xb)
            out = model(xb)
            loss += F.cross_entropy(out, yb, reduction="sum").item()
            correct += (out.argmax(1) == yb).sum().item()
    return correct / len(x), loss / len(x)


def plain_local_train(model: nn.Module, x: torch.Tensor, y: torch.Tensor, w: Workload, device: torch.device,
                      generator: torch.Generator | None = None, batches: list[list[int]] | None = None,
                      channels_last: bool = False) -> nn.Module:
    """One client's local training as most research code writes it: a deep copy of the global
    model, a shuffling DataLoader over the client's TensorDataset, ``torch.optim.SGD``.

    ``batches`` (lists of indices into the client's data) replaces the shuffling sampler,
    to replay a given batch order (tests compare with the engine on the same batches).
    ``channels_last``: each batch is put in channels-last format (the model is expected to be
    channels-last already; its deep copy stays so).
    """
    local = copy.deepcopy(model)
    local.train()
    opt = torch.optim.SGD(local.parameters(), lr=w.lr)
    ds = TensorDataset(x, y)
    if batches is not None:
        loaders = [DataLoader(ds, batch_sampler=batches)]
    else:
        loaders = [DataLoader(ds, batch_size=w.batch_size, shuffle=True, generator=generator)
                   for _ in range(w.epochs)]
    for loader in loaders:
        for xb, yb in loader:
            xb, yb = xb.to(device), yb.to(device)
            if channels_last:
                xb = to_channels_last(xb)
            opt.zero_grad()
            F.cross_entropy(local(xb), yb).backward()
            opt.step()
    return local


def plain_server_train(model: nn.Module, x: torch.Tensor, y: torch.Tensor, w: Workload, device: torch.device,
                       generator: torch.Generator | None = None, batches: list[list[int]] | None = None,
                       channels_last: bool = False) -> None:
    """FSL's server learning as research code would write it: the global model (after the clients' mean)
    trained in place for E_s epochs of SGD at batch B and step η_l on the server's samples (``plain_local_train``
    on a copy, loaded back; ``batches`` as there)."""
    trained = plain_local_train(model, x, y, replace(w, epochs=w.server_epochs), device, generator, batches,
                                channels_last)
    model.load_state_dict(trained.state_dict())


def mean_state(states: list[dict[str, torch.Tensor]]) -> dict[str, torch.Tensor]:
    """The element-wise mean of state dicts, in the order given."""
    return {k: torch.stack([s[k] for s in states]).mean(0) for k in states[0]}


def fedavg_mean(global_model: nn.Module, locals_: list[nn.Module]) -> None:
    """FedAvg with equal weights (the clients hold equally many samples): the mean of the
    clients' state dicts, loaded into ``global_model``."""
    global_model.load_state_dict(mean_state([m.state_dict() for m in locals_]))


class LoopPeer(Peer):
    """The plain sequential PyTorch loop (see ``plain_local_train``, ``fedavg_mean``,
    ``plain_evaluate``), one seed after another. Clients are sampled as the engine samples
    them (``fedsl.core.rng.sample_clients``), so both train the same clients each round.

    ``share_plan``: take each client's batches from the engine's batch plan instead of a
    shuffling DataLoader (tests: then both give the same model on a dropout-free model).
    """

    name = "plain loop"
    channels_last = False

    def __init__(self, w: Workload, data: Data, device: torch.device, share_plan: bool = False) -> None:
        super().__init__()
        self.w, self.data, self.device, self.share_plan = w, data, device, share_plan
        self.t = 0

    def setup(self) -> None:
        w = self.w
        # the clients' datasets, held on the CPU as research code usually does; batches move to the device
        self.client_data = [(self.data.x[idx], self.data.y[idx]) if len(idx) else None for idx in self.data.clients]
        self.x_test, self.x_server = self.data.x_test, self.data.x_server
        self.models = [plain_model(w, s, self.device) for s in range(w.seeds)]
        self.gen = torch.Generator().manual_seed(0)
        self.settings = f"deepcopy + DataLoader + SGD per client, eval batch 500, {torch.get_num_threads()} threads"
        self.run(1)

    def _batches(self, seed: int, cid: int) -> list[list[int]]:
        return engine_batches(self.w, seed, self.t, cid)

    def round(self, seed: int) -> None:
        w = self.w
        if w.train:
            ids = rng.sample_clients(seed, self.t, w.num_clients, w.clients_per_round)
            locals_ = []
            for cid in ids.tolist():
                x, y = self.client_data[cid]
                batches = self._batches(seed, cid) if self.share_plan else None
                locals_.append(plain_local_train(self.models[seed], x, y, w, self.device, self.gen, batches,
                                                 self.channels_last))
            fedavg_mean(self.models[seed], locals_)
            if w.server_samples:
                batches = engine_server_batches(w, seed, self.t) if self.share_plan else None
                plain_server_train(self.models[seed], self.x_server, self.data.y_server, w, self.device, self.gen,
                                   batches, self.channels_last)
        if w.evaluate:
            plain_evaluate(self.models[seed], self.x_test, self.data.y_test, self.device,
                           channels_last=self.channels_last)

    def run(self, rounds: int) -> list[float]:
        times = []
        for _ in range(rounds):
            t0 = time.perf_counter()
            for seed in range(self.w.seeds):
                self.round(seed)
            sync(self.device)
            times.append(time.perf_counter() - t0)
            self.t += 1
        return times


class ChannelsLastLoopPeer(LoopPeer):
    """The plain loop (``LoopPeer``) in channels-last memory format on the CPU: the models, the
    clients' images, the test images and every batch (PyTorch's channels-last recipe), on the
    process's torch threads. Its convolutions take oneDNN's channels-last kernels, which sum in
    another order than the default layout's: the same model as the plain loop to float rounding,
    not bit for bit."""

    name = "loop channels-last"
    channels_last = True

    def setup(self) -> None:
        w = self.w
        self.client_data = [(to_channels_last(self.data.x[idx]), self.data.y[idx]) if len(idx) else None
                            for idx in self.data.clients]
        self.x_test = to_channels_last(self.data.x_test)
        self.x_server = None if self.data.x_server is None else to_channels_last(self.data.x_server)
        self.models = [plain_model(w, s, self.device).to(memory_format=torch.channels_last) for s in range(w.seeds)]
        self.gen = torch.Generator().manual_seed(0)
        self.settings = (f"channels-last, deepcopy + DataLoader + SGD per client, eval batch 500, "
                         f"{torch.get_num_threads()} threads")
        self.run(1)


def engine_batches(w: Workload, seed: int, t: int, cid: int) -> list[list[int]]:
    """Client ``cid``'s batches in round ``t`` of run ``seed`` as the engine plans them (indices into
    the client's data; a last short batch without its padding)."""
    from fedsl.engine.plan import make_plan
    plan = make_plan([np.arange(w.samples_per_client)], [cid], w.batch_size, w.epochs, None, seed, t,
                     rng.CLIENT_BATCHES)
    return [plan.idx[0, k, :int((plan.weight[0, k] > 0).sum())].tolist() for k in range(plan.steps[0])]


def engine_server_batches(w: Workload, seed: int, t: int) -> list[list[int]]:
    """The server's K0 batches in round ``t`` of run ``seed`` as the engine plans them (indices into D0)."""
    from fedsl.engine.plan import make_plan
    from fedsl.engine.simulator import SERVER_ID
    plan = make_plan([np.arange(w.server_samples)], [SERVER_ID], w.batch_size, w.server_epochs, None, seed, t,
                     rng.SERVER_BATCHES)
    return [plan.idx[0, k, :int((plan.weight[0, k] > 0).sum())].tolist() for k in range(plan.steps[0])]


def median(xs: list[float]) -> float:
    return statistics.median(xs) if xs else float("nan")
