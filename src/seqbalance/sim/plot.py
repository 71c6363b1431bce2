"""A one-page picture of a simulation: per-rank load per strategy, and the length distribution."""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:
    from seqbalance.sim.result import SimulationResult

__all__ = ["check_figure_path", "plot", "pyplot", "save_figure"]


def pyplot() -> Any:
    try:
        import matplotlib
    except ImportError:
        raise ImportError("plotting needs matplotlib: pip install 'seqbalance[plot]'") from None
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def check_figure_path(path: str | os.PathLike[str], argument: str) -> None:
    """Refuse, before any work, a figure path matplotlib cannot write: its suffix names no
    format it knows (``--plot x.txt`` failed with matplotlib's message, naming no flag, after
    the work was done).

    Raises:
        ImportError: matplotlib is not installed (the install line).
        ValueError: the suffix names no format; the message names ``argument`` and the path.
    """
    pyplot()
    from matplotlib.backend_bases import FigureCanvasBase

    suffix = Path(path).suffix
    formats = FigureCanvasBase.get_supported_filetypes()
    if suffix and suffix[1:].lower() not in formats:
        raise ValueError(
            f"{argument} {str(path)!r}: matplotlib writes no {suffix!r} files; give a name ending "
            f"in one of {', '.join('.' + name for name in sorted(formats))} (no suffix: PNG)"
        )


def save_figure(figure: Any, path: str | os.PathLike[str]) -> Path:
    """Write ``figure`` to exactly ``path`` (its format from the suffix; a name without one is
    a PNG: matplotlib would write ``path + ".png"`` instead, and the caller name a file that
    does not exist) and close it."""
    path = Path(path)
    figure.savefig(path, dpi=110, format=None if path.suffix else "png")
    pyplot().close(figure)
    return path


def plot(result: SimulationResult, path: str | os.PathLike[str]) -> Path:
    """Write a PNG of ``result`` to ``path`` and return the path.

    Top row: one panel per strategy with the predicted per-rank load (seconds) of the
    representative step, its lower bound dashed, so stragglers stand out at a glance. Bottom:
    the histogram of the planned sample lengths (tokens) with the micro-batch token cap.
    """
    plt = pyplot()
    names = list(result.strategies)
    step = result.representative_step
    figure = plt.figure(figsize=(max(8.0, 2.4 * len(names)), 7.0), layout="constrained")
    grid = figure.add_gridspec(2, len(names), height_ratios=(3, 2))
    top = max(float(result.strategies[name].rank_seconds.max()) for name in names)
    bound = float(result.lower_bound_seconds[step])
    ranks = np.arange(result.dp_size)
    first_axis = None
    for column, name in enumerate(names):
        stats = result.strategies[name]
        axis = figure.add_subplot(grid[0, column], sharey=first_axis)
        first_axis = first_axis or axis
        loads = stats.rank_seconds
        slowest = int(np.argmax(loads))
        colors = ["#d62728" if rank == slowest else "#1f77b4" for rank in ranks]
        axis.bar(ranks, loads, color=colors)
        if result.objective == "step":
            axis.axhline(bound, color="black", linestyle="--", linewidth=1, label="lower bound")
        mean = float(loads.mean())
        imbalance = float(loads.max()) / mean if mean > 0 else 1.0
        axis.set_title(f"{name}\nslowest {loads.max():.3g} s, max/mean {imbalance:.2f}", fontsize=9)
        axis.set_xlabel("rank")
        axis.set_xticks(ranks if result.dp_size <= 16 else ranks[:: result.dp_size // 8])
        axis.set_ylim(0, 1.25 * top if top > 0 else 1.0)
        if column == 0:
            axis.set_ylabel(f"predicted load, step {step} (s)")
            if result.objective == "step":
                axis.legend(loc="upper right", fontsize=8)
        else:
            axis.tick_params(labelleft=False)

    histogram = figure.add_subplot(grid[1, :])
    lengths = result.lengths[result.lengths > 0]
    heavy_tailed = lengths.size > 0 and lengths.max() > 20 * max(float(np.median(lengths)), 1.0)
    bins: Any = np.geomspace(lengths.min(), lengths.max() + 1, 60) if heavy_tailed else 60
    histogram.hist(lengths, bins=bins, color="#7f7f7f")
    if heavy_tailed:
        histogram.set_xscale("log")
    # A cap far beyond the longest sample would squash the histogram into one corner.
    if result.max_tokens is not None and result.max_tokens <= 2 * lengths.max():
        histogram.axvline(
            result.max_tokens,
            color="#d62728",
            linestyle=":",
            label=f"max_tokens {result.max_tokens}",
        )
        histogram.legend(fontsize=8)
    histogram.set_xlabel("sample length (tokens)")
    histogram.set_ylabel("samples")
    histogram.set_title(
        f"{result.lengths.size} samples, median {int(np.median(result.lengths))} tokens, "
        f"max_tokens {result.max_tokens}, {result.truncated} truncated to it",
        fontsize=9,
    )
    figure.suptitle(
        f"{result.model}, dp {result.dp_size}, global batch {result.global_batch_size}, "
        f"{result.steps} steps, objective {result.objective}\n{result.headline()}",
        fontsize=10,
    )
    return save_figure(figure, path)
