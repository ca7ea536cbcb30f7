"""The zoo's index: which prebuilt schedules exist, what each was made for, and where its file is.

``index.json`` (next to this file) holds one record per entry (see `FIELDS`); the solution files lie
in ``schedules/``.  Both are package data of ``monet.zoo``, found from this module's own folder, never
from the working directory.  ``monet zoo build`` (`monet.zoo.build`) writes them; everything here only
reads them, and needs neither torch nor the solver.

A reference ``"zoo:NAME"`` is accepted wherever a solution file path is (`monet.solution.load_solution`
resolves it with `resolve`), so ``MONeTWrapper(model, "zoo:resnet50-184-6GB", (3, 224, 224))`` and
``monet check zoo:vgg16-176-8GB`` work as with a file.
"""
from __future__ import annotations

import difflib
import json
from pathlib import Path

from monet.errors import SolutionFileError

ZOO_DIR = Path(__file__).resolve().parent  # the monet.zoo package folder (package data lives here)
INDEX_NAME = "index.json"
SCHEDULES = "schedules"
PREFIX = "zoo:"
INDEX_FORMAT = 1
GiB = 2**30

# The fields of an index record, in the order index.json writes them.
FIELDS = {
    "name": "entry name, e.g. resnet50-184-6GB (model-batch-budget)",
    "model": "zoo model name (monet.zoo.models.MODELS)",
    "batch_size": "batch size",
    "input_shape": "one sample's shape, without the batch dimension",
    "dtype": "parameter and activation dtype",
    "budget": "the budget as asked: '6GB' (6 x 2^30 bytes), '50%' of the plain peak, or 'min'",
    "budget_bytes": "the budget the schedule was solved for, in bytes",
    "substitute_for": "for a 'min' entry: the asked budgets that were infeasible",
    "mode": "the ILP mode (what the solver could choose)",
    "device": "device type the schedule is for",
    "cost_source": "'analytic <preset>' (roofline model) or 'profile <device name>'",
    "predicted_peak_bytes": "the simulator's peak of the schedule, in bytes",
    "eager_peak_bytes": "the simulator's peak of plain PyTorch, in bytes",
    "predicted_overhead": "predicted iteration time over plain PyTorch's, minus 1",
    "objective_s": "predicted iteration time, seconds",
    "eager_time_s": "predicted plain PyTorch iteration time, seconds",
    "bound_s": "the solver's lower bound on objective_s (null if none)",
    "gap": "(objective - bound) / objective (null if unknown)",
    "status": "optimal, gap, time_limit or heuristic (monet.solution.STATUSES)",
    "solver": "solver that produced the schedule",
    "solve_time_s": "wall time of the solve, seconds",
    "time_limit_s": "the solve's time limit, seconds",
    "recomputations": "forward-node recomputations over all backward stages",
    "file": "solution file under schedules/",
    "file_bytes": "size of that file",
    "fingerprint": "fingerprint of the captured graph (OpGraph.fingerprint)",
    "monet_version": "monet version that made the entry",
    "torch_version": "torch version that made the entry",
    "created": "when the entry was made (ISO 8601, UTC)",
    "wall_s": "wall time of the entry's solve in the build that made it, seconds (0: an earlier schedule reused)",
    "best_known_s": "the best objective known for this model and batch within budget_bytes, seconds: the lowest of "
                    "benchmarks/best_known.csv's rows whose budget fits (monet.solver.best_known.best_fitting), as "
                    "the build read it; null if none fits or the table is not for this entry's input shape, mode, "
                    "device or costs",
    "best_known_budget": "the budget key of that row: '70' (percent of the plain peak) or '10GB'; null if none",
    "vs_best": "objective_s / best_known_s - 1, the gap to the best schedule known (negative: this entry beats it, "
               "a new best); null if none",
}
# Fields an index written by an older monet lacks (read as null: "-" in the tables).
LATER_FIELDS = ("best_known_s", "best_known_budget", "vs_best")

# Columns of `list_entries` for `monet zoo list`: (index field, column title).
TABLE = (("name", "name"), ("model", "model"), ("batch_size", "batch"), ("budget", "budget"),
         ("predicted_peak_bytes", "predicted peak"), ("predicted_overhead", "predicted overhead"),
         ("status", "status"), ("gap", "gap"), ("vs_best", "vs best known"), ("cost_source", "source"))


class ZooEntryError(SolutionFileError, KeyError):
    """No zoo entry of that name; the message names the available entries.

    Both a `SolutionFileError` (what a bad solution path raises, so ``monet check zoo:x`` and
    ``MONeTWrapper`` report it like a missing file) and a `KeyError`.
    """

    __str__ = Exception.__str__  # KeyError would quote the message


def index_path(root: Path | str | None = None) -> Path:
    """``<root>/index.json``; ``root`` defaults to the installed zoo (`ZOO_DIR`)."""
    return Path(root if root is not None else ZOO_DIR) / INDEX_NAME


def load_index(root: Path | str | None = None) -> list[dict]:
    """The index's records (an empty list when there is no index yet).

    Raises:
        SolutionFileError: index.json exists but is not a zoo index of a format this monet reads.
    """
    path = index_path(root)
    if not path.exists():
        return []
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError) as e:
        raise SolutionFileError(f"{path}: cannot read the zoo index ({e}): rebuild it with `monet zoo build`") from None
    if not isinstance(data, dict) or not isinstance(data.get("entries"), list):
        raise SolutionFileError(f"{path}: not a monet zoo index (no 'entries' list)")
    if data.get("format") != INDEX_FORMAT:
        raise SolutionFileError(f"{path}: zoo index format {data.get('format')!r}, this monet reads "
                                f"{INDEX_FORMAT}: rebuild it with `monet zoo build` or upgrade monet")
    return [dict(r) for r in data["entries"]]


def save_index(records: list[dict], root: Path | str | None = None) -> Path:
    """Write ``records`` as the index (sorted by `sort_key`), atomically; returns the path."""
    path = index_path(root)
    path.parent.mkdir(parents=True, exist_ok=True)
    rows = sorted(records, key=sort_key)
    rows = [{k: r.get(k) for k in FIELDS} | {k: v for k, v in r.items() if k not in FIELDS} for r in rows]
    text = json.dumps({"format": INDEX_FORMAT, "generated_by": "monet zoo build", "entries": rows}, indent=1)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text + "\n")
    tmp.replace(path)
    return path


def sort_key(record: dict):
    """Entries of a model together (zoo model order), larger budgets first."""
    try:
        from monet.zoo.models.registry import MODELS  # imports torch: only the order is needed
        order = list(MODELS)
    except Exception:  # pragma: no cover - a broken torch must not stop the listing
        order = []
    model = record.get("model", "")
    return (order.index(model) if model in order else len(order), model, record.get("batch_size", 0),
            -int(record.get("budget_bytes") or 0), record.get("name", ""))


def entry(name: str, root: Path | str | None = None) -> dict:
    """The index record of entry ``name``.

    Raises:
        ZooEntryError: no such entry; the message lists the available ones.
    """
    records = load_index(root)
    for r in records:
        if r.get("name") == name:
            return r
    names = [r["name"] for r in records]
    if not names:
        raise ZooEntryError(f"no zoo entry named {name!r}: the zoo is empty (build it with `monet zoo build`)")
    close = difflib.get_close_matches(name, names, n=3)
    hint = f"; did you mean {', '.join(close)}?" if close else ""
    raise ZooEntryError(f"no zoo entry named {name!r}{hint} available: {', '.join(names)} "
                        "(`monet zoo list` shows them)")


def path_of(name: str, root: Path | str | None = None) -> Path:
    """The solution file of entry ``name`` (ZooEntryError if unknown, SolutionFileError if missing)."""
    rec = entry(name, root)
    path = Path(root if root is not None else ZOO_DIR) / SCHEDULES / rec["file"]
    if not path.is_file():
        raise SolutionFileError(f"zoo entry {name!r} is in the index but its file {path} is missing: "
                                "rebuild it with `monet zoo build`")
    return path


def is_reference(ref) -> bool:
    """Whether ``ref`` is a ``"zoo:NAME"`` reference (a str, not a Path)."""
    return isinstance(ref, str) and ref.startswith(PREFIX)


def resolve(ref: str, root: Path | str | None = None) -> Path:
    """``"zoo:NAME"`` -> the path of its solution file."""
    if not is_reference(ref):
        raise ValueError(f"{ref!r} is not a zoo reference ('zoo:NAME')")
    return path_of(ref[len(PREFIX):].strip(), root)


def pct(f, signed: bool = True) -> str:
    """A fraction as a percentage with two decimals, signed ("+1.25 %") or not ("1.25 %"); "-" for
    None or NaN."""
    if f is None or f != f:
        return "-"
    return (f"{100 * f + 0.0:+.2f} %" if signed else f"{100 * f + 0.0:.2f} %").replace("-0.00", "+0.00" if signed else "0.00")


def vs_best_text(record: dict) -> str:
    """A record's gap to the best schedule known, for reading: ``"+0.42 %"``; ``"new best"`` when
    its objective beats every fitting best known (``vs_best`` < 0, beyond float noise:
    `monet.solver.best_known.SAME`), or equals the table's row at its own budget (the row recorded
    from it); ``"-"`` when none is known (or the record predates the field)."""
    from monet.solver.best_known import SAME, budget_key

    v = record.get("vs_best")
    if v is None or v != v:  # None or NaN
        return "-"
    if v < -SAME:
        return "new best"
    own = record.get("best_known_budget")
    if abs(v) <= SAME:
        if own is not None and own == budget_key(record.get("budget", "")):
            return "new best"
        v = 0.0
    return f"{100 * v:+.2f} %"


def list_entries(root: Path | str | None = None, raw: bool = False):
    """The zoo as a pandas DataFrame, one row per entry.

    ``raw=False``: the `TABLE` columns, formatted for reading (peaks in GiB, overhead, gap and the
    gap to the best schedule known in %, `vs_best_text`);
    ``raw=True``: every index field, unformatted.
    """
    import pandas as pd

    records = load_index(root)
    frame = pd.DataFrame(records, columns=list(FIELDS) if not records else None)
    if raw:
        return frame
    if frame.empty:
        return pd.DataFrame(columns=[title for _, title in TABLE])

    out = pd.DataFrame({
        "name": frame["name"], "model": frame["model"], "batch": frame["batch_size"],
        "budget": [b if b != "min" else f"min ({bb / GiB:.2f} GiB)" for b, bb in zip(frame["budget"], frame["budget_bytes"])],
        "predicted peak": [f"{v / GiB:.2f} GiB" for v in frame["predicted_peak_bytes"]],
        "predicted overhead": [pct(v) for v in frame["predicted_overhead"]],
        "status": frame["status"],
        "gap": [pct(v, signed=False) for v in frame["gap"]],
        "vs best known": [vs_best_text(r) for r in records],
        "source": frame["cost_source"],
    })
    return out.reset_index(drop=True)


__all__ = ["ZOO_DIR", "PREFIX", "FIELDS", "LATER_FIELDS", "TABLE", "ZooEntryError", "index_path", "load_index",
           "save_index", "entry", "path_of", "is_reference", "resolve", "list_entries", "pct", "vs_best_text"]
