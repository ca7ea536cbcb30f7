"""Cost tables measured once and committed with the tests (tests/data/), for the tests whose
assertions depend on the measured numbers: the same inputs on every machine.

The workspace the CPU profiler measures (`monet.profiling.profiler.profile_costs`) depends on the
machine (its oneDNN kernels, its thread count), and so do a smallest budget, whether a fraction of
the plain peak is feasible, or which implementation fits: a test that asserts those on the running
machine's measurement passes on one machine and fails on another.  Such a test reads
the table recorded here instead.  A test that holds the measured peak to a prediction made with
the measured workspace (the same machine on both sides) keeps measuring.

A table is `profile_costs`'s (one cold run: its times are noise, the tests take its
``workspace_bytes``), written by `monet.profiling.profiler.save_costs` as
``tests/data/<name>-<graph fingerprint[:16]>.csv`` (``<name>-<fingerprint>-<implementations>.csv``
for a variant graph: the fingerprint is the captured graph's, `OpGraph.impls` says what was
applied).  A graph that has no table (the model, the capture or the operators changed) is an
error that says how to record it again:

    rm tests/data/<name>-*.csv
    MONET_RECORD_COSTS=1 pytest tests/<the test file>   # measures and writes the tables it reads
"""
from __future__ import annotations

import os
from pathlib import Path

import pandas as pd

from monet.profiling.costs import costs_for
from monet.profiling.profiler import load_costs, profile_costs, save_costs

DATA = Path(__file__).resolve().parent / "data"


def recorded_costs(name: str, model, example_input, graph) -> pd.DataFrame:
    """The recorded cost table of ``graph`` (`monet.profiling.costs` columns), measured on the CPU.

    Args:
        name: the table's name in tests/data (a graph may have several: a model and its variants).
        model, example_input: what ``graph`` was captured from (measured only when recording).
        graph: the `OpGraph`; its `portable_fingerprint` picks the file (the same on every admitted
            torch release).

    With the environment variable ``MONET_RECORD_COSTS`` set, measures the table on this machine
    and writes it first.

    Raises:
        FileNotFoundError: no table for this graph's fingerprint; names the tables there are and
            the command that records one.
        ValueError: the table does not describe the graph (`costs_for`).
    """
    applied = "".join(f"-{k}={v}" for k, v in sorted(graph.impls.items()))
    path = DATA / f"{name}-{graph.portable_fingerprint[:16]}{applied.replace(':', '')}.csv"
    if os.environ.get("MONET_RECORD_COSTS"):
        save_costs(profile_costs(model, example_input, graph, "cpu", repeats=1, warmup=0, progress=False), path)
    if not path.is_file():
        have = sorted(p.name for p in DATA.glob(f"{name}-*.csv"))
        raise FileNotFoundError(
            f"no recorded cost table {path.name} for {name!r} (portable graph fingerprint "
            f"{graph.portable_fingerprint[:16]}); "
            f"tests/data has {have or 'none'}: the graph changed, or the table was never recorded. Record it "
            f"with: rm -f tests/data/{name}-*.csv && MONET_RECORD_COSTS=1 pytest tests/<the test file>")
    table = load_costs(path)
    costs_for(graph, table, where=str(path))
    return table
