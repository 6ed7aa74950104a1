"""One benchmark invocation's measurements and their Markdown (``Report``)."""

from __future__ import annotations

from dataclasses import dataclass, field

from harness import machine
from harness.table import Row, floors, markdown


@dataclass
class Report:
    """Everything one benchmark invocation measured."""

    rows: list[Row]
    machine: dict[str, str]
    rates: dict[str, machine.Rates]
    footprint: list[dict[str, float]]
    settings: dict[str, str]
    command: str = ""
    started: str = ""
    seconds: float = 0.0
    notes: list[str] = field(default_factory=list)

    def markdown(self) -> str:
        out = [f"Measured {self.started} in {self.seconds / 60:.1f} min" + (f" with `{self.command}`" if self.command
                                                                             else "") + ".", ""]
        out += [f"- {k}: {v}" for k, v in self.machine.items()]
        out += ["", markdown(self.rows), ""]
        out += floors(self.rows) + [""]
        out += [
                "Ratios `x PEER` = PEER's seconds per round / this row's (above 1: this row is faster). "
                "`% of best` = the time the row's samples would take at the model's best measured training "
                "(fwd+bwd) and inference (fwd) rates / the row's time. samples/s counts training and "
                "evaluation samples. peak MB: the process's peak RSS during the row (Flower: its driver "
                "+ actors x the largest actor peak; loop 1 proc/core: the process + workers x the largest "
                "worker peak, shared pages counted in each), or CUDA memory allocated on a GPU.", ""]
        out += ["Best rates measured in this run (FLOPs per sample from `torch.utils.flop_counter`):", "",
                "| model | train MFLOP/sample | eval MFLOP/sample | best train samples/s (GFLOP/s) | setting "
                "| best eval samples/s (GFLOP/s) | setting | matmul GFLOP/s |",
                "|---|---:|---:|---:|---|---:|---|---:|"]
        for name, r in self.rates.items():
            out.append(f"| {name} | {r.train_flops / 1e6:.1f} | {r.eval_flops / 1e6:.1f} | {r.train_samples_s:,.0f} "
                       f"({r.train_gflops:.1f}) | {r.train_setting} | {r.eval_samples_s:,.0f} ({r.eval_gflops:.1f}) "
                       f"| {r.eval_setting} | {r.matmul_gflops:.0f} |")
        out += ["", "Settings:", ""] + [f"- {k}: {v}" for k, v in self.settings.items()]
        if self.footprint:
            out += ["", "Per-client state for N clients (part 5):", "",
                    "| rule | N | model params | state MB | memory before init MB | after init MB "
                    "| peak over a round MB |", "|---|---:|---:|---:|---:|---:|---:|"]
            for f in self.footprint:
                out.append(f"| {f['rule']} | {f['N']} | {f['params']:,} | {f['state_mb']:,.0f} | "
                           f"{f['before_mb']:,.0f} | {f['rss_mb']:,.0f} | {f['round_peak_mb']:,.0f} |")
            out += ["", "Memory: the process's RSS on a CPU, CUDA memory allocated on a GPU; it includes "
                    "the N clients' data (N x 50 CIFAR images, 586 MiB) and the model."]
        if self.notes:
            out += [""] + [f"- {n}" for n in self.notes]
        return "\n".join(out)
