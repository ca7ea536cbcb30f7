"""MONeT's ILP in recompute-or-store mode (normal mode) as a solver peer: `solve_normal`.

The time-minimising ILP of `solver.ilp.solve_ilp` (LP relaxation, repaired and greedy starts,
local search, CBC) on a graph whose implementations are fixed, wrapped to the peers' signature
``solve_x(graph, costs, budget, *, deadline, ...) -> Solution`` (docs/design.md, "Shape of the code").
``offload_bandwidth`` (bytes/s) makes offload to host memory a third choice (`solver.offload`).
"""
from __future__ import annotations

import time

from monet.graph import OpGraph
from monet.profiling.costs import CostArrays
from monet.solution import RunInfo, Solution
from monet.solver.deadline import Deadline
from monet.solver.formulation import LARGE
from monet.solver.ilp import InfeasibleBudgetError, problem_size, solve_ilp
from monet.solver.memory_model import MemoryModel
from monet.solver.finish import finish_solution, memory_model, simulated_peak_fn, simulation_seconds

#: the simulations of its schedule a solve keeps time for, in units of `simulation_seconds`
SIMULATION_MARGIN = 1.5


def solve_normal(graph: OpGraph, costs: CostArrays, budget: int, *, deadline: Deadline,
                 info: RunInfo | dict | None = None,
                 solver: str = "CBC", verbose: bool = False, mode: str = "normal",
                 eager: int | None = None, eager_time: float | None = None,
                 gap: float = 0.0, progress=None, relaxation: bool = True, smallest: bool = True,
                 offload_bandwidth: float | None = None) -> Solution:
    """MONeT's ILP in recompute-or-store mode at ``budget`` bytes, in the seconds ``deadline`` has
    left (`monet.solver.ilp.solve_ilp`, same errors and ``relaxation``); with
    ``offload_bandwidth`` (bytes/s) offload to host memory is a third choice (`solver.offload`).

    ``graph`` may carry implementations already (``graph.impls``, fixed by
    `solver.portfolio.solve_full`); ``mode`` is the label stored in the solution.  The other options are `solve_ilp`'s.
    """
    t0 = time.perf_counter()
    mem = memory_model(graph, costs, offload_bandwidth)
    # what is left once the memory model is built, less the simulation of the schedule found
    # (checked against the budget, then kept for `finish_solution`): 5 s each on a 96-layer GPT-2
    time_limit = max(1.0, deadline.left() - SIMULATION_MARGIN * simulation_seconds(graph))
    const = costs.total_time
    kw = dict(mode="normal", solver=solver, constant_s=const, verbose=verbose,
              peak_of=simulated_peak_fn(graph, costs, mem), gap=gap, progress=progress,
              relaxation=relaxation)
    if mem.offload is not None and problem_size(graph, mem, costs.fwd_recompute, "normal")[0] > LARGE:
        res = _solve_offload_policies(graph, mem, costs, budget, time_limit, smallest, kw)
    else:
        res = solve_ilp(graph, mem, costs.fwd_recompute, budget, time_limit=time_limit, smallest=smallest, **kw)
    entries = () if res.O is None else mem.offload.entries(res.O)
    return finish_solution(graph, costs, res.S, res.R, budget=budget, mode=mode, status=res.status,
                           solver=res.solver, objective_s=res.objective_s, bound_s=res.bound_s, gap=res.gap,
                           solve_time_s=time.perf_counter() - t0, info=info, eager=eager,
                           eager_time=eager_time, offload=entries, offload_bandwidth=offload_bandwidth)


def _solve_offload_policies(graph: OpGraph, mem: MemoryModel, costs: CostArrays, budget: int, time_limit: float,
                            smallest: bool, kw: dict):
    """Above `LARGE` variables no MIP solver runs and the local search (`solver.repair.improve`),
    which sees memory but not transfer time, finds the schedule: it is run with two offload
    policies (`solver.offload`), on half of the time each, and the faster schedule (transfer time
    included) is returned: the copies that compute hides completely
    (`OffloadModel.hidden_policy`; two thirds of the time: at budgets where it fits, it competes
    with the recompute-only search, whose schedules it contains), then every candidate.

    Raises:
        InfeasibleBudgetError: nothing fits with every candidate offloadable.
    """
    full = mem.offload
    best = None
    policies, weights = [full.hidden_policy(), full.candidate], [2.0, 1.0]
    t_end = time.perf_counter() + time_limit
    try:
        for k, allowed in enumerate(policies):
            mem.offload = full.with_allowed(allowed)
            last = k == len(policies) - 1
            share = max(1.0, (t_end - time.perf_counter()) * weights[k] / sum(weights[k:]))
            try:
                res = solve_ilp(graph, mem, costs.fwd_recompute, budget, time_limit=share,
                                smallest=smallest and last and best is None, **kw)
            except InfeasibleBudgetError:
                if last and best is None:
                    raise
                continue
            if best is None or res.objective_s < best[0].objective_s:
                best = (res, mem.offload)
    finally:
        mem.offload = full if best is None else best[1]
    return best[0]


