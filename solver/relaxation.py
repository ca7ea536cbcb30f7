"""The LP relaxations of the ILP (`solver.formulation.Problem` with continuous variables): the
bound and fractional keeps at a budget (`lp_relaxation`), the bound on the smallest budget
(`min_budget_relaxation`), solved with HiGHS through scipy, in a thread when asked."""
from __future__ import annotations

import time
from concurrent.futures import Future, ThreadPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout

import cvxpy as cp
import numpy as np

from monet.graph import OpGraph
from monet.solver.formulation import LARGE, Problem
from monet.solver.memory_model import MemoryModel


def lp_relaxation(graph: OpGraph, mem: MemoryModel, recompute_s: np.ndarray, budget: float, mode: str,
                  time_limit: float) -> tuple[float | None, np.ndarray | None, np.ndarray | None]:
    """The LP relaxation at ``budget`` bytes: (optimal recomputation time in seconds, a lower bound
    on the ILP's optimum; fractional S (T, G); fractional M (O,) or None without options), or
    (None, None, None) if it has no solution in time.

    Solved with HiGHS's dual simplex through scipy (`cp.SCIPY`; scipy comes with cvxpy), which
    needs no extra package, where CBC's own LP takes twice as long (HiGHS's interior point
    method: 93 s, its PDLP: no answer in 120 s).  The memory rows per recomputed node are left
    out (``recompute_rows``): a weaker relaxation in principle, but on ResNet-50 at batch 184 its
    bound was the same at 70 / 50 / 33 % of the plain peak (0.6249 / 0.6336 / 0.6411 s) in 12 /
    17 / 27 s instead of 22 / 44 / 58 s.  scipy's HiGHS releases the GIL: `solve_ilp` and
    `solver.portfolio.solve_full` run it in a thread next to the local search at full scale.
    """
    P = Problem(mem, recompute_s, mode, relax=True, recompute_rows=False)
    relaxed = cp.Problem(cp.Minimize(P.time_objective()), P.cons + P.memory_constraints(float(budget)))
    if not _solve_lp(relaxed, time_limit):
        return None, None, None
    frac_m = None if P.m is None or P.m.value is None else np.clip(np.asarray(P.m.value, dtype=float), 0, 1)
    return float(relaxed.value), P.fractional_s(), frac_m


def min_budget_relaxation(graph: OpGraph, mem: MemoryModel, mode: str = "normal",
                          time_limit: float = 60.0) -> tuple[float | None, np.ndarray | None]:
    """A lower bound (bytes) on the smallest budget any schedule fits in the ILP's memory model:
    the LP relaxation of `solve_min_budget`'s ILP, with the memory rows per recomputed node left
    out as in `lp_relaxation` (a weaker relaxation, so still a bound), and its fractional S (T, G)
    (rounded by `solver.repair` into candidates); (None, None) if HiGHS gives no answer within
    ``time_limit`` seconds.

    The ILP's memory is an upper bound of the simulator's (within about 1 %), so a schedule the
    simulator fits may sit slightly below it: VGG-16 at batch 176 has 56.96 % of its plain peak
    here (0.2 s) and a schedule simulated at 56.94 %.  Budgets below the bound are infeasible in
    the model; a schedule found at or below it is the model's smallest.
    """
    P = Problem(mem, np.zeros(len(graph.fwd)), mode, relax=True, recompute_rows=False)
    b = P.budget_var
    relaxed = cp.Problem(cp.Minimize(b), P.cons + P.memory_constraints(b))
    if not _solve_lp(relaxed, time_limit):
        return None, None
    return float(relaxed.value) * P.scale, P.fractional_s()


def _solve_lp(relaxed: cp.Problem, time_limit: float) -> bool:
    """Solve an LP relaxation with HiGHS through scipy (see `lp_relaxation` for why); True when it
    has an optimal value within ``time_limit`` seconds, or at all for an LP of at most `LARGE`
    variables, whatever ``time_limit`` (docs/design.md, "Note [Small problems are solved whole]")."""
    options = {"method": "highs"}
    if sum(v.size for v in relaxed.variables()) > LARGE:
        options["time_limit"] = float(time_limit)
    try:
        relaxed.solve(solver=cp.SCIPY, scipy_options=options)
    except cp.error.SolverError:
        return False
    return relaxed.status in (cp.OPTIMAL, cp.OPTIMAL_INACCURATE) and relaxed.value is not None


def relaxation_in_background(graph: OpGraph, mem: MemoryModel, recompute_s: np.ndarray, budget: float, mode: str,
                             time_limit: float) -> Future:
    """`lp_relaxation` started in a thread (HiGHS releases the GIL, so it uses a second core while
    the caller searches); read it with `relaxation_result`."""
    pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="monet-lp")
    future = pool.submit(lp_relaxation, graph, mem, recompute_s, budget, mode, max(1.0, time_limit))
    pool.shutdown(wait=False)
    return future


def relaxation_result(future: Future, deadline: float, grace: float = 2.0):
    """The result of `relaxation_in_background`, waiting until ``deadline`` (a `time.perf_counter`
    value) at most (``grace`` seconds after it, for the LP's own time limit to stop it): (None,
    None, None) if it has no answer by then."""
    try:
        return future.result(timeout=max(0.0, deadline - time.perf_counter()) + grace)
    except FutureTimeout:
        return None, None, None
