"""The zoo's frontier plot (`plot_frontier`), its table (`table_rows`, `markdown_table`) and its raw
results file (`write_csv`)."""
from __future__ import annotations

from pathlib import Path

from monet.zoo.index import GiB, pct, vs_best_text


def _model_label(r: dict) -> str:
    return f"{r['model']} ({r['batch_size']})"


def plot_frontier(records: list[dict], out: Path | str) -> Path:
    """PNG: predicted peak (GiB) against predicted overhead (%), one line per model and batch,
    ending at plain PyTorch's simulated peak (overhead 0).  matplotlib with the Agg backend."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out = Path(out)
    groups: dict[str, list[dict]] = {}
    for r in records:
        groups.setdefault(_model_label(r), []).append(r)
    fig, ax = plt.subplots(figsize=(8, 5.5), dpi=120)
    for label, rows in groups.items():
        rows = sorted(rows, key=lambda r: r["predicted_peak_bytes"])
        xs = [r["predicted_peak_bytes"] / GiB for r in rows] + [rows[0]["eager_peak_bytes"] / GiB]
        ys = [round(100 * (r["predicted_overhead"] or 0.0), 4) for r in rows] + [0.0]
        line, = ax.plot(xs[:-1], ys[:-1], marker="o", label=label)
        ax.plot(xs[-2:], ys[-2:], linestyle=":", color=line.get_color())
        ax.plot(xs[-1:], ys[-1:], marker="x", color=line.get_color(), linestyle="none")
    sources = sorted({r["cost_source"] for r in records})
    ax.set_xlabel("predicted peak memory (GiB, 1 GiB = 2^30 bytes)")
    ax.set_ylabel("predicted overhead over plain PyTorch (%)")
    ax.set_title(f"monet zoo: predicted frontier ({', '.join(sources) or 'no entries'}); x = plain PyTorch",
                 fontsize=10)
    lo, hi = ax.get_ylim()
    if hi - lo < 2.0:  # overheads all about 0: show a readable range, not float noise
        mid = (hi + lo) / 2
        ax.set_ylim(mid - 1.0, mid + 1.0)
    ax.ticklabel_format(axis="y", useOffset=False, style="plain")
    ax.grid(True, alpha=0.3)
    if groups:
        ax.legend(fontsize=8)
    fig.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out)
    plt.close(fig)
    return out


HEADER = ["entry", "model (batch)", "budget", "predicted peak GiB", "plain peak GiB", "predicted overhead", "status",
          "gap", "vs best known", "solve s", "costs"]


def table_rows(records: list[dict]) -> list[dict]:
    """One row of string cells (`HEADER`) per zoo entry: its budget, predicted and plain peaks (GiB),
    predicted overhead, status, the solver's gap to its own bound, the gap to the best schedule known
    (`monet.zoo.index.vs_best_text`: "-" for records without one), solve time (s) and costs."""
    rows = []
    for r in records:
        budget = r["budget"] if r["budget"] != "min" else (
            f"min {r['budget_bytes'] / GiB:.2f} GiB (for {', '.join(r.get('substitute_for') or [])})")
        rows.append(dict(zip(HEADER, [
            r["name"], _model_label(r), budget, f"{r['predicted_peak_bytes'] / GiB:.2f}",
            f"{r['eager_peak_bytes'] / GiB:.2f}", pct(r.get("predicted_overhead")), r["status"],
            "-" if r.get("gap") is None else f"{100 * r['gap']:.2f} %", vs_best_text(r),
            f"{r.get('solve_time_s', 0):.0f}", r["cost_source"]])))
    return rows


def markdown_table(records: list[dict]) -> str:
    """The zoo as a GitHub markdown table of `table_rows`."""
    from monet.profiling.markdown import md_table

    return md_table(HEADER, [list(r.values()) for r in table_rows(records)], "lllrrrlllrl")


def write_csv(records: list[dict], path: Path | str, command: str) -> Path:
    """(Re)write the raw results file ``path`` (benchmarks/results/zoo.csv) with `table_rows` and the
    provenance of ``command``: the zoo is rebuilt whole, so its earlier rows are all replaced."""
    from monet.profiling.raw_results import append_rows, provenance

    append_rows(Path(path), table_rows(records), provenance(command), replaces=lambda old: True)
    return Path(path)
