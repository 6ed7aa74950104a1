"""Where a run's numbers live: its device, and whether its clients' state tables stay on it or in host memory."""

from __future__ import annotations

import torch

from fedsl.algorithms import Algorithm, Spec
from fedsl.experiments.config import ConfigError, RunConfig


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
