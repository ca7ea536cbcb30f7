"""How the CPU recompute factor holds: the factor the cost model uses against the one a schedule shows.

    python benchmarks/recompute_factor.py [--models a,b] [--fractions 0.5,0.7] [--csv benchmarks/results/recompute-factor.csv]

On the CPU the ``hybrid`` costs scale every recomputation by one factor per graph, measured on
Chen's sqrt(n) schedule and cached with the graph's iteration record
(`monet.profiling.dispatch.recompute_factor`).  For each model of ``tests/reach_models.py`` (or
``zoo/<name>``, as `benchmarks/reach_table.py` builds them) this prints:

- *cached*: the factor the costs use (the cached record's, measured when the costs were first made);
- *fresh*: the same measurement made now (`dispatch.measure_iterations` on Chen's schedule again);
- for each fraction of plain PyTorch's simulated peak (the smallest feasible budget found where it
  is higher), the normal-mode schedule's recomputations, its predicted overhead, its overhead
  measured twice against plain PyTorch (`monet.profiling.measure.step_overhead`), and *implied*: the
  factor that would have predicted the mean of the two, ``(measured time - T) / R`` (``T`` the
  keep-everything time the costs predict, ``R`` the schedule's recomputation before the factor).

A factor that moves between *cached* and *fresh* is a measurement that does not repeat; an
*implied* factor far from both is a schedule whose recomputation costs what Chen's does not.
Progress goes to stderr.
"""
from __future__ import annotations

import argparse
import copy
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(0, str(ROOT / "benchmarks"))

import bench  # noqa: E402,F401  (first: sets OMP_WAIT_POLICY=PASSIVE before torch loads)
import reach_table as rt  # noqa: E402


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def model_rows(name: str, fractions: list[float], time_limit: float, repeats: int) -> list[dict]:
    """One row per fraction for model ``name`` (see the module docstring for the columns)."""
    import reach_models as rm

    from monet.plan import prepare
    from monet.profiling import dispatch, sources
    from monet.profiling.measure import step_overhead

    batch = rt.bench.CONFIGS[name[len(rt.ZOO):]].batch_size if name.startswith(rt.ZOO) else \
        rm.TABLE_BATCH.get(name, rm.B)
    b = rt.Bench(name, batch, log)
    kw = dict(loss_fn=b.loss_fn, target=b.target) if b.target is not None else {}
    plan = prepare(copy.deepcopy(b.model), b.raw_inputs, cost="hybrid", progress=False, **kw)
    record = sources.iterations("hybrid", plan.module, plan.inputs, plan.graph, "cpu")
    table = sources.measured_table("hybrid", plan.module, plan.inputs, plan.graph, "cpu")
    fresh = dispatch.measure_iterations(plan.module, plan.inputs, plan.graph, table)
    between = dispatch.between_operators_s(fresh["executor_iteration_s"], table)
    fresh_factor = dispatch.recompute_factor(fresh, between, dispatch.operator_scale(fresh["executor_iteration_s"], table))
    cached = record["recompute_factor"]
    log(f"{name}: factor cached {cached:.2f}, measured again {fresh_factor:.2f}")
    rows = []
    for fraction in fractions:
        sol = plan.solve(f"{round(100 * fraction)}%", mode="normal", time_limit=time_limit, if_infeasible="smallest",
                         calibrate=False)  # the cached factor alone: what this benchmark measures
        wrapped = plan.wrap(sol, b.fresh())
        measured = [step_overhead(b.plain, wrapped, plan.inputs, repeats=repeats)[0] for _ in range(2)]
        total, plain = plan.costs.total_time, plan.costs.plain_time
        recompute = sol.meta.objective_s - total  # with the cached factor
        mean = sum(measured) / 2
        implied = ((1 + mean) * plain - total) / (recompute / cached) if recompute > 0 else float("nan")
        rows.append(dict(model=name, budget=f"{sol.meta.budget_bytes / plan.eager_peak_bytes:.2f}",
                         recomputations=sol.schedule.recompute_count(), cached=f"{cached:.2f}",
                         fresh=f"{fresh_factor:.2f}", implied=f"{implied:.2f}",
                         predicted=rt.pct(sol.meta.predicted_overhead()), measured=rt.pct(measured[0]),
                         again=rt.pct(measured[1]), points=f"{100 * (sol.meta.predicted_overhead() - mean):+.1f}"))
        log(f"  {rows[-1]}")
        rt._release()
    return rows


def main(argv=None) -> int:
    import pandas as pd

    import reach_models as rm
    from monet.profiling.raw_results import append_rows, command_line, provenance

    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--models", default=",".join(rm.MODELS), help="comma-separated reach or zoo/<name> models")
    p.add_argument("--fractions", default="0.5,0.7", help="budgets as fractions of the simulated plain peak")
    p.add_argument("--time-limit", type=float, default=8.0, help="seconds per solve")
    p.add_argument("--repeats", type=int, default=21, help="timed iterations per side of each overhead")
    p.add_argument("--csv", type=Path, help="append the rows, with their provenance, to this raw results file "
                   "(benchmarks/results/recompute-factor.csv: `benchmarks/report.py` renders it)")
    args = p.parse_args(argv)
    fractions = [float(f) for f in args.fractions.split(",")]
    rows = []
    for name in args.models.split(","):
        try:
            rows += model_rows(name, fractions, args.time_limit, args.repeats)
        except Exception as e:  # noqa: BLE001 - a failure is the model's row
            log(f"{name}: {rt.error_text(e)}")
            rows.append(dict(model=name, budget=rt.error_text(e)))
    frame = pd.DataFrame(rows).fillna("").astype(str)
    print(frame.to_string(index=False))
    if args.csv:
        append_rows(args.csv, frame.to_dict("records"),
                    provenance(command_line("python benchmarks/recompute_factor.py", argv)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
