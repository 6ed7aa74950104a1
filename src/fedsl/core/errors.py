"""Errors about data: one line naming the file or setting and the fix (the CLI prints it). Raised by the sources
(``fedsl.sources``), the federation (``fedsl.data``) and what reads them."""

from __future__ import annotations

import warnings
from typing import Sequence


def download_hint(dataset: str | None = None) -> str:
    """How to ask for a download, in the command line's words: the loaders' messages reach CLI users,
    who have no ``download=True`` argument to pass. ``dataset``: a ``data.dataset`` name that
    ``fedsl data prepare`` takes (None for server-only sources such as STL-10)."""
    prepare = f", or `fedsl data prepare {dataset} --download`" if dataset else ""
    return f"set data.download = true (--set data.download=true{prepare})"


class DataError(ValueError):
    """Missing/corrupt files, bad checksums, unsatisfiable partitions, unknown class names."""


class DataWarning(UserWarning):
    """Data that loads but may not be what was meant (e.g. a test split without some class)."""


def warn_missing_classes(labels, class_names: Sequence[str], where: str, why: str = "") -> list[str]:
    """Warn (``DataWarning``, one line) when ``labels`` has no sample of some of ``class_names``.

    ``where`` names the split for the message (e.g. "test split data/test"), ``why`` says
    what follows from it. Returns the names of the missing classes.
    """
    import numpy as np

    present = set(np.unique(np.asarray(labels)).tolist())
    missing = [str(n) for i, n in enumerate(class_names) if i not in present]
    if missing:
        shown = ", ".join(repr(m) for m in missing[:10]) + (f" and {len(missing) - 10} more" if len(missing) > 10
                                                           else "")
        warnings.warn(f"{where} has no sample of class{'es' if len(missing) > 1 else ''} {shown} "
                      f"(expected every one of the {len(class_names)} classes){': ' + why if why else ''}",
                      DataWarning, stacklevel=3)
    return missing
