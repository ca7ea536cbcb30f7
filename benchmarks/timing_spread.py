"""How much one solved schedule's measured overhead moves when it is timed again and again on the CPU.

Solves one model of `reach_table.py` (a reach model or ``zoo/<name>``, at that table's batch) at its
budget (`reach_table.table_budget`;
uncalibrated, 8 s), then times that one schedule ``--times`` times in a row, each time in two
ways: the solve-time calibration's (`monet.profiling.calibration.measure_schedule`: the schedule
``M`` against the executor keeping everything ``K`` and plain PyTorch ``P``, paired per turn) and
the table's (`monet.profiling.measure.step_overhead` against a separate plain copy: the median of each
turn's ratio, and beside it the ratio of the two medians taken apart), as a table read it before.  ``--shared``
times the executors on plain PyTorch's own parameters instead of copies (`dispatch.own_copy`
replaced by the identity), as the calibration once did.  Prints one row per timing.

    python benchmarks/timing_spread.py torchvision/resnet18 --times 4
    python benchmarks/timing_spread.py torchvision/resnet18 --times 4 --shared
"""
from __future__ import annotations

import argparse
import copy
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

import bench  # noqa: E402
import pandas as pd  # noqa: E402
import reach_models as rm  # noqa: E402
import reach_table as rt  # noqa: E402


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("model", help="a name of tests/reach_models.py, or zoo/<name>")
    ap.add_argument("--mode", choices=("normal", "full"), default="normal")
    ap.add_argument("--times", type=int, default=3, help="timings of the one schedule (>= 1)")
    ap.add_argument("--shared", action="store_true", help="time the executors on plain PyTorch's parameters")
    args = ap.parse_args(argv)
    if args.times < 1:
        ap.error("--times must be >= 1")

    from monet.plan import prepare
    from monet.profiling import calibration, dispatch
    from monet.profiling.measure import step_overhead, training_step
    from monet.solver.solve import min_budget

    if args.shared:
        dispatch.own_copy = lambda model: model
    batch = (bench.CONFIGS[args.model[len(rt.ZOO):]].batch_size if args.model.startswith(rt.ZOO)
             else rm.TABLE_BATCH.get(args.model, rm.B))
    b = rt.Bench(args.model, batch, lambda m: print(m, file=sys.stderr))
    kw = dict(loss_fn=b.loss_fn, target=b.target) if b.target is not None else {}
    plan = prepare(copy.deepcopy(b.model), b.raw_inputs, cost="hybrid", progress=False, **kw)
    mode = plan.mode_for(rt.FULL_MODE if args.mode == "full" else "normal")
    least, _ = min_budget(plan.graph, plan.costs, mode, time_limit=8, device=plan.device, cost_fn=plan.cost_fn)
    budget = rt.table_budget(plan.eager_peak_bytes, least)
    sol = plan.solve(budget, mode=mode, time_limit=8, if_infeasible="smallest", calibrate=False)
    keep = dispatch.keep_all(plan.module, plan.inputs, plan.graph, plan.costs)
    wrapped = plan.wrap(sol, b.fresh())
    t0 = time.perf_counter()
    training_step(b.plain, plan.inputs)
    repeats = bench.timed_repeats(time.perf_counter() - t0, 5, target_s=4.0, cap=401)  # as reach_table.py
    print(f"{args.model} ({args.mode}, batch {batch}), budget {budget / plan.eager_peak_bytes:.2f} of the plain peak, {sol.schedule.recompute_count()} recomputations, "
          f"{'shared parameters' if args.shared else 'copies'}", flush=True)
    rows = []
    for i in range(args.times):
        m, k, p = calibration.measure_schedule(plan.module, plan.inputs, plan.graph, sol, keep)
        # the table's timing, read both ways: the median of each turn's ratio, and the two medians apart
        table, mc, mp = step_overhead(b.plain, wrapped, plan.inputs, repeats=repeats)
        rows.append({"timing": i + 1, "plain s": round(p, 4), "M/K %": 100 * (m / k - 1), "K/P %": 100 * (k / p - 1),
                     "M/P %": 100 * (m / p - 1), "table M/P %": 100 * table, "table medians %": 100 * (mc / mp - 1)})
        print(f"timing {i + 1} of {args.times}: M/P {rows[-1]['M/P %']:+.1f} %, table {rows[-1]['table M/P %']:+.1f} %",
              file=sys.stderr, flush=True)
    df = pd.DataFrame(rows)
    print(df.round({c: 1 for c in df.columns[2:]}).to_string(index=False))
    print("range (max - min), points:", ", ".join(f"{c} {df[c].max() - df[c].min():.1f}" for c in df.columns[2:]))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
