"""LP rounding and repair as a solver peer: `solve_rounding`.

The LP relaxation of the time-minimising ILP (`solver.relaxation.lp_relaxation`) gives a lower bound and
a fractional keep matrix; `solver.repair.round_and_repair` rounds it at several thresholds (and
tries Chen-style checkpoint sets), repairs each into a valid schedule, and keeps the cheapest that
fits (the LP relaxation serves for a bound and for rounding).
"""
from __future__ import annotations

import time

from monet.graph import OpGraph
from monet.profiling.costs import CostArrays
from monet.solution import RunInfo, Solution
from monet.solver.deadline import Deadline
from monet.solver.formulation import allowed
from monet.solver.ilp import InfeasibleBudgetError
from monet.solver.relaxation import lp_relaxation
from monet.solver.repair import round_and_repair
from monet.solver.finish import finish_solution, memory_model, simulated_peak_fn


def solve_rounding(graph: OpGraph, costs: CostArrays, budget: int, *, deadline: Deadline,
                 info: RunInfo | dict | None = None,
                   **_) -> Solution:
    """The cheapest repaired rounding of the LP relaxation at ``budget`` bytes (status
    "heuristic", solver "lp-rounding").  The LP gets the seconds ``deadline`` has left (at least
    1 s, HiGHS's time limit); without an answer in time only the checkpoint sets are repaired.

    A candidate fits when the ILP's memory does, or else the simulator's peak (`round_and_repair`).
    The objective (seconds) is plain PyTorch's time plus the recomputation; the bound is the LP's
    optimum plus that time, reported when the schedule is not below it (a schedule the simulator
    fits but the ILP's memory does not may be).  Other options (for the common signature) are
    ignored.

    Raises:
        InfeasibleBudgetError: no repaired candidate fits the budget (no smallest budget is
            searched: `solver.smallest.min_budget` does).
    """
    t0 = time.perf_counter()
    mem = memory_model(graph, costs)
    lp, frac_s, _ = lp_relaxation(graph, mem, costs.fwd_recompute, float(budget), "normal", max(1.0, deadline.left()))
    found = round_and_repair(graph, mem, frac_s, allowed(mem)[2], float(budget), costs.fwd_recompute,
                             simulated_peak_fn(graph, costs, mem))
    if found is None:
        raise InfeasibleBudgetError(budget, None, "normal (LP rounding and repair: no repaired candidate fits)")
    S, R, cost = found
    objective = costs.total_time + cost
    bound = None if lp is None or costs.total_time + lp > objective else costs.total_time + lp
    return finish_solution(graph, costs, mem.group_to_node(S), R, budget=budget, mode="normal", status="heuristic",
                           solver="lp-rounding", objective_s=objective, bound_s=bound,
                           gap=None if bound is None else max(0.0, 1 - bound / objective) if objective > 0 else 0.0,
                           solve_time_s=time.perf_counter() - t0, info=info)
