"""Build one run from its config: data → model → algorithm → simulator, and the checks before any work.

``check`` / ``check_all`` build what a run needs on the CPU, without training, so that a bad sweep
fails in seconds; ``prepare`` builds the run for its device (or takes over what ``check`` built).
The rounds themselves are the simulator's (``fedsl.engine.simulator``); driving them, with the run's
files, is ``fedsl.runs.runner``'s.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, replace
from typing import Callable

import torch

from fedsl.algorithms import Algorithm, Pretraining
from fedsl.config.own_keys import changed
from fedsl.config.resolve import Setting, finetune_lr, privacy_budget, resolve
from fedsl.config.schema import ConfigError, RunConfig
from fedsl.core import threads
from fedsl.core.privacy_accounting import Budget
from fedsl.core.types import Params
from fedsl.data.datasets import build_federation, is_text
from fedsl.data.federation import Federation
from fedsl.engine.executors import make_executor
from fedsl.engine.functional import FunctionalModel
from fedsl.engine.simulator import Simulator
from fedsl.engine.stacked import same_tensor
from fedsl.models import MODELS, TEXT_MODELS, build_model
from fedsl.models.flops import train_flops
from fedsl.runs import tracking
from fedsl.runs.placement import (
    host_memory_available,
    number_bytes,
    resolve_device,
    resolve_executor,
    run_train_gflop,
    side_by_side,
    tables_on_host,
)


@dataclass
class Prepared:
    cfg: RunConfig
    fed: Federation
    sim: Simulator
    algorithm: Algorithm
    pretrain: Pretraining | None
    hparams: list[Setting]
    device: torch.device
    privacy: Budget | None = None  # the DP accounting (privacy.clip set): ε per row of metrics.csv, summary.json


def finetune(sim: Simulator, cfg: RunConfig, x: Params, clients=None) -> dict | None:
    """The 'FedAvg, then fine-tune on D0' control: ``server.finetune_epochs`` epochs of SGD on D0 from the
    final model ``x`` (step ``server.finetune_lr``, default η_l; batches of B0 = ``server.batch_size`` or B, at
    most n0), then one test evaluation. The summary fields it gives (None: no fine-tuning configured)."""
    s = cfg.server
    if not s.finetune_epochs:
        return None
    lr = finetune_lr(cfg)
    batch = min(cfg.server_batch_size, sim.fed.n0)
    acc, loss = sim.evaluate(sim.finetune(x, s.finetune_epochs, lr, batch), clients)
    return {"final_accuracy_finetuned": acc, "final_loss_finetuned": loss,
            "finetune": {"epochs": s.finetune_epochs, "lr": lr, "batch_size": batch}}


def make_model(cfg: RunConfig, fed: Federation) -> FunctionalModel:
    """The configured model as a pure function; a model the engine cannot run is a ConfigError."""
    text = is_text(fed.x)
    builtin = cfg.model.name in MODELS
    if builtin and text != (cfg.model.name in TEXT_MODELS):
        want = "one of " if text else "a model other than "
        raise ConfigError(f"model.name = {cfg.model.name!r} reads {'images or features' if text else 'text'}, but "
                          f"data.dataset = {cfg.data.dataset!r} gives {'text' if text else 'images or features'}: "
                          f"expected {want}{', '.join(TEXT_MODELS)}")
    try:
        fm = FunctionalModel(build_model(cfg.model.name, fed.num_classes, fed.input_shape, cfg.seed, cfg.model.init,
                                         cfg.model.import_dir))
    except ValueError as e:
        raise ConfigError(str(e)) from None
    check_batchnorm(cfg, fed, fm)
    return fm


def with_batchnorm(cfg: RunConfig, algorithm: Algorithm, fm: FunctionalModel) -> Algorithm:
    """``algorithm`` as the run trains it: with ``model.batchnorm = 'local'`` (FedBN) its rule keeps each client's
    BatchNorm γ, β (``algorithms.local_norm.LocalNorm``); else as it is."""
    if batchnorm_mode(cfg, fm) != "local":
        return algorithm
    from fedsl.algorithms.local_norm import LocalNorm, norm_parameters
    names = norm_parameters(fm.norm_names, fm.names)
    if not names:
        raise ConfigError("model.batchnorm = 'local' keeps each client's BatchNorm γ and β, but the model's BatchNorm "
                          "layers have none (affine=False): expected 'clients', 'server' or 'batch'")
    return replace(algorithm, rule=LocalNorm(algorithm.rule, names))


def batchnorm_mode(cfg: RunConfig, fm: FunctionalModel) -> str:
    """``model.batchnorm`` with 'auto' resolved: 'clients' for BatchNorm layers that tracked running statistics
    (their evaluation statistics are the clients'), else 'batch' (each evaluated batch's own)."""
    if cfg.model.batchnorm != "auto":
        return cfg.model.batchnorm
    return "clients" if fm.tracked_stats else "batch"


def check_batchnorm(cfg: RunConfig, fed: Federation, fm: FunctionalModel) -> None:
    """model.batchnorm, batchnorm_samples and batchnorm_clients are read only where they mean something: a model
    with BatchNorm, 'server' with D0, the sample size with 'clients', the clients' number with 'local'."""
    m = cfg.model
    if not fm.norm_names:
        unread = [k for k in ("batchnorm_samples", "batchnorm_clients") if changed(m, k)]
        if m.batchnorm != "auto" or unread:
            key = "model.batchnorm" if m.batchnorm != "auto" else f"model.{unread[0]}"
            raise ConfigError(f"{key} is read only for a model with BatchNorm layers, and model.name = "
                              f"{m.name!r} has none: expected it left out")
        return
    mode = batchnorm_mode(cfg, fm)
    if mode == "server" and not fed.n0:
        raise ConfigError("model.batchnorm = 'server' estimates BatchNorm's statistics on D0, but the run has no "
                          "server data (n0 = 0): expected 'clients' or 'batch'")
    if mode != "clients" and changed(m, "batchnorm_samples"):
        raise ConfigError(f"model.batchnorm_samples is read only with model.batchnorm = 'clients' (here {mode!r}): "
                          "expected it left out")
    if mode != "local" and changed(m, "batchnorm_clients"):
        raise ConfigError(f"model.batchnorm_clients is read only with model.batchnorm = 'local' (here {mode!r}): "
                          "expected it left out")


def check_representation(cfg: RunConfig, algorithm: Algorithm, fm: FunctionalModel) -> None:
    """A rule whose local loss reads the model's representation z (MOON) needs a model that exposes one."""
    if algorithm.spec is not None and algorithm.spec.needs_representation and not fm.has_representation:
        raise ConfigError(f"algorithm.name = {cfg.algorithm.name!r} reads the model's representation, but model.name = "
                          f"{cfg.model.name!r} has none: expected a model with methods features(x) -> z and "
                          "head(z) -> logits (the built-in mlp, small_cnn, cifar_cnn, emnist_cnn; not linear or "
                          "logreg)")


@dataclass
class Built:
    """What ``check`` built of a run, on the CPU, for ``prepare`` to take over (once: ``prepare``
    moves the model to the run's device and dtype), so that a checked run is built only once."""
    fed: Federation
    algorithm: Algorithm
    pretrain: Pretraining | None
    hparams: list[Setting]
    fm: FunctionalModel

    def nbytes(self) -> int:
        """Memory it holds beyond the data pool that runs share: the model and the index arrays."""
        model = sum(p.numel() * p.element_size() for p in self.fm.module.parameters())
        return model + self.fed.clients.nbytes + self.fed.server.nbytes


# How much a sweep's checks keep for its runs to take over (the first runs' builds; the others
# are built again by ``prepare``, cheaply: decoded data and its tensors are memoised per process).
KEEP_BYTES = 256 * 2**20


def check(cfg: RunConfig, _models_seen: set | None = None, *, keep: bool = False) -> Built | None:
    """Every check that needs the data or the model (sizes, batch vs client data, n0), without training.

    ``_models_seen``: (model, init, classes, input shape) already built by earlier checks of
    the same sweep; a model is built once per such key, not once per run (40,000 runs).
    ``keep``: return what was built (the run's federation, algorithm and seeded model), for
    ``prepare(cfg, built=...)``.
    """
    resolve_device(cfg.device, cfg.compile)
    tracking.require(cfg.tracking)
    fed = build_federation(cfg.data, cfg.seed)
    algorithm, pretrain, hp = resolve(cfg, fed)
    key = (cfg.model.name, cfg.model.init, fed.num_classes, tuple(fed.input_shape))
    fm = None
    if keep or _models_seen is None or key not in _models_seen:
        fm = make_model(cfg, fed)
        if _models_seen is not None:
            _models_seen.add(key)
    if algorithm.spec is not None and algorithm.spec.needs_representation:
        check_representation(cfg, algorithm, fm or make_model(cfg, fed))
    if fm is not None:
        with_batchnorm(cfg, algorithm, fm)  # its refusals, before any work (prepare wraps the rule)
    return Built(fed, algorithm, pretrain, hp, fm) if keep else None


def check_all(runs: dict[str, RunConfig], progress: Callable[[int], None] | None = None,
              keep_bytes: int = KEEP_BYTES) -> dict[str, Built]:
    """``check`` every run of a sweep before any work; returns what the checks built for the first
    runs (up to about ``keep_bytes``), by run name, for ``run_group(..., built=...)``.

    ``progress(i)`` is called after the i-th run's check.
    """
    models: set = set()
    built: dict[str, Built] = {}
    left = keep_bytes
    for i, (name, cfg) in enumerate(runs.items(), 1):
        b = check(cfg, models, keep=left > 0)
        if b is not None:
            built[name] = b
            left -= b.nbytes()
        if progress is not None:
            progress(i)
    return built


def default_side_by_side(runs: dict[str, RunConfig], built: dict[str, Built]) -> int:
    """How many of a group's ``runs`` to run side by side when the command line does not say
    (``placement.side_by_side``), weighed by what their checks built (``check_all``: the first runs; the group's
    client training is their mean times the runs); 1 on a GPU or when nothing was built."""
    if len(runs) < 2 or not built or any(resolve_device(c.device).type != "cpu" for c in runs.values()):
        return 1
    gflop, run_bytes = 0.0, 0.0
    for name, b in built.items():
        cfg = runs[name]
        gflop += run_train_gflop(cfg, b.fed.num_clients, b.fed.n, train_flops(b.fm.module, b.fed.input_shape))
        size = number_bytes(cfg.dtype) if b.fed.x.is_floating_point() else b.fed.x.element_size()  # text: as held
        data = (b.fed.x.numel() + b.fed.x_test.numel()) * size  # the pool and test set, as run
        run_bytes = max(run_bytes, data + b.nbytes())
    return side_by_side(len(runs), [c.threads for c in runs.values()], threads.auto_threads(),
                        gflop * len(runs) / len(built), run_bytes, host_memory_available())


def prepare(cfg: RunConfig, pools: list[Federation] | None = None, built: Built | None = None) -> Prepared:
    """Data, model, algorithm and simulator of ``cfg``.

    ``pools`` (stacked runs): federations prepared before; a pool or test set equal to
    one of theirs is shared rather than held twice (a CIFAR-10 pool is 600 MB).
    ``built``: what ``check(cfg, keep=True)`` built (taken over, not built again).
    """
    device = resolve_device(cfg.device, cfg.compile)
    dtype = getattr(torch, cfg.dtype)
    # process-wide: with other work on the cores, spinning OpenMP threads wait on each other
    # (a loaded machine runs slower with 2 threads than with 1); 0 = a safe automatic number
    threads.apply(cfg.threads)
    if device.type == "cuda":
        # cuDNN's fastest convolution backward accumulates with atomics: results then agree
        # to rounding only, run to run; deterministic algorithms make them bit-identical.
        torch.backends.cudnn.deterministic = cfg.deterministic
        torch.backends.cudnn.benchmark = not cfg.deterministic
    if built is None:
        fed = build_federation(cfg.data, cfg.seed)
        algorithm, pretrain, hp = resolve(cfg, fed)
        fm = make_model(cfg, fed)
    else:
        fed, algorithm, pretrain, hp, fm = built.fed, built.algorithm, built.pretrain, built.hparams, built.fm
    check_representation(cfg, algorithm, fm)
    algorithm = with_batchnorm(cfg, algorithm, fm)
    fm.module.to(device=device, dtype=dtype)
    free_cores = functools.cache(threads.auto_threads)  # asked once: the pool gets the cores the choice counted
    name = resolve_executor(cfg, device, fed.num_clients, fed.n, lambda: train_flops(fm.module, fed.input_shape),
                            free_cores)
    # 'auto' chose the pool: one worker per core the run's automatic threads would use (the load leaves them free)
    workers = free_cores() if cfg.executor == "auto" and name == "processes" else None
    executor = make_executor(name, fm, device, cfg.compile, workers)
    on_device = fed.to(device, dtype)
    if pools is not None:
        on_device = _share_tensors(on_device, pools)
    d = sum(p.numel() for p in fm.module.parameters())
    sim = Simulator(fm, on_device, algorithm, executor, cfg.algorithm.clients_per_round, cfg.seed,
                    cfg.eval_batch_size, cfg.eval_precision, tables_on_host(cfg, device, algorithm, fed.num_clients, d),
                    cfg.participation, cfg.byzantine, cfg.client_state.settings(), threads=None,  # set above
                    batchnorm=batchnorm_mode(cfg, fm), batchnorm_samples=cfg.model.batchnorm_samples,
                    batchnorm_clients=cfg.model.batchnorm_clients)
    return Prepared(cfg, fed, sim, algorithm, pretrain, hp, device, privacy_budget(cfg, fed))


def _share_tensors(fed: Federation, pools: list[Federation]) -> Federation:
    """``fed`` with its pool and test set replaced by equal tensors of ``pools`` (then added to them)."""
    x, y, xt, yt = fed.x, fed.y, fed.x_test, fed.y_test
    for p in pools:
        if same_tensor(p.x, x) and same_tensor(p.y, y):
            x, y = p.x, p.y
        if same_tensor(p.x_test, xt) and same_tensor(p.y_test, yt):
            xt, yt = p.x_test, p.y_test
    fed = replace(fed, x=x, y=y, x_test=xt, y_test=yt)
    pools.append(fed)
    return fed
