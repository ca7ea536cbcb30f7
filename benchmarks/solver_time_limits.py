"""The schedule a time limit buys: a model solved at each budget with time limits from 2 to 60 s,
the budgets in descending and in ascending order on one plan each (as a user solves one budget
after another), optionally beside one busy process.

    python benchmarks/solver_time_limits.py [--model demo|gpt2-24|llama-96|zoo:resnet50,zoo:unet|...]
                                            [--budgets 50%,40%,35%|per-block]
                                            [--time-limits 2,5,10,20,60] [--busy]
                                            [--csv benchmarks/results/solver-time-limits.csv]

``--model``: ``demo`` (`monet demo`'s quarter-width ResNet-50, batch 64, 3x64x64) or
``<gpt2|llama|bert>-<layers>``, transformers' model as `benchmarks/depth.py` builds it (hidden 256,
2 x 256 tokens, vocabulary 1024, no dropout); or ``zoo:<model>``, a configuration of MONeT's zoo at
full scale (`monet.zoo.build`: MONeT's batch size, captured on the meta device, the zoo's profile
or the P100 roofline, MONeT's full mode), solved by `monet.solver.solve.solve` on one captured
graph per order (the smallest-budget search is kept on it, as a plan keeps it).  Several models,
comma-separated, are solved one after another in one run (one table).

``--budgets`` takes what `monet.optimize` takes and ``per-block``: the simulated peak of per-block
checkpointing (``torch.utils.checkpoint`` around every block of the model's chain,
`monet.solver.structured.Structure.per_block`), in bytes, for a model with a chain of blocks.

Each row is one ``Plan.solve(budget, time_limit=T, calibrate=False)``: the budget in bytes, its
predicted overhead (the objective over plain PyTorch's simulated step, minus 1), its status, its
wall time (seconds), and ``vs best``: its objective over the lowest objective of that budget in the
whole run, minus 1. A model is captured and costed once per order (`monet.prepare`); nothing is
measured but the solve.
"""
from __future__ import annotations

import argparse
import multiprocessing as mp
import sys
import time
from pathlib import Path

from monet.cli.common import build_model
from monet.cli.demo import DEMO_BATCH, DEMO_MODEL, DEMO_SHAPE, DEMO_WIDTH
from monet.plan import prepare
from monet.solver.ilp import InfeasibleBudgetError
from monet.profiling.raw_results import append_rows, command_line, provenance

PER_BLOCK = "per-block"  # the budget at per-block checkpointing's simulated peak (`per_block_peak`)
DEFAULT_CSV = Path(__file__).resolve().parent / "results" / "solver-time-limits.csv"


def _spin() -> None:
    while True:
        pass


def build(name: str):
    """(model, example inputs, its name in the table) for ``--model`` ``name``.

    Raises:
        ValueError: a name neither ``demo`` nor ``<model>-<layers>`` of `benchmarks/depth.py`."""
    if name == "demo":
        model, x = build_model(DEMO_MODEL, DEMO_BATCH, DEMO_SHAPE, "cpu", base_width=DEMO_WIDTH)[:2]
        return model, x, f"{DEMO_MODEL} (base width {DEMO_WIDTH})"
    import depth

    kind, _, layers = name.partition("-")
    if not layers.isdigit():
        raise ValueError(f"--model {name!r}: demo, or <model>-<layers> with a model of {', '.join(depth.MODELS)}")
    model, x = depth.build(kind, int(layers), hidden=256, seq=256, batch=2, vocab=1024, dropout=0.0)
    return model, x, f"{kind} {layers} layers"


def per_block_peak(plan) -> int:
    """The simulated peak (bytes) of per-block checkpointing on ``plan``'s graph.

    Raises:
        SystemExit: the graph has no chain of identical blocks."""
    from monet.solver.finish import memory_model, simulated_peak_fn
    from monet.solver.formulation import allowed
    from monet.solver.structured import Structure

    mem = memory_model(plan.graph, plan.costs)
    structure = Structure(plan.graph, mem, plan.costs.fwd_recompute, allowed(mem)[2])
    if not structure.blocks:
        raise SystemExit("--budgets per-block: the model has no chain of identical blocks")
    every = structure.per_block()
    return int(simulated_peak_fn(plan.graph, plan.costs, mem)(every.S, every.R))


class _ZooPlan:
    """A zoo configuration (``zoo:<model>``) with `monet.plan.Plan`'s ``graph``, ``costs`` and
    ``solve(budget, time_limit=...)``, solved as `monet.zoo.build` solves it."""

    def __init__(self, model: str):
        from monet.solver.finish import eager_peak
        from monet.zoo.build import BATCH, MODE, ZooConfig, capture_config, zoo_costs

        self.config = ZooConfig(model, BATCH[model], ())
        self.graph = capture_config(model, self.config.batch_size)
        zc = zoo_costs(self.graph, self.config.gpu_spec)
        self.costs, self.cost_fn, self.mode = zc.costs, zc.cost_fn, MODE
        self.eager = eager_peak(self.graph, self.costs)
        self.label = f"{model} (batch {self.config.batch_size}, {zc.source})"

    def solve(self, budget, time_limit: float, **_):
        from monet.solver.solve import parse_budget, solve

        sol = solve(self.graph, self.costs, parse_budget(budget, self.eager), self.mode, time_limit=time_limit,
                    device=self.config.device, cost_fn=self.cost_fn)
        sol.meta.eager_time_s = float(self.costs.total_time)
        return sol


def solve_rows(name: str, budgets: list[str], limits: list[float], order: str) -> list[dict]:
    """One row per (time limit, budget) of one plan of ``--model`` ``name``, the budgets in
    ``order`` ("descending" as given, or "ascending")."""
    if name.startswith("zoo:"):
        plan = _ZooPlan(name[len("zoo:"):])
        label = plan.label
    else:
        model, x, label = build(name)
        plan = prepare(model, x, progress=False)
    seq = budgets if order == "descending" else list(reversed(budgets))
    asked = {b: per_block_peak(plan) if b == PER_BLOCK else b for b in budgets}
    rows = []
    for limit in limits:
        for budget in seq:
            t0 = time.perf_counter()
            try:
                sol = plan.solve(asked[budget], time_limit=limit, calibrate=False, progress=None)
            except InfeasibleBudgetError as e:
                raise SystemExit(f"--budgets {budget}: {e}") from None
            m = sol.meta
            rows.append({"model": label, "budget": budget, "budget bytes": m.budget_bytes, "order": order,
                         "time limit s": limit, "objective s": round(m.objective_s, 5),
                         "predicted overhead": f"{100 * (m.objective_s / m.eager_time_s - 1):+.1f} %",
                         "status": m.status, "wall s": round(time.perf_counter() - t0, 1)})
            print(f"{order} T={limit:g} {budget}: {rows[-1]['predicted overhead']} ({rows[-1]['wall s']} s)",
                  file=sys.stderr, flush=True)
    return rows


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default="demo",
                   help="demo, <gpt2|llama|bert>-<layers>, or zoo:<model> (MONeT's configuration); several "
                        "comma-separated, each solved at every budget (default demo)")
    p.add_argument("--budgets", default="50%,40%,35%",
                   help="comma-separated, from the largest: percentages, bytes, or per-block (per-block "
                        "checkpointing's simulated peak)")
    p.add_argument("--time-limits", default="2,5,10,20,60", help="seconds, comma-separated")
    p.add_argument("--busy", action="store_true", help="one process spinning beside the solves")
    p.add_argument("--csv", type=Path, default=DEFAULT_CSV,
                   help="raw results file (rows appended; they replace the model's earlier rows at these budgets)")
    args = p.parse_args(argv)
    budgets = [b.strip() for b in args.budgets.split(",") if b.strip()]
    limits = [float(t) for t in args.time_limits.split(",") if t.strip()]
    busy = mp.Process(target=_spin, daemon=True) if args.busy else None
    if busy is not None:
        busy.start()
    try:
        rows = [r for name in args.model.split(",") if name.strip()
                for order in ("descending", "ascending") for r in solve_rows(name.strip(), budgets, limits, order)]
    finally:
        if busy is not None:
            busy.terminate()
    best = {}
    for r in rows:
        key = (r["model"], r["budget"])
        best[key] = min(best.get(key, float("inf")), r["objective s"])
    for r in rows:
        r["vs best"] = f"{100 * (r['objective s'] / best[r['model'], r['budget']] - 1):+.1f} %"
        r["busy process"] = "yes" if args.busy else "no"
    # a model's budgets solved again replace their earlier rows: the table is of today's solver
    measured = {(r["model"], r["budget"]) for r in rows}
    append_rows(args.csv, rows, provenance(command_line("python benchmarks/solver_time_limits.py", argv)),
                replaces=lambda old: (old["model"], old["budget"]) in measured)
    print(f"wrote {len(rows)} rows to {args.csv}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
