"""How far a long branch and bound moves the bound: HiGHS's MIP (highspy, one thread) on the ILP
of a configuration (the joint one, or with implementations fixed), optionally with the production
cuts of `profiling.bench_relaxation`, started from `solver.ilp._start`'s schedule (20 s) on the
cheap memory-lean implementations; prints HiGHS's log (bound and incumbent over time).

    python -m monet.profiling.bench_bounds [--model unet] [--budget 40] [--set joint|lean|bn] [--cuts] [--seconds 300]

``bn``: the lean implementations with BatchNorm's output-activated backward everywhere.
"""
from __future__ import annotations

import argparse
import time

import cvxpy as cp
import cvxpy.settings as s
import numpy as np


def main(argv=None) -> int:
    import highspy
    from cvxpy.reductions.solvers.conic_solvers.conic_solver import dims_to_solver_dict

    from monet.profiling.bench_relaxation import production_cuts
    from monet.profiling.bench_solver import CONFIGS, MODE, _graph_and_costs
    from monet.solver.choices import chosen_graph
    from monet.solver.ilp import _Problem, _start
    from monet.solver.solve import eager_peak, fixed_time, full_model, lean_impls, memory_model

    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default="unet")
    p.add_argument("--budget", type=float, default=40.0)
    p.add_argument("--set", choices=["joint", "lean", "bn"], default="joint")
    p.add_argument("--cuts", action="store_true")
    p.add_argument("--seconds", type=float, default=300.0)
    a = p.parse_args(argv)
    graph, costs, _, cost_fn = _graph_and_costs(a.model, CONFIGS[a.model])
    eager = eager_peak(graph, costs)
    options, mem = full_model(graph, costs, MODE, "cuda", cost_fn)
    impls = lean_impls(options, cheap=True)
    if a.set == "bn":
        impls.update({o.key: o.impl for o in options if o.impl == "batchnorm.output_activated"})
    gl, cl = chosen_graph(graph, costs, options, impls)
    ml = memory_model(gl, cl)
    Pl = _Problem(gl, ml, cl.fwd_recompute, "normal")
    budget = int(eager * a.budget / 100)
    st = _start(Pl, gl, ml, cl.fwd_recompute, budget - 1e-6 * Pl.scale, None, time.perf_counter() + 20, iterate=True)
    if a.set == "joint":
        g, m, mode, const, rec = graph, mem, MODE, fixed_time(graph, costs, options), costs.fwd_recompute
        S = np.zeros((len(graph.bwd), len(mem.groups)))  # the start's groups in the joint model
        index = {k: i for i, k in enumerate(mem.groups)}
        for gf, (i, slot) in enumerate(ml.groups):
            gj = index.get((i, slot), index.get((i, slot, impls.get(f"fwd:{i}", "default"))))
            S[:, gj] = np.maximum(S[:, gj], st[3][:, gf])
        M = np.array([float(o.impl == impls.get(o.key, "default")) for o in options])
    else:
        g, m, mode, const, rec, S, M = gl, ml, "normal", cl.total_time, cl.fwd_recompute, st[3], None
    P = _Problem(g, m, rec, mode)
    cons = P.cons + P.memory_constraints(budget - 1e-6 * P.scale)
    if a.cuts:
        cons += production_cuts(P, g, m)
    data = cp.Problem(cp.Minimize(P.time_objective()), cons).get_problem_data(cp.CBC)[0]
    A = data[s.A].tocsc()
    b = np.asarray(data[s.B], float)
    n = A.shape[1]
    neq = dims_to_solver_dict(data[s.DIMS])[s.EQ_DIM]
    lp = highspy.HighsLp()
    lp.num_col_, lp.num_row_ = n, A.shape[0]
    lp.col_cost_ = np.asarray(data[s.C], float)
    lp.col_lower_ = np.array(data[s.LOWER_BOUNDS], float) if data.get(s.LOWER_BOUNDS) is not None else np.full(n, -np.inf)
    lp.col_upper_ = np.array(data[s.UPPER_BOUNDS], float) if data.get(s.UPPER_BOUNDS) is not None else np.full(n, np.inf)
    lp.row_lower_ = np.concatenate([b[:neq], np.full(len(b) - neq, -np.inf)])
    lp.row_upper_ = b
    lp.a_matrix_.format_ = highspy.MatrixFormat.kColwise
    lp.a_matrix_.start_, lp.a_matrix_.index_, lp.a_matrix_.value_ = A.indptr, A.indices, A.data
    ints = set(np.asarray(data[s.BOOL_IDX], int).tolist())
    lp.integrality_ = [highspy.HighsVarType.kInteger if j in ints else highspy.HighsVarType.kContinuous for j in range(n)]
    lp.offset_ = float(np.ravel(data.get(s.OFFSET, 0.0))[0]) + const
    for j in ints:
        lp.col_lower_[j], lp.col_upper_[j] = max(lp.col_lower_[j], 0), min(lp.col_upper_[j], 1)
    h = highspy.Highs()
    h.passModel(lp)
    for k, v in (("time_limit", a.seconds), ("threads", 1), ("mip_rel_gap", 0.002)):
        h.setOptionValue(k, v)
    cols = data[s.PARAM_PROB].var_id_to_col
    x = np.zeros(n)
    x[cols[P.s.id]:cols[P.s.id] + P.s.size] = S.ravel()[P.s_idx]
    x[cols[P.r.id]:cols[P.r.id] + P.r.size] = st[4].ravel()[P.r_idx]
    if M is not None:
        x[cols[P.m.id]:cols[P.m.id] + P.m.size] = M
    sol = highspy.HighsSolution()
    sol.col_value, sol.value_valid = list(x), True
    h.setSolution(sol)  # HiGHS completes the continuous variables with an LP
    print(f"start (lean implementations): {st[1] + cl.total_time:.5f} s", flush=True)
    h.run()
    info = h.getInfo()
    print(f"after {a.seconds:g} s: incumbent {info.objective_function_value:.5f} s, bound {info.mip_dual_bound:.5f} s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
