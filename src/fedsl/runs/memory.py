"""GPU memory planning: how many runs advance together as one stack (``stack = 'auto'``).

A stacked run's device memory is its clients' state tables (N × d numbers per state its rule keeps, or a sparse
store's rows of the clients seen, unless they live in host memory or on disk) and its working memory (its S clients'
activations and gradients), measured once for the CIFAR CNN and scaled from there. d is counted on the model itself,
built for the config's dataset.
"""

from __future__ import annotations

import functools

from fedsl.algorithms import SPECS
from fedsl.config.schema import RunConfig
from fedsl.data.registry import DATASETS
from fedsl.models import build_model, count_parameters
from fedsl.runs import placement
from fedsl.sources.emnist import paper_45_classes

# Peak device memory of one stacked run besides its tables, measured (benchmarks/RESULTS-gpu.md) for the
# CIFAR CNN on CIFAR-10's inputs in float32 with S·B = 10·10 client samples per step: mostly the clients'
# activations and gradients. Other runs scale it by S·B, by their model's d and by their numbers' width.
RUN_BYTES_MEASURED = 0.75e9
MEASURED_MODEL = ("cifar_cnn", 10, (3, 32, 32))  # the model it was measured with: name, L, (C, H, W)
MEASURED_CLIENT_SAMPLES = 100  # S·B of the measurement
STACK_MEMORY_SHARE = 0.8  # of the free memory: the rest for the allocator's fragmentation and cuDNN
STACK_MAX = 64  # runs in one stack at most
UNKNOWN_MODEL_PARAMS = 4e6  # d of a model the config alone cannot size (an image folder's inputs): a generous bound


def stack_limit(cfg: RunConfig) -> int:
    """How many runs like ``cfg`` advance together: ``cfg.stack``, or for 'auto' 1 on CPU (measured:
    stacking gains nothing there) and on CUDA up to ``STACK_MAX``, fewer when their per-client tables
    (SCAFFOLD, FedDyn: N × d each) and their measured working memory would not fit in 80% of the
    free memory (with 139 GB free: 37 SCAFFOLD runs of the CIFAR CNN at N = 1,000; with 79 GB: 21);
    tables in host memory (``client_tables``) do not count."""
    if cfg.stack != "auto":
        return cfg.stack
    device = placement.resolve_device(cfg.device)
    if device.type != "cuda":
        return 1
    import torch
    free, _ = torch.cuda.mem_get_info(device)
    return max(1, min(STACK_MAX, int(STACK_MEMORY_SHARE * free // run_bytes(cfg, free))))


def run_bytes(cfg: RunConfig, free: float | None = None) -> float:
    """A stacked run's device memory: its clients' tables (N × d, or a sparse store's rows of at most min(N, S·T)
    clients seen: ``[client_state]``; none when they live in host memory or on disk: ``client_tables``, which 'auto'
    decides from ``free``: ``placement.tables_go_to_host``) and its working
    memory (measured for the CIFAR CNN, scaled by S·B, by d for larger models, by 2 for float64)."""
    d = model_params(cfg)
    width = placement.number_bytes(cfg.dtype)
    tables = placement.client_state_bytes(cfg, SPECS[cfg.algorithm.name], cfg.data.num_clients, d)
    if placement.tables_go_to_host(cfg.client_tables, tables, free if free is not None else float("inf")):
        tables = 0
    work = RUN_BYTES_MEASURED * cfg.algorithm.clients_per_round * cfg.algorithm.batch_size / MEASURED_CLIENT_SAMPLES
    return tables + work * max(1.0, d / count_params(*MEASURED_MODEL)) * width / 4


def model_params(cfg: RunConfig) -> float:
    """d, the number of parameters of ``cfg``'s model on its dataset's inputs (``UNKNOWN_MODEL_PARAMS``
    when the config alone does not size them, or the model cannot be built here)."""
    d, info = cfg.data, DATASETS[cfg.data.dataset]
    if isinstance(d.classes, list):
        classes = len(d.classes)
    elif d.classes == "paper45":
        classes = len(paper_45_classes())
    else:
        classes = info.num_classes  # the publisher's split: the head is a small part of d
    if classes is None or info.channels is None or info.image_size is None:
        return UNKNOWN_MODEL_PARAMS
    return count_params(cfg.model.name, classes, (info.channels, *info.image_size), cfg.model.import_dir)


@functools.cache
def count_params(model: str, num_classes: int, input_shape: tuple[int, ...], import_dir: str | None = None) -> float:
    """d of model ``model`` built for ``num_classes`` classes and inputs of ``input_shape`` (built once)."""
    try:
        return count_parameters(build_model(model, num_classes, input_shape, seed=0, init="torch",
                                            import_dir=import_dir))
    except ValueError:  # an imported factory not allowed here, or inputs the model refuses: the run says so
        return UNKNOWN_MODEL_PARAMS
