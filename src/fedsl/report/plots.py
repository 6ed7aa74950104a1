"""Plots of accuracy curves (matplotlib, no display needed)."""

from __future__ import annotations

from pathlib import Path

import matplotlib
import matplotlib.colors
import matplotlib.figure
import matplotlib.ticker

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

# one colour per method, the same in every figure
METHOD_COLOURS = {"fedavg": "#1f77b4", "fl": "#1f77b4", "fsl": "#d62728", "fsl_p": "#9467bd", "ds": "#2ca02c",
                  "scaffold": "#ff7f0e", "feddyn": "#8c564b", "fslsyn": "#e377c2"}


def method_of(name: str) -> str | None:
    """The method a run or variant name starts with ('FSL-g0.5-classes_per_client=2' -> 'fsl',
    'FSL-p-...' -> 'fsl_p', 'FSLsyn-720' -> 'fslsyn', 'DS-S4' -> 'ds'), or None."""
    norm = name.lower().replace("-", "_")
    hits = [k for k in METHOD_COLOURS if norm == k or norm.startswith(k + "_")]
    return max(hits, key=len) if hits else None


def colours(names: list[str]) -> dict[str, str]:
    """The method's fixed colour for the first name of each method (so FL, DS and FSL look the
    same in every figure), distinct tab20 colours for the rest (e.g. FSL's other γ)."""
    out: dict[str, str] = {}
    for n in names:
        m = method_of(n)
        if m is not None and METHOD_COLOURS[m] not in out.values():
            out[n] = METHOD_COLOURS[m]
    spare = [matplotlib.colors.to_hex(c) for c in plt.get_cmap("tab20").colors]
    spare = [c for c in spare if c not in out.values() and c not in METHOD_COLOURS.values()]
    for n in names:
        if n not in out:
            out[n] = spare.pop(0) if spare else "#555555"
    return out


MAX_CURVES = 12  # more lines than this are unreadable in one panel


def select_curves(curves: dict[str, tuple], limit: int = MAX_CURVES) -> tuple[dict[str, tuple], str]:
    """At most ``limit`` curves, the best by final rolling accuracy (a sweep's 40 runs would be a
    tangle), and a note saying so for the title; all of them stay in the tables."""
    if len(curves) <= limit:
        return curves, ""
    def final(item):
        roll = item[1][2]
        return roll[-1] if len(roll) else float("-inf")
    best = dict(sorted(curves.items(), key=final, reverse=True)[:limit])
    return {n: c for n, c in curves.items() if n in best}, f"the best {limit} of {len(curves)} by final accuracy"


def curves_figure(curves: dict[str, tuple], title: str, window: int = 20) -> matplotlib.figure.Figure:
    """The figure of ``accuracy_curves`` (not saved): per method, raw test accuracy (thin), its
    rolling mean (thick) and, when given, a ±1 std band.

    ``curves[name] = (rounds, accuracy, rolling_accuracy[, rolling_std])``. With more than
    ``MAX_CURVES``, only the best are drawn (``select_curves``) and the title says so. Rounds are
    whole numbers (ticks too, also for a 2-round quick run), and the legend stands outside the axes
    on the right: inside, it covered the curves' ends, where they are read.
    """
    import numpy as np

    curves, note = select_curves(curves)
    if note:
        title = f"{title} ({note})"
    many = len(curves) > 6
    fig, ax = plt.subplots(figsize=(10 if many else 8.5, 4.2), dpi=120)
    palette = colours(list(curves))
    for name, curve in curves.items():
        rounds, acc, roll = curve[:3]
        c = palette[name]
        ax.plot(rounds, acc, color=c, alpha=0.25, lw=1)
        ax.plot(rounds, roll, color=c, lw=2.2, label=f"{name} (rolling {window})")
        if len(curve) > 3 and np.any(np.asarray(curve[3]) > 0):
            lo, hi = np.asarray(roll) - np.asarray(curve[3]), np.asarray(roll) + np.asarray(curve[3])
            ax.fill_between(rounds, lo, hi, color=c, alpha=0.15, lw=0)
    ax.set_xlabel("round")
    ax.set_ylabel("test accuracy")
    ax.set_title(title)
    ax.set_ylim(0, 1)
    ax.xaxis.set_major_locator(matplotlib.ticker.MaxNLocator(integer=True))
    ax.grid(alpha=0.3)
    if curves:
        ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=8, borderaxespad=0)
    fig.tight_layout()
    return fig


def accuracy_curves(curves: dict[str, tuple], path: str | Path, title: str, window: int = 20) -> Path:
    """``curves_figure`` saved to ``path`` (PNG)."""
    fig = curves_figure(curves, title, window)
    path = Path(path)
    fig.savefig(path, bbox_inches="tight")  # the legend outside the axes stays in the picture
    plt.close(fig)
    return path


def contact_sheet(images, labels, class_names: list[str], path: str | Path, per_class: int = 8,
                  title: str = "") -> Path:
    """A grid of ``per_class`` samples of each class (rows), uint8 [n, H, W(, C)] images."""
    import numpy as np

    classes = [c for c in range(len(class_names)) if np.any(labels == c)]
    rows, cols = len(classes), per_class
    fig, axes = plt.subplots(rows, cols, figsize=(cols * 0.7 + 1.2, rows * 0.7 + 0.5), dpi=100, squeeze=False)
    for r, c in enumerate(classes):
        idx = np.flatnonzero(labels == c)[:per_class]
        for k in range(cols):
            ax = axes[r][k]
            ax.axis("off")
            if k < len(idx):
                img = images[idx[k]]
                ax.imshow(img, cmap="gray" if img.ndim == 2 else None, vmin=0, vmax=255)
        axes[r][0].text(-0.15, 0.5, class_names[c], transform=axes[r][0].transAxes, ha="right", va="center",
                        fontsize=8)
    if title:
        fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    path = Path(path)
    fig.savefig(path)
    plt.close(fig)
    return path


def partition_heatmap(counts, class_names: list[str], path: str | Path, title: str = "") -> Path:
    """Clients (rows) × classes (columns) sample counts."""
    import numpy as np

    counts = np.asarray(counts)
    n, L = counts.shape
    fig, ax = plt.subplots(figsize=(min(2 + 0.3 * L, 16), min(1.5 + 0.12 * n, 14)), dpi=110)
    im = ax.imshow(counts, aspect="auto", cmap="viridis", interpolation="nearest")
    ax.set_xlabel("class")
    ax.set_ylabel("client")
    ax.yaxis.set_major_locator(matplotlib.ticker.MaxNLocator(integer=True))
    if L <= 50:
        ax.set_xticks(range(L), class_names, rotation=90 if L > 12 else 0, fontsize=7)
    fig.colorbar(im, ax=ax, label="samples")
    ax.set_title(title or f"{n} clients × {L} classes")
    fig.tight_layout()
    path = Path(path)
    fig.savefig(path)
    plt.close(fig)
    return path
