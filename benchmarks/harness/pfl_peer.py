"""pfl-research's simulation (``pip install pfl``, PyTorch backend) as a peer.

The same workload as the other peers, through pfl's public API:

- model: fedsl's ``build_model(w.model, ...)`` (seed 0, the engine's initialisation) inside a
  small ``nn.Module`` that gives pfl the ``loss(x, y)`` (train mode, mean cross-entropy) and
  ``metrics(x, y, eval=True)`` (eval mode, ``torch.no_grad``, summed loss and correct
  predictions as ``Weighted``) it asks for, wrapped in ``pfl.model.pytorch.PyTorchModel`` with
  ``torch.optim.SGD`` as the local optimizer and ``SGD(lr=1)`` as the central optimizer;
- data: a ``FederatedDataset`` whose ``make_dataset_fn`` builds client i's ``Dataset`` from the
  workload's index array into the same tensors the other peers use; its user sampler hands out
  the clients that fedsl's engine samples (``fedsl.core.rng.sample_clients``) round by round,
  so all peers train the same S clients each round;
- training: ``FederatedAveraging`` over ``SimulatedBackend`` (one process, no privacy, no
  postprocessors), ``NNTrainHyperParams(local_num_epochs=E, local_learning_rate=η_l,
  local_batch_size=B)``. pfl's update is ``x + 1 · mean_i(x_i - x)`` (every client's statistics
  weigh 1; clients hold equally many samples): the plain loop's mean of the clients' models, η_g = 1;
- evaluation (``+eval``): ``CentralEvaluationCallback`` on the test set after every round,
  batch 500 (the plain loop's).

Differences that remain: pfl walks a client's data in stored order every epoch (its ``Dataset``
does not shuffle; the engine and the loop draw a new order per epoch; ``share_plan=True``
replays the engine's batch plan instead, for tests); pfl's central evaluation also evaluates
the model before the first round, and pfl's iteration 0 evaluates every client's data before
and after its training (both in the untimed warm-up round here).

Timing: ``run(rounds)`` continues the same algorithm for ``rounds`` more central iterations; a
callback placed after the evaluation callback stamps the clock at ``on_train_begin`` and after
every central iteration (training of S clients, the update, the evaluation). ``setup`` builds
everything and runs one untimed round; its time is reported apart (pfl is imported earlier,
when the peer is made).
"""

from __future__ import annotations

import functools
import logging
import os
import time

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from harness.peers import Peer, plain_model
from harness.workloads import Data, Workload


def _missing() -> str | None:
    """Why pfl's PyTorch simulation cannot run here, or None.

    Importing pfl's PyTorch ops sets the process's multiprocessing start method to
    'forkserver' (for its DataLoader workers, which this peer does not use); the process's
    setting is put back, so that other code in it (a test session) is not changed under it.
    """
    import multiprocessing as mp
    before = mp.get_start_method(allow_none=True)
    try:
        import pfl.model.pytorch  # noqa: F401
    except Exception as e:  # ImportError, or pfl failing on this torch/Python
        return f"pfl not importable ({type(e).__name__}: {e}); install the bench extra: pip install -e '.[bench]'"
    finally:
        if mp.get_start_method(allow_none=True) != before:
            mp.set_start_method(before, force=True)
    return None


class _Net(nn.Module):
    """The workload's model with the two methods ``PyTorchModel`` requires."""

    def __init__(self, net: nn.Module) -> None:
        super().__init__()
        self.net = net

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)

    def loss(self, x: torch.Tensor, y: torch.Tensor, eval: bool = False) -> torch.Tensor:  # noqa: A002
        self.eval() if eval else self.train()
        return F.cross_entropy(self.net(x), y)

    @torch.no_grad()
    def metrics(self, x: torch.Tensor, y: torch.Tensor, eval: bool = True) -> dict:  # noqa: A002
        from pfl.metrics import Weighted
        self.eval() if eval else self.train()
        out = self.net(x)
        n = len(y)
        return {"loss": Weighted(F.cross_entropy(out, y, reduction="sum").item(), n),
                "accuracy": Weighted((out.argmax(1) == y).sum().item(), n)}


class _Sampler:
    """pfl user sampler (``callable() -> user id``): the engine's S clients of round t for the
    t-th group of S calls. The id is ``(t, cid)`` so that a dataset can depend on the round."""

    def __init__(self, w: Workload, seed: int) -> None:
        self.w, self.seed, self.calls = w, seed, 0

    def __call__(self) -> tuple[int, int]:
        from fedsl.core import rng
        w = self.w
        t, k = divmod(self.calls, w.clients_per_round)
        self.calls += 1
        return t, int(rng.sample_clients(self.seed, t, w.num_clients, w.clients_per_round)[k])


class PflPeer(Peer):
    """FedAvg in pfl-research's simulation (``FederatedAveraging`` + ``SimulatedBackend``,
    ``PyTorchModel``), in this process with its torch threads; see the module doc.

    ``share_plan``: each client's batches follow the engine's batch plan (``fedsl.engine.plan``)
    instead of pfl's in-order slices: then pfl and the engine give the same model (tests).
    """

    name = "pfl"

    def __init__(self, w: Workload, data: Data, device: torch.device, seed: int = 0,
                 share_plan: bool = False, eval_batch_size: int = 500) -> None:
        super().__init__()
        self.w, self.data, self.device, self.seed = w, data, device, seed
        self.share_plan, self.eval_bs = share_plan, eval_batch_size
        self.t = 0  # central iterations done
        self.accuracy = float("nan")  # the last central evaluation's
        from harness.machine import optional_version
        self.version = optional_version("pfl") or "?"
        why = _missing()
        if why:
            self.available, self.why_not = False, why
        elif w.seeds > 1:
            self.available, self.why_not = False, "one pfl simulation per seed: 8x its single-seed row"
        elif not w.train:
            self.available, self.why_not = False, "pfl's central evaluation is the plain loop's evaluate"
        elif w.server_samples:
            self.available, self.why_not = False, "FedAvg only here (FSL's server steps would be the plain loop's)"

    # -- data -------------------------------------------------------------------------------
    def _plan_batches(self, t: int, cid: int) -> list[list[list[int]]]:
        """The engine's batches of client ``cid`` in round ``t``, per epoch (lists of indices)."""
        from fedsl.core import rng
        from fedsl.engine.plan import make_plan
        w = self.w
        plan = make_plan([np.arange(w.samples_per_client)], [cid], w.batch_size, w.epochs, None, self.seed, t,
                         rng.CLIENT_BATCHES)
        steps = [plan.idx[0, k, :int((plan.weight[0, k] > 0).sum())].tolist() for k in range(plan.steps[0])]
        per_epoch = len(steps) // w.epochs
        return [steps[e * per_epoch:(e + 1) * per_epoch] for e in range(w.epochs)]

    def _make_dataset(self, user):
        from pfl.data.dataset import Dataset
        t, cid = user
        idx = torch.from_numpy(np.asarray(self.data.clients[cid], dtype=np.int64))
        x, y = self.data.x[idx], self.data.y[idx]
        if not self.share_plan:
            return Dataset((x, y), user_id=str(cid))
        return _plan_dataset_class()((x, y), user_id=str(cid), batch_size=self.w.batch_size,
                            epochs=self._plan_batches(t, cid))

    # -- life cycle -------------------------------------------------------------------------
    def setup(self) -> None:
        t0 = time.perf_counter()
        self._env = os.environ.get("PFL_PYTORCH_DEVICE")
        os.environ["PFL_PYTORCH_DEVICE"] = str(self.device)  # pfl puts the model and batches there
        self._levels = {n: logging.getLogger(n).level for n in ("pfl",)}
        for n in self._levels:
            logging.getLogger(n).setLevel(logging.WARNING)

        from pfl.aggregate.simulate import SimulatedBackend
        from pfl.algorithm import FederatedAveraging, NNAlgorithmParams
        from pfl.callback.base import TrainingProcessCallback
        from pfl.callback.central_evaluation import CentralEvaluationCallback
        from pfl.data.dataset import Dataset
        from pfl.data.federated_dataset import FederatedDataset
        from pfl.hyperparam import NNEvalHyperParams, NNTrainHyperParams
        from pfl.model.pytorch import PyTorchModel

        w = self.w
        peer = self

        class Clock(TrainingProcessCallback):
            def on_train_begin(self, *, model):
                from pfl.metrics import Metrics
                peer._stamps.append(time.perf_counter())
                return Metrics()

            def after_central_iteration(self, aggregate_metrics, model, *, central_iteration):
                from pfl.metrics import Metrics
                peer._stamps.append(time.perf_counter())
                for name, value in aggregate_metrics:
                    if "accuracy" in str(name) and "Central val" in str(name):
                        peer.accuracy = float(value.overall_value)
                return False, Metrics()

        self.net = _Net(plain_model(w, self.seed, torch.device("cpu")))
        self.model = PyTorchModel(model=self.net, local_optimizer_create=torch.optim.SGD,
                                  central_optimizer=torch.optim.SGD(self.net.parameters(), lr=1.0))
        self.backend = SimulatedBackend(
            training_data=FederatedDataset(self._make_dataset, _Sampler(w, self.seed)), val_data=None)
        self.train_params = NNTrainHyperParams(local_num_epochs=w.epochs, local_learning_rate=w.lr,
                                               local_batch_size=w.batch_size)
        self.eval_params = NNEvalHyperParams(local_batch_size=self.eval_bs)
        self.algorithm = FederatedAveraging()
        self.callbacks = []
        if w.evaluate:
            test = Dataset((self.data.x_test, self.data.y_test), eval_kwargs={"eval": True})
            class Evaluation(CentralEvaluationCallback):
                # pfl evaluates before training begins, i.e. at every ``algorithm.run``; this peer
                # continues one run over several calls, so only the first call does (in the warm-up).
                # Otherwise the later calls' metrics would clash with those of their first iteration.
                began = False

                def on_train_begin(self, *, model):
                    from pfl.metrics import Metrics
                    if self.began:
                        return Metrics()
                    self.began = True
                    return super().on_train_begin(model=model)

            self.callbacks.append(Evaluation(test, model_eval_params=self.eval_params, frequency=1))
        self.callbacks.append(Clock())  # last: after the evaluation
        self._params = NNAlgorithmParams
        self._stamps: list[float] = []
        self.settings = (f"pfl {self.version}, PyTorchModel + FederatedAveraging (central SGD lr 1), "
                         f"SimulatedBackend in this process, eval batch {self.eval_bs}, "
                         f"{torch.get_num_threads()} threads")
        self.run(1)  # warm-up: iteration 0 also evaluates every client's data before and after training
        self.extra = {"startup_once_s": time.perf_counter() - t0}

    def run(self, rounds: int) -> list[float]:
        self._stamps = []
        # the algorithm goes on from its last central iteration, ``rounds`` more
        params = self._params(central_num_iterations=self.t + rounds, evaluation_frequency=10 ** 9,
                              train_cohort_size=self.w.clients_per_round, val_cohort_size=None)
        self.algorithm.run(algorithm_params=params, backend=self.backend, model=self.model,
                           model_train_params=self.train_params, model_eval_params=self.eval_params,
                           callbacks=self.callbacks, send_metrics_to_platform=False)
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        if len(self._stamps) != rounds + 1:
            raise RuntimeError(f"pfl ran {len(self._stamps) - 1} of {rounds} rounds")
        self.t += rounds
        return [b - a for a, b in zip(self._stamps, self._stamps[1:])]

    def params(self) -> dict[str, torch.Tensor]:
        """The global model's parameters, named as in fedsl's model."""
        return {k: v.detach().clone() for k, v in self.net.net.state_dict().items()}

    def close(self) -> None:
        for n, level in getattr(self, "_levels", {}).items():
            logging.getLogger(n).setLevel(level)
        if hasattr(self, "_env"):
            if self._env is None:
                os.environ.pop("PFL_PYTORCH_DEVICE", None)
            else:
                os.environ["PFL_PYTORCH_DEVICE"] = self._env


@functools.cache
def _plan_dataset_class():
    from pfl.data.dataset import Dataset

    class PlanDataset(Dataset):
        """A client's ``Dataset`` whose training batches (``iter(B)``) follow given index lists,
        one list per epoch in turn; other batch sizes (evaluation) slice as pfl does."""

        def __init__(self, raw_data, user_id, batch_size: int, epochs: list[list[list[int]]]) -> None:
            super().__init__(raw_data, user_id=user_id)
            self._bs, self._epochs, self._epoch = batch_size, epochs, 0

        def iter(self, batch_size):  # noqa: A003
            if batch_size != self._bs:
                yield from super().iter(batch_size)
                return
            batches = self._epochs[self._epoch % len(self._epochs)]
            self._epoch += 1
            x, y = self.raw_data
            for b in batches:
                yield x[b], y[b]

    return PlanDataset
