"""The solve pipeline's entry point: graph + costs + budget -> `Solution` (schedule, matrices, metadata).

`solve` picks the solver of a mode; every solver is a peer with one signature,
``solve_x(graph, costs, budget, *, deadline, ...) -> Solution`` (docs/design.md, "Shape of the code"),
one file each, compared on the same inputs by `benchmarks/bench_solver.py --peers`:

* `solver.checkpoint_all.solve_checkpoint_all`: keep everything, recompute nothing (plain PyTorch);
* `solver.chen.solve_chen`: Chen et al. 2016's sqrt(n) checkpoints;
* `solver.greedy.solve_greedy`: the greedy that drops values where memory is short;
* `solver.rounding.solve_rounding`: the LP relaxation, rounded and repaired;
* `solver.ilp_peer.solve_normal`: MONeT's ILP, recompute-or-store (`monet.solver.ilp`);
* `solver.portfolio.solve_full`: the ILP choosing operator implementations too (MONeT's other
  modes), a portfolio of solves under one deadline with its policy in one table.

``offload_bandwidth`` (bytes/s) makes offload to host memory a third choice of the normal-mode ILP
(`monet.solver.offload`; off by default and on CPU).  The names other modules import from here
(`eager_peak`, `memory_model`, `full_model`, `min_budget`, ...) are re-exported from the modules
that hold them.
"""
from __future__ import annotations

import dataclasses


from monet.graph import OpGraph
from monet.impls import MODES, mode_tokens
from monet.profiling.costs import CostArrays
from monet.matrices import schedule_from_matrices
from monet.solution import RunInfo, Solution
from monet.solver.budget import parse_budget  # noqa: F401 (monet.solver.solve's name)
from monet.solver.checkpoint_all import solve_checkpoint_all
from monet.solver.chen import solve_chen
from monet.solver.choices import (analytic_cost_fn, chosen_graph, fixed_time, full_model, lean_impls,  # noqa: F401
                                  no_recompute_bound)
from monet.solver.deadline import Deadline
from monet.solver.greedy import solve_greedy
from monet.solver.ilp import InfeasibleBudgetError
from monet.solver.ilp_peer import solve_normal
from monet.solver.offload import check_offload
from monet.solver.portfolio import solve_full
from monet.solver.rounding import solve_rounding
from monet.solver.finish import eager_peak, keep_all_matrices, memory_model  # noqa: F401
from monet.solver.smallest import (DESCENT_SHARE, KNEE_PRICE, _smallest, frontier, knee, min_budget, min_budget_lower, searched,  # noqa: F401
                                   smallest_schedule)

# The normal-mode peers by name, for comparisons on the same inputs (`benchmarks/bench_solver.py
# --peers`): each ``solve_x(graph, costs, budget, *, deadline, info=None, ...) -> Solution``,
# raising `InfeasibleBudgetError` when nothing it finds fits.
PEERS = {"checkpoint_all": solve_checkpoint_all, "chen": solve_chen, "greedy": solve_greedy,
         "rounding": solve_rounding, "ilp": solve_normal}

def same_kernels_solution(graph: OpGraph, costs: CostArrays, sol: Solution, device: str = "cpu",
                          cost_fn=None) -> Solution:
    """A keep-everything solution (no recomputation) with ``sol``'s operator implementations: the
    reference that tells the schedule's effect on gradients (none: bitwise on CPU) from the
    implementations' (other arithmetic, e.g. PyTorch's native convolution instead of oneDNN's).

    ``graph``/``costs`` are the captured graph and its costs that ``sol`` was solved from (with
    ``device`` and ``cost_fn`` as for `solve`); its meta is ``sol``'s, with mode "none".
    """
    impls = dict(sol.schedule.impl)
    if impls:
        options, _ = full_model(graph, costs, sol.meta.mode, device, cost_fn)
        graph, costs = chosen_graph(graph, costs, options, impls)
    S, R = keep_all_matrices(graph)
    schedule = schedule_from_matrices(graph, S, R)
    schedule.impl = dict(graph.impls)
    meta = dataclasses.replace(sol.meta, mode="none", status="optimal", objective_s=sol.meta.eager_time_s or 0.0)
    return Solution(schedule=schedule, S=S, R=R, meta=meta)


#: of a solve at the smallest feasible budget (``budget`` None) without a search kept from before,
#: the share of the time limit the search gets; the time-minimising solve at the budget it found
#: gets the rest
SEARCH_SHARE = 0.5


def solve(graph: OpGraph, costs: CostArrays, budget: int | None, mode: str = "normal", *,
          solver: str = "CBC", time_limit: float = 60.0, info: RunInfo | dict | None = None,
          verbose: bool = False, device: str = "cpu", cost_fn=None, progress=None, gap: float = 0.0,
          offload_bandwidth: float | None = None, deadline: Deadline | None = None, knee_min: bool = True) -> Solution:
    """Solve at ``budget`` bytes, or when ``budget`` is None at the smallest budget found whose
    recomputation is worth it: in normal mode the `monet.solver.smallest.knee` of the schedules
    near the smallest feasible budget (followed down while one percent of plain PyTorch's peak less
    costs at most `KNEE_PRICE` points of overhead), in the other modes the smallest feasible
    budget itself.

    One deadline covers the whole call: the smallest-budget search, the solve at the budget and
    the fallback to the search's schedule share it, so the call returns within ``time_limit``
    (give or take the seconds a step cannot be stopped in: CBC is stopped 2 s after its share,
    and each full-mode step gets at least 1 s; in normal mode, an ILP that finds nothing at the
    budget leaves the smallest-budget search at least `SEARCH_SHARE` of the limit, so that its
    answer or error names a budget the search had time to find).  The smallest-budget search is kept on ``graph``
    (`monet.solver.smallest`): a call at ``budget`` None after one that found the budget
    infeasible (or after another such call) returns the schedule it kept at once.

    Args:
        mode: "none", "normal" or MONeT's mode strings (`monet.impls.MODES`; "full" = all).
        device: the device type the implementations are for ("cpu" or "cuda").
        cost_fn: costs of variant graphs (`solver.choices.implementation_options`); default analytic.
        time_limit: seconds of wall clock for the whole call (ignored when ``deadline`` is given).
            At ``budget`` None, with no search kept, `SEARCH_SHARE` of it for the search and the
            rest for the time-minimising solve at the budget found.
        deadline: the `Deadline` the call shares with its caller (`monet.plan.Plan.solve`), or None.
        gap: stop once the schedule is proven within this fraction of the best bound (0: optimal).
        knee_min: at ``budget`` None, solve at the knee (above); False: at the smallest feasible
            budget found itself (``if_infeasible="smallest"``).
        progress: ``progress(str)``, lines on the solve as it goes (incumbent, bound).
        offload_bandwidth: bytes per second (each direction) of host<->device copies: a kept
            value may then be offloaded to host memory (`solver.offload`; normal mode only).
            None or 0 (the default, and the CPU setting): no offload.  See
            `monet.solver.offload.DEFAULT_BANDWIDTHS` and
            `monet.profiling.bandwidth.measure_host_bandwidth`.

    Raises:
        ValueError: unknown mode; offload with a mode other than normal.
        TypeError: ``info`` with a key that is no field of `monet.solution.RunInfo`.
        InfeasibleBudgetError: the budget is below the smallest feasible one (named in the message).
    """
    info = RunInfo.of(info)  # one typed record from here on
    mode = MODES[-1] if mode == "full" else mode
    mode_tokens(mode)  # validates
    check_offload(mode, offload_bandwidth)
    deadline = deadline if deadline is not None else Deadline(time_limit)
    ref = dict(eager=None, eager_time=None)
    if budget is None and mode != "none":
        kept = searched(graph, costs, mode, solver, device, cost_fn, offload_bandwidth) and not offload_bandwidth
        least, _ = min_budget(graph, costs, mode, solver, 0.0 if kept else deadline.share(SEARCH_SHARE), device,
                              cost_fn, offload_bandwidth=offload_bandwidth)
        budget = least
        if knee_min and mode == "normal" and not offload_bandwidth:
            # the smallest budget worth its recomputation (`knee`), not the last MiB at any price
            R_least = _smallest(graph, costs, mode, solver, 0.0, device, cost_fn)[5]
            budget, note = knee(frontier(graph, costs, least, R_least), costs.plain_time,
                               eager_peak(graph, costs))
            if note and progress is not None:
                progress("  " + note)
        if kept and budget == least:
            # kept from an earlier call (one that found its budget infeasible): its schedule, with
            # what the time limit leaves, or at least DESCENT_SHARE of it, for a descent from it
            # (`solver.smallest.descended`)
            if progress is not None:
                progress(f"  the smallest feasible budget found before: {least} bytes; its schedule")
            return smallest_schedule(graph, costs, least, info, mode, solver,
                                     max(deadline.left(), DESCENT_SHARE * deadline.limit_s), device, cost_fn, ref)
    elif budget is None:
        budget = eager_peak(graph, costs)
    if mode == "none":
        return solve_checkpoint_all(graph, costs, int(budget), deadline=deadline, info=info)
    if mode == "normal":
        if offload_bandwidth:  # the smallest-budget search's schedule does not carry its offloads
            return solve_normal(graph, costs, int(budget), deadline=deadline, info=info, solver=solver,
                                verbose=verbose, gap=gap, progress=progress, offload_bandwidth=offload_bandwidth)
        try:
            return solve_normal(graph, costs, int(budget), deadline=deadline, info=info, solver=solver,
                                verbose=verbose, gap=gap, progress=progress, smallest=False)
        except InfeasibleBudgetError:
            # the smallest-budget search's schedule if it fits, else its error: the search is cached
            # on the graph, so a retry at the budget the error names gets that schedule, even where a
            # second time-limited search would stop at a larger budget (as on loaded machines)
            # the search gets at least `SEARCH_SHARE` of the limit even past the deadline: with the
            # seconds the ILP left (often none) it stops at plain PyTorch's peak and the error would
            # name that as the smallest budget
            seconds = max(deadline.left(), SEARCH_SHARE * deadline.limit_s)
            return smallest_schedule(graph, costs, int(budget), info, mode, solver, seconds, device, cost_fn, ref)
    return solve_full(graph, costs, int(budget), info, mode=mode, solver=solver, time_limit=deadline.left(),
                      verbose=verbose, device=device, cost_fn=cost_fn, progress=progress, gap=gap)
