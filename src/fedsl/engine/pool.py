"""The process-pool executor: a round's clients trained in W worker processes of one torch thread.

Why: on a CPU the sequential executor trains one client after another on one core, and
intra-op threads do not pay at the paper's batch sizes (10-50) — on a shared machine
threads that wait on each other make a round several times slower. Clients are independent, so
W processes with one thread each keep W cores busy the way Flower's Ray actors do, with no
barrier inside an op.

How:
- W workers (``torch.multiprocessing``, spawn), started at the first ``train`` that has more
  than one client and stopped by ``close()`` (also when the executor is garbage-collected
  and at interpreter exit).
- The model is sent to each worker once. The training pool (x, y: the federation's whole
  data, 600 MB for CIFAR-10) is moved into shared memory in place (``share_memory_``, as
  ``torch.multiprocessing`` does for any tensor it sends) and handed to the workers once;
  it is sent again only when a call passes other pool tensors.
- A call splits the planned clients into W contiguous chunks of about equal steps; each
  worker runs ``SequentialExecutor.train_each`` on its chunk (its slice of starts, plan,
  states, what was sent, η_l) and returns each client's model and state; the caller stacks
  them in client order as ``SequentialExecutor.train`` does. The per-call tensors travel as
  bytes with their strides (a channels-last weight stays channels-last, so the worker takes
  the same convolution path): results are bit-identical to the sequential executor with one
  torch thread.
- A call with one client (server learning, pretraining on D0, a Flower node) or one worker
  runs in the calling process (nothing to spread, no transfer).
- A worker that dies mid-round (killed, out of memory) is reported in one line; the pool is
  stopped and the next call starts a new one. Workers ignore SIGINT: Ctrl-C reaches the
  caller, which stops them.

When it pays (measured, benchmarks/RESULTS.md): Scenario 1 (10 clients × 500 samples: each
chunk is seconds of compute) on a CPU with ≥ 2 free cores. A Scenario-2 round (10 clients ×
5 steps) is short beside the transfers of a call, so it gains less.
"""

from __future__ import annotations

import os
import pickle
import signal
import traceback
import weakref
from dataclasses import dataclass
from multiprocessing.connection import Connection, wait
from multiprocessing.reduction import ForkingPickler
from typing import Any

import torch

from fedsl.algorithms.base import LOCAL_SGD, LocalSGD
from fedsl.core.types import Params, State
from fedsl.engine.functional import FunctionalModel
from fedsl.engine.plan import BatchPlan, Lr, stack_clients
from fedsl.engine.sequential import SequentialExecutor

NAME = "processes"


# ---- per-call tensors as bytes with their layout -------------------------------------------------

def _dense(t: torch.Tensor) -> bool:
    """Whether ``t``'s elements fill exactly ``numel`` consecutive slots of its storage (any order)."""
    dims = sorted((st, sz) for st, sz in zip(t.stride(), t.size()) if sz != 1)
    expected = 1
    for st, sz in dims:
        if st != expected:
            return False
        expected *= sz
    return True


def _rebuild(data: bytearray, dtype: torch.dtype, size: tuple[int, ...], stride: tuple[int, ...]) -> torch.Tensor:
    # a fresh (aligned) torch allocation with the sender's strides: alignment and layout can
    # change a kernel's vector path, and so the last bits of its result
    out = torch.empty_strided(size, stride, dtype=dtype)
    if out.numel():
        out.as_strided((out.numel(),), (1,)).view(torch.uint8).copy_(torch.frombuffer(data, dtype=torch.uint8))
    return out


class _Pickler(pickle.Pickler):
    """Pickles plain CPU tensors as their bytes plus size and strides (one copy, no shared-memory
    segment per tensor: a call's tensors are small, and a segment costs more than the copy)."""

    def reducer_override(self, obj: Any) -> Any:
        if type(obj) is not torch.Tensor:
            return NotImplemented
        t = obj.detach()
        if t.device.type != "cpu":
            raise ValueError(f"executor {NAME!r}: expected CPU tensors, got one on {t.device}")
        if not _dense(t):  # an expanded or sliced view: its values, packed
            t = t.contiguous()
        flat = t.as_strided((t.numel(),), (1,), t.storage_offset()) if t.numel() else t.reshape(0)
        data = pickle.PickleBuffer(flat.view(torch.uint8).numpy()) if t.numel() else bytearray()
        return _rebuild, (data, t.dtype, tuple(t.size()), tuple(t.stride()))


def _dumps(obj: Any) -> bytes:
    import io
    buf = io.BytesIO()
    _Pickler(buf, protocol=5).dump(obj)
    return buf.getvalue()


# ---- the worker -----------------------------------------------------------------------------------

def _worker_main(conn: Connection) -> None:
    """A worker's loop: ("model", fm) once, ("pool", x, y) when the pool changes, ("train", ...) per call,
    ("stop",) at the end; every "train" is answered ("ok", finals, rows) or ("error", exc, text)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the caller's to handle; it stops us
    torch.set_num_threads(1)  # one core per worker: the parallelism is across workers
    executor: SequentialExecutor | None = None
    x = y = None
    while True:
        try:
            msg = pickle.loads(conn.recv_bytes())
        except (EOFError, OSError):  # the caller is gone
            return
        except Exception as e:  # e.g. a class this process cannot import: say so, then end
            conn.send_bytes(pickle.dumps(("fatal", None, f"{type(e).__name__}: {e}")))
            return
        kind = msg[0]
        if kind == "stop":
            return
        if kind == "model":
            executor = SequentialExecutor(msg[1])
            conn.send_bytes(pickle.dumps(("ready",)))  # the caller waits for it: a bad model fails at start
            continue
        if kind == "pool":
            x, y = msg[1], msg[2]
            continue
        try:
            _, client, starts, plan, lr, states, sent = msg
            assert executor is not None and x is not None
            finals, rows = executor.train_each(client, starts, plan, x, y, lr, states, sent)
            reply = _dumps(("ok", finals, rows))
        except Exception as e:  # reported to the caller, which raises it
            text = "".join(traceback.format_exception_only(type(e), e)).strip()
            try:
                reply = _dumps(("error", e, text))
            except Exception:
                reply = _dumps(("error", None, text))
        conn.send_bytes(reply)


def _signal_name(code: int | None) -> str:
    if code is None:
        return "no exit code"
    if code < 0:
        try:
            name = signal.Signals(-code).name
        except ValueError:
            name = f"signal {-code}"
        return f"{name}" + (" (killed: out of memory, or by hand)" if -code == signal.SIGKILL else "")
    return f"exit code {code}"


class _Fatal(RuntimeError):
    """A worker could not unpickle its message (a class it cannot import) and ended."""


@dataclass
class _Worker:
    process: Any
    conn: Connection


def _stop(workers: list[_Worker]) -> None:
    """Stop every worker: ask, then wait a little, then terminate (used by ``close`` and the finaliser)."""
    for w in workers:
        try:
            w.conn.send_bytes(pickle.dumps(("stop",)))
        except (OSError, ValueError):
            pass
    for w in workers:
        w.process.join(timeout=2.0)
        if w.process.is_alive():
            w.process.terminate()
            w.process.join(timeout=2.0)
        if w.process.is_alive():  # pragma: no cover - terminate ignored
            w.process.kill()
            w.process.join()
        w.conn.close()
    workers.clear()


def _chunks(steps: tuple[int, ...], parts: int) -> list[tuple[int, int]]:
    """``parts`` contiguous, non-empty ranges of the clients with about equal total steps (the work)."""
    n = len(steps)
    parts = max(1, min(parts, n))
    cum = [0]
    for s in steps:
        cum.append(cum[-1] + max(1, s))
    bounds = [0]
    for p in range(1, parts):
        target = cum[-1] * p / parts
        # the cut nearest the target that leaves every range at least one client
        bounds.append(min(range(bounds[-1] + 1, n - (parts - p) + 1), key=lambda j: abs(cum[j] - target)))
    bounds.append(n)
    return list(zip(bounds, bounds[1:]))


def _slice_plan(plan: BatchPlan, a: int, b: int) -> BatchPlan:
    return BatchPlan(plan.idx[a:b], plan.weight[a:b], plan.keys[a:b], plan.steps[a:b])


def _slice_lr(lr: Lr, a: int, b: int) -> Lr:
    if isinstance(lr, (int, float)):
        return lr
    return lr[a:b]


def _slice_state(states: State | None, a: int, b: int) -> State | None:
    return None if states is None else {k: {n: v[a:b] for n, v in g.items()} for k, g in states.items()}


def shm_free() -> int | None:
    """Bytes free in /dev/shm, where torch puts shared tensors on Linux (None: cannot tell)."""
    try:
        st = os.statvfs("/dev/shm")
    except (OSError, AttributeError):
        return None
    return st.f_bavail * st.f_frsize


def default_workers() -> int:
    """W: the cores this process may use, divided by the runs fedsl runs side by side (``--parallel``)."""
    from fedsl.core.threads import CONCURRENT_ENV, _positive_int, usable_cores
    return max(1, usable_cores() // (_positive_int(os.environ.get(CONCURRENT_ENV)) or 1))


class ProcessPoolExecutor:
    """The round's clients in ``workers`` processes of one torch thread (see the module doc).

    Args:
        fm: the model (sent to each worker once).
        workers: W; default ``default_workers()`` (usable cores / runs side by side).
    """

    name = NAME

    def __init__(self, fm: FunctionalModel, workers: int | None = None) -> None:
        if workers is not None and workers < 1:
            raise ValueError(f"executor {NAME!r}: workers = {workers}: expected at least 1")
        self.fm = fm
        self.workers = workers or default_workers()
        self._local = SequentialExecutor(fm)
        self._procs: list[_Worker] = []
        self._pool: tuple[torch.Tensor, torch.Tensor, int, int] | None = None  # x, y, their data_ptrs
        self._model: bytes | None = None
        # stops the workers when this executor is collected or the interpreter exits (not holding self)
        self._finalizer = weakref.finalize(self, _stop, self._procs)

    # -- lifecycle --

    def close(self) -> None:
        """Stop the worker processes (idempotent; a later ``train`` starts new ones)."""
        _stop(self._procs)
        self._pool = None

    def __enter__(self) -> ProcessPoolExecutor:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @property
    def pids(self) -> list[int]:
        """The workers' process ids (empty before the first parallel call and after ``close``)."""
        return [w.process.pid for w in self._procs]

    def _start(self) -> None:
        import torch.multiprocessing as mp
        if self._model is None:
            try:
                self._model = pickle.dumps(("model", self.fm), protocol=5)
            except Exception as e:
                raise ValueError(f"executor {NAME!r}: the model cannot be sent to worker processes "
                                 f"({type(e).__name__}: {e}); use executor = 'sequential'") from None
        ctx = mp.get_context("spawn")
        for _ in range(self.workers):
            parent, child = ctx.Pipe(duplex=True)
            p = ctx.Process(target=_worker_main, args=(child,), daemon=True, name="fedsl-pool-worker")
            p.start()
            child.close()
            self._procs.append(_Worker(p, parent))
            parent.send_bytes(self._model)
        for w in list(self._procs):  # all start at once; each says it has the model
            ready = wait([w.conn, w.process.sentinel])
            if w.conn in ready or w.conn.poll():
                try:
                    reply = pickle.loads(w.conn.recv_bytes())
                except (EOFError, OSError):
                    self._died(w, "while starting")
                if reply[0] != "ready":
                    self.close()
                    raise ValueError(f"executor {NAME!r}: a worker process could not load the model ({reply[2]}); "
                                     "define the model in an importable module, or use executor = 'sequential'")
            else:
                self._died(w, "while starting")

    def _share_pool(self, x: torch.Tensor, y: torch.Tensor) -> None:
        """Hand the workers the pool once: shared memory, keyed by the tensors and their data pointers."""
        if self._pool is not None and self._procs:
            px, py, ptr_x, ptr_y = self._pool
            if px is x and py is y and x.data_ptr() == ptr_x and y.data_ptr() == ptr_y:
                return
        if x.device.type != "cpu" or y.device.type != "cpu":
            raise ValueError(f"executor {NAME!r} runs on CPU: the data pool is on {x.device}")
        need = sum(t.untyped_storage().nbytes() for t in (x, y) if not t.is_shared())
        free = shm_free()
        if free is not None and need > free:
            # a full /dev/shm is a SIGBUS when the pages are touched, not an error: refuse first
            raise ValueError(f"executor {NAME!r}: the data pool ({need / 2**20:,.0f} MiB) does not fit in shared "
                             f"memory (/dev/shm has {free / 2**20:,.0f} MiB free); enlarge it (docker run "
                             "--shm-size=...) or use executor = 'sequential'")
        # in place (the caller's tensors now live in shared memory; a no-op when they already do):
        # no second copy of a 600 MB pool, and the workers map the same pages
        x.share_memory_()
        y.share_memory_()
        if not self._procs:
            self._start()
        for w in self._procs:  # pickled per worker: each shared-memory handle is handed over once
            self._send(w, bytes(ForkingPickler.dumps(("pool", x, y))))
        self._pool = (x, y, x.data_ptr(), y.data_ptr())

    def _send(self, w: _Worker, msg: bytes) -> None:
        try:
            w.conn.send_bytes(msg)
        except (BrokenPipeError, ConnectionResetError, OSError):
            self._died(w, "before its share of the round was sent")

    def _died(self, w: _Worker, when: str) -> None:
        w.process.join(timeout=1.0)
        code = w.process.exitcode
        pid = w.process.pid
        self.close()
        raise RuntimeError(f"executor {NAME!r}: worker process {pid} died ({_signal_name(code)}) {when}; "
                           "the pool was stopped and the next round starts a new one")

    # -- the Executor protocol --

    def train(self, client: LocalSGD, starts: list[Params], plan: BatchPlan, x: torch.Tensor, y: torch.Tensor,
              lr: Lr, states: State | None = None, sent: list[State] | None = None) -> tuple[Params, State]:
        """``SequentialExecutor.train``, the clients split over the workers (see the module doc)."""
        chunks = _chunks(plan.steps, self.workers)
        if len(chunks) < 2:
            return self._local.train(client, starts, plan, x, y, lr, states, sent)
        if isinstance(lr, torch.Tensor):
            lr = lr.tolist()
        try:
            for w in self._procs:
                if not w.process.is_alive():
                    self._died(w, "between rounds")
            self._share_pool(x, y)  # starts the workers first when there are none
            used = self._procs[:len(chunks)]
            for w, (a, b) in zip(used, chunks):
                self._send(w, _dumps(("train", client, starts[a:b], _slice_plan(plan, a, b), _slice_lr(lr, a, b),
                                      _slice_state(states, a, b), sent[a:b] if sent else None)))
            replies, error = self._collect(used, chunks)
        except BaseException:
            # Ctrl-C or an error mid-call: replies may still be on their way, so the pipes are out of
            # step with the calls; stop the workers (the next call starts new ones)
            if self._procs:
                self.close()
            raise
        if error is not None:  # every reply was read: the workers are in step and stay up, unless one ended
            if isinstance(error, _Fatal):
                self.close()
            raise error
        finals: list[Params] = []
        rows: list[State] = []
        for f, r in replies:
            finals += f
            rows += r
        return stack_clients(finals), stack_clients(rows)

    def _collect(self, used: list[_Worker], chunks: list[tuple[int, int]]
                 ) -> tuple[list[tuple[list, list]], BaseException | None]:
        """Every worker's reply, in chunk order, and the first exception a worker reported (raised by
        the caller once all replies are read); a worker that dies is reported, never waited for."""
        replies: dict[int, tuple] = {}
        pending = dict(enumerate(used))
        error: BaseException | None = None
        while pending:
            ready = wait([w.conn for w in pending.values()] + [w.process.sentinel for w in pending.values()])
            for i, w in list(pending.items()):
                if w.conn in ready or (w.process.sentinel in ready and w.conn.poll()):
                    try:
                        msg = pickle.loads(w.conn.recv_bytes())
                    except (EOFError, OSError):
                        a, b = chunks[i]
                        self._died(w, f"while training clients {a}..{b - 1} of the call")
                    del pending[i]
                    if msg[0] == "ok":
                        replies[i] = (msg[1], msg[2])
                    elif msg[0] == "fatal":  # the worker could not read its share and has ended
                        error = _Fatal(f"executor {NAME!r}: worker process {w.process.pid} could not read its "
                                       f"share of the round ({msg[2]}); the pool was stopped")
                    elif error is None:
                        exc, text = msg[1], msg[2]
                        error = exc if isinstance(exc, Exception) else RuntimeError(f"in a worker: {text}")
                elif w.process.sentinel in ready:
                    a, b = chunks[i]
                    self._died(w, f"while training clients {a}..{b - 1} of the call")
        return [replies[i] for i in sorted(replies)], error

    def local_sgd(self, params: Params, plan: BatchPlan, x: torch.Tensor, y: torch.Tensor, lr: float) -> Params:
        return self.train(LOCAL_SGD, [params] * plan.num_clients, plan, x, y, lr)[0]
