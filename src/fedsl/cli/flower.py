"""`fedsl show OUT` on a Flower ServerApp's ``out-dir`` (``fedsl.flower.strategy`` writes it):

    rounds.json        one entry per round done: its clients (sampled, trained), rejected replies, seconds, ...
    evaluations.json   one entry per evaluated round (round 0: x_0): round, accuracy, loss
    checkpoint.pt      x_t and these records, with the run's config (its T and rolling window)
    done.json          at the end: {"status": "completed", "rounds", "federation", ...}, beside final.pt (x_T)
    failed.json        a run that failed: {"status": "failed", "reason", "rounds"}

The run's table has `fedsl show`'s columns for a run: its final accuracy, rise time and T_0.5 are the paper's
metrics (``metrics.summarize``) over the evaluations of rounds 1..t, with the config's rolling window, as a
simulated run's summary.json has them. Reading JSON only (and the checkpoint's records), it needs no Flower.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from rich.table import Table

from fedsl.cli.common import UserError, console
from fedsl.engine import metrics

FILES = ("rounds.json", "evaluations.json", "done.json", "failed.json", "final.pt")
SHOWN = 20  # evaluations printed at most: the last ones (evaluations.json holds them all)


def is_flower_folder(path: Path) -> bool:
    """Whether ``path`` is a ServerApp's out-dir (one of its files, and no run or group of `fedsl run`)."""
    return (not (path / "config.json").is_file() and not (path / "group.json").is_file()
            and any((path / f).is_file() for f in FILES))


def _json(path: Path, default: Any) -> Any:
    """``path``'s JSON (``default`` when there is no file); one line naming it when it cannot be read."""
    if not path.is_file():
        return default
    try:
        return json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise UserError(f"{str(path)!r} cannot be read ({e}): expected the JSON a fedsl ServerApp writes") from None


def _list(path: Path, numbers: tuple[str, ...] = ()) -> list[dict]:
    """``path``'s list of entries, each with an integer ``round`` and the numbers ``numbers``."""
    data = _json(path, [])
    if not isinstance(data, list) or not all(
            isinstance(e, dict) and isinstance(e.get("round"), int)
            and all(isinstance(e.get(k), (int, float)) for k in numbers) for e in data):
        what = f"entries with round{''.join(f', {k}' for k in numbers)}"
        raise UserError(f"{str(path)!r} is not a list of {what}: expected the JSON a fedsl ServerApp writes")
    return data


def _record(path: Path) -> dict | None:
    """done.json or failed.json: a table, or None without the file."""
    data = _json(path, None)
    if data is not None and not isinstance(data, dict):
        raise UserError(f"{str(path)!r} is not a table of keys: expected the JSON a fedsl ServerApp writes")
    return data


def _config(path: Path) -> dict:
    """The run's config from the checkpoint's records ({} without a readable one: T and the window unknown)."""
    from fedsl.runs import checkpoint
    try:
        ckpt = checkpoint.load(path / "checkpoint.pt", mmap=True)
    except checkpoint.CorruptCheckpoint:
        return {}
    config = ckpt.extra.get("config") if ckpt is not None else None
    return config if isinstance(config, dict) else {}


def print_flower(path: Path) -> None:
    """The ServerApp's run in ``path``: a table as `fedsl show` prints of a run, what its rounds aggregated, and
    its evaluations (the last ``SHOWN``)."""
    from fedsl.report.tables import fmt, legend
    history, evals = _list(path / "rounds.json"), _list(path / "evaluations.json", ("accuracy", "loss"))
    done, failed, config = _record(path / "done.json"), _record(path / "failed.json"), _config(path)
    status = "completed" if done else "failed" if failed else "unfinished"
    rounds = len(history)
    window = config.get("rolling_window", metrics.WINDOW)
    scored = [e for e in evals if e["round"] > 0]  # x_0's row is no round: the paper's metrics are over 1..t
    summary = metrics.summarize([e["round"] for e in scored], [e["accuracy"] for e in scored], window)
    target = config.get("rounds")
    table = Table(title=f"{path}  (Flower ServerApp out-dir)")
    for c in ("run", "status", "final acc", "rise time", "T_0.5", "rounds", "time (s)"):
        table.add_column(c, justify="left" if c in ("run", "status") else "right")
    table.add_row(path.name, status, fmt(summary["final_accuracy"], "final_accuracy"),
                  fmt(summary["rise_time"], "rise_time"), fmt(summary["T_0.5"], "T_0.5"),
                  f"{rounds} of {target}" if isinstance(target, int) else str(rounds),
                  fmt(sum(h.get("seconds") or 0.0 for h in history), "wall_time"))
    console.print(table)
    say = lambda line: console.print(line, markup=False, highlight=False)  # noqa: E731
    if failed:
        say(f"failed: {failed.get('reason', 'no reason recorded')}")
    elif not done:
        say("no done.json or failed.json: the ServerApp is running, or stopped; the same `flwr run` continues it "
            "from checkpoint.pt")
    trained = sum(len(h.get("trained") or ()) for h in history)
    idle = sum(not h.get("trained") for h in history)
    rejected = sum(len(h.get("rejected") or ()) for h in history)
    federation = (done or {}).get("federation") or config.get("federation")
    say(f"{trained} client updates aggregated in {rounds} rounds ({idle} rounds without one), {rejected} replies "
        f"rejected" + (f"; federation {federation}" if federation else ""))
    if done and "final_accuracy_finetuned" in done:
        say(f"fine-tuned on D0 after round {rounds}: test accuracy {fmt(done['final_accuracy_finetuned'])}")
    if done and isinstance(done.get("privacy"), dict) and "epsilon" in done["privacy"]:
        say(f"differential privacy: ε = {done['privacy']['epsilon']:.4g} after {rounds} rounds")
    if evals:
        _print_evaluations(evals, window)
    say(legend(window, [rounds]).replace("metrics.csv", "evaluations.json"))  # a run's rows are Flower's evaluations


def _print_evaluations(evals: list[dict], window: int) -> None:
    """evaluations.json as a table with the rolling accuracy (over rounds 1..t, as metrics.csv's; x_0's is its
    accuracy), the last ``SHOWN`` rows."""
    scored = [e for e in evals if e["round"] > 0]
    rolling = dict(zip((e["round"] for e in scored),
                       metrics.rolling([e["round"] for e in scored], [e["accuracy"] for e in scored], window)))
    shown = evals[-SHOWN:]
    caption = f"last {len(shown)} of {len(evals)} evaluations (all in evaluations.json)" if len(evals) > SHOWN \
        else "evaluations"
    table = Table(title=caption)
    for c in ("round", "accuracy", "loss", "rolling acc"):
        table.add_column(c, justify="right")
    for e in shown:
        roll = rolling.get(e["round"], e["accuracy"])
        table.add_row(str(e["round"]), f"{e['accuracy']:.4f}", f"{e['loss']:.4f}", f"{roll:.4f}")
    console.print(table)
