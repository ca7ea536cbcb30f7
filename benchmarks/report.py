"""BENCHMARKS.md, generated from the raw results in benchmarks/results/.

    python benchmarks/report.py            # (re)writes BENCHMARKS.md
    python benchmarks/report.py --check    # exit status 1 when BENCHMARKS.md is not what the results give

The benchmarks write raw results only: one CSV row per measured method (or, for the GPU, one JSON
object per model), each row with the columns `PROVENANCE` (date in UTC, machine, torch release and
the command that measured it).  This script is the only writer of BENCHMARKS.md: one section per
claim, each table captioned with the provenance of its rows.  Every results file must be read by
a section (`SECTIONS`), so a result nobody renders is refused rather than silently left out.
"""
from __future__ import annotations

import argparse
import difflib
import json
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import pandas as pd

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results"
OUT = ROOT / "BENCHMARKS.md"
COMMAND = "python benchmarks/report.py"
PROVENANCE = ("date", "machine", "torch", "command")
MiB = 2 ** 20


# --- reading ----------------------------------------------------------------------------------------

def read(name: str) -> pd.DataFrame:
    """The rows of ``benchmarks/results/<name>`` as strings (empty cells as ``""``), in file order.

    Raises:
        FileNotFoundError: no such results file.
        ValueError: the file lacks one of the `PROVENANCE` columns."""
    frame = pd.read_csv(RESULTS / name, dtype=str, keep_default_na=False)
    missing = [c for c in PROVENANCE if c not in frame.columns]
    if missing:
        raise ValueError(f"benchmarks/results/{name} has no {', '.join(missing)} column: every raw row "
                         f"carries its provenance {PROVENANCE}")
    return frame


def caption(frame: pd.DataFrame) -> str:
    """One italic line per distinct (machine, torch, command) of ``frame``'s rows, with the dates
    of its runs in order: date(s), machine, torch, command."""
    runs: dict[tuple, list[str]] = {}
    seen = dict.fromkeys(tuple(r) for r in frame[list(PROVENANCE)].itertuples(index=False))
    for date, machine, torch, command in seen:
        runs.setdefault((machine, torch, command), []).append(date)
    return "\n".join(f"*{_dates(dates)} UTC; {machine}; torch {torch}; `{command}`*"
                     for (machine, torch, command), dates in runs.items())


def _dates(dates: list[str]) -> str:
    """The run dates, each after the first without the day it shares with the one before
    (``"D 07:33"``, ``"D 13:49"`` -> ``"D 07:33, 13:49"``)."""
    out = dates[:1]
    for before, date in zip(dates, dates[1:]):
        day, _, clock = date.partition(" ")
        out.append(clock if clock and before.startswith(day + " ") else date)
    return ", ".join(out)


def cells(frame: pd.DataFrame) -> pd.DataFrame:
    """``frame`` without its provenance columns."""
    return frame.drop(columns=list(PROVENANCE))


# --- formatting -------------------------------------------------------------------------------------

def mib(value: str) -> str:
    """Bytes as MiB with one decimal; ``-`` for an empty cell."""
    return "-" if value in ("", None) else f"{float(value) / MiB:.1f}"


def pct(value: str) -> str:
    """A fraction as a signed percentage with one decimal; ``-`` for an empty cell."""
    return "-" if value in ("", None) else f"{100 * float(value):+.1f} %"


def markdown(frame: pd.DataFrame, right: tuple[str, ...] = ()) -> str:
    """``frame`` (string cells) as a GitHub table, the columns named in ``right`` right-aligned."""
    from monet.profiling.markdown import md_table

    align = "".join("r" if c in right else "l" for c in frame.columns)
    return md_table([str(c) for c in frame.columns], frame.astype(str).values.tolist(), align)


def folded(frame: pd.DataFrame, columns: tuple[str, ...], min_rows: int = 4) -> tuple[pd.DataFrame, str]:
    """``frame`` without those of ``columns`` whose cell is the same in every row (of at least
    ``min_rows`` rows), and the line that says them: ``"Gradients: bitwise in every row."``
    (empty when none is folded; a column empty or "-" throughout is dropped unsaid)."""
    same = [c for c in columns if c in frame.columns and len(frame) >= min_rows and frame[c].nunique() == 1]
    note = "; ".join(f"{c}: {frame[c].iloc[0]}" for c in same if str(frame[c].iloc[0]) not in ("", "-"))
    return frame.drop(columns=same), (f"{note[0].upper()}{note[1:]} in every row." if note else "")


def block(frame: pd.DataFrame, shown: pd.DataFrame | None = None, right: tuple[str, ...] = (),
          title: str = "") -> list[str]:
    """A table of ``shown`` (default: ``frame``'s cells) with ``frame``'s caption under it."""
    shown = cells(frame) if shown is None else shown
    head = [f"**{title}**", ""] if title else []
    return head + [markdown(shown, right), "", caption(frame), ""]


# --- the sections' tables ---------------------------------------------------------------------------

def as_is(*names: str, right: tuple[str, ...] = (), drop: tuple[str, ...] = ()) -> Callable[[], list[str]]:
    """Each file's rows as they are (less the columns ``drop``), one table per run (provenance)."""
    def tables() -> list[str]:
        out = []
        for name in names:
            for _, run in read(name).groupby(list(PROVENANCE), sort=False):
                shown = cells(run).drop(columns=list(drop))
                shown, note = folded(shown, tuple(shown.columns[1:]))
                out += block(run, shown, right=right)
                if note:
                    out[-2:-2] = [note, ""]
        return out
    return tables


DEPTH_FILES = tuple(f"depth-{layers}{dtype}.csv" for dtype in ("", "-bf16") for layers in (12, 24, 48, 96))


def _depth_frames(names=DEPTH_FILES) -> pd.DataFrame:
    return pd.concat([read(n) for n in names], ignore_index=True).fillna("")


def _plain_peaks(frame: pd.DataFrame) -> dict[tuple, float]:
    plain = frame[frame.method == "plain PyTorch"]
    return {(r.model, r.layers, r.dtype): float(r.peak) for r in plain.itertuples() if r.peak}


def _config(r) -> tuple:
    return r.model, r.layers, r.dtype


def depth_at_peers() -> list[str]:
    """Per configuration and peer: the peer's measured peak and overhead, and monet's at that peak."""
    frame = _depth_frames()
    plain = _plain_peaks(frame)
    by_method = {(_config(r), r.method): r for r in frame.itertuples()}
    rows = []
    for r in frame.itertuples():
        if r.method in ("plain PyTorch",) or r.method.startswith("monet") or r.error:
            continue
        ours = by_method.get((_config(r), f"monet at {r.method}"))
        base = plain.get(_config(r))
        won = "-" if ours is None or ours.error or not ours.overhead else (
            "yes" if float(ours.overhead) <= float(r.overhead) else "**no**")
        rows.append({"model": r.model, "layers": r.layers, "dtype": r.dtype, "method": r.method,
                     "peak MiB": mib(r.peak), "of plain": f"{float(r.peak) / base:.2f}x" if base else "-",
                     "its overhead": pct(r.overhead), "monet's": "-" if ours is None else pct(ours.overhead),
                     "faster": won, "gradients": "-" if ours is None else ours.grads})
    shown, note = folded(pd.DataFrame(rows), ("faster", "gradients"))
    return [markdown(shown, ("layers", "peak MiB", "of plain", "its overhead", "monet's")), ""] + (
        [note, ""] if note else [])


def _monet_rows(frame: pd.DataFrame, keep: Callable[[str], bool]) -> pd.DataFrame:
    plain = _plain_peaks(frame)
    rows = []
    for r in frame.itertuples():
        if not keep(r.method):
            continue
        base = plain.get(_config(r))
        if r.error:
            rows.append({"model": r.model, "layers": r.layers, "dtype": r.dtype, "method": r.method,
                         "budget MiB": mib(r.budget), "peak MiB": "-", "of plain": "-", "overhead": "-",
                         "predicted": "-", "gradients": r.error[:80]})
            continue
        rows.append({"model": r.model, "layers": r.layers, "dtype": r.dtype, "method": r.method,
                     "budget MiB": mib(r.budget), "peak MiB": mib(r.peak),
                     "of plain": f"{float(r.peak) / base:.2f}x" if base and r.peak else "-",
                     "overhead": "-" if r.method == "plain PyTorch" else pct(r.overhead),
                     "predicted": pct(r.predicted_overhead), "gradients": r.grads})
    return pd.DataFrame(rows)


_RIGHT = ("layers", "budget MiB", "peak MiB", "of plain", "overhead", "predicted")


def depth() -> list[str]:
    """At each peer's peak (`depth_at_peers`), then monet at its own budgets (50 % of plain PyTorch's
    simulated peak, ``min``), predicted and measured; one caption for both."""
    frame = _depth_frames()
    own, note = folded(_monet_rows(frame, lambda m: m in ("monet 50%", "monet min")), ("gradients",))
    return (depth_at_peers() + ["monet at its own budgets:", "", markdown(own, _RIGHT), ""]
            + ([note, ""] if note else []) + [caption(frame), ""])


def gpt2_small() -> list[str]:
    frame = read("gpt2-small-cpu.csv")
    return [markdown(_monet_rows(frame, lambda m: True), _RIGHT), "", caption(frame), ""]


def _failed(error: str) -> str:
    """A row's error, short: an infeasible budget as the smallest budget it names."""
    import re

    found = re.search(r"smallest (?:feasible budget|budget found feasible) is (\d+) bytes", error)
    return f"infeasible: smallest {mib(found.group(1))} MiB" if found else error.splitlines()[0][:60]


def _compiled_config(r) -> tuple:
    return r.model, r.layers, r.dtype


def compiled_at_peers(frame: pd.DataFrame) -> list[str]:
    """Per configuration and compiled peer: the peer's measured peak and overhead against plain
    ``torch.compile``, and monet compiled's at that peak."""
    plain = {_compiled_config(r): float(r.peak) for r in frame.itertuples() if r.method == "torch.compile" and r.peak}
    by_method = {(_compiled_config(r), r.method): r for r in frame.itertuples()}
    rows = []
    for r in frame.itertuples():
        if r.method == "torch.compile" or r.method.startswith("monet") or r.error:
            continue
        ours = by_method.get((_compiled_config(r), f"monet compiled at {r.method}"))
        base = plain.get(_compiled_config(r))
        won = "-" if ours is None or ours.error or not ours.overhead else (
            "yes" if float(ours.overhead) <= float(r.overhead) else "**no**")
        rows.append({"model": r.model, "layers": r.layers if r.layers != "0" else "-", "dtype": r.dtype,
                     "peer": r.method, "peak MiB": mib(r.peak),
                     "of torch.compile": f"{float(r.peak) / base:.2f}x" if base else "-",
                     "its overhead": pct(r.overhead),
                     "monet's peak MiB": "-" if ours is None or ours.error else mib(ours.peak),
                     "monet's": "-" if ours is None else _failed(ours.error) if ours.error else pct(ours.overhead),
                     "faster": won, "gradients": "-" if ours is None or ours.error else ours.grads})
    return [markdown(pd.DataFrame(rows), ("layers", "peak MiB", "of torch.compile", "its overhead",
                                          "monet's peak MiB", "monet's")), ""]


def compiled_own(frame: pd.DataFrame) -> list[str]:
    """monet compiled at its own budgets (50 %, 30 % and 100 % of plain PyTorch's simulated peak),
    predicted beside measured, with the start-up and, in bf16, the loss drift; the infeasible
    budgets in one line under the table, each with the smallest budget it names."""
    plain = {_compiled_config(r): float(r.peak) for r in frame.itertuples() if r.method == "torch.compile" and r.peak}
    drift = {(_compiled_config(r), r.method[:-len(" (losses)")]): r.loss_drift for r in frame.itertuples()
             if r.method.endswith(" (losses)")}
    rows, infeasible = [], []
    for r in frame.itertuples():
        if r.method not in ("monet compiled 50%", "monet compiled 30%", "monet compiled 100%"):
            continue
        if r.error and _failed(r.error).startswith("infeasible: smallest "):
            layers = f" {r.layers}" if r.layers != "0" else ""
            infeasible.append(f"{r.model}{layers} {r.dtype} {r.method.rsplit(' ', 1)[1]}: "
                              + _failed(r.error).rsplit(" ", 2)[1])
            continue
        base = plain.get(_compiled_config(r))
        d = drift.get((_compiled_config(r), r.method))
        rows.append({"model": r.model, "layers": r.layers if r.layers != "0" else "-", "dtype": r.dtype,
                     "method": r.method, "budget MiB": mib(r.budget), "peak MiB": mib(r.peak),
                     "of torch.compile": f"{float(r.peak) / base:.2f}x" if base and r.peak else "-",
                     "overhead": pct(r.overhead), "predicted": pct(r.predicted_overhead),
                     "start-up s": f"{float(r.startup_s):.0f}" if r.startup_s else "-",
                     "gradients": _failed(r.error) if r.error else r.grads or "-",
                     "loss drift": f"{float(d):.1e}" if d else "-"})
    table = [markdown(pd.DataFrame(rows), ("layers", "budget MiB", "peak MiB", "of torch.compile", "overhead",
                                           "predicted", "start-up s")), ""]
    return table + ([f"Infeasible, with the smallest budget each names (MiB): {'; '.join(infeasible)}.", ""]
                    if infeasible else [])


def compiled() -> list[str]:
    """At each compiled peer's peak (`compiled_at_peers`), then monet compiled at its own budgets
    (`compiled_own`); one caption for both."""
    frame = read("compiled.csv")
    return (compiled_at_peers(frame) + ["monet compiled at its own budgets:", ""] + compiled_own(frame)
            + [caption(frame), ""])


def runs_merged(name: str, right: tuple[str, ...] = ()) -> Callable[[], list[str]]:
    """The runs of one command (same machine and torch) in one table: one row per ``method``, a
    cell the runs' values in the caption's order ("a / b / c"), or the one value they share."""
    def tables() -> list[str]:
        out = []
        for _, same in read(name).groupby(["command", "machine", "torch"], sort=False):
            runs = [cells(r).set_index("method") for _, r in same.groupby(list(PROVENANCE), sort=False)]
            rows = []
            for method in dict.fromkeys(m for r in runs for m in r.index):
                row = {"method": method}
                for col in runs[0].columns:
                    values = [r.at[method, col] if method in r.index else "-" for r in runs]
                    row[col] = values[0] if len(set(values)) == 1 else " / ".join(values)
                rows.append(row)
            out += block(same, pd.DataFrame(rows), right=right)
        return out
    return tables


def solver_time_limits() -> list[str]:
    """Per run (provenance), one row per model and budget: the lowest predicted overhead of the
    run, and within each time limit the objective against that lowest in each order of the solves
    (descending / ascending budgets; one figure where they agree) with the longer solve's wall
    time (`benchmarks/solver_time_limits.py`)."""
    out = []
    for _, run in read("solver-time-limits.csv").groupby(list(PROVENANCE), sort=False):
        limits = list(dict.fromkeys(run["time limit s"]))
        orders = list(dict.fromkeys(run["order"]))
        rows = []
        for (_, budget), r in run.groupby(["model", "budget"], sort=False):
            best = min(r["predicted overhead"], key=lambda o: float(o.split()[0]))
            by_limit = {}
            for t, at in r.groupby("time limit s", sort=False):
                gaps = [dict(zip(at["order"], at["vs best"].str.replace(" %", ""))).get(o, "-") for o in orders]
                shown = gaps[0] if len(set(gaps)) == 1 else " / ".join(gaps)  # one figure where the orders agree
                by_limit[t] = f"{shown} % ({max(float(w) for w in at['wall s']):.0f} s)"
            nbytes = r["budget bytes"].iloc[0] if "budget bytes" in r else ""
            shown = f"{budget} ({mib(nbytes)} MiB)" if budget == "per-block" and nbytes else budget
            rows.append({"model": r["model"].iloc[0], "budget": shown,
                         "best": best, **{f"{float(t):g} s": by_limit.get(t, "-") for t in limits}})
        out += block(run, pd.DataFrame(rows), right=("best",) + tuple(f"{float(t):g} s" for t in limits))
        if orders != ["descending", "ascending"]:
            out[-2:-2] = [f"Orders: {' / '.join(orders)}.", ""]
    return out


def gpu() -> list[str]:
    """Each model measured on a GPU (benchmarks/results/gpu/*.json, written by gpu_table.py)."""
    sys.path.insert(0, str(ROOT / "benchmarks"))
    from gpu_table import model_frame

    out = []
    for path in sorted((RESULTS / "gpu").glob("*.json")):
        res = json.loads(path.read_text())
        c = res["config"]
        amp = f"{c['autocast']} autocast" if c["autocast"] else "fp32"
        out += [f"**{c['model']}, batch {c['batch_size']}, input {'x'.join(map(str, c['input_shape']))}, {amp}**", "",
                markdown(model_frame(res), ("budget GiB", "predicted GiB", "allocated GiB", "reserved GiB",
                                            "reserved / allocated", "overhead", "grad. error")), "",
                f"*{res['date']} UTC; {res['device_name']}; torch {res['torch']}; `{res['command']}`; "
                f"PYTORCH_CUDA_ALLOC_CONF {res['alloc_conf']}*", ""]
    return out


# --- the document -----------------------------------------------------------------------------------

@dataclass(frozen=True)
class Section:
    """One claim: a heading, what its tables measure (reference text, no figures), its tables and
    the results files they read (relative to benchmarks/results)."""
    title: str
    text: str
    tables: Callable[[], list[str]]
    files: tuple[str, ...]


MEASURED = ("Peak: one training iteration at the allocator, parameters and gradients included "
            "(`monet.profiling.measure.step_peak`). Overhead: the median of paired, interleaved iterations "
            "against the reference in one process, minus 1 (`monet.profiling.measure.step_overhead`). "
            "Predicted: the solver's iteration time over the reference's. Gradients: the largest relative "
            "difference from the reference's after one step, `bitwise` where equal.")

SECTIONS = (
    Section("GPU", "ResNet-50 at MONeT's batch 184 on a GPU, every schedule against plain PyTorch. Allocated: "
            "peak `max_memory_allocated` of one iteration after warm-up; reserved: peak `max_memory_reserved`; "
            "fits: allocated at or under the budget; grad. error: relative L2 error of all gradients; MONeT "
            "(P100): the published figure (16 GB P100, fp32, PyTorch 1.5.1) at the same budget.",
            gpu, ("gpu/resnet50.json",)),
    Section("The demo (CPU)", "`monet demo`: the quarter-width ResNet-50 (batch 64, 3x64x64) trained by each "
            "method from the same weights; budgets are fractions of plain PyTorch's simulated peak. The runs of "
            "one command share a table: a cell holds each run's value in the caption's order, or the one they share.",
            runs_merged("demo.csv", right=("budget MiB", "predicted MiB", "peak MiB", "% of plain",
                                           "predicted overhead", "overhead")), ("demo.csv",)),
    Section("Deep networks", "transformers' GPT-2, Llama and BERT from a config (hidden 256, 2 x 256 tokens, "
            "vocabulary 1024), 12 to 96 layers, fp32 and bf16 autocast, one process per configuration "
            "(`benchmarks/depth.py`). Peers: transformers' checkpointing every 1, 2 or 4 layers and with offload, "
            "torch's selective checkpointing (torchtitan's policy), `torch.compile`'s activation memory budget "
            "0.5; monet is solved at each peer's measured peak. Reference: plain PyTorch. First table: overheads "
            "at each peer's peak; second: monet at 50 % of plain PyTorch's simulated peak and at "
            "`budget=\"min\"`, predicted beside measured.\n\n![overhead against measured peak](docs/depth.png)", depth, DEPTH_FILES),
    Section("GPT-2 small on the CPU", "transformers' GPT-2 small (12 x 768, vocabulary 50,257, 2 x 512 tokens), "
            "with and without the chunked language-model loss (`lm_loss=\"chunked\"`), against per-block "
            "checkpointing. Reference: plain PyTorch.", gpt2_small, ("gpt2-small-cpu.csv",)),
    Section("Compiled: monet against torch.compile (CPU)", "`monet.optimize(..., compile=True)` against what a "
            "`torch.compile` user has (`benchmarks/compiled.py`): `activation_memory_budget` 0.5, 0.3 and 0.1, "
            "and transformers' per-block checkpointing under `torch.compile`, on the depth benchmark's GPT-2, "
            "Llama and BERT and the demo's ResNet-50 (layers -). Reference: plain `torch.compile` (Inductor, no "
            "budget). First table: overheads at each peer's peak; second: monet compiled at its own budgets. "
            "Start-up: `monet.optimize` plus the first step; loss drift (bf16): the largest relative difference "
            "of the loss from the reference's over 20 SGD steps.",
            compiled, ("compiled.csv",)),
    Section("Gradient precision", "The largest relative gradient difference after one step on the demo's "
            "ResNet-50, against eager PyTorch and against `torch.compile`, in float32 and float64: a gap that "
            "shrinks with the precision is rounding, not a different computation.",
            as_is("gradient_precision.csv"), ("gradient_precision.csv",)),
    Section("Real models (torchvision, timm, transformers)", "The tiny models of `tests/reach_models.py` and the "
            "zoo's models at their CPU configuration (`benchmarks/reach_table.py`): the smallest budgets in "
            "normal and full mode, and monet's overhead beside Chen's and `torch.compile`'s. Reference: plain "
            "PyTorch.", as_is("reach.csv", "zoo-models.csv", drop=("notes",)), ("reach.csv", "zoo-models.csv")),
    Section("Predicted against measured overhead", "The same schedules: the cost model's prediction, the "
            "calibrated one and two measurements (*points*: |predicted - measured| in percentage points).",
            as_is("reach-prediction.csv", "zoo-models-prediction.csv"),
            ("reach-prediction.csv", "zoo-models-prediction.csv")),
    Section("Solver at full scale", "MONeT's five CNNs at their batch sizes and GPT-2 small at 8 x 1024, at 70 "
            "to 33 % of the simulated plain peak and at the smallest budget, full mode, analytic P100 costs "
            "(`benchmarks/bench_solver.py`; MONeT's fast formulation, CBC): the objective against the LP bound and "
            "against the best schedule known (`benchmarks/best_known.csv`).", as_is("solver.csv", drop=("formulation", "solver")), ("solver.csv",)),
    Section("Solver: the schedule a time limit buys", "Each model solved at each budget within each "
            "time limit, one budget after another on one plan, in both orders (`Plan.solve(..., calibrate=False)`, "
            "`benchmarks/solver_time_limits.py`; `--busy`: beside one busy process). *best*: the run's lowest "
            "predicted overhead at that budget; per limit: the objective against it, descending / ascending "
            "(one figure where they agree), and the longer wall time. *per-block*: per-block checkpointing's "
            "simulated peak.", solver_time_limits,
            ("solver-time-limits.csv",)),
    Section("Schedule zoo", "The prebuilt schedules (`monet zoo list`), predicted by the simulator with the "
            "costs each entry names, not measured.\n\n![predicted peak against overhead](docs/zoo_frontier.png)",
            as_is("zoo.csv"), ("zoo.csv",)),
    Section("monet.optimize: wall time", "`monet.optimize(model, inputs, budget, time_limit=T)` from the call to "
            "its return, split into capture, costs, solve and calibration (`benchmarks/optimize_walltime.py`).",
            as_is("optimize-walltime-deep.csv"), ("optimize-walltime-deep.csv",)),
    Section("Executor tax (keep everything, CPU)", "What monet's executor costs beyond plain PyTorch when its "
            "schedule keeps every activation (`benchmarks/executor_tax.py`), one thread, this process's CPU "
            "time.", as_is("executor-tax.csv"), ("executor-tax.csv",)),
    Section("Cost model checks (CPU)", "The workspace bound of the analytic cost source against measured "
            "workspaces per operator family (`benchmarks/workspace_bound.py`), and the recompute factor "
            "measured on Chen's schedule against the solved schedules' measured overheads "
            "(`benchmarks/recompute_factor.py`).", as_is("workspace-bound.csv", "recompute-factor.csv"),
            ("workspace-bound.csv", "recompute-factor.csv")),
)


def anchor(title: str) -> str:
    """GitHub's anchor of a heading."""
    keep = "".join(ch for ch in title.lower() if ch.isalnum() or ch in " -_")
    return keep.replace(" ", "-")


def results_files() -> list[str]:
    """The results files a section must read: the CSVs under benchmarks/results and the GPU's JSONs."""
    return sorted([p.name for p in RESULTS.glob("*.csv")] + [f"gpu/{p.name}" for p in (RESULTS / "gpu").glob("*.json")])


def render() -> str:
    """BENCHMARKS.md's text.

    Raises:
        ValueError: a results file that no section reads, or a section reading a file that is not there."""
    read_by = {f for s in SECTIONS for f in s.files}
    unread = [f for f in results_files() if f not in read_by]
    absent = sorted(f for f in read_by if not (RESULTS / f).exists())
    if unread or absent:
        raise ValueError("benchmarks/report.py: " + "; ".join(
            [f"benchmarks/results/{f} is read by no section (add it to SECTIONS or delete it)" for f in unread] +
            [f"benchmarks/results/{f} is named by a section but missing" for f in absent]))
    lines = ["# Benchmarks", "",
             f"Generated by `{COMMAND}` from the raw results in [benchmarks/results](benchmarks/results); "
             "do not edit it by hand. Each table's caption gives the date, machine, torch release and command of "
             "its rows. " + MEASURED, "",
             "| section | results |", "| --- | --- |"]
    lines += [f"| [{s.title}](#{anchor(s.title)}) | {', '.join(f'`{f}`' for f in s.files[:2])}"
              f"{' ...' if len(s.files) > 2 else ''} |" for s in SECTIONS]
    lines.append("")
    for s in SECTIONS:
        lines += [f"## {s.title}", "", s.text, ""] + s.tables()
    return "\n".join(lines).rstrip("\n") + "\n"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                epilog="BENCHMARKS.md is only ever written by this command.")
    p.add_argument("--check", action="store_true",
                   help="write nothing; exit 1 (with a diff) when BENCHMARKS.md differs from what the results give")
    p.add_argument("--out", type=Path, default=OUT, help="the file to write or check (default: BENCHMARKS.md)")
    args = p.parse_args(argv)
    text = render()
    if args.check:
        old = args.out.read_text() if args.out.exists() else ""
        if old == text:
            return 0
        sys.stdout.writelines(difflib.unified_diff(old.splitlines(True), text.splitlines(True),
                                                   str(args.out), "generated", n=1))
        print(f"{args.out} is not what the results give: run `{COMMAND}`", file=sys.stderr)
        return 1
    args.out.write_text(text)
    print(f"wrote {args.out} ({len(text):,} characters)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
