"""Measures *production cuts* in the LP relaxation (`solver.ilp.lp_relaxation`'s problem) at the
solver benchmark's configurations: how much they raise the bound of the joint ILP and of the ILP
with the implementations fixed, and what they cost in LP time.

    python -m monet.profiling.bench_relaxation [--models resnet50,unet] [--budgets 50,33] [--sets joint,lean,rounded]

The cuts (valid for every integer schedule): with E[b, i] = "forward node i was recomputed in a
stage before b" (E[b, i] <= E[b-1, i] + R[b-1, i], E <= 1, E[0] = 0),

* E[b, j] <= S[0, g] + E[b, i] for every forward edge (group g of node i read by node j): j was
  recomputed before b only if its input was there then, kept from the forward pass or recomputed;
* S[b, g] <= S[0, g] + E[b, node(g)]: a value held at stage b was kept from the forward pass or
  recomputed before b.

They cut off the relaxation's "accumulation": recompute a node a fiftieth at a time in fifty
stages from a fiftieth of its input held throughout (one recomputation's time, a fiftieth of its
input's memory).  Sets: ``joint`` (implementations chosen), ``lean`` (`lean_impls` with
``cheap=True``), ``rounded`` (the joint relaxation's implementations, rounded).
"""
from __future__ import annotations

import argparse
import time

import cvxpy as cp
import numpy as np
import scipy.sparse as sp


def production_cuts(P, graph, mem) -> list:
    """The cuts of the module docstring on the variables of ``P`` (a relaxed `solver.ilp._Problem`)."""
    N, T, G = len(graph.fwd), len(graph.bwd), len(mem.groups)
    TN, TG = T * N, T * G

    def sel(idx, width):
        return sp.csr_matrix((np.ones(len(idx)), (np.arange(len(idx)), idx)), shape=(len(idx), width))

    Rf = sp.csr_matrix((np.ones(len(P.r_idx)), (P.r_idx, np.arange(len(P.r_idx)))), shape=(TN, len(P.r_idx))) @ P.r
    Sf = sp.csr_matrix((np.ones(len(P.s_idx)), (P.s_idx, np.arange(len(P.s_idx)))), shape=(TG, len(P.s_idx))) @ P.s
    E = cp.Variable(TN, bounds=[0, 1], name="E")
    cons = [E[np.arange(N)] == 0]
    bb, ii = (a.ravel() for a in np.meshgrid(np.arange(1, T), np.arange(N), indexing="ij"))
    cons.append(sel(bb * N + ii, TN) @ E <= sel((bb - 1) * N + ii, TN) @ E + sel((bb - 1) * N + ii, TN) @ Rf)
    edges = sorted({(mem.group_of[v], n.id) for n in graph.fwd for v in n.reads})
    eg, ej = np.array([e[0] for e in edges]), np.array([e[1] for e in edges])
    bb, kk = (a.ravel() for a in np.meshgrid(np.arange(1, T), np.arange(len(edges)), indexing="ij"))
    cons.append(sel(bb * N + ej[kk], TN) @ E <= sel(eg[kk], TG) @ Sf + sel(bb * N + mem.group_node[eg[kk]], TN) @ E)
    tt, gg = np.nonzero(P.allow_s[1:])
    cons.append(sel((tt + 1) * G + gg, TG) @ Sf <= sel(gg, TG) @ Sf + sel((tt + 1) * N + mem.group_node[gg], TN) @ E)
    return cons


def main(argv=None) -> int:
    from monet.profiling.bench_solver import CONFIGS, MODE, _graph_and_costs
    from monet.solver.choices import chosen_graph
    from monet.solver.ilp import _Problem, _solve_lp
    from monet.solver.solve import _round_options, eager_peak, fixed_time, full_model, lean_impls, memory_model

    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--models", default="resnet50,unet")
    p.add_argument("--budgets", default="50,33")
    p.add_argument("--sets", default="joint,lean,rounded")
    a = p.parse_args(argv)
    print("| model | budget | implementations | LP s | LP time s | with cuts s | with cuts time s | fractional choices |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- |")
    for name in a.models.split(","):
        graph, costs, _, cost_fn = _graph_and_costs(name, CONFIGS[name])
        eager = eager_peak(graph, costs)
        options, mem = full_model(graph, costs, MODE, "cuda", cost_fn)
        for pct in map(float, a.budgets.split(",")):
            budget = float(int(eager * pct / 100))
            M = None
            for which in a.sets.split(","):
                if which == "joint":
                    g, m, mode, const = graph, mem, MODE, fixed_time(graph, costs, options)
                    rec = costs.fwd_recompute
                else:
                    if which == "rounded" and M is None:
                        continue
                    impls = lean_impls(options, cheap=True) if which == "lean" else _round_options(options, M)
                    g, c = chosen_graph(graph, costs, options, impls)
                    m, mode, const, rec = memory_model(g, c), "normal", c.total_time, c.fwd_recompute
                cells, frac = [], "-"
                for cuts in (False, True):
                    P = _Problem(g, m, rec, mode, relax=True, recompute_rows=False)
                    extra = production_cuts(P, g, m) if cuts else []
                    lp = cp.Problem(cp.Minimize(P.time_objective()), P.cons + P.memory_constraints(budget) + extra)
                    t0 = time.perf_counter()
                    ok = _solve_lp(lp, 900.0)
                    cells += [f"{lp.value + const:.4f}" if ok else "-", f"{time.perf_counter() - t0:.1f}"]
                    if ok and P.m is not None:
                        vals = np.asarray(P.m.value)
                        n_frac = sum(vals[opts].max() < 0.99 for opts in m.choices)
                        frac = (f"{n_frac} of {len(m.choices)}" if not cuts else frac + f" / {n_frac}")
                        if not cuts:
                            M = vals
                print(f"| {name} | {pct:g} % | {which} | {' | '.join(cells)} | {frac} |", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
