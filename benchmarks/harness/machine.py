"""What the machine can do: FLOPs per sample, best measured rates, memory, a description.

- ``flops_per_sample``: ``torch.utils.flop_counter.FlopCounterMode`` counts the FLOPs of
  one forward (evaluation) or forward + backward (training: gradients of the parameters,
  not of the input) of the model on a batch, divided by the batch size. Only matmuls and
  convolutions are counted (as FlopCounterMode does); ReLU, pooling and the loss are not. An
  ``nn.LSTM`` (whose fused kernel FlopCounterMode does not count) is counted as the same LSTM
  written from plain operations: its input and hidden matmuls.
- ``best_rates``: the model's best training rate (forward + backward + nothing else, at a
  large batch, in the better of contiguous and channels-last layouts) and best inference
  rate (forward under ``inference_mode``), in samples/s and GFLOP/s, and a large float32
  matmul's GFLOP/s, all measured in the running process (so in the same conditions as the
  rows they are compared with).
- ``PeakMemory``: the process's peak resident memory between ``reset`` and ``read`` on
  Linux (VmHWM, reset through /proc/self/clear_refs), ``ru_maxrss`` elsewhere (not
  resettable), and ``torch.cuda.max_memory_allocated`` on CUDA.
"""

from __future__ import annotations

import os
import platform
import resource
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn


def sync(device: torch.device) -> None:
    """Wait for queued CUDA work, so that wall-clock timing covers it."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


InputMaker = Callable[[int], torch.Tensor]  # n -> a batch of n random inputs of the model (on the CPU)


def _rand_inputs(input_shape: tuple[int, ...]) -> InputMaker:
    return lambda n: torch.rand(n, *input_shape)


def _count_lstm_as_plain_ops(model: nn.Module) -> list:
    """Forward hooks that replace each ``nn.LSTM``'s output (batch-first, one direction, no projection, zero
    initial state: fedsl's char-LSTMs) by the same LSTM from plain operations (``fedsl.models.lstm.lstm``, equal
    to float rounding), so that ``FlopCounterMode`` sees its matmuls: it counts no FLOPs in the fused LSTM kernel
    (``aten.lstm`` / oneDNN's ``mkldnn_rnn_layer`` on a CPU). Returns the hooks' handles (``.remove()`` them)."""
    handles = []
    for m in model.modules():
        if isinstance(m, nn.LSTM):
            assert m.batch_first and not m.bidirectional and not m.proj_size, m

            def hook(mod, args, out):
                from fedsl.models.lstm import lstm
                layers = [tuple(getattr(mod, f"{w}_l{k}") for w in ("weight_ih", "weight_hh", "bias_ih", "bias_hh"))
                          for k in range(mod.num_layers)]
                return lstm(args[0], layers), out[1]
            handles.append(m.register_forward_hook(hook))
    return handles


def flops_per_sample(model: nn.Module, input_shape: tuple[int, ...], num_classes: int, train: bool,
                     batch: int = 8, make_input: InputMaker | None = None) -> float:
    """FLOPs of one sample: forward (``train=False``) or forward + backward (``train=True``).

    ``make_input``: a batch of random inputs (default ``torch.rand`` of ``input_shape``, in the model's dtype;
    a text model's are character indices). An ``nn.LSTM`` is counted as its plain-operations form (its fused
    kernel counts 0): the matmuls of its input and hidden products, forward and backward.
    """
    from torch.utils.flop_counter import FlopCounterMode

    p = next(model.parameters())
    x = (make_input or _rand_inputs(input_shape))(batch).to(p.device)
    if x.is_floating_point():
        x = x.to(p.dtype)
    y = torch.randint(0, num_classes, (batch,), device=p.device)
    was = model.training
    model.train(train)
    counter = FlopCounterMode(display=False)
    handles = _count_lstm_as_plain_ops(model)
    try:
        with counter:
            if train:
                F.cross_entropy(model(x), y).backward()
            else:
                with torch.no_grad():
                    model(x)
    finally:
        for h in handles:
            h.remove()
    model.zero_grad(set_to_none=True)
    model.train(was)
    return counter.get_total_flops() / batch


def _layout(t: torch.Tensor, channels_last: bool) -> torch.Tensor:
    return t.contiguous(memory_format=torch.channels_last) if channels_last and t.dim() == 4 else t


def _time(fn: Callable[[], None], device: torch.device, repeats: int, min_seconds: float = 0.0) -> float:
    """Median seconds of ``fn`` after one warm-up call."""
    fn()
    sync(device)
    times = []
    t_end = time.perf_counter() + min_seconds
    while len(times) < repeats or time.perf_counter() < t_end:
        t = time.perf_counter()
        fn()
        sync(device)
        times.append(time.perf_counter() - t)
    return statistics.median(times)


@dataclass
class Rates:
    """Best measured rates of one model on this machine (same process as the benchmark)."""

    train_flops: float  # FLOPs per sample, forward + backward
    eval_flops: float  # FLOPs per sample, forward
    train_samples_s: float
    eval_samples_s: float
    train_setting: str  # batch and layout of the best training rate
    eval_setting: str
    matmul_gflops: float

    @property
    def train_gflops(self) -> float:
        return self.train_samples_s * self.train_flops / 1e9

    @property
    def eval_gflops(self) -> float:
        return self.eval_samples_s * self.eval_flops / 1e9


def matmul_gflops(device: torch.device, n: int = 2048, repeats: int = 5) -> float:
    """GFLOP/s of an n×n float32 matmul (2n³ FLOPs), median of ``repeats``."""
    a = torch.rand(n, n, device=device)
    b = torch.rand(n, n, device=device)
    s = _time(lambda: torch.mm(a, b), device, repeats)
    return 2 * n ** 3 / s / 1e9


def best_rates(model_factory: Callable[[], nn.Module], input_shape: tuple[int, ...], num_classes: int,
               device: torch.device, train_batches: tuple[int, ...] = (128, 512),
               eval_batches: tuple[int, ...] = (100, 500, 2000), repeats: int = 3,
               make_input: InputMaker | None = None) -> Rates:
    """The model's best fwd+bwd and fwd rates over the given batches and both memory layouts (images).

    Training: ``cross_entropy(model(x), y).backward()`` (what any training step must do, no
    optimiser). Evaluation: ``model(x)`` under ``torch.inference_mode``. ``model_factory``
    builds a fresh plain module (torch's own dropout). ``make_input``: a batch of random inputs (default
    ``torch.rand`` of ``input_shape``; a text model's: character indices).
    """
    make_input = make_input or _rand_inputs(input_shape)
    model = model_factory().to(device)
    f_train = flops_per_sample(model, input_shape, num_classes, True, make_input=make_input)
    f_eval = flops_per_sample(model, input_shape, num_classes, False, make_input=make_input)
    layouts = (False, True) if len(input_shape) == 3 else (False,)
    best_t, best_e = (0.0, ""), (0.0, "")
    for cl in layouts:
        m = model_factory().to(device)
        if cl:
            m = m.to(memory_format=torch.channels_last)
        tag = "channels-last" if cl else "contiguous"
        for b in train_batches:
            x = _layout(make_input(b).to(device), cl)
            y = torch.randint(0, num_classes, (b,), device=device)
            m.train(True)

            def step() -> None:  # timed right here, in this iteration
                m.zero_grad(set_to_none=True)  # noqa: B023
                F.cross_entropy(m(x), y).backward()  # noqa: B023
            rate = b / _time(step, device, repeats)
            if rate > best_t[0]:
                best_t = (rate, f"batch {b}, {tag}")
        m.train(False)
        for b in eval_batches:
            x = _layout(make_input(b).to(device), cl)

            def fwd() -> None:  # timed right here, in this iteration
                with torch.inference_mode():
                    m(x)  # noqa: B023
            rate = b / _time(fwd, device, repeats)
            if rate > best_e[0]:
                best_e = (rate, f"batch {b}, {tag}")
    return Rates(f_train, f_eval, best_t[0], best_e[0], best_t[1], best_e[1], matmul_gflops(device))


def choose_threads(model_factory: Callable[[], nn.Module], input_shape: tuple[int, ...], num_classes: int,
                   candidates: tuple[int, ...], batch: int = 10, eval_batch: int = 100, rounds: int = 3,
                   log: Callable[[str], None] | None = None, make_input: InputMaker | None = None) -> int:
    """The intra-op thread count (of ``candidates``) that runs this model's small-batch work fastest.

    Probe: 20 SGD-sized fwd+bwd steps at ``batch`` plus 5 forward passes at ``eval_batch``
    (what a Scenario-2 round and its evaluation are made of), timed ``rounds`` times per
    count, interleaved; the count with the smallest median wins. On a 2-core machine
    shared with other work, 2 threads were measured 10x slower than 1 (both threads must
    be scheduled at every op); on a quiet one, 2 threads are faster.
    """
    make_input = make_input or _rand_inputs(input_shape)
    m = model_factory()
    if len(input_shape) == 3:
        m = m.to(memory_format=torch.channels_last)
    x = _layout(make_input(batch), True)
    y = torch.randint(0, num_classes, (batch,))
    xe = _layout(make_input(eval_batch), True)

    def probe() -> None:
        m.train(True)
        for _ in range(20):
            m.zero_grad(set_to_none=True)
            F.cross_entropy(m(x), y).backward()
        m.train(False)
        with torch.inference_mode():
            for _ in range(5):
                m(xe)
    before = torch.get_num_threads()
    times: dict[int, list] = {c: [] for c in candidates}
    for c in candidates:  # warm-up
        torch.set_num_threads(c)
        probe()
    for _ in range(rounds):
        for c in candidates:
            torch.set_num_threads(c)
            t = time.perf_counter()
            probe()
            times[c].append(time.perf_counter() - t)
    torch.set_num_threads(before)
    med = {c: statistics.median(v) for c, v in times.items()}
    if log is not None:
        log("thread probe (s): " + ", ".join(f"{c} threads {v:.3f}" for c, v in med.items()))
    return min(med, key=med.get)


def load_average() -> str:
    try:
        return ", ".join(f"{v:.1f}" for v in os.getloadavg())
    except (OSError, AttributeError):
        return "n/a"


class PeakMemory:
    """Peak memory of this process (and CUDA allocations) over a stretch of code.

    CPU: peak resident set size from ``/proc/self/status`` (VmHWM), reset by writing 5 to
    ``/proc/self/clear_refs``; where that is not possible, ``ru_maxrss`` (peak since start).
    """

    def __init__(self, device: torch.device) -> None:
        self.device = device

    def reset(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(self.device)
        try:
            with open("/proc/self/clear_refs", "w") as f:
                f.write("5")
        except OSError:
            pass

    def read(self) -> dict[str, float]:
        """{'rss_mb': peak RSS, 'cuda_mb': peak CUDA memory allocated (CUDA only)} in MiB."""
        out = {"rss_mb": peak_rss_mb()}
        if self.device.type == "cuda":
            out["cuda_mb"] = torch.cuda.max_memory_allocated(self.device) / 2 ** 20
        return out


def peak_rss_mb() -> float:
    """Peak resident memory of this process in MiB (VmHWM, else ru_maxrss)."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) / 1024
    except OSError:
        pass
    r = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return r / 2 ** 20 if platform.system() == "Darwin" else r / 1024


def current_rss_mb() -> float:
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) / 1024
    except OSError:
        pass
    return float("nan")


def describe(device: torch.device) -> dict[str, str]:
    """CPU model, cores, memory, GPU, torch version and thread settings."""
    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    cpu = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    mem = ""
    try:
        with open("/proc/meminfo") as f:
            mem = f"{int(f.readline().split()[1]) / 2 ** 20:.0f} GiB"
    except (OSError, ValueError, IndexError):
        pass
    out = {
        "cpu": f"{cpu}, {os.cpu_count()} logical CPUs" + (f", {mem} RAM" if mem else ""),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "threads": f"intra-op {torch.get_num_threads()}, inter-op {torch.get_num_interop_threads()}",
        "mkldnn": str(torch.backends.mkldnn.is_available()),
    }
    if device.type == "cuda":
        out["gpu"] = torch.cuda.get_device_name(device)
    return out


def optional_version(distribution: str) -> str | None:
    """Installed version of a distribution (without importing it), None when absent."""
    try:
        from importlib.metadata import PackageNotFoundError, version
        try:
            return version(distribution)
        except PackageNotFoundError:
            return None
    except ImportError:
        return None
