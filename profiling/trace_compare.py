"""A trace's measured bytes against the simulator's, row by row (`compare`, `compare_trace`), and
the report of that comparison (`format_report`)."""
from __future__ import annotations

from dataclasses import dataclass

import pandas as pd

from monet.profiling.trace import Trace, replay_trace
from monet.profiling.trace_format import PEAK_TOLERANCE


# ----------------------------------------------------------------------------------------------
# comparing
# ----------------------------------------------------------------------------------------------


@dataclass
class Comparison:
    """Measured against simulated (bytes).

    Attributes:
        measured_peak, simulated_peak: the iteration's peaks; ``peak_ratio`` = simulated / measured.
        first_parting: the first row (a dict of the node's columns plus ``quantity``, "after" or
            "peak", and ``difference`` = measured - simulated) where the two differ by more than
            ``tolerance_bytes``; None when they never do.
        unmatched: rows the simulation has no node for (NaN ``sim_*``: the traced modules differ).
        nodes: the rows with ``diff_after`` and ``diff_peak`` columns.
    """

    measured_peak: int
    simulated_peak: int
    measured_peak_at: str
    simulated_peak_at: str
    tolerance_bytes: int
    first_parting: dict | None
    unmatched: int
    nodes: pd.DataFrame

    @property
    def peak_ratio(self) -> float:
        return self.simulated_peak / self.measured_peak if self.measured_peak else float("nan")

    @property
    def within(self) -> bool:
        """The simulated peak within `PEAK_TOLERANCE` (2 %) of the measured one."""
        return abs(self.simulated_peak - self.measured_peak) <= PEAK_TOLERANCE * self.measured_peak


def compare(nodes: pd.DataFrame, measured_peak: int, simulated_peak: int, *, simulated_peak_at: str = "",
            tolerance_bytes: int | None = None, rtol: float = 0.002) -> Comparison:
    """Compare a trace's measured and simulated columns row by row.

    Args:
        nodes: a trace's nodes with ``sim_*`` columns (`replay_trace`, or as recorded).
        measured_peak, simulated_peak: the iteration's peaks (bytes).
        tolerance_bytes: how far measured and simulated may differ before they "part"; default
            ``rtol`` of the measured peak.
    """
    tol = int(rtol * measured_peak) if tolerance_bytes is None else int(tolerance_bytes)
    df = nodes.copy()
    df["diff_after"] = df["after_bytes"] - df["sim_after_bytes"]
    df["diff_peak"] = df["peak_bytes"] - df["sim_peak_bytes"]
    unmatched = int(df["sim_after_bytes"].isna().sum())
    first = None
    for _, r in df.iterrows():
        if pd.isna(r["sim_after_bytes"]):
            continue
        for quantity in ("after", "peak"):
            d = r[f"diff_{quantity}"]
            if abs(d) > tol:
                first = {**r.to_dict(), "quantity": quantity, "difference": int(d)}
                break
        if first is not None:
            break
    at = str(df.loc[int(df["peak_bytes"].idxmax()), "name"]) if len(df) else ""
    return Comparison(measured_peak=int(measured_peak), simulated_peak=int(simulated_peak), measured_peak_at=at,
                      simulated_peak_at=simulated_peak_at, tolerance_bytes=tol, first_parting=first,
                      unmatched=unmatched, nodes=df)


def compare_trace(trace: Trace, *, replay: bool = True, tolerance_bytes: int | None = None) -> Comparison:
    """`compare` a trace's measurement with its simulation: recomputed here (`replay_trace`, the
    default) or as recorded (``replay=False``).

    Raises:
        TraceMismatchError: (replay) the model rebuilt here is another graph.
    """
    if replay:
        sim, nodes = replay_trace(trace)
        peak, at = sim.peak_bytes, sim.peak_at
    else:
        nodes, peak, at = trace.nodes, trace.meta["simulated"]["peak_bytes"], trace.meta["simulated"]["peak_at"]
    return compare(nodes, trace.meta["measured"]["peak_bytes"], peak, simulated_peak_at=at,
                   tolerance_bytes=tolerance_bytes)


def _mib(b) -> str:
    return "-" if b is None or pd.isna(b) else f"{b / 2**20:,.2f}"


def format_report(c: Comparison, meta: dict | None = None, rows: int | None = None) -> str:
    """A text report: a table of every row (or of the ``rows`` either side of the first parting node,
    else of the measured peak), the first parting node and the peaks (MiB = 2^20 bytes)."""
    lines = []
    if meta:
        m, d, s = meta["model"], meta["device"], meta.get("solution", {})
        lines.append(f"trace of {m['name']} {m.get('kwargs') or ''} batch {m['batch_size']} {m['dtype']}, "
                     f"schedule {s.get('label') or '-'}, on {d['name']} (torch {d['torch']}), workspace from "
                     f"{meta['workspace']['source']}")
    df = c.nodes
    if rows is not None and len(df):
        k = int(c.first_parting["row"]) if c.first_parting is not None else int(df.loc[df["peak_bytes"].idxmax(), "row"])
        df = df[(df["row"] >= k - rows) & (df["row"] <= k + rows)]
    header = f"{'row':>5} {'pass':8} {'stage':>5} {'node':28} {'op':36} {'role':9} " \
             f"{'after MiB':>11} {'sim after':>11} {'peak MiB':>11} {'sim peak':>11}"
    lines.append(header)
    for _, r in df.iterrows():
        mark = " <" if c.first_parting is not None and int(r["row"]) == int(c.first_parting["row"]) else ""
        lines.append(f"{int(r['row']):>5} {r['pass']:8} {int(r['stage']):>5} {str(r['name'])[:28]:28} "
                     f"{str(r['op'])[:36]:36} {r['role']:9} {_mib(r['after_bytes']):>11} {_mib(r['sim_after_bytes']):>11} "
                     f"{_mib(r['peak_bytes']):>11} {_mib(r['sim_peak_bytes']):>11}{mark}")
    if c.first_parting is None:
        lines.append(f"measured and simulated agree at every node within {c.tolerance_bytes} bytes")
    else:
        f = c.first_parting
        lines.append(f"first parting node: row {int(f['row'])} {f['name']} ({f['op']}, {f['pass']} {f['role']}): "
                     f"measured {f['quantity']} - simulated = {f['difference']:+,} bytes "
                     f"(tolerance {c.tolerance_bytes:,})")
    if c.unmatched:
        lines.append(f"{c.unmatched} rows have no simulated node (the modules traced here differ from the recorded)")
    lines.append(f"peak: measured {c.measured_peak:,} bytes ({_mib(c.measured_peak)} MiB) at {c.measured_peak_at}, "
                 f"simulated {c.simulated_peak:,} bytes ({_mib(c.simulated_peak)} MiB) at {c.simulated_peak_at}; "
                 f"simulated / measured {c.peak_ratio:.4f} "
                 f"({'within' if c.within else 'NOT within'} {PEAK_TOLERANCE:.0%})")
    return "\n".join(lines)
