"""The memory-overhead frontier of `monet.profiling.comparison.MethodResult` rows as a PNG
(``monet demo --plot``): measured peak on x, overhead on y, one point per method."""
from __future__ import annotations

from pathlib import Path


def frontier_plot(results, path, title: str = "", joined: str = "monet") -> Path:
    """Write the frontier of ``results`` (`MethodResult` rows; those without a measured peak or
    overhead are left out) to the PNG ``path``: x the measured peak (MiB), y the overhead (%),
    each point labelled with its method; the points of methods whose name starts with ``joined``
    are joined by a line in order of peak.  Returns ``path`` as a `Path`.

    Raises:
        OSError: ``path`` cannot be written (a missing folder, no permission).
    """
    import matplotlib

    matplotlib.use("Agg")  # no display needed; set before pyplot is imported
    import matplotlib.pyplot as plt

    path = Path(path)
    points = [(r.method, r.peak_bytes / 2**20, 100 * r.overhead) for r in results
              if r.peak_bytes is not None and r.overhead is not None]
    fig, ax = plt.subplots(figsize=(7, 4.5), dpi=100)
    line = sorted((x, y) for m, x, y in points if m.startswith(joined))
    if len(line) > 1:
        ax.plot(*zip(*line), "-", color="tab:blue", alpha=0.6, label=f"{joined} (budgets joined)")
    for method, x, y in points:
        ax.plot(x, y, "o", color="tab:blue" if method.startswith(joined) else "tab:gray")
        ax.annotate(method, (x, y), textcoords="offset points", xytext=(5, 5), fontsize=8)
    ax.set_xlabel("measured peak memory of one training iteration (MiB)")
    ax.set_ylabel("overhead over plain PyTorch (%)")
    ax.set_title(title, fontsize=9)
    ax.grid(True, alpha=0.3)
    if len(line) > 1:
        ax.legend(fontsize=8)
    fig.tight_layout()
    try:
        fig.savefig(path, format="png")
    finally:
        plt.close(fig)
    return path
