"""Checking a zoo entry against its graph (`verify`): it loads, it was made for this graph, and its
schedule's simulated peak is the one recorded, with the workspace it was solved with
(`workspace_for`)."""
from __future__ import annotations

from pathlib import Path

from monet.zoo.index import (entry, path_of)
from monet.zoo.build import PROFILES, capture_config, zoo_costs


# ----------------------------------------------------------------------------------------------
# checking
# ----------------------------------------------------------------------------------------------


def workspace_for(graph, record: dict, profiles_dir: Path | str | None = None):
    """(forward, backward) workspace arrays the entry was solved with: a profile's (by node id:
    implementations keep node ids) for a 'profile ...' cost source, else zeros (analytic)."""
    import numpy as np

    if str(record.get("cost_source", "")).startswith("profile"):
        zc = zoo_costs(graph, profiles_dir=profiles_dir)
        if zc.profile is None:
            raise FileNotFoundError(f"zoo entry {record['name']} was solved with costs from a profile "
                                    f"({record['cost_source']}), but zoo/profiles has none for its graph")
        return zc.costs.fwd_workspace, zc.costs.bwd_workspace
    return np.zeros(len(graph.fwd), dtype=np.int64), np.zeros(len(graph.bwd), dtype=np.int64)


def verify(name: str, graph=None, root: Path | str | None = None) -> dict:
    """Check zoo entry ``name``: it loads (restricted unpickler), it was made for the graph of its
    zoo model at its batch and input shape (fingerprint), and the simulator's peak of its schedule is
    within its budget and equals its recorded prediction.

    Args:
        graph: the captured graph of the entry's configuration (`capture_config`); captured here
            when None (pass it to check several entries of one configuration with one capture).

    Returns:
        dict(name, peak_bytes (simulated), budget_bytes, predicted_peak_bytes, fits, matches_prediction).

    Raises:
        ZooEntryError, SolutionFileError: unknown entry, missing or unreadable file.
        SolutionMismatchError: the file was made for another graph than its zoo model's.
    """
    from monet.executor import build_modules
    from monet.impls import apply_impls
    from monet.simulate import simulate
    from monet.solution import SolutionFileError, check_compatible, load_solution

    rec = entry(name, root)
    sol = load_solution(path_of(name, root))
    m = sol.meta
    if (m.model, m.batch_size, list(m.input_shape), m.budget_bytes) != (
            rec["model"], rec["batch_size"], list(rec["input_shape"]), rec["budget_bytes"]):
        raise SolutionFileError(f"zoo entry {name}: the file {path_of(name, root)} does not match its index "
                                f"record (model, batch, input shape or budget): rebuild it")
    if graph is None:
        graph = capture_config(rec["model"], rec["batch_size"], rec["input_shape"])
    check_compatible(m, graph.fingerprint, graph.summary, model=rec["model"], batch_size=rec["batch_size"],
                     input_shape=tuple(rec["input_shape"]), dtype=rec.get("dtype", m.dtype),
                     nodes=(len(graph.fwd), len(graph.bwd)))
    g = apply_impls(graph, sol.schedule.impl)
    fw, bw = build_modules(g, sol.schedule)
    ws_f, ws_b = workspace_for(graph, rec, Path(root) / PROFILES if root is not None else None)
    peak = simulate(g, fw, bw, ws_f, ws_b).peak_bytes
    return dict(name=name, peak_bytes=peak, budget_bytes=m.budget_bytes, predicted_peak_bytes=m.predicted_peak_bytes,
                fits=peak <= m.budget_bytes, matches_prediction=peak == m.predicted_peak_bytes)


# ----------------------------------------------------------------------------------------------
# plot and markdown
# ----------------------------------------------------------------------------------------------
