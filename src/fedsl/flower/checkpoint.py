"""The ServerApp's checkpoint and resume: ``out-dir/checkpoint.pt``, written atomically every
``checkpoint_every`` rounds and after the last one in the simulator's format (``fedsl.experiments.checkpoint``),
holds x_t, the server state, γ_t and, as its records, the run's history, evaluations and config; a
ServerApp started on that ``out-dir`` continues from it (``resume``)."""

from __future__ import annotations

import json
from logging import ERROR, INFO, WARNING
from pathlib import Path
from typing import Any

import torch
from flwr.supercore import log

from fedsl.engine.simulator import RunState
from fedsl.experiments import checkpoint
from fedsl.experiments.checkpoint import RESTART_SERVER_APP, Checkpoint, CorruptCheckpoint
from fedsl.experiments.config import ConfigError, validate
from fedsl.experiments.results import RunDir

CHECKPOINT = "checkpoint.pt"
# Config keys a resumed run may change: they do not change the rounds' arithmetic.
RESUMABLE_CHANGES = ("rounds", "eval_every", "eval_final_window", "checkpoint_every", "threads")


def config_diff(a: Any, b: Any, prefix: str = "") -> list[str]:
    """Dotted keys where two config dumps differ."""
    if isinstance(a, dict) and isinstance(b, dict):
        return [d for k in sorted(set(a) | set(b)) for d in config_diff(a.get(k), b.get(k), f"{prefix}{k}.")]
    return [] if a == b else [prefix.rstrip(".")]


class Checkpointing:
    """Checkpoint and resume for ``FedslStrategy`` (which provides ``setup``, ``sim``, ``state``,
    ``offset``, ``history``, ``evaluations``, ``received``, ``tables`` and ``_out()``)."""

    def _config_dump(self) -> dict[str, Any]:
        return self.setup.cfg.model_dump(mode="json")

    def save_checkpoint(self) -> Path | None:
        """``out-dir/checkpoint.pt`` (written atomically): the model after round ``len(history)``, the
        server state, γ_t, and as its records the run's history and evaluations so far and its config."""
        d = self._out()
        if d is None:
            return None
        records = {"history": self.history, "evaluations": self.evaluations, "config": self._config_dump()}
        checkpoint.save(d / CHECKPOINT, Checkpoint(len(self.history), self.state, records))
        return d / CHECKPOINT

    def restore(self, ckpt: Checkpoint) -> None:
        """Continue from a checkpoint's round (``save_checkpoint``'s).

        Raises:
            ConfigError: the checkpoint is of another config (other than ``RESUMABLE_CHANGES``), or
                past ``rounds``.
        """
        cfg = self.setup.cfg
        ignore = set(RESUMABLE_CHANGES)
        theirs, ours = ckpt.extra.get("config"), self._config_dump()
        if not isinstance(theirs, dict):
            raise ConfigError(f"{self.setup.options.out_dir}/{CHECKPOINT} is not a ServerApp's checkpoint (it holds "
                              "no config; a `fedsl run` folder?): use another out-dir, or resume = false to start over")
        try:  # through today's schema: a key added since (absent there, so at its default) is no difference
            theirs = validate(theirs).model_dump(mode="json")
        except ConfigError as e:
            raise ConfigError(f"{self.setup.options.out_dir}/{CHECKPOINT} holds a config this fedsl cannot read "
                              f"({e}): use another out-dir, or resume = false to start over") from None
        diff = [k for k in config_diff(theirs, ours) if k.split(".")[0] not in ignore]
        if diff:
            raise ConfigError(f"{self.setup.options.out_dir}/{CHECKPOINT} is of another config (differs in "
                              f"{', '.join(diff[:5])}{' ...' if len(diff) > 5 else ''}): use another out-dir, "
                              f"or resume = false to start over")
        done = ckpt.round
        if done > cfg.rounds:
            raise ConfigError(f"{self.setup.options.out_dir}/{CHECKPOINT} is at round {done}, past rounds = "
                              f"{cfg.rounds}")
        sim = self.sim

        def dev(group: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
            return {n: v.to(device=sim.device, dtype=sim.dtype) for n, v in group.items()}

        s = ckpt.state  # the server state only: the clients keep theirs
        self.state = RunState(dev(s.x), {k: dev(g) for k, g in s.algo.items()}, s.gamma)
        self.offset = done
        self.history = list(ckpt.extra.get("history", []))[:done]
        self.evaluations = [e for e in ckpt.extra.get("evaluations", []) if e["round"] <= done]

    def resume(self) -> int:
        """Continue from ``out-dir/checkpoint.pt`` when there is one and ``resume`` is on; returns the
        checkpoint's round (0: the run starts at round 1, and an old checkpoint there is removed)."""
        d = self._out()
        if d is None:
            return 0
        RunDir(d).remove_stale_tmp()  # temporary files of writes killed half-way
        path = d / CHECKPOINT
        if not path.is_file():
            return 0
        if not self.setup.options.resume:
            path.unlink()
            log(INFO, "fedsl: resume = false: removed %s, starting at round 1", path)
            return 0
        try:
            ckpt = checkpoint.load(path, RESTART_SERVER_APP)
        except CorruptCheckpoint as e:  # one line in the log and as the run's failure, not torch's traceback
            log(ERROR, "fedsl: %s", e)
            raise
        self.restore(ckpt)
        received = d / "received.json"
        if received.is_file():  # the audit of what arrived before, kept
            try:
                self.received = list(json.loads(received.read_text()))
            except (ValueError, TypeError):
                self.received = []
        log(INFO, "fedsl: resuming from %s at round %d of %d", path, self.offset + 1, self.setup.cfg.rounds)
        tables = list(self.alg.rule.init_client_state(self.state.x))
        if tables:
            log(WARNING, "fedsl: %s keeps %s on the clients, which start them over in a new Flower run: the resumed "
                "run is not bit-identical to an uninterrupted one", self.alg.name, ", ".join(tables))
        return self.offset
