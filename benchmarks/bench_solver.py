"""Solver benchmark at MONeT's full-scale configurations: how big the ILP is, how long it
takes, and how close to the bound its schedule is.

    python benchmarks/bench_solver.py [--models resnet50,...] [--budgets 70,60,50,40,33] [--solver CBC[,HIGHS]]
                                      [--time-limit 60] [--gap 0.01] [--plain] [--min-budget] [--csv benchmarks/results/solver.csv]
                                      [--peers checkpoint_all,chen,greedy,rounding,ilp]

Configurations (`CONFIGS`): MONeT's five CNNs at their batch sizes (input 3x224x224; UNet at the zoo
model's input) and GPT-2 small at batch 8, sequence 1024, fp32.  Nothing runs on a device: the
graph is captured with fake tensors, and the costs come from a GPU profile in the zoo where one
exists, else from the analytic roofline model of MONeT's GPU (``DeviceSpec.named("p100")``).  The
mode is the full mode (implementations chosen with the checkpoints).

Per configuration and budget (a percentage of plain PyTorch's simulated peak) the table gives the
ILP's variables and constraint rows, the build time, the solve time (everything `solve` does,
wall clock), the objective (predicted iteration time, seconds), the best bound, the gap
(objective - bound) / objective, the predicted peak over the budget, the status, and whether it
meets the target: within 1 % of the best schedule known for that row (`BEST_KNOWN`, the
committed file ``benchmarks/best_known.csv``, `monet.solver.best_known`: the lowest objective any run here has found, with
the command that found it) within the time limit, or, for a budget below the smallest feasible
one, proven infeasible within the limit (the budget is under the LP relaxation's bound on the
smallest budget, `solver.relaxation.min_budget_relaxation`) where no schedule is known.  A ``min`` row
meets it when the smallest budget found within the limit is within 1 % of the best known one.
``to_best_s`` is the wall time from the call until the solve first held a schedule within 1 % of
the best known, as its progress lines announce them (a MIP solver's incumbents, the local
search's schedule at the end of its step; the call's end when no line did but the schedule
returned is within 1 %); "-" when the schedule returned is not.  ``--solver CBC,HIGHS`` solves
each budget with each solver in turn (one row each, interleaved, so that the load of other
processes hits both alike).
``--record-best`` writes every row that beats the file's entry back into it, with this command.  With
``--plain`` each row is followed by MONeT's formulation as written (no pruned variables, no LP
relaxation, no start, the solver through cvxpy) at the same time limit, for contrast; with
``--min-budget`` a last row per model times the smallest-budget search.  Progress
goes to stderr; the markdown section is rewritten after every row.

With ``--peers`` the table compares solver peers instead (`monet.solver.solve.PEERS`, one
signature ``solve_x(graph, costs, budget, *, deadline)``), in normal mode (PyTorch's
implementations), on the same graph, costs and budgets, each with ``--time-limit`` seconds: its
objective (predicted iteration time, s), the overhead over plain PyTorch's time, the predicted
(simulated) peak over the budget, the solve time and the status; "infeasible" where the peer
found nothing that fits (checkpoint-all and Chen's sqrt(n) have no budget knob: their peak is
named).  It is printed, not written to ``--out``.
"""
from __future__ import annotations

import argparse
import datetime as _dt
import re
import sys
import time
from pathlib import Path

import pandas as pd

from monet.profiling.markdown import md_table
from monet.profiling.raw_results import append_rows, command_line, provenance
from monet.solver import DEFAULT_GAP
from monet.solver.best_known import BEST_KNOWN, load_best_known, record_best_known
from monet.zoo.build import BATCH as ZOO_BATCH

CONFIGS = dict(ZOO_BATCH)  # model: batch size (MONeT, Table 2; GPT-2 small at 8), as the zoo builds them
BUDGETS = (70, 60, 50, 40, 33)
MODE = "inplace_conv_multiway_newnode"
TARGET = 0.01  # a row's schedule (or smallest budget) within 1 % of the best known
# the objectives (seconds) a solve's progress lines announce: a MIP solver's incumbents, the local
# search's schedule above solver.formulation.LARGE
_ANNOUNCED = re.compile(r"incumbent ([-+0-9.eE]+)|local search's schedule stands \(([-+0-9.eE]+) s\)")
# an announced value this far below the best known is not this row's objective (the smallest-budget
# search's incumbents are budgets, in the ILP's units)
_BELOW = 0.05


class _Trace:
    """A solve's progress callback: logs each line (`_log`) and keeps the (seconds since the
    trace began, objective) points the lines announce (`_ANNOUNCED`)."""

    def __init__(self):
        self.t0 = time.perf_counter()
        self.points: list[tuple[float, float]] = []

    def __call__(self, line: str) -> None:
        m = _ANNOUNCED.search(line)
        if m:
            self.points.append((time.perf_counter() - self.t0, float(m.group(1) or m.group(2))))
        _log(line)


def _time_to_best(points, known: float | None, value: float | None, solve_s: float | None) -> float | None:
    """Seconds until a schedule within `TARGET` of ``known`` (the best known objective) was first
    announced (``points``: (seconds, objective)), else ``solve_s`` when the returned ``value`` is
    within it; None when the returned schedule is not within it (or there is none, or no best known)."""
    if known is None or value is None or value > known * (1 + TARGET) + 1e-12:
        return None
    hits = [t for t, v in points if known * (1 - _BELOW) <= v <= known * (1 + TARGET) + 1e-12]
    return min(hits + [solve_s])


def _against_best(row: dict, best: dict, time_limit: float) -> None:
    """Fill ``row``'s best-known columns and decide whether it meets the target (module docstring)."""
    known = best.get((row["model"], int(row["batch"]), row["_key"]))
    value = row.get("_value")
    row["best_known"] = known
    row["vs_best"] = None if known is None or value is None else value / known - 1.0
    if row["_key"] != "min":
        row["to_best_s"] = _time_to_best(row.get("_points", []), known, value, row["solve_s"])
    in_time = row["solve_s"] is not None and row["solve_s"] <= time_limit
    if row["vs_best"] is not None:
        row["meets target"] = "yes" if in_time and row["vs_best"] <= TARGET + 1e-9 else "no"
    elif value is not None:
        row["meets target"] = "yes (no best known: this is it)" if in_time else "no"
    elif row.get("_proven_infeasible") and known is None:
        row["meets target"] = "yes (proven infeasible)" if in_time else "no"
    else:
        row["meets target"] = "no"


def _log(msg: str) -> None:
    print(f"bench-solver: {msg}", file=sys.stderr, flush=True)


def _graph_and_costs(model_name: str, batch: int):
    """(graph, costs, cost source, cost_fn) for a configuration, exactly as the zoo makes them
    (`monet.zoo.build`): captured on the meta device, costed from a zoo profile or the P100 roofline."""
    from monet.zoo.build import capture_config, zoo_costs

    graph = capture_config(model_name, batch)
    zc = zoo_costs(graph, "p100")
    return graph, zc.costs, zc.source, zc.cost_fn


def bench_config(model_name: str, batch: int, budgets, solver: str, time_limit: float, gap: float,
                 plain: bool, on_row=None, min_budget_row: bool = False, best: dict | None = None) -> list[dict]:
    """Rows (dicts) for one configuration; see the module docstring for the columns.  ``solver``:
    one name, or several comma-separated (each budget is solved by each in turn; ``--plain`` and
    the smallest-budget row use the first).  With ``min_budget_row``, a last row times the
    smallest-budget search; ``best``: `load_best_known`'s table the rows are held against."""
    solvers = [x.strip().upper() for x in solver.split(",") if x.strip()]
    solver = solvers[0]
    best = load_best_known() if best is None else best
    from monet.solver.ilp import InfeasibleBudgetError, plain_solve, problem_size
    from monet.solver.solve import eager_peak, fixed_time, full_model, parse_budget, solve

    t0 = time.perf_counter()
    graph, costs, source, cost_fn = _graph_and_costs(model_name, batch)
    eager = eager_peak(graph, costs)
    options, mem = full_model(graph, costs, MODE, "cuda", cost_fn)
    n_vars, n_cons, build_s = problem_size(graph, mem, costs.fwd_recompute, MODE)
    _log(f"{model_name} b{batch}: {len(graph.fwd)} forward, {len(graph.bwd)} backward nodes, "
         f"{len(options)} implementation options, plain peak {eager / 2**30:.2f} GiB, "
         f"prepared in {time.perf_counter() - t0:.1f} s")
    rows = []
    for pct, each in ((p, x) for p in budgets for x in solvers):
        budget = parse_budget(f"{pct:g}%", eager)
        row = dict(model=model_name, batch=batch, budget=f"{pct:g} %", formulation="fast", solver=each,
                   variables=n_vars, constraints=n_cons, build_s=build_s, solve_s=None, objective_s=None,
                   bound_s=None, gap=None, peak_over_budget=None, status="", costs=source, _key=f"{pct:g}")
        _log(f"{model_name} at {pct} % ({budget / 2**30:.2f} GiB), {each}, limit {time_limit:g} s")
        trace = _Trace()
        row["_points"] = trace.points
        t1 = time.perf_counter()
        try:
            sol = solve(graph, costs, budget, MODE, solver=each, time_limit=time_limit, device="cuda",
                        cost_fn=cost_fn, gap=gap, progress=trace)
            m = sol.meta
            row.update(solve_s=time.perf_counter() - t1, objective_s=m.objective_s, bound_s=m.bound_s,
                       gap=m.gap, peak_over_budget=m.predicted_peak_bytes / budget, status=m.status,
                       _value=m.objective_s)
        except InfeasibleBudgetError as e:
            lower = e.lower_bytes
            row.update(solve_s=time.perf_counter() - t1, status="infeasible: smallest found "
                       f"{100 * (e.min_budget_bytes or 0) / eager:.1f} %"
                       + ("" if lower is None else f", LP bound {100 * lower / eager:.1f} %"))
            row["_proven_infeasible"] = lower is not None and budget < lower
        _against_best(row, best, time_limit)
        rows.append(row)
        if on_row:
            on_row(rows)
        if plain and each == solver:
            p = plain_solve(graph, mem, costs.fwd_recompute, budget, MODE, solver, time_limit,
                            constant_s=fixed_time(graph, costs, options))
            gap_p = (None if p["objective_s"] is None or p["bound_s"] is None
                     else max(0.0, 1 - p["bound_s"] / p["objective_s"]))
            rows.append({**row, "formulation": "plain", "variables": p["n_variables"],
                         "constraints": p["n_constraints"], "build_s": p["build_s"], "solve_s": p["solve_s"],
                         "objective_s": p["objective_s"], "bound_s": p["bound_s"], "gap": gap_p,
                         "peak_over_budget": None, "status": p["status"], "meets target": "-",
                         "best_known": None, "vs_best": None, "to_best_s": None, "_value": None,
                         "_points": []})
            if on_row:
                on_row(rows)
    if min_budget_row:
        row = _min_budget_row(graph, costs, cost_fn, eager, model_name, batch, solver, time_limit, source,
                              n_vars, n_cons, build_s)
        _against_best(row, best, time_limit)
        rows.append(row)
        if on_row:
            on_row(rows)
    return rows


def _min_budget_row(graph, costs, cost_fn, eager, model_name, batch, solver, time_limit, source, n_vars, n_cons,
                    build_s) -> dict:
    """The row of `monet solve --min-budget`'s search (`solver.solve.min_budget`, its own time limit):
    solve_s is the search's wall clock, the status names the budget found (% of the plain peak)."""
    from monet.solver.solve import min_budget, min_budget_lower

    graph.__dict__.pop("_monet_smallest", None)  # no answer cached by an infeasible row's search
    _log(f"{model_name}: smallest budget, {solver}, limit {time_limit:g} s")
    t1 = time.perf_counter()
    least, proven = min_budget(graph, costs, MODE, solver, time_limit, "cuda", cost_fn)
    solve_s = time.perf_counter() - t1
    lower = min_budget_lower(graph, costs, MODE, solver, time_limit, "cuda", cost_fn)  # cached: no time
    how = "proven" if proven else ("not proven" if lower is None else f"LP bound {100 * lower / eager:.1f} %")
    return dict(model=model_name, batch=batch, budget="min", formulation="fast", solver=solver.upper(),
                variables=n_vars, constraints=n_cons, build_s=build_s, solve_s=solve_s,
                objective_s=None, bound_s=None, gap=None, peak_over_budget=None,
                status=f"smallest {100 * least / eager:.1f} % ({least / 2**30:.2f} GiB, {how})", costs=source,
                _key="min", _value=float(least))


def bench_peers(model_name: str, batch: int, budgets, peers: list[str], solver: str, time_limit: float) -> list[dict]:
    """Rows (dicts) comparing ``peers`` (names in `monet.solver.solve.PEERS`) at each budget (% of
    the plain peak) of one configuration, in normal mode; see the module docstring."""
    from monet.solver.deadline import Deadline
    from monet.solver.ilp import InfeasibleBudgetError
    from monet.solver.solve import PEERS, eager_peak, parse_budget

    graph, costs, source, _ = _graph_and_costs(model_name, batch)
    eager = eager_peak(graph, costs)
    rows = []
    for pct in budgets:
        budget = parse_budget(f"{pct:g}%", eager)
        for name in peers:
            _log(f"{model_name} at {pct} % ({budget / 2**30:.2f} GiB): peer {name}, limit {time_limit:g} s")
            t1 = time.perf_counter()
            row = dict(model=model_name, batch=batch, budget=f"{pct:g} %", peer=name)
            try:
                m = PEERS[name](graph, costs, budget, deadline=Deadline(time_limit), solver=solver).meta
                row.update(objective_s=f"{m.objective_s:.4f}",
                           overhead=f"{100 * m.predicted_overhead():+.2f} %",
                           peak_over_budget=f"{m.predicted_peak_bytes / budget:.3f}",
                           solve_s=f"{time.perf_counter() - t1:.1f}", status=f"{m.status} ({m.solver})")
            except InfeasibleBudgetError as e:
                least = e.min_budget_bytes
                row.update(objective_s="-", overhead="-", peak_over_budget="-",
                           solve_s=f"{time.perf_counter() - t1:.1f}",
                           status="infeasible" + ("" if least is None else f": needs {100 * least / eager:.1f} %"))
            rows.append(dict(row, costs=source))
    return rows


def peers_markdown(rows: list[dict], argv: list[str]) -> str:
    """The peer comparison table for ``rows`` (`bench_peers`)."""
    sources = sorted({r.pop("costs") for r in rows})
    head = (f"`python benchmarks/bench_solver.py {' '.join(argv)}` on {_dt.date.today().isoformat()}, normal mode "
            f"(PyTorch's implementations); costs: {', '.join(sources)}; times are wall clock on this machine's CPU.\n\n")
    return head + md_table(list(rows[0]), [[str(v) for v in r.values()] for r in rows]) + "\n"


def display_frame(rows: list[dict]) -> pd.DataFrame:
    """``rows`` as the table shows them (string cells; the costs column dropped)."""
    df = pd.DataFrame(rows)
    df = df[[c for c in df.columns if not c.startswith("_")]]
    unit_min = df["budget"] == "min"
    df["best_known"] = [("-" if v is None or pd.isna(v) else (f"{v / 2**30:.3f} GiB" if m else f"{v:.4f}"))
                        for v, m in zip(df["best_known"], unit_min)]
    df["vs_best"] = df["vs_best"].map(lambda v: "-" if v is None or pd.isna(v) else f"{100 * v:+.2f} %")
    cols = list(df.columns)
    cols.remove("meets target")
    df = df[cols + ["meets target"]]
    fmt = {"build_s": "{:.2f}", "solve_s": "{:.1f}", "objective_s": "{:.4f}", "bound_s": "{:.4f}", "to_best_s": "{:.1f}"}
    for col, f in ((c, f) for c, f in fmt.items() if c in df):
        df[col] = df[col].map(lambda v, f=f: "-" if v is None or pd.isna(v) else f.format(v))
    df["gap"] = df["gap"].map(lambda v: "-" if v is None or pd.isna(v) else f"{100 * v:.2f} %")
    df["peak_over_budget"] = df["peak_over_budget"].map(lambda v: "-" if v is None or pd.isna(v) else f"{v:.3f}")
    return df.drop(columns=["costs"]).astype(str)


def to_markdown(rows: list[dict], argv: list[str]) -> str:
    """The table of ``rows``, printed by a run, with its command, mode and costs above it."""
    sources = sorted({r["costs"] for r in rows})
    df = display_frame(rows)
    head = (f"`python benchmarks/bench_solver.py {' '.join(argv)}`, mode {MODE}; costs: {', '.join(sources)}; "
            "times are wall clock on this machine's CPU.\n\n")
    return head + md_table(list(df.columns), df.values.tolist()) + "\n"


def build_parser() -> argparse.ArgumentParser:
    """The command line (see the module docstring)."""
    p = argparse.ArgumentParser(prog="python benchmarks/bench_solver.py",
                                description=__doc__.split("\n\n")[0] + " Needs no GPU.")
    p.add_argument("--models", default=",".join(CONFIGS), help="comma-separated zoo models (batch from CONFIGS)")
    p.add_argument("--budgets", default=",".join(map(str, BUDGETS)), help="percentages of the plain peak")
    p.add_argument("--solver", type=str.upper, default="CBC",
                   help="MILP solver: CBC, HIGHS or SCIP; several comma-separated (CBC,HIGHS) solve each "
                        "budget with each in turn, interleaved")
    p.add_argument("--time-limit", type=float, default=60.0, metavar="S", help="seconds per solve (wall clock)")
    p.add_argument("--gap", type=float, default=DEFAULT_GAP,
                   help="stop once proven within this fraction of the bound (default %(default)g, monet solve's)")
    p.add_argument("--plain", action="store_true", help="also solve MONeT's formulation as written, for contrast")
    p.add_argument("--min-budget", action="store_true",
                   help="also time the smallest-budget search (monet solve --min-budget) per model")
    p.add_argument("--csv", type=Path, default=None,
                   help="append each model's rows, with their provenance, to this raw results file "
                        "(benchmarks/results/solver.csv; `python benchmarks/report.py` renders it)")
    p.add_argument("--record-best", action="store_true",
                   help=f"write rows that beat the best known schedule into {BEST_KNOWN.name}, with this command")
    p.add_argument("--peers", default=None, metavar="NAMES",
                   help="compare these solver peers in normal mode instead (comma-separated: checkpoint_all, "
                        "chen, greedy, rounding, ilp)")
    return p


def run(args, argv: list[str]) -> int:
    """Run the benchmark for parsed ``args``; prints the table to stdout."""
    models = [m.strip() for m in args.models.split(",") if m.strip()]
    unknown = [m for m in models if m not in CONFIGS]
    if unknown:
        raise SystemExit(f"bench-solver: unknown model(s) {', '.join(unknown)}; choose from {', '.join(CONFIGS)}")
    budgets = [float(b) for b in args.budgets.split(",") if b.strip()]  # "" : only --min-budget rows
    from monet.solver.ilp import SOLVERS

    solvers = [x.strip() for x in args.solver.split(",") if x.strip()]
    if not solvers or any(x not in SOLVERS for x in solvers) or (args.peers and len(solvers) > 1):
        raise SystemExit(f"bench-solver: --solver {args.solver}: name one of {', '.join(SOLVERS)} "
                         "(several, comma-separated, only without --peers)")
    rows: list[dict] = []
    best = load_best_known()
    if args.peers:
        from monet.solver.solve import PEERS

        peers = [p.strip() for p in args.peers.split(",") if p.strip()]
        bad = [p for p in peers if p not in PEERS]
        if bad or not peers:
            raise SystemExit(f"bench-solver: unknown peer(s) {', '.join(bad) or '(none given)'}; "
                             f"choose from {', '.join(PEERS)}")
        for m in models:
            rows += bench_peers(m, CONFIGS[m], budgets, peers, args.solver, args.time_limit)
        print(peers_markdown(rows, argv))
        return 0

    prov = provenance(command_line("python benchmarks/bench_solver.py", argv))
    for m in models:
        made = bench_config(m, CONFIGS[m], budgets, args.solver, args.time_limit, args.gap, args.plain,
                            lambda current: None, min_budget_row=args.min_budget, best=best)
        rows += made
        if args.csv:  # each model's rows as it finishes: an interrupted run keeps them
            append_rows(args.csv, display_frame(made).to_dict("records"), prov)
    print(to_markdown(rows, argv))
    if args.record_best:
        command = command_line("python benchmarks/bench_solver.py", argv)
        for e in record_best_known([r for r in rows if r["formulation"] == "fast"], command):
            _log(f"new best known: {e['model']} {e['budget']}: {e['best']:.6g} {e['unit']}")
    return 0


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    return run(build_parser().parse_args(argv), argv)


if __name__ == "__main__":
    raise SystemExit(main())
