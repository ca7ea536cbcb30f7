"""Measures the block DP start (`solver.blocks`) against `solver.ilp._start`'s schedule at the
solver benchmark's configurations (issue 4: "articulation points and a dynamic program over
blocks"), each on the cheap memory-lean implementations (`solver.solve.lean_impls`), whose
schedules the full-scale table reports at 33-50 %:

    python -m monet.profiling.bench_block_dp [--models resnet50,gpt2-small] [--budgets 50,40,33] [--seconds 20]

Per row: the DP's schedule (predicted iteration time, s), the same after `solver.repair.improve`
(a descent, then the iterated search, half of ``--seconds`` each), and `_start`'s (the greedy, the
window knapsack and the checkpoint sets, improved the same way) in ``--seconds``.
"""
from __future__ import annotations

import argparse
import time

import numpy as np


def main(argv=None) -> int:
    from monet.profiling.bench_solver import CONFIGS, MODE, _graph_and_costs
    from monet.solver.blocks import articulation_blocks, block_schedule
    from monet.solver.choices import chosen_graph
    from monet.solver.ilp import _Problem, _start
    from monet.solver.repair import improve
    from monet.solver.solve import eager_peak, full_model, lean_impls, memory_model

    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--models", default="resnet50,gpt2-small")
    p.add_argument("--budgets", default="50,40,33")
    p.add_argument("--seconds", type=float, default=20.0)
    a = p.parse_args(argv)
    print("| model | budget | blocks | DP s | DP solve s | DP + search s | `_start` s |")
    print("| --- | --- | --- | --- | --- | --- | --- |")
    for name in a.models.split(","):
        graph, costs, _, cost_fn = _graph_and_costs(name, CONFIGS[name])
        eager = eager_peak(graph, costs)
        options, _ = full_model(graph, costs, MODE, "cuda", cost_fn)
        g, c = chosen_graph(graph, costs, options, lean_impls(options, cheap=True))
        m = memory_model(g, c)
        P = _Problem(g, m, c.fwd_recompute, "normal")
        n_blocks = len(articulation_blocks(g, m))
        for pct in map(float, a.budgets.split(",")):
            limit = int(eager * pct / 100) - 1e-6 * P.scale
            t0 = time.perf_counter()
            dp = block_schedule(g, m, P.allow_s, limit, c.fwd_recompute)
            dp_s = time.perf_counter() - t0
            cells = ["-", "-"]
            if dp is not None:
                S, R, cost = dp
                cells[0] = f"{cost + c.total_time:.4f}"
                S, R, _ = improve(g, m, S, R, limit, c.fwd_recompute, P.allow_s, time.perf_counter() + a.seconds / 2)
                S, R, cost = improve(g, m, S, R, limit, c.fwd_recompute, P.allow_s,
                                     time.perf_counter() + a.seconds / 2, rng=np.random.default_rng(0))
                cells[1] = f"{cost + c.total_time:.4f}"
            st = _start(P, g, m, c.fwd_recompute, limit, None, time.perf_counter() + a.seconds, iterate=True)
            ref = "-" if st is None else f"{st[1] + c.total_time:.4f}"
            print(f"| {name} | {pct:g} % | {n_blocks} | {cells[0]} | {dp_s:.2f} | {cells[1]} | {ref} |", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
