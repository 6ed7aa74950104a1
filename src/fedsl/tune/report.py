"""What a tune folder's studies found: each variant's trials, its chosen values, the budget it spent and the values
still at an edge of their range (``results``); best.json and trials.png (``write_report``).

A trial is named by its run folder (``trial-0007``), the name it had in the progress lines; a trial run again
after a kill keeps its name.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

from fedsl.algorithms.spec import Range
from fedsl.config.schema import ConfigError, RunConfig, validate
from fedsl.config.tune_storage import open_storage, study_name
from fedsl.tune.edges import at_edges, from_json

TUNE_FILE = "tune.json"
STUDY_FILE = "study.db"  # tune.storage = 'sqlite' (the default)
TRIAL_NAME = "trial-{:04d}"


def optuna_module():
    """Optuna, or a ConfigError of one line saying how to install it."""
    try:
        import optuna
    except ImportError:
        raise ConfigError("fedsl tune needs Optuna: pip install 'fedsl[tune]'") from None
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    return optuna


def planned_config(out: str | Path) -> RunConfig:
    """The config a tune folder's studies were planned from (its tune.json)."""
    try:
        return validate(json.loads((Path(out) / TUNE_FILE).read_text())["config"])
    except (OSError, ValueError, KeyError) as e:
        raise ConfigError(f"{Path(out) / TUNE_FILE}: cannot be read ({e}): expected a folder written by `fedsl tune`") \
            from None


def trial_index(folder: str) -> int:
    """7 for 'trial-0007'."""
    return int(folder.rsplit("-", 1)[-1])


def _folder(trial) -> str:
    return trial.user_attrs.get("folder", TRIAL_NAME.format(trial.number))


def _rounds_run(folder: Path, trial, rounds: int) -> int:
    """The rounds ``trial`` ran: as told to its study, else as its run folder's summary.json says (a study of an
    earlier fedsl), else all its rounds."""
    if "rounds_run" in trial.user_attrs:
        return int(trial.user_attrs["rounds_run"])
    try:
        return int(json.loads((folder / _folder(trial) / "summary.json").read_text())["rounds_done"])
    except (OSError, ValueError, KeyError, TypeError):
        return rounds


_DESCRIBED = re.compile(r"\[(?P<low>[^,]+), (?P<high>[^\]]+)\](?P<flags>.*)")


def parse_described(space: dict[str, str]) -> dict[str, Range]:
    """The ranges of a space as ``tune_space.describe`` wrote them ('[0.001, 1] log integer hard high')."""
    out = {}
    for key, text in space.items():
        m = _DESCRIBED.fullmatch(text)
        if m:
            flags = m["flags"]
            out[key] = Range(float(m["low"]), float(m["high"]), " log" in flags, " integer" in flags,
                             "hard low" in flags, "hard high" in flags)
    return out


def results(out: str | Path, top: int = 3) -> list[dict[str, Any]]:
    """Each variant's study: trials finished (complete, pruned, failed), rounds run, ranges widened, the best value
    and values, the top trials and the spread of their values (what a comparison reports beside its chosen values),
    and which chosen values lie at an edge of their (final) range: key -> 'low' / 'high', '(hard)' where that edge
    may not be widened."""
    optuna = optuna_module()
    out = Path(out)
    record = json.loads((out / TUNE_FILE).read_text())
    cfg = planned_config(out)
    t = cfg.tune
    storage = open_storage(t.storage, out)
    prefix = record.get("study_prefix", record.get("fingerprint", ""))
    # each variant's planned ranges: as tune.json keeps them (a folder of an earlier fedsl: as it describes them)
    spaces = {v: ({k: Range(**e) for k, e in r["ranges"].items()} if "ranges" in r
                  else parse_described(r.get("space", {}))) | r.get("choices", {})
              for v, r in record["variants"].items()}
    S = optuna.trial.TrialState
    rows = []
    for variant, planned in record["variants"].items():
        try:
            study = optuna.load_study(study_name=study_name(t.storage, prefix, variant), storage=storage)
        except KeyError:
            rows.append({"variant": variant, "complete": 0, "pruned": 0, "failed": 0, "best": None})
            continue
        trials = [tr for tr in study.trials if "rerun" not in tr.user_attrs]
        done = sorted((tr for tr in trials if tr.state == S.COMPLETE), key=lambda tr: -tr.value)
        widenings = study.user_attrs.get("widenings", 0)
        space = from_json(spaces.get(variant, {}), study.user_attrs.get("space", {}))
        rounds = planned["rounds"]
        rows.append({
            "variant": variant, "complete": len(done), "pruned": sum(tr.state == S.PRUNED for tr in trials),
            "failed": sum(tr.state == S.FAIL for tr in trials),
            "budget": record["trials"] + widenings * t.edge_trials if t.budget_rounds is None else None,
            "budget_rounds": None if t.budget_rounds is None else t.budget_rounds + widenings * t.edge_trials * rounds,
            "rounds_run": sum(_rounds_run(out / variant, tr, rounds) for tr in trials if tr.state != S.RUNNING),
            "rounds_per_trial": rounds, "widenings": widenings,
            "widened": {k: v for i in range(1, widenings + 1) for k, v in study.user_attrs.get(f"widening-{i}",
                                                                                               {}).items()},
            "best": done[0].value if done else None, "params": done[0].params if done else {},
            "folder": _folder(done[0]) if done else None,
            "at_edge": at_edges(space, done[0].params) if done else {},
            "top": [(_folder(tr), tr.value, tr.params) for tr in done[:top]],
            "top_spread": (done[0].value - done[min(top, len(done)) - 1].value) if done else None,
            "values": [(_folder(tr), tr.value) for tr in trials if tr.state == S.COMPLETE]})
    return rows


def write_report(out: str | Path) -> Path:
    """best.json (each variant's chosen values, its top trials and their spread, its budget in trials and rounds
    run, the values at an edge) and trials.png (each trial's validation accuracy by its folder's number, and the
    best so far, per variant)."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out = Path(out)
    rows = results(out)
    (out / "best.json").write_text(json.dumps(rows, indent=1, default=str))
    fig, ax = plt.subplots(figsize=(6, 3.5))
    for r in rows:
        if r.get("values"):
            xs, ys = zip(*sorted((trial_index(f), v) for f, v in r["values"]))
            line = ax.plot(xs, ys, "o", ms=4, alpha=0.6, label=r["variant"])[0]
            best = [max(ys[:i + 1]) for i in range(len(ys))]
            ax.step(xs, best, where="post", color=line.get_color())
    ax.set_xlabel("trial (its folder's number)")
    ax.set_ylabel("validation accuracy (final, rolling)")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(out / "trials.png", dpi=120)
    plt.close(fig)
    return out / "trials.png"
