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


def client_table_bytes(sp: Spec, num_clients: int, d: float, dtype: str) -> float:
    """The clients' state tables of one run of ``sp``'s rule: N × d numbers of ``dtype`` per entry of its
    ``client_state`` (SCAFFOLD's c_i, FedDyn's ∇L_i; none for stateless clients)."""
    return len(sp.client_state) * num_clients * d * number_bytes(dtype)


def tables_on_host(cfg: RunConfig, device: torch.device, algorithm: Algorithm, num_clients: int, d: int) -> bool:
    """Whether a run keeps its clients' state tables in host memory (``cfg.client_tables``; 'auto': on a GPU,
    when its tables, N × d numbers per state the rule keeps, would take more than half the free memory)."""
    if device.type != "cuda" or cfg.client_tables == "device":
        return False
    free = torch.cuda.mem_get_info(device)[0] if cfg.client_tables == "auto" else 0
    return tables_go_to_host(cfg.client_tables, client_table_bytes(algorithm.spec, num_clients, d, cfg.dtype), free)
