"""The config's foundations: its error, the strict base of every table, the upper bounds of its numbers and the
rule for run names (every table of ``fedsl.config.schema`` builds on them)."""

from __future__ import annotations

import re

from pydantic import BaseModel, ConfigDict


class ConfigError(ValueError):
    """A bad configuration; the message is one line meant for the user."""


class _Strict(BaseModel):
    # strict: no silent coercion (true -> 1, "5" -> 5); no inf/nan learning rates
    model_config = ConfigDict(extra="forbid", strict=True, validate_default=True, allow_inf_nan=False)


# Upper bounds: absurd values stop at validation with one line, not later with a MemoryError
# or hours of silence (each is in its field's description).
ROUNDS_MAX = 10**7          # rounds and every per-round period (eval_every, checkpoint_every, ...)
SEED_MAX = 2**63 - 1        # seeds are non-negative int64
CLIENTS_MAX = 1_000_000     # N, S, c
PER_CLASS_MAX = 1_000_000   # generated or carved images per class
SAMPLES_MAX = 10_000_000    # sample counts (n_i, n0)
BATCH_MAX = 1_000_000       # batch sizes
EPOCHS_MAX = 10_000         # epochs per round
STEPS_MAX = 1_000_000       # steps per round
# executor = 'auto' on a CPU: the run's client training (GFLOP) from which a process pool pays (experiments.placement)
POOL_MIN_GFLOP = 4000.0
RUNS_MAX = 100_000          # runs of one config (variants × sweep points × seeds)

# Names of runs and variants become folder names under --out: a safe character set only.
NAME_MAX = 200
_NAME = re.compile(r"\w[\w .+=,()-]*")  # \w: letters and digits of any script, and _
NAME_RULE = (f"letters, digits, spaces and _ . - + = , ( ) only, starting with a letter, digit or _, "
             f"at most {NAME_MAX} bytes in UTF-8 (it names the run's folder)")
_UNSAFE = re.compile(r"[^\w .+=,()-]")


def name_problem(name: str) -> str | None:
    """Why ``name`` cannot name a run folder (None when it can)."""
    if not name:
        return "expected a non-empty name"
    if not _NAME.fullmatch(name) or len(name.encode("utf-8")) > NAME_MAX:
        return f"expected {NAME_RULE}"
    return None


def slug(text: str) -> str:
    """``text`` with every character outside the safe set replaced by '_'."""
    return _UNSAFE.sub("_", text)

