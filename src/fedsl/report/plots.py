"""Plots of accuracy curves (matplotlib, no display needed)."""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

# one colour per method, the same in every figure
METHOD_COLOURS = {"fedavg": "#1f77b4", "fl": "#1f77b4", "fsl": "#d62728", "fsl_p": "#9467bd", "ds": "#2ca02c",
                  "scaffold": "#ff7f0e", "feddyn": "#8c564b", "fslsyn": "#e377c2"}


def colour(name: str, i: int) -> str:
    return METHOD_COLOURS.get(name.lower().replace("-", "_"), f"C{i % 10}")


def accuracy_curves(curves: dict[str, tuple], path: str | Path, title: str, window: int = 20) -> Path:
    """Per method: raw test accuracy (thin), its rolling mean (thick) and, when given, a ±1 std band.

    ``curves[name] = (rounds, accuracy, rolling_accuracy[, rolling_std])``.
    """
    import numpy as np

    fig, ax = plt.subplots(figsize=(7, 4.2), dpi=120)
    for i, (name, curve) in enumerate(curves.items()):
        rounds, acc, roll = curve[:3]
        c = colour(name, i)
        ax.plot(rounds, acc, color=c, alpha=0.25, lw=1)
        ax.plot(rounds, roll, color=c, lw=2.2, label=f"{name} (rolling {window})")
        if len(curve) > 3 and np.any(np.asarray(curve[3]) > 0):
            lo, hi = np.asarray(roll) - np.asarray(curve[3]), np.asarray(roll) + np.asarray(curve[3])
            ax.fill_between(rounds, lo, hi, color=c, alpha=0.15, lw=0)
    ax.set_xlabel("round")
    ax.set_ylabel("test accuracy")
    ax.set_title(title)
    ax.set_ylim(0, 1)
    ax.grid(alpha=0.3)
    ax.legend(loc="lower right")
    fig.tight_layout()
    path = Path(path)
    fig.savefig(path)
    plt.close(fig)
    return path
