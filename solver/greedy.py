"""The greedy alone as a solver peer: `solve_greedy`.

`solver.repair.drop_greedily` builds a schedule from keep-everything by dropping values where
memory is over the budget (the rematerialisation greedy of Chen et al. 2016, Sec. 4, and Kirisame
et al. 2021's cost per byte, on MONeT's stages); `solver.repair.improve`'s greedy descent then
recomputes less while memory allows, until the deadline.  The ILP (`solver.ilp_peer`) starts from
this schedule among others, so its objective is at most this one's.
"""
from __future__ import annotations

import time

from monet.graph import OpGraph
from monet.profiling.costs import CostArrays
from monet.solution import RunInfo, Solution
from monet.solver.deadline import Deadline
from monet.solver.formulation import allowed
from monet.solver.ilp import InfeasibleBudgetError
from monet.solver.repair import drop_greedily, improve
from monet.solver.finish import finish_solution, memory_model


def solve_greedy(graph: OpGraph, costs: CostArrays, budget: int, *, deadline: Deadline,
                 info: RunInfo | dict | None = None,
                 descend: bool = True, **_) -> Solution:
    """The greedy schedule at ``budget`` bytes (status "heuristic", solver "greedy"), improved by
    the greedy descent of `solver.repair.improve` (with ``descend``) until ``deadline``.

    Memory is the ILP's (`solver.memory_model.MemoryModel`, an upper bound of the simulator's),
    so the simulated peak fits.  The objective (seconds) is plain PyTorch's time plus the
    recomputation.  Other options (for the common signature) are ignored.

    Raises:
        InfeasibleBudgetError: dropping values did not bring the peak within the budget, or the
            deadline passed before it did (the message says which budget; no smallest budget
            is searched: `solver.smallest.min_budget` does).
    """
    t0 = time.perf_counter()
    mem = memory_model(graph, costs)
    allow_s = allowed(mem)[2]
    found = drop_greedily(graph, mem, allow_s, float(budget), costs.fwd_recompute, deadline.end)
    if found is None:
        why = "stopped by its deadline" if deadline.expired() else "no value left to drop"
        raise InfeasibleBudgetError(budget, None, f"normal (the greedy: {why})")
    S, R, cost = found
    if descend:
        S, R, cost = improve(graph, mem, S, R, float(budget), costs.fwd_recompute, allow_s, deadline.end)
    return finish_solution(graph, costs, mem.group_to_node(S), R, budget=budget, mode="normal", status="heuristic",
                           solver="greedy", objective_s=costs.total_time + cost, bound_s=None, gap=None,
                           solve_time_s=time.perf_counter() - t0, info=info)
