"""The table of the best schedules known: ``benchmarks/best_known.csv``.

One row per zoo model, batch and budget key, for the zoo's graph and costs (`monet.zoo.build`'s
``capture_config`` and ``zoo_costs(graph, "p100")``) in the full mode (``inplace_conv_multiway_newnode``):

* ``budget`` ``"70"`` (a percent of plain PyTorch's simulated peak, ``eager_peak(graph, costs)``;
  the budget in bytes is ``parse_budget(f"{pct}%", eager)``, as ``monet solve --budget 70%``) or ``"10GB"`` (10 x 2^30 bytes): ``best`` is
  the lowest objective (predicted iteration time) any run has found there, unit ``"s"`` (seconds);
* ``budget`` ``"min"``: ``best`` is the smallest feasible budget found, unit ``"bytes"``.

Each row names the command that found it (``found_by``), the commit and the date.  The solver
benchmark (``benchmarks/bench_solver.py --record-best``) and the zoo build (``monet zoo build
--record-best``) write it; both hold their results against it.  Needs pandas, not the solver.
"""
from __future__ import annotations

import datetime as _dt
import re
import subprocess
from pathlib import Path

from monet.solver.budget import parse_budget

GiB = 2**30
BEST_KNOWN = Path(__file__).resolve().parents[1] / "benchmarks" / "best_known.csv"
BEST_COLUMNS = ["model", "batch", "budget", "best", "unit", "found_by", "commit", "date"]
_GB = re.compile(r"([0-9]*\.?[0-9]+)GB")
# Relative difference below which an objective equals the best known (the same schedule's, in other
# float rounding): such an objective neither beats it nor is "new best".
SAME = 1e-9


def load_best_known(path: Path | str = BEST_KNOWN) -> dict[tuple[str, int, str], float]:
    """``{(model, batch, budget key): best}`` from the best-known file: a percent (``"70"``) or
    ``"<n>GB"`` key with the best objective in seconds, or ``"min"`` with the smallest feasible
    budget in bytes.  An absent file is an empty table.

    Raises:
        pandas.errors.ParserError, KeyError, ValueError: a file that is not such a table.
    """
    import pandas as pd

    path = Path(path)
    if not path.exists():
        return {}
    df = pd.read_csv(path, dtype={"budget": str})
    return {(r.model, int(r.batch), r.budget): float(r.best) for r in df.itertuples()}


def key_budget_bytes(key: str, eager_bytes: int) -> int | None:
    """The budget in bytes of a best-known key: ``"70"`` -> ``parse_budget("70%", eager_bytes)``,
    ``"10GB"`` -> 10 x 2^30; None for ``"min"`` (its row is a budget, not an objective) and for a
    key of no known form."""
    if key == "min":
        return None
    m = _GB.fullmatch(key)
    if m:
        return int(float(m.group(1)) * GiB)
    try:
        pct = float(key)
    except ValueError:
        return None

    return parse_budget(f"{pct:g}%", eager_bytes)


def budget_key(label: str) -> str | None:
    """The table's key of a budget as the zoo writes it: ``"50%"`` -> ``"50"`` (the solver
    benchmark's percent keys), ``"10GB"`` -> ``"10GB"``; None for ``"min"`` and any other form
    (bytes, GiB, MiB: no row of the table is keyed so)."""
    s = str(label).strip().upper().replace(" ", "")
    try:
        if s.endswith("%"):
            return f"{float(s[:-1]):g}"
        if _GB.fullmatch(s):
            return f"{float(s[:-2]):g}GB"
    except ValueError:
        return None
    return None


def best_fitting(best: dict, model: str, batch: int, budget_bytes: int,
                 eager_bytes: int) -> tuple[float, str] | None:
    """The best objective known (seconds) for ``model`` at ``batch`` within ``budget_bytes``, with
    the key of the row it comes from; None when no row fits.

    A row fits when its own budget (`key_budget_bytes`, percents of ``eager_bytes``, plain
    PyTorch's simulated peak in bytes) is at most ``budget_bytes``: a schedule found at a smaller
    budget also meets a larger one, so it is a best known for the larger budget too.  ``"min"``
    rows (bytes, not objectives) are skipped.

    Args:
        best: `load_best_known`'s table.
    """
    fits = [(value, key) for (m, b, key), value in best.items()
            if m == model and int(b) == int(batch) and (kb := key_budget_bytes(key, eager_bytes)) is not None
            and kb <= budget_bytes]
    return min(fits, default=None)


def _budget_order(key: str) -> tuple[int, float, str]:
    """Sort key of a budget key: percents descending, then GB keys descending, then ``"min"``,
    then anything else by name."""
    m = _GB.fullmatch(key)
    if m:
        return (1, -float(m.group(1)), key)
    if key == "min":
        return (2, 0.0, key)
    try:
        return (0, -float(key), key)
    except ValueError:
        return (3, 0.0, key)


def _commit() -> str:
    try:
        return subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                              cwd=Path(__file__).parent, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "?"


def record_best_known(rows: list[dict], command: str, path: Path | str = BEST_KNOWN) -> list[dict]:
    """Write the rows that beat (or are missing from) the best-known file into it; returns the
    entries written (dicts with `BEST_COLUMNS`).

    Args:
        rows: dicts with ``model``, ``batch``, ``_key`` (the budget key: ``"70"``, ``"10GB"`` or
            ``"min"``) and ``_value`` (objective in seconds, or for ``"min"`` the smallest budget in
            bytes; None: nothing to record).  Lower is better for both.
        command: the command line that found them (the ``found_by`` column).
        path: the csv file; created when absent.

    The file keeps its models in the order they first appear (new models last), each model's rows
    with percent budgets descending, then GB budgets descending, then ``"min"``.

    Raises:
        OSError: the file cannot be written.
    """
    import pandas as pd

    path = Path(path)
    df = (pd.read_csv(path, dtype={"budget": str}) if path.exists() else pd.DataFrame(columns=BEST_COLUMNS))
    order = {m: k for k, m in enumerate(dict.fromkeys([*df["model"], *(r["model"] for r in rows)]))}
    commit = _commit()
    better = []
    for r in rows:
        value = r.get("_value")
        if value is None:
            continue
        key = (df["model"] == r["model"]) & (df["batch"].astype(int) == int(r["batch"])) & (df["budget"] == r["_key"])
        if key.any() and float(df.loc[key, "best"].iloc[0]) <= value:
            continue
        df = df[~key]
        entry = dict(model=r["model"], batch=int(r["batch"]), budget=r["_key"], best=value,
                     unit="s" if r["_key"] != "min" else "bytes", found_by=command, commit=commit,
                     date=_dt.date.today().isoformat())
        df = pd.concat([df, pd.DataFrame([entry])], ignore_index=True)
        better.append(entry)
    records = sorted(df[BEST_COLUMNS].to_dict("records"),
                     key=lambda e: (order[e["model"]], int(e["batch"]), _budget_order(str(e["budget"]))))
    pd.DataFrame(records, columns=BEST_COLUMNS).to_csv(path, index=False)
    return better


__all__ = ["BEST_KNOWN", "BEST_COLUMNS", "SAME", "load_best_known", "budget_key", "key_budget_bytes", "best_fitting",
           "record_best_known"]
