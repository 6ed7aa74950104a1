"""What the command line's modules share: its consoles, the one-line errors, the config loader."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import List, Optional

import typer
from rich.console import Console

PRESET_HELP = "a bundled preset instead of CONFIG (see `fedsl presets`)"
DATA_DIR_HELP = "dataset folder (default: $FEDSL_DATA_DIR, else ~/.cache/fedsl/data)"
# Piped or captured output gets wide lines instead of rich's 80-column wrapping and truncation.
console = Console() if sys.stdout.isatty() else Console(width=160)
err_console = Console(stderr=True) if sys.stderr.isatty() else Console(stderr=True, width=1000)


class UserError(Exception):
    """Bad input; printed as one line, exit status 2."""


def clean_errors(fn):
    """Turn expected errors (config, data, files) into one line on stderr and exit 2."""
    import functools

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        import warnings

        from fedsl.config.schema import ConfigError
        from fedsl.core.errors import DataError, DataWarning
        from fedsl.runs.results import CorruptCheckpoint, FolderInUse
        shown = warnings.showwarning

        def one_line(message, category, filename, lineno, file=None, line=None):
            if issubclass(category, DataWarning):  # ours: one readable line, not Python's source echo
                err_console.print(f"warning: {message}", markup=False, highlight=False, emoji=False, soft_wrap=True)
            else:
                shown(message, category, filename, lineno, file, line)
        try:
            with warnings.catch_warnings():
                warnings.showwarning = one_line
                return fn(*args, **kwargs)
        except (UserError, ConfigError, DataError, FolderInUse, CorruptCheckpoint) as e:
            # one line, whatever the message quotes back (newlines in keys, ':emoji:' codes)
            msg = "".join(ch if ch.isprintable() else repr(ch)[1:-1] for ch in str(e))
            err_console.print(f"error: {msg}", markup=False, highlight=False, emoji=False, soft_wrap=True)
            raise typer.Exit(2) from None
        except KeyboardInterrupt as e:
            from fedsl.runs.interrupts import Terminated
            raise typer.Exit(143 if isinstance(e, Terminated) else 130) from None
    return wrapper


def print_line(line: str) -> None:
    """A line of the runner's log, printed as is (a run's name may hold brackets: no rich markup)."""
    console.print(line, markup=False, highlight=False)


def load_config(config: Optional[Path], preset: Optional[str], set_: List[str], data_dir: Optional[Path],
                quick: bool = False, variants: Optional[str] = None):
    """The config a command runs: CONFIG or the preset, ``--quick``'s table, ``--set`` and ``--data-dir`` applied,
    validated; with ``--variants`` (names split at commas) only those variants, ``--set`` refused where all of them
    replace its key, and a UserError of one line naming the variants there are when one is not among them."""
    from fedsl.config import loading, presets
    from fedsl.config.expand import only_variants
    if (config is None) == (preset is None):
        raise UserError("give either a CONFIG file or --preset NAME (see `fedsl presets`)")
    names = None if variants is None else [v.strip() for v in variants.split(",") if v.strip()]
    base = presets.load(preset) if preset else None
    extra = [f"data.data_dir={str(data_dir)!r}"] if data_dir is not None else []
    cfg = loading.load(config, [*set_, *extra], base=base, quick=quick, variants=names)
    if names is None:
        return cfg
    if not names or any(v not in cfg.variants for v in names):
        raise UserError(f"--variants {variants!r}: expected names from "
                        f"{list(cfg.variants) or 'none (the config has no variants)'}")
    return only_variants(cfg, names)
