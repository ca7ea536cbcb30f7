"""Checkpoint-all: keep every activation, recompute nothing (plain PyTorch; mode ``none``).

A peer of the other solvers (`solver.chen`, `solver.greedy`, `solver.rounding`,
`solver.ilp_peer`): the same signature, compared on the same inputs by `benchmarks/bench_solver.py`.
"""
from __future__ import annotations

from monet.graph import OpGraph
from monet.profiling.costs import CostArrays
from monet.solution import RunInfo, Solution
from monet.solver.deadline import Deadline
from monet.solver.ilp import InfeasibleBudgetError
from monet.solver.finish import finish_solution, keep_all_matrices


def solve_checkpoint_all(graph: OpGraph, costs: CostArrays, budget: int, *, deadline: Deadline,
                         info: RunInfo | dict | None = None, **_) -> Solution:
    """Plain PyTorch's schedule: every forward node's outputs kept in every backward stage.

    Its objective is the plain iteration time (``costs.total_time``, seconds), its peak the
    simulator's plain-PyTorch peak (bytes).  Needs no time: ``deadline`` is only read for the
    solve time reported.  Other options (for the common signature) are ignored.

    Raises:
        InfeasibleBudgetError: the plain peak exceeds ``budget`` bytes (named as the smallest
            budget of this schedule): lower the memory with a solver that recomputes.
    """
    S, R = keep_all_matrices(graph)
    const = costs.total_time
    sol = finish_solution(graph, costs, S, R, budget=budget, mode="none", status="optimal", solver="none",
                          objective_s=const, bound_s=const, gap=0.0, solve_time_s=deadline.elapsed(),
                          info=info, check=False)
    if sol.meta.predicted_peak_bytes > budget:
        raise InfeasibleBudgetError(budget, sol.meta.predicted_peak_bytes, "none")
    return sol
