"""The channels-last plain loop run as one process per core (``PerCoreLoopPeer``).

W worker processes (W = the cores this process may use, at most S), one torch thread each,
started once in ``setup`` (forkserver where the platform has it, else spawn; not counted in
the round's time, as the other peers' start-up is not) and stopped in ``close``. Each round
the parent samples the S clients as the engine does (``fedsl.core.rng.sample_clients``),
splits them into W contiguous shares and sends each worker the global state dict and its
share's client ids; a worker trains each of its clients from the global state exactly as the
channels-last loop does (``plain_local_train``: deepcopy + DataLoader + ``torch.optim.SGD``)
and returns their state dicts; the parent takes their mean in client order (``mean_state``,
as ``fedavg_mean``) and evaluates on its own threads when the workload evaluates.

The training images are handed to the workers once, in channels-last format, in shared
memory (as ``fedsl.engine.pool`` hands its pool); a round's messages are the state dicts
and the clients' ids (and, with ``share_plan``, the engine's batch order).
"""

from __future__ import annotations

import pickle
import signal
import time
import traceback
import weakref
from multiprocessing.connection import Connection, wait
from multiprocessing.reduction import ForkingPickler
from typing import Any

import numpy as np
import torch
import torch.multiprocessing  # noqa: F401 - registers ForkingPickler's reducers that share tensors

from fedsl.core import rng
from fedsl.engine.pool import shm_free
from harness.peers import (
    LoopPeer,
    engine_batches,
    mean_state,
    plain_local_train,
    plain_model,
    to_channels_last,
)
from harness.workloads import Data, Workload


def _peak_rss_mb() -> float:
    from harness.machine import peak_rss_mb
    return peak_rss_mb()


def _arrays(state: dict[str, torch.Tensor]) -> dict[str, np.ndarray]:
    """A state dict as numpy arrays, for a pipe: pickled as one copy each (torch's own tensor pickling
    serialises every storage through ``torch.save``, ~10x slower on a CIFAR CNN's state)."""
    return {k: v.detach().numpy() for k, v in state.items()}


def _tensors(arrays: dict[str, np.ndarray]) -> dict[str, torch.Tensor]:
    return {k: torch.from_numpy(v) for k, v in arrays.items()}


def _worker_main(conn: Connection, index: int) -> None:
    """A worker: ("setup", model, x, y) once, answered ("ready",); then ("train", w, state, [(idx, batches)
    per client]) answered ("ok", [state dicts], peak RSS MB); ("error", text) for either; until ("stop",) or
    the parent is gone. State dicts travel as numpy arrays (``_arrays``)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the parent's; it stops the workers
    torch.set_num_threads(1)  # one core per worker: the parallelism is across workers
    model = x = y = None
    gen = torch.Generator().manual_seed(index)  # each worker shuffles its clients' batches its own way
    cpu = torch.device("cpu")
    while True:
        try:
            msg = pickle.loads(conn.recv_bytes())
        except (EOFError, OSError):
            return
        if msg[0] == "stop":
            return
        try:
            if msg[0] == "setup":
                _, model_bytes, x, y = msg  # x, y: the parent's shared-memory pool
                model = pickle.loads(model_bytes)  # a private copy: its parameters are this worker's own
                reply: tuple = ("ready",)
            else:
                _, w, state, share = msg
                model.load_state_dict(_tensors(state))
                states = []
                for idx, batches in share:
                    i = torch.from_numpy(idx)
                    local = plain_local_train(model, to_channels_last(x[i]), y[i], w, cpu, gen, batches,
                                              channels_last=True)
                    states.append(_arrays(local.state_dict()))
                reply = ("ok", states, _peak_rss_mb())
        except Exception as e:  # reported to the parent, which raises it
            reply = ("error", "".join(traceback.format_exception_only(type(e), e)).strip())
        conn.send_bytes(pickle.dumps(reply, protocol=5))


def _stop(workers: list[tuple[Any, Connection]]) -> None:
    """Ask every worker to stop, wait a little, then terminate; close the pipes."""
    for _, conn in workers:
        try:
            conn.send_bytes(pickle.dumps(("stop",)))
        except (OSError, ValueError):
            pass
    for proc, conn in workers:
        proc.join(timeout=5.0)
        if proc.is_alive():
            proc.terminate()
            proc.join(timeout=5.0)
        conn.close()
    workers.clear()


def _context():
    import torch.multiprocessing as mp
    if "forkserver" in mp.get_all_start_methods():
        ctx = mp.get_context("forkserver")
        # the server imports torch once, and every worker forked from it starts with it imported (the
        # harness itself is imported by each worker: the server does not take the caller's sys.path);
        # torch._dynamo: torch.optim's first step imports it (with sympy), 1-2 CPU-s a worker
        ctx.set_forkserver_preload(["torch", "torch._dynamo", "torch.utils.data", "numpy", "fedsl.core.rng"])
        return ctx
    return mp.get_context("spawn")


class PerCoreLoopPeer(LoopPeer):
    """The channels-last plain loop with the round's clients split over one process per core (see the
    module doc). ``workers``: W (default: the usable cores); ``share_plan`` as ``LoopPeer``'s."""

    name = "loop 1 proc/core"
    channels_last = True

    def __init__(self, w: Workload, data: Data, device: torch.device, share_plan: bool = False,
                 workers: int | None = None) -> None:
        super().__init__(w, data, device, share_plan)
        if device.type != "cpu":
            self.available, self.why_not = False, "CPU only"
        elif not w.train:
            self.available, self.why_not = False, "no training to spread (its evaluation is loop channels-last's)"
        if workers is None:
            from fedsl.core.threads import usable_cores
            workers = usable_cores()
        if workers < 1:
            raise ValueError(f"workers = {workers}: expected at least 1")
        self.workers = max(1, min(workers, w.clients_per_round))
        self._procs: list[tuple[Any, Connection]] = []
        self._finalizer = weakref.finalize(self, _stop, self._procs)  # not holding self
        self.peak_worker_mb = 0.0

    @property
    def pids(self) -> list[int]:
        """The workers' process ids (empty before ``setup`` and after ``close``)."""
        return [p.pid for p, _ in self._procs]

    @property
    def processes(self) -> list[Any]:
        return [p for p, _ in self._procs]

    def setup(self) -> None:
        t0 = time.perf_counter()
        w = self.w
        x = self.data.x
        need = x.numel() * x.element_size() + self.data.y.numel() * self.data.y.element_size()
        free = shm_free()
        if free is not None and need > free:
            raise ValueError(f"the training images ({need / 2**20:,.0f} MiB) do not fit in shared memory "
                             f"(/dev/shm has {free / 2**20:,.0f} MiB free)")
        # one channels-last copy of the pool in shared memory, mapped by every worker
        self.x = torch.empty_like(x, memory_format=torch.channels_last) if x.dim() == 4 else torch.empty_like(x)
        self.x.share_memory_().copy_(x)
        self.y = self.data.y.clone().share_memory_()
        self.x_test = to_channels_last(self.data.x_test)
        self.x_server = None if self.data.x_server is None else to_channels_last(self.data.x_server)
        self.gen = torch.Generator().manual_seed(0)
        self.models = [plain_model(w, s, self.device).to(memory_format=torch.channels_last) for s in range(w.seeds)]
        ctx = _context()
        model_bytes = pickle.dumps(plain_model(w, 0, self.device).to(memory_format=torch.channels_last), protocol=5)
        try:
            for i in range(self.workers):
                parent, child = ctx.Pipe(duplex=True)
                p = ctx.Process(target=_worker_main, args=(child, i), daemon=True, name="bench-loop-worker")
                p.start()
                child.close()
                self._procs.append((p, parent))
                # pickled per worker: each shared-memory handle is handed over once
                parent.send_bytes(bytes(ForkingPickler.dumps(("setup", model_bytes, self.x, self.y))))
            self._receive(list(range(self.workers)))
            self.settings = (f"channels-last, deepcopy + DataLoader + SGD per client in {self.workers} worker "
                             f"processes x 1 thread ({ctx.get_start_method()}, started in set-up, not counted), "
                             f"FedAvg mean, FSL's server steps and eval batch 500 in the parent "
                             f"({torch.get_num_threads()} threads)")
            self.run(1)  # warm-up
        except BaseException:  # the benchmark closes only the peers that set up: stop the workers here
            self.close()
            raise
        self.extra["startup_once_s"] = time.perf_counter() - t0

    def _receive(self, which: list[int]) -> list[tuple]:
        """The replies of workers ``which``, in that order; a worker's error or death is raised (the pool stopped)."""
        replies: dict[int, tuple] = {}
        pending = list(which)
        while pending:
            ready = wait([self._procs[i][1] for i in pending] + [self._procs[i][0].sentinel for i in pending])
            for i in list(pending):
                p, conn = self._procs[i]
                if conn in ready or (p.sentinel in ready and conn.poll()):
                    try:
                        msg = pickle.loads(conn.recv_bytes())
                    except (EOFError, OSError):
                        msg = ("error", "its pipe closed")
                elif p.sentinel in ready:
                    msg = ("error", f"it ended (exit code {p.exitcode})")
                else:
                    continue
                pending.remove(i)
                if msg[0] == "error":
                    pid = p.pid
                    self.close()
                    raise RuntimeError(f"worker process {pid}: {msg[1]}")
                replies[i] = msg
        return [replies[i] for i in which]

    def round(self, seed: int) -> None:
        w = self.w
        ids = rng.sample_clients(seed, self.t, w.num_clients, w.clients_per_round).tolist()
        model = self.models[seed]
        state = _arrays(model.state_dict())
        shares = [s for s in np.array_split(np.arange(len(ids)), self.workers) if len(s)]
        used = list(range(len(shares)))
        for i, share in zip(used, shares):
            clients = [(self.data.clients[ids[j]], engine_batches(w, seed, self.t, ids[j]) if self.share_plan else None)
                       for j in share]
            try:
                self._procs[i][1].send_bytes(pickle.dumps(("train", w, state, clients), protocol=5))
            except (OSError, ValueError) as e:
                pid = self._procs[i][0].pid
                self.close()
                raise RuntimeError(f"worker process {pid}: cannot send its share ({e})") from None
        states = []
        for reply in self._receive(used):
            states += [_tensors(a) for a in reply[1]]
            self.peak_worker_mb = max(self.peak_worker_mb, reply[2])
        model.load_state_dict(mean_state(states))
        if w.server_samples:  # x̄ first: the server's steps cannot overlap the clients'
            from harness.peers import engine_server_batches, plain_server_train
            batches = engine_server_batches(w, seed, self.t) if self.share_plan else None
            plain_server_train(model, self.x_server, self.data.y_server, w, self.device, self.gen, batches, True)
        self.extra["actors"] = float(self.workers)
        self.extra["actor_peak_mb"] = self.peak_worker_mb
        if w.evaluate:
            from harness.peers import plain_evaluate
            plain_evaluate(model, self.x_test, self.data.y_test, self.device, channels_last=True)

    def close(self) -> None:
        """Stop the workers (idempotent)."""
        _stop(self._procs)
