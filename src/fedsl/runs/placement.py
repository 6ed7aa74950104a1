"""Where a run's numbers live and what computes them: its device, whether its clients' state tables stay on it or in
host memory, and which executor trains its clients on a CPU."""

from __future__ import annotations

from collections.abc import Callable

import torch

from fedsl.algorithms import Algorithm, Spec
from fedsl.config.schema import POOL_MIN_GFLOP, ConfigError, RunConfig


def resolve_device(name: str, compile: str = "off") -> torch.device:
    """The device of ``device = name`` on this machine; a ConfigError when it has none such, or when
    ``compile = 'cuda-graphs'`` (config validation refuses it with device = 'cpu') meets an 'auto' without a GPU."""
    if name == "cuda" and not torch.cuda.is_available():
        raise ConfigError("device = 'cuda': no CUDA device is available here; expected 'auto' or 'cpu'")
    device = torch.device(("cuda" if torch.cuda.is_available() else "cpu") if name == "auto" else name)
    if compile == "cuda-graphs" and device.type != "cuda":
        raise ConfigError(f"compile = 'cuda-graphs' captures CUDA graphs: device = {name!r} is {device.type!r} on this "
                          "machine: expected a machine with a CUDA device, or compile = 'off'")
    return device


TABLES_DEVICE_SHARE = 0.5  # client_tables = 'auto': host tables beyond this share of the GPU's free memory


def tables_go_to_host(client_tables: str, table_bytes: float, free: float) -> bool:
    """``client_tables`` on a GPU with ``free`` bytes: 'host', or 'auto' when one run's tables (``table_bytes``)
    would take more than half the free memory (the rule ``tables_on_host`` and ``memory.run_bytes`` apply)."""
    return client_tables == "host" or (client_tables == "auto" and table_bytes > TABLES_DEVICE_SHARE * free)


def number_bytes(dtype: str) -> int:
    """Bytes of one number of ``dtype`` ("float32": 4, "float64": 8)."""
    return getattr(torch, dtype).itemsize


def client_state_bytes(cfg: RunConfig, sp: Spec, num_clients: int, d: float) -> float:
    """The memory of one run's clients' states where they live (a GPU, or the host) as ``cfg.client_state`` keeps
    them, d numbers per entry of the rule's ``client_state`` (SCAFFOLD's c_i, FedDyn's ∇L_i) and client: N rows
    (dense), or at most min(N, S·T) rows of the clients seen (sparse; in the run's dtype or float16; its index, about
    ``client_state.INDEX_BYTES`` per client seen, is on the host); 0 for stateless clients and for a store on disk
    (the file's pages are the operating system's to hold)."""
    st = cfg.client_state.settings()
    if not sp.client_state or st.on_disk:
        return 0.0
    rows = st.rows(num_clients, cfg.algorithm.clients_per_round, cfg.rounds)
    per_client = len(sp.client_state) * d * st.number_bytes(number_bytes(cfg.dtype))
    return rows * per_client


def tables_on_host(cfg: RunConfig, device: torch.device, algorithm: Algorithm, num_clients: int, d: int) -> bool:
    """Whether a run keeps its clients' state tables in host memory (``cfg.client_tables``; 'auto': on a GPU,
    when its tables, N × d numbers per state the rule keeps, or a sparse store's rows of at most min(N, S·T) clients,
    would take more than half the free memory). A store on disk lives on the host whatever this says."""
    if device.type != "cuda" or cfg.client_tables == "device":
        return False
    free = torch.cuda.mem_get_info(device)[0] if cfg.client_tables == "auto" else 0
    return tables_go_to_host(cfg.client_tables, client_state_bytes(cfg, algorithm.spec, num_clients, d), free)


def pool_pays(threads: int, free_cores: int, clients_per_round: int, train_gflop: float) -> bool:
    """``executor = 'auto'`` on a CPU takes the process pool (one worker of one torch thread per free core) over the
    sequential executor when all hold:

    - ``threads = 0``: the run leaves its threads to fedsl (a set number asks for the sequential executor's);
    - ``free_cores`` ≥ 2: the cores ``threads = 0`` would use (affinity, load, runs side by side), so a loaded
      machine or a ``--parallel`` sweep of one core per run keeps the sequential executor;
    - S ≥ 2 clients per round to spread;
    - the run's client training, ``train_gflop`` (T · S · K · B samples at the model's training FLOPs), reaches
      ``POOL_MIN_GFLOP``: the workers' start (processes importing torch, the data put in shared memory) is paid
      once, and a run must train long enough to win it back (the threshold is about twice the break-even
      measured on a whole Scenario-2 CIFAR-10 run: benchmarks/RESULTS.md).
    """
    return threads == 0 and free_cores >= 2 and clients_per_round >= 2 and train_gflop >= POOL_MIN_GFLOP


def run_train_gflop(cfg: RunConfig, num_clients: int, n: int, sample_flops: float) -> float:
    """The run's client training in GFLOP: T rounds × S clients × K steps × B samples × FLOPs per sample, with K
    the mean client's (``local_steps``, or E_c · ⌈n_i/B⌉ from the n samples of N clients)."""
    a = cfg.algorithm
    return cfg.rounds * a.clients_per_round * a.mean_steps(n, num_clients) * a.batch_size * sample_flops / 1e9


def resolve_executor(cfg: RunConfig, device: torch.device, num_clients: int, n: int,
                     sample_flops: Callable[[], float], free_cores: Callable[[], int]) -> str:
    """``cfg.executor`` for ``make_executor``: on a CPU, without ``compile``, 'auto' becomes 'processes' where
    ``pool_pays`` and 'sequential' otherwise; anything else is passed on as it is ('auto' on CUDA is the vectorised
    executor, ``make_executor``'s choice). ``sample_flops``: the model's training FLOPs per sample
    (``models.flops.train_flops``); ``free_cores``: ``threads.auto_threads``; both asked only for that choice."""
    if cfg.executor != "auto" or device.type != "cpu" or cfg.compile != "off":
        return cfg.executor
    gflop = run_train_gflop(cfg, num_clients, n, sample_flops())
    return "processes" if pool_pays(cfg.threads, free_cores(), cfg.algorithm.clients_per_round, gflop) else "sequential"


HOST_MEMORY_SHARE = 0.5  # runs side by side by default: their data at most this share of the available host memory


def side_by_side(runs: int, threads: list[int], free_cores: int, group_gflop: float, run_bytes: float,
                 available_bytes: float | None) -> int:
    """How many of a group's ``runs`` `fedsl run` runs side by side on a CPU when neither ``--parallel`` nor ``--ray``
    is given (1: one after another). The rule of ``pool_pays``, for whole runs: every run's ``threads`` is 0, the
    cores automatic threads would use (``free_cores``) are 2 or more, and the group's client training
    (``group_gflop``) reaches ``POOL_MIN_GFLOP``; then one run per free core, and no more than the runs' data
    (``run_bytes`` each) fits in ``HOST_MEMORY_SHARE`` of ``available_bytes`` (None: not known, not limited).
    Side by side beats both one after another and stacking on a CPU (benchmarks/RESULTS.md)."""
    if any(t != 0 for t in threads) or not pool_pays(0, free_cores, runs, group_gflop):
        return 1
    n = min(runs, free_cores)
    if available_bytes is not None and run_bytes > 0:
        n = min(n, int(HOST_MEMORY_SHARE * available_bytes // run_bytes))
    return max(1, n)


def host_memory_available() -> float | None:
    """Bytes of host memory the kernel says are available (Linux ``MemAvailable``); None elsewhere."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return float(line.split()[1]) * 1024
    except OSError:
        pass
    return None
