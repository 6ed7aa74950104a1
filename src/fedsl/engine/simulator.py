"""The simulator: one process, all clients in memory, rounds of any algorithm.

    sample S clients -> the algorithm's client half on each (executor, vmapped or a loop)
    -> the malicious clients' attack on their models, if any (``fedsl.core.attacks``)
    -> its server half (a robust rule, the rule's update, then server learning on D0) -> clients' new states

The algorithm owns the arithmetic (``fedsl.algorithms``); the simulator samples, plans batches
and schedules. Everything random is drawn from (seed, round), so ``round(state, t)`` is a
function of (state, t) alone: that is what makes resume bit-identical. (The clients' states,
e.g. SCAFFOLD's c_i, are [N, ...] tables, or a store of the rows of the clients seen so far
(``fedsl.engine.client_state``), whose sampled rows are updated in place.)

Nothing a round does costs O(N): S of N are drawn in O(S) (``fedsl.core.rng.sample_clients``), and only the
sampled clients' index ranges, batches and state rows are touched. A federation whose clients' samples are made on
demand (``Federation.on_demand``: a generated benchmark) gets a round pool each round: its pool (D0) followed by
the sampled clients' samples, made for them from (seed, client id), which their batch plans index.
"""

from __future__ import annotations

import hashlib
from collections import OrderedDict
from dataclasses import dataclass, field, replace
from pathlib import Path

import numpy as np
import torch

from fedsl.algorithms import distillation
from fedsl.algorithms.algorithm import Algorithm
from fedsl.algorithms.base import ClientResults, LocalTraining, RunState, State, stack_reply
from fedsl.algorithms.label_counts import LabelCounts, label_counts
from fedsl.algorithms.server_learning import Pretraining
from fedsl.algorithms.server_round import ServerMetrics, ServerSide, initial_state, server_update
from fedsl.algorithms.spec import CLIENT_MEASURES
from fedsl.core import attacks, participation, rng
from fedsl.core import threads as _threads
from fedsl.core.attacks import NO_ATTACK, Attack
from fedsl.core.participation import FULL, Participation
from fedsl.core.transfer import to_device
from fedsl.core.types import Params
from fedsl.data.federation import Federation
from fedsl.data.poisoning import flip_labels
from fedsl.engine.client_state import DENSE, STORE_FILE, ClientStore, SavedStore, StoreSettings, store_dtype
from fedsl.engine.executors import Executor
from fedsl.engine.functional import EVAL_PRECISIONS, FunctionalModel, evaluate, full_gradient
from fedsl.engine.plan import BatchPlan, make_plan, truncate
from fedsl.models.batchnorm import BATCHNORM_CLIENTS, BATCHNORM_MODES, BATCHNORM_SAMPLES

__all__ = ["ClientWork", "RoundInfo", "RunState", "Simulator"]  # RunState lives in algorithms.base

SERVER_ID = -1  # the server's id in batch-plan streams

# Pretrained x_0 by digest of everything it depends on (``Simulator._pretrain_key``). The runs of
# a sweep over γ, η_l, S or the algorithm share D0 and the seed, so they share one pretraining
# (500 epochs on D0: minutes on a CPU per run) instead of repeating it.
_PRETRAINED: OrderedDict[str, Params] = OrderedDict()
_PRETRAINED_MAX = 16  # a sweep cycles over seeds × D0s; 16 CIFAR CNNs are 35 MB


@dataclass
class RoundInfo:
    clients: np.ndarray  # ids of the sampled clients
    client_steps: tuple[int, ...]  # K_i actually taken
    server_steps: int  # K0 actually taken (0 without server learning)
    gamma: float | None = None  # γ_t used by server learning this round
    cos_theta: float | None = None  # cos of the angle between -∇f0(x_t) and the clients' update
    comm_params: int = 0  # parameters sent down and up this round
    dropped: tuple[int, ...] = ()  # sampled clients whose update never arrived (stragglers, mode 'drop')
    distill_steps: int = 0  # FedDF's distillation steps taken (early stopping may end them before distill.steps)


@dataclass
class ClientWork:
    """A round's client phase: who trains (ids, n_i) and on which batches."""

    ids: np.ndarray
    ids_t: torch.Tensor
    sizes: list[int]  # n_i of the sampled clients (D_i ∪ D0 for DS)
    plan: BatchPlan
    dropped: frozenset[int] = frozenset()  # stragglers that train but whose update never arrives
    pool: tuple[torch.Tensor, torch.Tensor] | None = None  # the round's (x, y) the plan indexes (None: the
    # federation's pool); clients made on demand: the pool, then the sampled clients' samples
    # what each sampled client measured at x_t for a rule that declares it (``Simulator.measure_clients``): the
    # measure's name -> one value per client, in ``ids``' order (a float, or parameters shaped like x)
    measured: dict[str, list] = field(default_factory=dict)

    @property
    def steps(self) -> tuple[int, ...]:
        return self.plan.steps  # K_i


# The channels-last copies of the last training pools converted in this process: the runs of a sweep share one
# pool tensor (``fedsl.data.datasets`` hands every run of a dataset the same one), so the pool is converted once,
# not once per run. Shared copies are read, never written to.
_CHANNELS_LAST: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}
_CHANNELS_LAST_KEPT = 2


def channels_last_pool(x: torch.Tensor) -> torch.Tensor:
    """``x.contiguous(memory_format=torch.channels_last)``, converted once per pool tensor and shared."""
    hit = _CHANNELS_LAST.get(id(x))
    if hit is not None and hit[0] is x:
        return hit[1]
    converted = x.contiguous(memory_format=torch.channels_last)
    while len(_CHANNELS_LAST) >= _CHANNELS_LAST_KEPT:
        _CHANNELS_LAST.pop(next(iter(_CHANNELS_LAST)))
    _CHANNELS_LAST[id(x)] = (x, converted)  # x is held, so its id is not reused while the entry lives
    return converted


class Simulator:
    """Runs rounds of ``algorithm`` on ``fed`` with ``executor``.

    Args:
        fm: the model as a pure function.
        fed: the federation, already on the target device and dtype.
        algorithm: what to run (FedAvg, FSL, FSL-p, DS, SCAFFOLD, FedDyn, ...).
        executor: runs the algorithm's client half for the sampled clients (sequential or vectorised).
        clients_per_round: S.
        seed: the run seed; all randomness derives from it and the round.
        eval_batch_size: batch size for evaluation (no grad).
        eval_precision: "float32", or "bfloat16" (evaluation's forward passes under bf16 autocast).
        tables_on_host: keep the clients' state tables (SCAFFOLD's c_i, FedDyn's ∇L_i: N × d) in host memory
            and copy the sampled rows to the device and back each round (a GPU too small for N × d).
        part: client availability and stragglers (``fedsl.core.participation``; default: the paper's setting).
        attack: Byzantine clients (``fedsl.core.attacks``; default none): the run's malicious clients
            (``malicious``, drawn once from the seed) train on flipped labels (label_flip: their samples are
            copied into the pool relabelled, ``fedsl.data.poisoning``) or replace their models after training.
        client_store: how the clients' states are kept (``fedsl.engine.client_state``): [N, ...] tables (the
            default), or the rows of the clients seen so far, in the run's dtype or float16, in memory (the
            tables' device) or in a file in ``run_folder``, which the runner sets to the run's folder.
        threads: torch's intra-op threads for this process, set here as ``fedsl run`` sets them: 0 (the default)
            the command line's automatic rule (``fedsl.core.threads``: never more than torch's current setting, the
            cores this process may use or the cores the machine's load leaves free; on a busy 2-core machine one
            thread, where torch's default two spin on each other many times slower), N pins N, None leaves torch's
            setting alone. Float sums, and so results in their last bits, depend on the number: pin it for
            bit-identical reruns across machines and loads.
        batchnorm: where a model's BatchNorm layers take their statistics when evaluated (``model.batchnorm``,
            ``fedsl.models.batchnorm``): "batch" (each evaluated batch's own), "clients" (estimated at each
            evaluation on ``batchnorm_samples`` of the clients' training samples, drawn once), "server" (on D0) or
            "local" (FedBN: the algorithm keeps each client's γ, β, ``algorithms.local_norm``; ``evaluate`` scores
            ``batchnorm_clients`` clients' own models, each with its own samples' statistics, ``personal``). In
            training every layer normalises by its batch's real samples. Unused for a model without BatchNorm.

    x_0 is ``fm``'s parameters as given: a module built with ``fedsl.build_model`` or wrapped as
    ``FunctionalModel(module, seed=...)`` is initialised from a seed, so a run is a function of its seeds alone.
    """

    def __init__(self, fm: FunctionalModel, fed: Federation, algorithm: Algorithm, executor: Executor,
                 clients_per_round: int, seed: int, eval_batch_size: int = 500, eval_precision: str = "float32",
                 tables_on_host: bool = False, part: Participation = FULL, attack: Attack = NO_ATTACK,
                 client_store: StoreSettings = DENSE, threads: int | None = 0, batchnorm: str = "batch",
                 batchnorm_samples: int = BATCHNORM_SAMPLES, batchnorm_clients: int = BATCHNORM_CLIENTS) -> None:
        assert eval_precision in EVAL_PRECISIONS, eval_precision  # config validation checks it
        if threads is not None:
            _threads.apply(threads)
        self.attack = attack
        self.malicious = attacks.malicious_clients(seed, fed.num_clients, attack)  # M, fixed for the run
        if attack.kind == "label_flip":
            fed = flip_labels(fed, self.malicious.tolist())
        self.fm, self.fed, self.alg, self.executor = fm, fed, algorithm, executor
        self.S, self.seed, self.eval_batch_size = clients_per_round, seed, eval_batch_size
        self.eval_precision = eval_precision
        self.part = part
        # DS: D'_i = D_i ∪ D0, fixed for the run (D0's indices kept once, appended to each client's when read)
        self.client_data = fed.clients.with_shared(fed.server) if algorithm.share_server_data else fed.clients
        # the run's float dtype: the inputs' (images, features), else the model's (text: character indices)
        self.dtype = fed.x.dtype if fed.x.is_floating_point() else next(fm.module.parameters()).dtype
        self.device = fed.x.device
        self.tables_device = torch.device("cpu") if tables_on_host or client_store.on_disk else self.device
        self.client_store = client_store
        self.run_folder: Path | None = None  # where a store on disk keeps its file (the run's folder)
        # Channels-last images and conv weights take oneDNN's fast convolutions on CPU: faster
        # evaluation and training of the CNNs (benchmarks/RESULTS.md).
        self.channels_last = self.device.type == "cpu" and fed.x.dim() == 4
        if self.channels_last:
            self.fed = replace(fed, x=channels_last_pool(fed.x),
                               x_test=fed.x_test.contiguous(memory_format=torch.channels_last))
        self.num_params = sum(p.numel() for p in fm.module.parameters())
        self._label_counts: LabelCounts | None = None
        self._unlabelled_parts: tuple[np.ndarray, torch.Tensor] | None = None
        self._validation: tuple[torch.Tensor, torch.Tensor] | None = None
        self._label_mix: np.ndarray | None = None  # p_i(c), for the clients' accuracies (made on first use)
        self.batchnorm = batchnorm
        self.norm_source = self._norm_source(batchnorm, batchnorm_samples)
        self.norm_clients = self._norm_clients(batchnorm_clients) if batchnorm == "local" else np.zeros(0, np.int64)

    def _norm_clients(self, m: int) -> np.ndarray:
        """FedBN's evaluation clients: ``m`` of the N, drawn once from (seed, BATCHNORM_SAMPLE), in id order."""
        if self.fed.on_demand is not None:
            raise ValueError("model.batchnorm = 'local' estimates each client's statistics on its own samples, which "
                             "a federation read on demand does not hold: expected 'clients', 'server' or 'batch'")
        n = self.fed.num_clients
        return np.sort(rng.rng(self.seed, rng.BATCHNORM_SAMPLE).choice(n, min(m, n), replace=False))

    def _norm_source(self, mode: str, samples: int) -> torch.Tensor | None:
        """The inputs BatchNorm's evaluation statistics are estimated on (``model.batchnorm``): none ('batch':
        each evaluated batch's own), D0 ('server'), or ``samples`` of the clients' training samples drawn once from
        (seed, BATCHNORM_SAMPLE) ('clients': their statistics under the evaluated model, pooled, which is what
        averaging the clients' statistics weighted by their sizes gives)."""
        if mode not in BATCHNORM_MODES:
            raise ValueError(f"model.batchnorm = {mode!r}: expected one of {', '.join(BATCHNORM_MODES)}")
        if mode in ("batch", "local") or not self.fm.norm_names:  # local: a client's own, at its evaluation
            return None
        if mode == "server":
            if not self.fed.n0:
                raise ValueError("model.batchnorm = 'server' estimates BatchNorm's statistics on D0, but the run has "
                                 "no server data (n0 = 0): expected 'clients' or 'batch'")
            idx = np.asarray(self.fed.server)
        else:
            pool = np.asarray(self.fed.clients.indices)
            if not len(pool):
                raise ValueError("model.batchnorm = 'clients': the clients hold no samples (on-demand data): "
                                 "expected 'server' or 'batch'")
            idx = np.sort(rng.rng(self.seed, rng.BATCHNORM_SAMPLE).choice(len(pool), min(samples, len(pool)),
                                                                          replace=False))
            idx = pool[idx]
        return self.fed.x[torch.as_tensor(idx, dtype=torch.long, device=self.device)]

    def initial_params(self, pretrain: Pretraining | None = None) -> Params:
        """x_0: the model's initialisation, optionally pretrained on D0 (before round 1)."""
        params = self.layout({n: p.to(device=self.device, dtype=self.dtype) for n, p in self.fm.params().items()})
        if pretrain is not None and pretrain.epochs > 0 and self.fed.n0 > 0:
            key = self._pretrain_key(params, pretrain)
            if key not in _PRETRAINED:
                plan = make_plan([self.fed.server], [SERVER_ID], pretrain.batch_size, pretrain.epochs, None,
                                 self.seed, -1, rng.PRETRAIN).to(self.device, self.dtype)
                done = self._one(self.executor.local_sgd(params, plan, self.fed.x, self.fed.y, pretrain.lr))
                _PRETRAINED[key] = {n: p.clone() for n, p in done.items()}
                while len(_PRETRAINED) > _PRETRAINED_MAX:
                    _PRETRAINED.popitem(last=False)
            _PRETRAINED.move_to_end(key)
            params = {n: p.clone() for n, p in _PRETRAINED[key].items()}
        return params

    def _pretrain_key(self, params: Params, pretrain: Pretraining) -> str:
        """A digest of every input of pretraining: the architecture, the initial weights, D0's
        samples and labels, the schedule (epochs, lr, batch), the seed (batch order, dropout),
        dtype, device and executor. Equal digests mean bit-equal pretrained models."""
        h = hashlib.sha256()
        head = (repr(self.fm.module), pretrain, self.seed, str(self.dtype), str(self.device),
                type(self.executor).__name__, self.channels_last)
        h.update(repr(head).encode())
        server = torch.as_tensor(self.fed.server, dtype=torch.long, device=self.device)
        tensors = [*(params[n] for n in sorted(params)), self.fed.x[server], self.fed.y[server]]
        for t in tensors:
            h.update(repr((tuple(t.shape), str(t.dtype))).encode())
            h.update(t.detach().cpu().contiguous().numpy().tobytes())
        return h.hexdigest()

    def initial_state(self, pretrain: Pretraining | None = None) -> RunState:
        """Round 0: x_0 (optionally pretrained), the server's and every client's initial state, γ_0."""
        x = self.initial_params(pretrain)
        rule, n = self.alg.rule, self.fed.num_clients
        initial = rule.init_client_state(x)
        if self.client_store.sparse and initial:  # rows for the clients seen, the initial row implied for the rest
            clients = ClientStore(initial, n, self.tables_device, store_dtype(self.client_store, self.dtype),
                                  self.store_file())
        else:
            # the clients' states as [N, ...] tables: the round updates the sampled clients' rows in place,
            # since copying N×d numbers (2 GB for 1,000 CIFAR clients) would cost more than the round
            clients = {k: {p: v.to(self.tables_device).unsqueeze(0).expand(n, *v.shape).clone() for p, v in g.items()}
                       for k, g in initial.items()}
        return initial_state(self.alg, x, clients)

    def store_file(self) -> Path | None:
        """The file of a store on disk (``STORE_FILE`` in the run's folder; never outside it), None in memory."""
        if not self.client_store.on_disk:
            return None
        if self.run_folder is None:
            raise ValueError("client_state.on_disk = true keeps the clients' states in a file in the run's folder: "
                             "expected a run with an output folder (Simulator.run_folder)")
        return Path(self.run_folder) / STORE_FILE

    def place_clients(self, clients: State | ClientStore | SavedStore) -> State | ClientStore:
        """A checkpoint's clients' states (on the CPU) where this run keeps them: dense tables on the tables'
        device in the run's dtype; a sparse store's rows on its device or in its file, rebuilt from the checkpoint
        (so a file a killed run left ahead of its checkpoint is overwritten)."""
        if not clients:
            return {}
        saved = clients.saved() if isinstance(clients, ClientStore) else clients
        if isinstance(clients, ClientStore) and clients.path is not None and clients.path == self.store_file():
            saved = replace(saved, rows=saved.rows.clone())  # its file is rewritten below: the rows first in memory
        sparse = isinstance(saved, SavedStore)
        if sparse != self.client_store.sparse:
            held = "a sparse store" if sparse else "dense tables"
            raise ValueError(f"the checkpoint holds the clients' states as {held}: expected client_state.store as the "
                             f"run started with, not {self.client_store.store!r}")
        if not isinstance(saved, SavedStore):
            return {k: {n: v.to(device=self.tables_device, dtype=self.dtype) for n, v in g.items()}
                    for k, g in saved.items()}
        if saved.dtype != store_dtype(self.client_store, self.dtype):
            raise ValueError(f"the checkpoint's client states are {str(saved.dtype).removeprefix('torch.')}: expected "
                             f"client_state.dtype as the run started with, not {self.client_store.dtype!r}")
        return ClientStore.restore(saved, self.fed.num_clients, self.device, self.dtype, self.tables_device,
                                   self.store_file())

    def round(self, state: RunState, t: int) -> tuple[RunState, RoundInfo]:
        """x_{t+1} (and the algorithm's state) from x_t: one round of the algorithm.

        Sample S clients and plan their batches; run the algorithm's client half for them (the
        executor); its server half (``server_round.server_update``: the rule's update, then
        server learning on D0); write the clients' new states into their rows.
        """
        state = replace(state, x=self.layout(state.x))
        work = self.measure_clients(self.sample(t), state.x)
        finals, rows = self.train_clients(state, work, t) if len(work.ids) else ({}, {})
        results = self.results(work, finals, state.x, t)
        new, metrics = server_update(self.alg, state, results, t, self.server)
        return self.end_round(new, work, rows, metrics)

    # A round in phases, so that ``StackedSimulator`` can run the clients (and the server's SGD)
    # of several runs in one executor call between them, and a Flower ClientApp its one client.

    def sample(self, t: int, host: bool = False) -> ClientWork:
        """Round t's S clients (drawn from (seed, t) alone) and their batches; ``host``: the ids and plan
        stay on the host (``StackedSimulator`` concatenates those of all runs and copies them once).
        With availability p < 1: S of the available clients (fewer, or none); with stragglers, their
        shortened plans and the clients whose update will not arrive (``fedsl.core.participation``)."""
        ids = participation.sample(self.seed, t, self.fed.num_clients, self.S, self.part)
        ids_t = torch.from_numpy(ids) if host else to_device(torch.from_numpy(ids), self.device)
        pool, data = self.round_pool(ids)
        plan, dropped = self._plan(data, ids.tolist(), t, self.alg.local), frozenset()
        if not self.part.full:
            steps, dropped = participation.stragglers(self.seed, t, ids, plan.steps, self.part)
            plan = truncate(plan, steps)
        return ClientWork(ids, ids_t, [len(d) for d in data], plan if host else plan.to(self.device, self.dtype),
                          dropped, pool)

    def round_pool(self, ids: np.ndarray) -> tuple[tuple[torch.Tensor, torch.Tensor] | None, list[np.ndarray]]:
        """The pool that clients ``ids`` train from, and each one's index array into it (D_i, or D_i ∪ D0 for DS).
        Clients in the federation's pool: None (that pool) and their index arrays. Clients made on demand: the
        pool (D0) followed by their samples, made now (in ``ids``' order), and their positions in it."""
        if self.fed.on_demand is None:
            return None, [self.client_data[i] for i in ids]
        if not len(ids):
            return None, []
        x_new, y_new = self.fed.on_demand.samples(ids)
        base, own = len(self.fed.x), self.fed.clients.sizes_of(ids)
        starts = base + np.concatenate([[0], np.cumsum(own)[:-1]]).astype(np.int64)
        shared = self.client_data.shared
        data = [np.arange(a, a + k, dtype=np.int64) for a, k in zip(starts, own)]
        if shared is not None:
            data = [np.concatenate([d, shared]) for d in data]
        x = torch.cat([self.fed.x, torch.from_numpy(x_new).to(device=self.device, dtype=self.dtype)])
        y = torch.cat([self.fed.y, torch.from_numpy(y_new).to(self.device)])
        return (x, y), data

    def results(self, work: ClientWork, finals: dict, x: Params, t: int) -> ClientResults | None:
        """What reaches the server of the sampled clients' models ``finals`` trained from x_t = ``x`` in round t:
        all but the dropped stragglers' (None: nothing arrives, x̄ = x_t), a malicious client's attacked
        (``fedsl.core.attacks.attack_finals``: x_t + A(Δ_i); honest rows and runs without an attack as they are)."""
        if not work.dropped:
            if not len(work.ids):
                return None
            ids = tuple(work.ids.tolist())
            return ClientResults(self._attacked(x, finals, ids, t), work.sizes, work.steps, ids,
                                 self.replies(work, range(len(ids))))
        keep = [j for j, i in enumerate(work.ids.tolist()) if i not in work.dropped]
        if not keep:
            return None
        at = torch.tensor(keep, device=next(iter(finals.values())).device)
        ids = tuple(int(work.ids[j]) for j in keep)
        return ClientResults(self._attacked(x, {n: v.index_select(0, at) for n, v in finals.items()}, ids, t),
                             [work.sizes[j] for j in keep], tuple(work.steps[j] for j in keep), ids,
                             self.replies(work, keep))

    def replies(self, work: ClientWork, rows) -> dict:
        """What the clients at positions ``rows`` of ``work`` send beside x_i (the spec's ``reply``), stacked:
        [S] float64 for a number each, parameters stacked [S, ...] for a tensor each."""
        names = self.alg.spec.reply if self.alg.spec is not None else ()
        measured = self._measured(work, names)
        return {name: stack_reply([measured[name][j] for j in rows], self.device) for name in names}

    def _measured(self, work: ClientWork, names: tuple[str, ...]) -> dict[str, list]:
        """``work.measured``, which must hold ``names`` (else a one-line error: a caller running the round's phases
        itself skipped ``measure_clients``)."""
        if any(k not in work.measured for k in names):
            raise ValueError(f"algorithm {self.alg.name!r} reads its clients' {', '.join(names)}: the round's work "
                             "was not measured at x_t (Simulator.measure_clients)")
        return work.measured

    def measure_clients(self, work: ClientWork, x: Params) -> ClientWork:
        """``work`` with what each sampled client measures at x_t = ``x`` for the rule (its spec's ``measures`` and
        ``reply``: ``client_measure``); as it is for a rule that declares none."""
        names = self.alg.spec.client_measures if self.alg.spec is not None else ()
        if not names:
            return work
        return replace(work, measured={k: [self.client_measure(k, x, int(i)) for i in work.ids] for k in names})

    def client_measure(self, name: str, x: Params, i: int):
        """A measure of client i at ``x`` on its data (D_i, or D_i ∪ D0 for DS), dropout off (the evaluation's
        forward pass): ``start_loss`` F_i(x), its mean cross-entropy (a float), or ``start_grad`` ∇F_i(x) (parameters
        shaped like x). A Flower ClientApp measures its own the same way and reports what the rule reads back."""
        (pool_x, pool_y), data = self.round_pool(np.array([i])) if self.fed.on_demand is not None else \
            ((self.fed.x, self.fed.y), [self.client_data[i]])
        idx = torch.as_tensor(data[0], dtype=torch.long, device=self.device)
        if name == "start_loss":
            return evaluate(self.fm, self.layout(x), pool_x[idx], pool_y[idx], self.eval_batch_size,
                            self.eval_precision, self.norm_source)[1]
        if name == "start_grad":
            return full_gradient(self.fm, self.layout(x), pool_x[idx], pool_y[idx], self.eval_batch_size)
        raise ValueError(f"client measure {name!r}: expected one of {list(CLIENT_MEASURES)}")

    def _attacked(self, x: Params, finals: Params, ids: tuple[int, ...], t: int) -> Params:
        return attacks.attack_finals(self.attack, x, finals, ids, self.malicious, self.seed, t)

    @property
    def attacked(self) -> bool:
        """Whether some client's model may be replaced by an attack (``results`` changes rows)."""
        return self.attack.on_updates and len(self.malicious) > 0

    def plan_clients(self, ids: list[int], t: int, local: LocalTraining | None = None, host: bool = False
                     ) -> BatchPlan:
        """The batches of clients ``ids`` in round t: each from rng(seed, t, CLIENT_BATCHES, i), so a client
        can plan its own from its id alone (a Flower node) and the plan does not depend on the others."""
        if self.fed.on_demand is not None:
            raise ValueError("the clients' samples are made on demand: their plans index a round's pool "
                             "(Simulator.sample)")
        plan = self._plan([self.client_data[i] for i in ids], ids, t, local or self.alg.local)
        return plan if host else plan.to(self.device, self.dtype)

    def _plan(self, data: list[np.ndarray], ids: list[int], t: int, loc: LocalTraining) -> BatchPlan:
        """The batches of clients ``ids`` over their index arrays ``data`` (on the host)."""
        return make_plan(data, ids, loc.batch_size, loc.epochs, loc.steps, self.seed, t, rng.CLIENT_BATCHES)

    def sent(self, state: RunState) -> State:
        """What the server sends the clients besides x_t (the spec's ``sends``): the server state they read
        (SCAFFOLD's c) and the server measures at x_t (FedCLG-C's ∇f0(x_t), ``ServerSide.measure``)."""
        sp = self.alg.spec
        if sp is None or not sp.sends:
            return {}
        return {**{k: state.algo[k] for k in sp.sent_state},
                **{k: self.server.measure(k, self.layout(state.x)) for k in sp.sent_measures}}

    def client_inputs(self, state: RunState, work: ClientWork) -> list[State]:
        """What each sampled client's half reads besides x_t and its state (its ``sent``): what the server sent
        (``sent``), and what the client measured at x_t for it (the spec's ``measures``: FedCLG-C's ∇F_i(x_t))."""
        sent = self.sent(state)
        own = self.alg.spec.measures if self.alg.spec is not None else ()
        measured = self._measured(work, own)
        return [{**sent, **{k: measured[k][j] for k in own}} for j in range(len(work.ids))]

    def train_clients(self, state: RunState, work: ClientWork, t: int) -> tuple[dict, State]:
        """The algorithm's client half for the sampled clients: their final models and new states."""
        rows = self.client_rows(state.clients, work)
        s = len(work.ids)
        x, y = work.pool if work.pool is not None else (self.fed.x, self.fed.y)
        return self.executor.train(self.alg.client, [state.x] * s, work.plan, x, y, self.alg.local.lr, rows,
                                   self.client_inputs(state, work))

    def end_round(self, new: RunState, work: ClientWork, rows: State, metrics: ServerMetrics
                  ) -> tuple[RunState, RoundInfo]:
        """The round's record, and the sampled clients' new states written into their rows."""
        # x_t down to every sampled client, their models up from those whose update arrives
        comm = round((2 * len(work.ids) - len(work.dropped)) * self.num_params * (self.alg.spec.comm_factor
                                                                                   if self.alg.spec else 1))
        info = RoundInfo(work.ids, work.steps, metrics.server_steps, metrics.gamma, metrics.cos_theta, comm,
                         tuple(sorted(work.dropped)), metrics.distill_steps)
        # last, so that an interruption inside the round leaves the tables as the checkpoint expects
        if isinstance(new.clients, ClientStore):
            new.clients.scatter(work.ids, rows)
            return new, info
        at = self._table_index(work)
        for key, new_rows in rows.items():
            for n, r in new_rows.items():
                new.clients[key][n][at] = r.to(self.tables_device)
        return new, info

    def client_rows(self, clients: State, work: ClientWork) -> State:
        """The sampled clients' rows of the state tables, on the device (copied over from host tables)."""
        if isinstance(clients, ClientStore):
            return clients.gather(work.ids)
        at = self._table_index(work)
        return {k: {n: to_device(v[at], self.device) for n, v in g.items()} for k, g in clients.items()}

    def _table_index(self, work: ClientWork) -> torch.Tensor:
        return torch.from_numpy(work.ids) if self.tables_device.type == "cpu" else work.ids_t

    @property
    def server(self) -> ServerSide:
        """N, n0, LocalSGD on D0, ∇f0, the accuracy on D0, the label counts, FLTrust's server model, the seed
        (DP-FedAvg's noise) and FedDF's distillation: what the server half needs."""
        rb = self.alg.robust
        root = self.root_sgd if rb is not None and rb.aggregator == "fltrust" else None
        distill = self.distill if self.alg.distillation is not None else None
        return ServerSide(self.fed.num_clients, self.fed.n0, self.server_sgd, self.f0_gradient, self.d0_accuracy,
                          self.label_counts, root, self.seed, distill)

    def d0_accuracy(self, x: Params) -> float:
        """The accuracy of ``x`` on D0 (FedDU's acc_t)."""
        idx = torch.as_tensor(self.fed.server, device=self.device)
        return evaluate(self.fm, self.layout(x), self.fed.x[idx], self.fed.y[idx], self.eval_batch_size,
                        self.eval_precision, self.norm_source)[0]

    def label_counts(self) -> LabelCounts:
        """The clients' (D_i, or D_i ∪ D0 for DS) and D0's class counts, made once."""
        if self._label_counts is None:
            self._label_counts = label_counts(self.fed.y, self.client_data, self.fed.server, self.fed.num_classes)
        return self._label_counts

    def f0_gradient(self, x: Params) -> Params:
        """∇f0(x) on all of D0 (dropout off)."""
        idx = torch.as_tensor(self.fed.server, device=self.device)
        return full_gradient(self.fm, x, self.fed.x[idx], self.fed.y[idx])

    def server_sgd(self, params: Params, t: int, lr: float) -> tuple[Params, int]:
        """LocalSGD(params, lr, K0, D0) over round t's server batches (line 10: lr = γ_t·η0); the model and K0."""
        plan = self.server_plan(t)
        x = self._one(self.executor.local_sgd(params, plan, self.fed.x, self.fed.y, lr))
        return x, plan.steps[0]

    def root_sgd(self, params: Params, t: int) -> Params:
        """FLTrust's server model in round t: LocalSGD on D0 from ``params`` (x_t) with the robust rule's schedule
        (``Robust.root``: η, B, K, by default the clients'), its batches from (seed, t, ROOT_BATCHES)."""
        rb = self.alg.robust
        assert rb is not None and rb.root is not None, "FLTrust's root schedule (resolve sets it)"
        loc = rb.root
        plan = make_plan([self.fed.server], [SERVER_ID], loc.batch_size, loc.epochs, loc.steps, self.seed, t,
                         rng.ROOT_BATCHES).to(self.device, self.dtype)
        return self._one(self.executor.local_sgd(self.layout(params), plan, self.fed.x, self.fed.y, loc.lr))

    def unlabelled_parts(self) -> tuple[np.ndarray, torch.Tensor]:
        """U's training part (pool indices, on the host: the batch plans draw from it) and validation part (on the
        device): ``distill.val_fraction`` of U held out, drawn once from (seed, DISTILL_SPLIT)."""
        if self._unlabelled_parts is None:
            d, u = self.alg.distillation, np.asarray(self.fed.unlabelled)
            assert d is not None, "only an algorithm that distils splits U"
            train, val = distillation.split(len(u), d.val_fraction, rng.rng(self.seed, rng.DISTILL_SPLIT))
            self._unlabelled_parts = u[train], to_device(torch.from_numpy(u[val]), self.device)
        return self._unlabelled_parts

    def distill_plan(self, t: int) -> BatchPlan:
        """Round t's distillation batches of U's training part: K = ``distill.steps`` batches of ``distill.batch_size``
        (epochs reshuffled), their dropout keys from (seed, t, DISTILL_BATCHES)."""
        d = self.alg.distillation
        assert d is not None
        return make_plan([self.unlabelled_parts()[0]], [SERVER_ID], d.batch_size, 1, d.steps, self.seed, t,
                         rng.DISTILL_BATCHES).to(self.device, self.dtype)

    def distill(self, x_bar: Params, finals: Params, t: int) -> distillation.Distilled:
        """FedDF's fusion in round t: the ensemble of the client models ``finals`` (stacked) distilled into x̄ on
        U (``distillation.distill``: the student in training mode, the teachers and the validation in evaluation
        mode)."""
        d, fm = self.alg.distillation, self.fm
        assert d is not None
        plan = self.distill_plan(t)

        def student(params: Params, x: torch.Tensor, key: torch.Tensor, w: torch.Tensor | None = None) -> torch.Tensor:
            fm.train(True)
            return fm.forward(params, x, key, w)

        def predict(params: Params, x: torch.Tensor) -> torch.Tensor:
            fm.train(False)
            return fm.forward(params, x)

        return distillation.distill(d, self.layout(x_bar), finals, student, predict, self.fed.x, plan.idx[0],
                                    plan.weight[0], plan.keys[0], self.unlabelled_parts()[1], self.eval_batch_size)

    def finetune(self, params: Params, epochs: int, lr: float, batch_size: int) -> Params:
        """``epochs`` epochs of SGD on D0 from ``params`` (step ``lr``, batches of ``batch_size``): the
        'FedAvg, then fine-tune on D0' control after the last round; its batches from (seed, FINETUNE)."""
        plan = make_plan([self.fed.server], [SERVER_ID], batch_size, epochs, None, self.seed, -1,
                         rng.FINETUNE).to(self.device, self.dtype)
        return self._one(self.executor.local_sgd(self.layout(params), plan, self.fed.x, self.fed.y, lr))

    def server_plan(self, t: int, host: bool = False) -> BatchPlan:
        """Round t's K0 batches of D0 (``StackedSimulator`` runs those of many runs in one call; ``host``:
        left on the host, as in ``sample``)."""
        sl = self.alg.server_learning
        assert sl is not None
        plan = make_plan([self.fed.server], [SERVER_ID], sl.batch_size, sl.epochs, sl.steps, self.seed, t,
                         rng.SERVER_BATCHES)
        return plan if host else plan.to(self.device, self.dtype)

    def layout(self, params: Params) -> Params:
        """The memory layout of the fast path (values unchanged): channels-last on CPU."""
        if not self.channels_last:
            return params
        return {n: p.contiguous(memory_format=torch.channels_last) if p.dim() == 4 else p for n, p in params.items()}

    @staticmethod
    def _one(stacked: Params) -> Params:
        return {n: p[0] for n, p in stacked.items()}

    def evaluate(self, params: Params, clients: State | ClientStore | None = None) -> tuple[float, float]:
        """(accuracy, loss) of the global model on the test set; with ``model.batchnorm = 'local'`` (FedBN), the mean
        over the evaluation's clients of each one's own model (``personal``), which reads ``clients``, their
        states."""
        if self.batchnorm == "local":
            return self.personal(params, clients, self.fed.x_test, self.fed.y_test)[:2]
        return evaluate(self.fm, self.layout(params), self.fed.x_test, self.fed.y_test, self.eval_batch_size,
                        self.eval_precision, self.norm_source)

    def _label_mixes(self) -> np.ndarray:
        from fedsl.engine import per_client
        if self._label_mix is None:
            self._label_mix = per_client.label_mix(self.fed)
        return self._label_mix

    def personal(self, params: Params, clients: State | ClientStore | None, x: torch.Tensor, y: torch.Tensor
                 ) -> tuple[float, float, np.ndarray]:
        """FedBN's evaluation (``model.batchnorm = 'local'``): for each of the run's evaluation clients (drawn once),
        its own model (x with its BatchNorm γ, β, from ``clients``) normalised by statistics of its own training
        samples, scored on (x, y) weighted by its label mix (``per_client``: acc_i = Σ_c p_i(c)·acc_c, the loss
        alike); (mean accuracy, mean loss, [m] accuracies)."""
        from fedsl.algorithms.local_norm import NORM_STATE
        from fedsl.engine import per_client
        if clients is None:
            raise ValueError("model.batchnorm = 'local' evaluates each client's own BatchNorm: expected the clients' "
                             "states (Simulator.evaluate(x, state.clients))")
        ids = self.norm_clients
        if isinstance(clients, ClientStore):
            rows = clients.gather(ids)[NORM_STATE]
        else:
            at = torch.as_tensor(ids, dtype=torch.long, device=self.tables_device)
            rows = {n: to_device(v[at], self.device) for n, v in clients[NORM_STATE].items()}
        mix = self._label_mixes()
        accs, losses = [], []
        for j, i in enumerate(ids):
            own = self.layout({**params, **{n: v[j] for n, v in rows.items()}})
            src = self.fed.x[torch.as_tensor(self.client_data[int(i)], dtype=torch.long, device=self.device)]
            stats = self.fm.statistics(own, src, self.eval_batch_size)
            acc_c, loss_c = per_client.class_scores(self.fm, own, x, y, self.fed.num_classes, self.eval_batch_size,
                                                    self.eval_precision, stats)
            accs.append(per_client.client_accuracies(mix[[i]], acc_c)[0])
            losses.append(per_client.client_accuracies(mix[[i]], loss_c)[0])
        accs_arr = np.asarray(accs, dtype=np.float64)
        return float(np.nanmean(accs_arr)), float(np.nanmean(losses)), accs_arr

    def evaluate_clients(self, params: Params, clients: State | ClientStore | None = None) -> dict[str, float]:
        """The global model's accuracy on each client's label mix, summarised over the N clients (mean, std, worst
        10%: ``fedsl.engine.per_client``); one more pass over the test set, per class. Reads the model only. With
        ``model.batchnorm = 'local'``: each evaluation client's own model (``personal``), summarised over them."""
        from fedsl.engine import per_client
        if self.batchnorm == "local":
            return per_client.summarise(self.personal(params, clients, self.fed.x_test, self.fed.y_test)[2])
        acc_c = per_client.class_accuracy(self.fm, self.layout(params), self.fed.x_test, self.fed.y_test,
                                          self.fed.num_classes, self.eval_batch_size, self.eval_precision,
                                          self.norm_source)
        return per_client.summarise(per_client.client_accuracies(self._label_mixes(), acc_c))

    def evaluate_validation(self, params: Params, clients: State | ClientStore | None = None
                            ) -> tuple[float, float] | None:
        """(accuracy, loss) of the global model on the validation set (``Federation.validation``: samples of the
        clients set aside by ``data.validation``), as ``evaluate`` measures the test set (same function, batch size
        and precision); None when the federation has none. What a study (hyper-parameter tuning) reads instead of
        the test set; it reads the model only, so it changes nothing a run trains."""
        if not len(self.fed.validation):
            return None
        if self._validation is None:  # gathered once: the samples are fixed for the run
            idx = torch.as_tensor(self.fed.validation, dtype=torch.long, device=self.device)
            x = self.fed.x[idx]
            if self.channels_last:  # the pool is channels-last here; a gather keeps that, made explicit
                x = x.contiguous(memory_format=torch.channels_last)
            self._validation = x, self.fed.y[idx]
        x, y = self._validation
        if self.batchnorm == "local":
            return self.personal(params, clients, x, y)[:2]
        return evaluate(self.fm, self.layout(params), x, y, self.eval_batch_size, self.eval_precision,
                        self.norm_source)
