"""Deprecated: ``fedsl.experiments.tune`` is ``fedsl.tune`` (a package of its own: the study, its plan, its edges and
its report). This name re-exports it for one release, with a DeprecationWarning."""

import warnings

from fedsl.tune import *  # noqa: F403
from fedsl.tune import __all__  # noqa: F401

warnings.warn("fedsl.experiments.tune is now fedsl.tune; the old name goes in the next release",
              DeprecationWarning, stacklevel=2)
