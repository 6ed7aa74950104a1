"""The ServerApp's checkpoint and resume: ``out-dir/checkpoint.pt``, written atomically every
``checkpoint_every`` rounds and after the last one in the simulator's format (``fedsl.runs.checkpoint``),
holds x_t, the server state, γ_t and, as its records, the run's history, evaluations and config; a
ServerApp started on that ``out-dir`` continues from it (``StrategyCheckpoint.resume``).

The strategy (``fedsl.flower.strategy``) holds one ``StrategyCheckpoint``, given what it needs once (the
config, ``out-dir``, whether to resume, the engine's device and dtype), and hands it the run's state and
records to save; what it resumes from comes back as a ``Resumed``.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, replace
from logging import ERROR, INFO
from pathlib import Path
from typing import Any

import torch
from flwr.supercore import log

from fedsl.config.schema import ConfigError, RunConfig, validate
from fedsl.engine.simulator import RunState
from fedsl.runs import checkpoint
from fedsl.runs.checkpoint import RESTART_SERVER_APP, Checkpoint, CorruptCheckpoint
from fedsl.runs.results import RunDir

CHECKPOINT = "checkpoint.pt"
# Config keys a resumed run may change: they do not change the rounds' arithmetic.
RESUMABLE_CHANGES = ("rounds", "eval_every", "eval_final_window", "checkpoint_every", "threads")


def config_diff(a: Any, b: Any, prefix: str = "") -> list[str]:
    """Dotted keys where two config dumps differ."""
    if isinstance(a, dict) and isinstance(b, dict):
        return [d for k in sorted(set(a) | set(b)) for d in config_diff(a.get(k), b.get(k), f"{prefix}{k}.")]
    return [] if a == b else [prefix.rstrip(".")]


def out_folder(out_dir: str | None) -> Path | None:
    """The ServerApp's ``out-dir``, made if missing; None when it writes no files (``out-dir`` unset)."""
    if not out_dir:
        return None
    d = Path(out_dir)
    d.mkdir(parents=True, exist_ok=True)
    return d


@dataclass(frozen=True)
class Resumed:
    """What a resumed ServerApp continues from: the checkpoint's round t (the rounds done) and RunState
    (x_t, the server state, γ_t; the clients keep theirs), the rounds' history and the evaluations up to t,
    and the audit of what arrived before (``received.json``; None: no such file)."""

    round: int
    state: RunState
    history: list[dict[str, Any]]
    evaluations: list[dict[str, Any]]
    received: list[dict[str, Any]] | None = None


class StrategyCheckpoint:
    """``out-dir/checkpoint.pt`` of one ServerApp run.

    Args:
        cfg: the run's config (saved with each checkpoint; a resumed run's must match it).
        out_dir: the ServerApp's ``out-dir`` (None or empty: nothing is saved or resumed).
        resume: continue from a checkpoint found there (False: remove it and start at round 1).
        device, dtype: where the resumed state's tensors go (the engine's).
    """

    def __init__(self, cfg: RunConfig, out_dir: str | None, resume: bool, device: torch.device,
                 dtype: torch.dtype) -> None:
        self.cfg, self.out_dir, self.resume_on, self.device, self.dtype = cfg, out_dir, resume, device, dtype

    def _config_dump(self) -> dict[str, Any]:
        return self.cfg.model_dump(mode="json")

    def save(self, state: RunState, history: list[dict[str, Any]],
             evaluations: list[dict[str, Any]]) -> Path | None:
        """``out-dir/checkpoint.pt`` (written atomically): the model after round ``len(history)``, the
        server state, γ_t, and as its records the run's history and evaluations so far and its config."""
        d = out_folder(self.out_dir)
        if d is None:
            return None
        records = {"history": history, "evaluations": evaluations, "config": self._config_dump()}
        checkpoint.save(d / CHECKPOINT, Checkpoint(len(history), state, records))
        return d / CHECKPOINT

    def restore(self, ckpt: Checkpoint) -> Resumed:
        """What to continue from at a checkpoint's round (``save``'s).

        Raises:
            ConfigError: the checkpoint is of another config (other than ``RESUMABLE_CHANGES``), or
                past ``rounds``.
        """
        cfg = self.cfg
        ignore = set(RESUMABLE_CHANGES)
        theirs, ours = ckpt.extra.get("config"), self._config_dump()
        if not isinstance(theirs, dict):
            raise ConfigError(f"{self.out_dir}/{CHECKPOINT} is not a ServerApp's checkpoint (it holds "
                              "no config; a `fedsl run` folder?): use another out-dir, or resume = false to start over")
        try:  # through today's schema: a key added since (absent there, so at its default) is no difference
            theirs = validate(theirs).model_dump(mode="json")
        except ConfigError as e:
            raise ConfigError(f"{self.out_dir}/{CHECKPOINT} holds a config this fedsl cannot read "
                              f"({e}): use another out-dir, or resume = false to start over") from None
        diff = [k for k in config_diff(theirs, ours) if k.split(".")[0] not in ignore]
        if diff:
            raise ConfigError(f"{self.out_dir}/{CHECKPOINT} is of another config (differs in "
                              f"{', '.join(diff[:5])}{' ...' if len(diff) > 5 else ''}): use another out-dir, "
                              f"or resume = false to start over")
        done = ckpt.round
        if done > cfg.rounds:
            raise ConfigError(f"{self.out_dir}/{CHECKPOINT} is at round {done}, past rounds = {cfg.rounds}")

        s = ckpt.state  # the server state only: the clients keep theirs
        return Resumed(done, s.moved(lambda v: v.to(device=self.device, dtype=self.dtype)),
                       list(ckpt.extra.get("history", []))[:done],
                       [e for e in ckpt.extra.get("evaluations", []) if e["round"] <= done])

    def resume(self) -> Resumed | None:
        """What to continue from, when ``out-dir/checkpoint.pt`` exists and ``resume`` is on; None: the run
        starts at round 1 (and an old checkpoint there is removed when ``resume`` is off)."""
        d = out_folder(self.out_dir)
        if d is None:
            return None
        RunDir(d).remove_stale_tmp()  # temporary files of writes killed half-way
        path = d / CHECKPOINT
        if not path.is_file():
            return None
        if not self.resume_on:
            path.unlink()
            log(INFO, "fedsl: resume = false: removed %s, starting at round 1", path)
            return None
        try:
            ckpt = checkpoint.load(path, RESTART_SERVER_APP)
        except CorruptCheckpoint as e:  # one line in the log and as the run's failure, not torch's traceback
            log(ERROR, "fedsl: %s", e)
            raise
        resumed = self.restore(ckpt)
        received = d / "received.json"
        if received.is_file():  # the audit of what arrived before, kept
            try:
                audit = list(json.loads(received.read_text()))
            except (ValueError, TypeError):
                audit = []
            resumed = replace(resumed, received=audit)
        log(INFO, "fedsl: resuming from %s at round %d of %d", path, resumed.round + 1, self.cfg.rounds)
        return resumed
