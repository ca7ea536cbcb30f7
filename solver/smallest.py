"""The smallest-budget search: the smallest budget (bytes) a schedule fits, and that schedule.

`min_budget` answers `monet solve --min-budget`; `smallest_schedule` is the fallback of a solve
that finds nothing at its budget (`solver.solve.solve`, `solver.portfolio.solve_full`).  The
search is cached on the graph, so a retry at the budget an `InfeasibleBudgetError` names gets the
very schedule the search found.
"""
from __future__ import annotations

import time

import numpy as np

from monet.graph import OpGraph
from monet.impls import mode_tokens
from monet.profiling.costs import CostArrays
from monet.solution import Solution
from monet.solver.choices import chosen_graph, chosen_impls, full_model, lean_impls
from monet.solver.formulation import allowed
from monet.solver.ilp import InfeasibleBudgetError, solve_min_budget
from monet.solver.offload import check_offload
from monet.solver.repair import repaired_candidates
from monet.solver.search import improve_in_simulated_slack
from monet.solver.finish import eager_peak, finish_solution, memory_model, simulated_peak_fn
from monet.solver.structured import lower_hull, structured_candidates
from monet.terms import fmt_size


def smallest_schedule(graph: OpGraph, costs: CostArrays, budget: int, info, mode: str, solver: str,
                      time_limit: float, device: str, cost_fn, ref: dict) -> Solution:
    """The smallest-budget search's schedule (`_smallest`, ``time_limit`` seconds when not cached)
    when it fits ``budget`` bytes (status "heuristic", solver "<name>+min-budget"); ``ref`` holds
    ``eager`` (bytes) and ``eager_time`` (seconds) for `finish_solution`.

    Raises:
        InfeasibleBudgetError: it does not fit; names the smallest budget found and the LP's bound.
    """
    t0 = time.perf_counter()
    least, proven, g, c, S, R, lower = _smallest(graph, costs, mode, solver, time_limit, device, cost_fn)
    if least > budget:
        raise InfeasibleBudgetError(budget, least, mode, exact=proven, lower_bytes=lower) from None
    if g is graph and mode_tokens(mode) <= {"inplace"}:
        S, R = descended(g, c, S, R, budget, max(time_limit - (time.perf_counter() - t0), DESCENT_SHARE * time_limit))
    return finish_solution(g, c, S, R, budget=budget, mode=mode, status="heuristic",
                           solver=solver.upper() + "+min-budget",
                           objective_s=float(c.total_time + c.fwd_recompute @ R.sum(axis=0)), bound_s=None, gap=None,
                           solve_time_s=0.0, info=info, eager=ref["eager"],
                           eager_time=ref["eager_time"])


#: the least share of `smallest_schedule`'s time limit its descent gets after the search
DESCENT_SHARE = 0.1


def descended(graph: OpGraph, costs: CostArrays, S: np.ndarray, R: np.ndarray, budget: int,
              seconds: float) -> tuple[np.ndarray, np.ndarray]:
    """The smallest-budget schedule (S (T, N), R (T, N) bool) with less recomputation where
    ``budget`` bytes allow it, for at most ``seconds``: `solver.search.improve_in_simulated_slack`,
    descents in the ILP's memory raised by what it over-counts, each result held to the budget by
    the simulator.

    Why: the search minimises memory, not time, so its schedule recomputes whatever frees a byte,
    and a budget a little above the smallest one, where the search finds nothing of its own, fell
    back to it whole (docs/design.md, "Note [Search at tight budgets]")."""
    if seconds <= 0:
        return S, R
    mem = memory_model(graph, costs)
    allow_s = allowed(mem, "normal")[2]
    groups = mem.node_to_group(S) & allow_s
    cost = float(costs.fwd_recompute @ R.sum(axis=0))
    # in the simulator's slack: the ILP's memory over-counts this schedule's peak, and near the
    # smallest budget by more than the budget leaves
    groups, R, _ = improve_in_simulated_slack(graph, mem, groups, R, cost, budget, costs.fwd_recompute, allow_s,
                                              time.perf_counter() + seconds, simulated_peak_fn(graph, costs, mem))
    return mem.group_to_node(groups), R


def _search_key(mode: str, solver: str, device: str, costs: CostArrays, cost_fn, offload_bandwidth) -> tuple:
    return (mode, solver.upper(), device, id(costs), id(cost_fn), offload_bandwidth or None)


def searched(graph: OpGraph, costs: CostArrays, mode: str, solver: str = "CBC", device: str = "cpu", cost_fn=None,
             offload_bandwidth: float | None = None) -> bool:
    """Whether the smallest-budget search of these arguments has run on ``graph`` (`_smallest`
    keeps it): `min_budget` and `smallest_schedule` then answer without searching."""
    cached = graph.__dict__.get("_monet_smallest", {}).get(
        _search_key(mode, solver, device, costs, cost_fn, offload_bandwidth))
    return cached is not None and cached[0] is costs and cached[1] is cost_fn


def _smallest(graph: OpGraph, costs: CostArrays, mode: str, solver: str, time_limit: float, device: str,
              cost_fn=None, progress=None, offload_bandwidth: float | None = None):
    """(bytes, proven, graph with the chosen implementations, its costs, S (T, N), R (T, N), the
    LP relaxation's lower bound in bytes or None) of the smallest-budget schedule found for ``mode``: the joint ILP's, or the normal-mode one on the
    memory-lean implementations (`lean_impls`) if that is smaller.  ``time_limit`` (wall clock)
    covers both: two thirds for the joint ILP, the rest for the lean one.

    Cached on the graph per (mode, solver, device, costs, cost_fn): ``monet solve --min-budget``
    searches, then solves at the budget found, and a full-mode solve that finds nothing at that
    budget falls back to this very schedule instead of a second, time-limited search that may
    stop at a larger budget."""
    cache = graph.__dict__.setdefault("_monet_smallest", {})
    key = _search_key(mode, solver, device, costs, cost_fn, offload_bandwidth)
    if key not in cache or cache[key][0] is not costs or cache[key][1] is not cost_fn:  # ids reused after a free
        cache[key] = (costs, cost_fn, _search_smallest(graph, costs, mode, solver, time_limit, device, cost_fn,
                                                       progress, offload_bandwidth))
    return cache[key][2]


def _search_smallest(graph: OpGraph, costs: CostArrays, mode: str, solver: str, time_limit: float, device: str,
                     cost_fn=None, progress=None, offload_bandwidth: float | None = None):
    """`_smallest` without its cache."""
    # planned on 95 % of the limit: the steps overrun their shares by seconds they cannot stop
    # (cvxpy's canonicalisation of each LP, the last candidate's simulation); GPT-2 small's search
    # ended at 59.6-60.1 s of 60 without this margin
    time_limit *= 0.95
    t_end = time.perf_counter() + time_limit
    tokens = mode_tokens(mode)
    options, mem = full_model(graph, costs, mode, device, cost_fn) if tokens - {"inplace"} else ([], None)
    if not options:
        mem = memory_model(graph, costs, offload_bandwidth)
    first = time_limit * (2 / 3 if options or mem.offload is not None else 1.0)
    peak_of = simulated_peak_fn(graph, costs, mem)
    least, proven, S, R, M, lower = solve_min_budget(graph, mem, mode, solver, first, peak_of=peak_of,
                                                     progress=progress)
    g, c = (chosen_graph(graph, costs, options, chosen_impls(options, M)) if M is not None else (graph, costs))
    best = (least, proven, g, c, mem.group_to_node(S), R, lower)
    if mem.offload is not None:
        # the recompute-only search's schedule, with the offloads it allows: above LARGE variables
        # both searches are heuristics, and the LP relaxation with offload rounds to other
        # candidates (ResNet-50 at batch 184, 400 GB/s: 19.4 % of the plain peak alone, where the
        # recompute-only search found 18.5 % without any offload)
        base = memory_model(graph, costs)
        _, _, S0, R0, _, _ = solve_min_budget(graph, base, mode, solver, max(1.0, t_end - time.perf_counter()),
                                              peak_of=simulated_peak_fn(graph, costs, base))
        least0 = int(np.ceil(peak_of(S0, R0)))
        if least0 < least:
            best = (least0, lower is not None and least0 <= lower, graph, costs, mem.group_to_node(S0), R0, lower)
    if options:
        g, c = chosen_graph(graph, costs, options, lean_impls(options))
        m = memory_model(g, c)
        lean, _, S, R, _, _ = solve_min_budget(g, m, "normal", solver, max(1.0, t_end - time.perf_counter()),
                                               peak_of=simulated_peak_fn(g, c, m), progress=progress)
        if lean < least:
            # the joint model's bound bounds every implementation set, this one's included
            best = (lean, lower is not None and lean <= lower, g, c, m.group_to_node(S), R, lower)
    return best


def min_budget(graph: OpGraph, costs: CostArrays, mode: str = "normal", solver: str = "CBC",
               time_limit: float = 60.0, device: str = "cpu", cost_fn=None, progress=None,
               offload_bandwidth: float | None = None) -> tuple[int, bool]:
    """Smallest feasible budget of a mode, in bytes, and whether the solver proved it minimal.

    For modes with implementation choices, the smaller of the joint ILP's answer and the
    normal-mode answer on the memory-lean implementations (`lean_impls`).  With
    ``offload_bandwidth`` (bytes/s; normal mode), every value that can be offloaded to host
    memory may be (`solver.offload`): the bandwidth sets the copy windows, not whether they pay.
    """
    check_offload(mode, offload_bandwidth)
    if mode == "none":
        return eager_peak(graph, costs), True
    least, proven, *_ = _smallest(graph, costs, mode, solver, time_limit, device, cost_fn, progress,
                                  offload_bandwidth)
    return least, proven


#: ``budget="min"`` descends the frontier of schedules near the smallest budget while saving one
#: more percent of plain PyTorch's peak costs at most this many points of overhead (`knee`)
KNEE_PRICE = 10.0


def frontier(graph: OpGraph, costs: CostArrays, least: int, R_least: np.ndarray) -> list[tuple[float, float]]:
    """(peak bytes, recomputation seconds) of the schedules near the smallest budget, on their
    lower convex hull, peak ascending: the smallest-budget schedule (``least`` bytes, its R
    (T, N)), the block-level schedules of chains of identical blocks (`solver.structured`) and the
    repaired checkpoint sets (`solver.repair.candidate_keeps`), their peaks the ILP's memory (an
    upper bound of the simulator's)."""
    mem = memory_model(graph, costs)
    allow_s = allowed(mem)[2]
    rec = np.asarray(costs.fwd_recompute, dtype=float)
    points = [(float(least), float(rec @ np.asarray(R_least).sum(axis=0)))]
    points += [(c.peak, c.cost) for c in structured_candidates(graph, mem, rec, allow_s, None)]
    points += [(p, c) for _, _, p, c in repaired_candidates(graph, mem, None, allow_s, rec)]
    return [(p, c) for p, c in lower_hull([pt for pt in points if pt[0] >= least])]


def knee(front: list[tuple[float, float]], plain_s: float, plain_bytes: float) -> tuple[int, str]:
    """The budget `budget="min"` solves at, from a `frontier` (peak ascending), and a sentence on
    what it gives up: from the largest peak down, the frontier is followed while one percent of
    ``plain_bytes`` (plain PyTorch's peak) less costs at most `KNEE_PRICE` points of overhead
    (of ``plain_s``, plain PyTorch's iteration, seconds).  A 12-layer GPT-2's smallest schedule was
    10 % below per-block checkpointing's peak at +3,455 % overhead against +30 %: the last MiB
    are seldom worth it."""
    plain_s, plain_bytes = max(float(plain_s), 1e-12), max(float(plain_bytes), 1.0)
    i = len(front) - 1
    while i > 0:
        (p0, c0), (p1, c1) = front[i - 1], front[i]
        price = (100 * (c0 - c1) / plain_s) / max(100 * (p1 - p0) / plain_bytes, 1e-12)
        if price > KNEE_PRICE:
            break
        i -= 1
    peak, cost = front[i]
    if i == 0:
        return int(np.ceil(peak)), ""
    p0, c0 = front[0]
    per_mib = (c0 - cost) / plain_s / max((peak - p0) / 2**20, 1e-9)
    return int(np.ceil(peak)), (f"the smallest budget found is {int(np.ceil(p0))} bytes ({fmt_size(p0)}) at "
                                f"{100 * c0 / plain_s:+.1f} % recomputation; {fmt_size(peak)} costs "
                                f"{100 * cost / plain_s:+.1f} %: each MiB below it costs about {100 * per_mib:.1f} "
                                f"points more (budget=\"min\" stops where one percent of plain PyTorch's peak less "
                                f"would cost more than {KNEE_PRICE:g} points; pass the bytes for less)")


def min_budget_lower(graph: OpGraph, costs: CostArrays, mode: str = "normal", solver: str = "CBC",
                     time_limit: float = 60.0, device: str = "cpu", cost_fn=None, progress=None) -> int | None:
    """A lower bound (bytes) on `min_budget`'s answer in the ILP's memory model: the LP relaxation
    of the budget-minimising ILP (`solver.relaxation.min_budget_relaxation`), None if it gave no answer
    in time.  The same search as `min_budget` (cached on the graph: calling both searches once)."""
    if mode == "none":
        return eager_peak(graph, costs)
    lower = _smallest(graph, costs, mode, solver, time_limit, device, cost_fn, progress)[-1]
    return None if lower is None else int(np.floor(lower))


