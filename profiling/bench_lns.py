"""Measures large-neighbourhood search with CBC on the solver benchmark's schedules: free the
keep/recompute variables of a few random runs of ``--width`` consecutive forward nodes (all
stages), fix the rest at the incumbent, solve that sub-ILP in CBC (``--sub-seconds``, started
from the incumbent), keep it when cheaper; for ``--seconds``.  On the cheap memory-lean
implementations (`solver.solve.lean_impls`), from `solver.ilp._start`'s schedule (20 s).

    python -m monet.profiling.bench_lns [--model resnet50] [--budget 33] [--width 8] [--runs 1]
"""
from __future__ import annotations

import argparse
import time

import cvxpy as cp
import cvxpy.settings as s
import numpy as np
from scipy.optimize import linprog


def main(argv=None) -> int:
    from cvxpy.reductions.solvers.conic_solvers.conic_solver import dims_to_solver_dict

    from monet.profiling.bench_solver import CONFIGS, MODE, _graph_and_costs
    from monet.solver import cbc_worker
    from monet.solver.cbc import library_path
    from monet.solver.choices import chosen_graph
    from monet.solver.ilp import _Problem, _start
    from monet.solver.solve import eager_peak, full_model, lean_impls, memory_model

    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default="resnet50")
    p.add_argument("--budget", type=float, default=33.0)
    p.add_argument("--width", type=int, default=8)
    p.add_argument("--runs", type=int, default=1)
    p.add_argument("--sub-seconds", type=float, default=3.0)
    p.add_argument("--seconds", type=float, default=60.0)
    a = p.parse_args(argv)
    graph, costs, _, cost_fn = _graph_and_costs(a.model, CONFIGS[a.model])
    eager = eager_peak(graph, costs)
    options, _ = full_model(graph, costs, MODE, "cuda", cost_fn)
    g, c = chosen_graph(graph, costs, options, lean_impls(options, cheap=True))
    m = memory_model(g, c)
    N, G = len(g.fwd), len(m.groups)
    P = _Problem(g, m, c.fwd_recompute, "normal")
    limit = int(eager * a.budget / 100) - 1e-6 * P.scale
    problem = cp.Problem(cp.Minimize(P.time_objective()), P.cons + P.memory_constraints(limit))
    st = _start(P, g, m, c.fwd_recompute, limit, None, time.perf_counter() + 20.0, iterate=True)
    data = problem.get_problem_data(cp.CBC)[0]
    A = data[s.A].tocsr()
    b = np.asarray(data[s.B], float)
    cost_vec = np.asarray(data[s.C], float)
    neq = dims_to_solver_dict(data[s.DIMS])[s.EQ_DIM]
    n = A.shape[1]
    row_lb = np.concatenate([b[:neq], np.full(len(b) - neq, -np.inf)])
    col_lb = np.array(data[s.LOWER_BOUNDS], float) if data.get(s.LOWER_BOUNDS) is not None else np.full(n, -np.inf)
    col_ub = np.array(data[s.UPPER_BOUNDS], float) if data.get(s.UPPER_BOUNDS) is not None else np.full(n, np.inf)
    isint = np.zeros(n, bool)
    isint[np.asarray(data[s.BOOL_IDX], int)] = True
    col_lb[isint], col_ub[isint] = np.maximum(col_lb[isint], 0), np.minimum(col_ub[isint], 1)
    cols = data[s.PARAM_PROB].var_id_to_col
    node_of = np.full(n, -1)
    s0, r0 = cols[P.s.id], cols[P.r.id]
    node_of[s0:s0 + P.s.size] = m.group_node[P.s_idx % G]
    node_of[r0:r0 + P.r.size] = P.r_idx % N
    x = np.zeros(n)
    x[s0:s0 + P.s.size], x[r0:r0 + P.r.size] = st[3].ravel()[P.s_idx], st[4].ravel()[P.r_idx]
    lb, ub = col_lb.copy(), col_ub.copy()
    lb[isint] = ub[isint] = x[isint]  # the continuous variables of the start: an LP with it fixed
    eq = np.isfinite(row_lb)
    x = linprog(cost_vec, A_ub=A[~eq], b_ub=b[~eq], A_eq=A[eq] if eq.any() else None,
                b_eq=b[eq] if eq.any() else None, bounds=np.stack([lb, ub], 1), method="highs").x
    x[isint] = np.round(x[isint])
    best = float(cost_vec @ x)
    print(f"start: {best + c.total_time:.5f} s")
    Acsc, rng, t_end, it = A.tocsc(), np.random.default_rng(0), time.perf_counter() + a.seconds, 0
    while time.perf_counter() < t_end:
        it += 1
        free_nodes = np.zeros(N + 1, bool)
        for lo in rng.integers(0, N - a.width + 1, size=a.runs):
            free_nodes[lo:lo + a.width] = True
        freeb = isint & (node_of >= 0) & free_nodes[node_of]
        rows = np.unique(Acsc[:, np.flatnonzero(freeb)].indices)
        touched = np.zeros(n, bool)
        touched[np.unique(A[rows].indices)] = True
        free = np.flatnonzero(freeb | (touched & ~isint))
        rows = np.unique(Acsc[:, free].indices)
        fixed = np.ones(n, bool)
        fixed[free] = False
        sub = A[rows]
        const = sub[:, fixed] @ x[fixed]
        As = sub[:, free].tocsc()
        job = {"lib": library_path(), "n": len(free), "m": len(rows), "indptr": As.indptr, "indices": As.indices,
               "data": As.data, "col_lb": col_lb[free], "col_ub": col_ub[free], "c": cost_vec[free],
               "row_lb": row_lb[rows] - const, "row_ub": b[rows] - const, "ints": np.flatnonzero(isint[free]),
               "params": {"log": "0", "timeMode": "elapsed", "seconds": str(a.sub_seconds)},
               "start_idx": np.flatnonzero(isint[free]), "start_val": x[free][isint[free]], "every_s": 1e9,
               "verbose": False}
        out: list = []
        cbc_worker.run(job, out.append)
        xs = out[-1][1]
        if xs is not None:
            new = x.copy()
            new[free] = xs
            new[isint] = np.round(new[isint])
            ok = max(np.max(A @ new - b), np.max(row_lb - A @ new)) <= 1e-6
            if ok and cost_vec @ new < best - 1e-9:
                x, best = new, float(cost_vec @ new)
    print(f"after {it} sub-ILPs in {a.seconds:g} s: {best + c.total_time:.5f} s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
