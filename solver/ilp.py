"""MONeT's ILP solved: the time-minimising solve at a budget (`solve_ilp`) and the smallest budget
(`solve_min_budget`), with CBC, the LP relaxation and the search (`solver.search`) under one time
limit.

Solving (`solve_ilp`): the LP relaxation (bound, roundings), a start from repaired schedules
improved by local search (`solver.repair.improve`), then CBC with that start; above `LARGE`
variables CBC is not run (it never answered within a minute there) and the search has its time.

The variables and constraints are `solver.formulation.Problem`'s; the relaxations
`solver.relaxation`'s.
"""
from __future__ import annotations

import time
import warnings
from concurrent.futures import Future
from dataclasses import dataclass

import cvxpy as cp
import numpy as np

from monet.graph import OpGraph
from monet.solver.cbc import solve_cbc
from monet.solver.formulation import LARGE, Problem, allowed
from monet.solver.memory_model import MemoryModel
from monet.solver.relaxation import lp_relaxation, min_budget_relaxation, relaxation_in_background, relaxation_result
from monet.solver.repair import round_and_repair, smallest_candidate
from monet.solver.search import huge_allow_s, mip_start, offload_s, search, simulated_fits
from monet.solver.structured import structured_candidates
from monet.terms import arg, fmt_size


SOLVERS = {"CBC": cp.CBC, "HIGHS": cp.HIGHS, "SCIP": cp.SCIP}


class InfeasibleBudgetError(ValueError):
    """No schedule fits the budget; ``min_budget_bytes`` is the smallest found that does,
    ``lower_bytes`` the LP relaxation's lower bound on it (`min_budget_relaxation`) when known."""

    def __init__(self, budget: int, min_budget: int | None, mode: str, exact: bool = True,
                 lower_bytes: float | None = None):
        self.budget_bytes = budget
        self.min_budget_bytes = min_budget
        self.lower_bytes = lower_bytes
        if min_budget is None:
            msg = f"no schedule fits a budget of {budget} bytes ({fmt_size(budget)}) in mode {mode}"
        else:
            word = "smallest feasible budget" if exact else "smallest budget found feasible"
            how = arg(f'budget={min_budget} (if_infeasible="smallest" solves there instead of raising), or '
                      'budget="min" for the smallest budget whose recomputation is worth it (at or above this one; '
                      "the search is kept, so either returns soon)",
                      f"--budget {min_budget} or --min-budget")
            msg = (f"no schedule fits a budget of {budget} bytes ({fmt_size(budget)}) in mode {mode}; "
                   f"the {word} is {min_budget} bytes ({fmt_size(min_budget)}): use {how}")
        # the LP bound is of the ILP's memory, which bounds the simulated peak from above: where a
        # schedule the simulator fits is below it, the bound says nothing the budget named does not
        if lower_bytes is not None and budget < lower_bytes and (min_budget is None or min_budget >= lower_bytes):
            msg += (f" (infeasible: in the ILP's memory model no schedule fits below {int(lower_bytes)} bytes, "
                    f"{fmt_size(lower_bytes)}, by its LP relaxation)")
        super().__init__(msg)


@dataclass
class ILPResult:
    """The solver's answer. Times in seconds, matrices (T, N) bool."""

    S: np.ndarray  # (T, N): node kept (any of its groups) at the start of stage t
    R: np.ndarray
    objective_s: float  # recomputation time + constant forward and backward time
    bound_s: float | None
    gap: float | None
    status: str  # "optimal" | "gap" (proven within the gap asked) | "time_limit" | "heuristic" | "no_integer"
    solve_time_s: float
    build_time_s: float
    n_variables: int
    n_constraints: int
    solver: str
    M: np.ndarray | None = None  # (O,) chosen implementation options (None without options)
    history: list = None  # (wall s, incumbent, bound) points of the solve, model units
    O: np.ndarray | None = None  # (G,) groups offloaded to the host (None without offload)


@dataclass
class _Run:
    """One MIP solve: cvxpy's status, the solver's bound (model units, None if unknown), seconds,
    and (wall s, incumbent, bound) progress points."""

    status: str
    bound: float | None
    seconds: float
    history: list
    stopped_at_gap: bool = False


def _solve(problem: cp.Problem, solver: str, time_limit: float, verbose: bool, start: dict | None = None,
           gap_abs: float = 0.0, progress=None, shown_offset: float = 0.0, through_cvxpy: bool = False) -> _Run:
    """Solve ``problem``; with CBC through its C interface (`solver.cbc`: MIP start ``start``,
    wall-clock ``time_limit``, stop at ``gap_abs``, the bound, progress lines), else (or with
    ``through_cvxpy``, for MONeT's formulation as written) through cvxpy's own solver calls."""
    name = solver.upper()
    if name not in SOLVERS:
        raise ValueError(f"unknown solver {solver!r}; choose one of {sorted(SOLVERS)}")
    if name == "CBC" and not through_cvxpy:
        out = solve_cbc(problem, time_limit=time_limit, gap_abs=gap_abs, start=start, progress=progress,
                        verbose=verbose, shown_offset=shown_offset)
        status = {"optimal": cp.OPTIMAL, "gap": cp.USER_LIMIT, "time_limit": cp.USER_LIMIT,
                  "infeasible": cp.INFEASIBLE}.get(out.status, cp.SOLVER_ERROR)
        return _Run(status, out.bound, out.solve_time_s, out.history, out.status == "gap")
    kwargs: dict = {}
    if name == "CBC":
        kwargs = {"maximumSeconds": max(1, int(time_limit))}  # CPU seconds, overrun by root cuts
    elif name == "HIGHS":
        kwargs = {"time_limit": float(time_limit), "mip_abs_gap": float(gap_abs)}
    elif name == "SCIP":
        kwargs = {"scip_params": {"limits/time": float(time_limit), "limits/absgap": float(gap_abs)}}
    t0 = time.perf_counter()
    try:
        with warnings.catch_warnings():  # "Solution may be inaccurate": checked by Problem.integral
            warnings.filterwarnings("ignore", message="Solution may be inaccurate")
            problem.solve(solver=SOLVERS[name], verbose=verbose, **kwargs)
    except cp.error.SolverError:
        pass  # no incumbent in time, or infeasible: the caller reads problem.status
    status = problem.status or cp.SOLVER_ERROR
    bound = None
    if status == cp.OPTIMAL and problem.value is not None:
        bound = float(problem.value)
    return _Run(status, bound, time.perf_counter() - t0, [])


def plain_solve(graph: OpGraph, mem: MemoryModel, recompute_s: np.ndarray, budget: float, mode: str,
                solver: str, time_limit: float, constant_s: float = 0.0) -> dict:
    """MONeT's formulation as written, for contrast: no pruned variables, no LP relaxation, no
    start, the solver called through cvxpy.  Returns sizes, times (s), objective and bound
    (seconds, with ``constant_s``; None where the solver gave none) and cvxpy's status."""
    P = Problem(mem, recompute_s, mode, prune=False)
    problem = cp.Problem(cp.Minimize(P.time_objective()),
                         P.cons + P.memory_constraints(float(budget) - 1e-6 * P.scale))
    run = _solve(problem, solver, time_limit, False, through_cvxpy=True)
    found = P.integral()
    obj = float(problem.value) + constant_s if found and problem.value is not None else None
    return dict(n_variables=sum(v.size for v in problem.variables()),
                n_constraints=sum(c.size for c in problem.constraints), build_s=P.build_time_s,
                solve_s=run.seconds, objective_s=obj,
                bound_s=obj if run.status == cp.OPTIMAL else None, status=str(run.status))


def problem_size(graph: OpGraph, mem: MemoryModel, recompute_s: np.ndarray, mode: str) -> tuple[int, int, float]:
    """(variables, constraint rows, build seconds) of the pruned ILP at a budget (`Problem`)."""
    P = Problem(mem, recompute_s, mode)
    problem = cp.Problem(cp.Minimize(P.time_objective()), P.cons + P.memory_constraints(1.0))
    return (sum(v.size for v in problem.variables()), sum(c.size for c in problem.constraints), P.build_time_s)


def _search_only(graph: OpGraph, mem: MemoryModel, allow_s: np.ndarray, recompute_s, budget: int, mode: str,
                 solver: str, time_limit: float, constant_s: float, peak_of, progress, smallest: bool,
                 t0: float) -> ILPResult:
    """`solve_ilp` above `HUGE` variables: `search`'s schedule in the whole limit (iterated), status
    ``heuristic``, no bound.  Raises `InfeasibleBudgetError` as `solve_ilp` does."""
    n_vars = int(allowed(mem, mode)[1].sum() + allow_s.sum())
    found = search(graph, mem, allow_s, recompute_s, float(budget), None, t0 + time_limit - 1.0, iterate=True,
                   peak_of=peak_of)
    if found is not None and peak_of is not None and peak_of(found[0], found[1]) > budget:
        found = None  # cannot happen: the ILP's memory bounds the simulator's
    if found is None:
        if not smallest:
            raise InfeasibleBudgetError(int(budget), None, mode)
        least, _, S, R, _, _ = solve_min_budget(graph, mem, mode, solver, max(1.0, t0 + time_limit - time.perf_counter()),
                                                peak_of=peak_of)
        if least > budget:
            raise InfeasibleBudgetError(int(budget), least, mode, exact=False)
        found = (S, R, float(np.asarray(recompute_s, dtype=float) @ R.sum(axis=0)), least)
    S, R, cost, _ = found
    if progress is not None:
        progress(f"  {n_vars} variables: no LP or MIP solver at this size, the search's schedule stands "
                 f"({cost + constant_s:.6g} s)")
    return ILPResult(S=mem.group_to_node(S), R=R, objective_s=cost + constant_s, bound_s=None, gap=None,
                     status="heuristic", solve_time_s=time.perf_counter() - t0, build_time_s=0.0, n_variables=n_vars,
                     n_constraints=0, solver="search", history=[])


def solve_min_budget(graph: OpGraph, mem: MemoryModel, mode: str = "normal", solver: str = "CBC",
                     time_limit: float = 60.0, verbose: bool = False, peak_of=None, progress=None):
    """Smallest budget (bytes) for which a schedule exists in ``mode``, and that schedule.

    Bounds it from below by the LP relaxation (`min_budget_relaxation`, on up to 30 % of the
    limit), solves ``min budget`` subject to the ILP's constraints (started from the smallest
    repaired checkpoint schedule) below `LARGE` variables, then compares its schedule with the
    repaired candidates of `monet.solver.repair` (roundings of the relaxations) by
    ``peak_of(S, R[, M])`` (the simulator's exact peak when given; else the ILP's expression, an
    upper bound).  Returns (bytes, proven, S (T, G), R (T, N), M (O,) or None for PyTorch's
    implementations, the LP's lower bound in bytes or None): ``proven`` when the solver proved
    its optimum and nothing beat it, or when the schedule's peak is at the LP bound or below.
    """
    t0 = time.perf_counter()
    in_model = peak_of is None  # peaks in the ILP's own memory: its optimum is proven
    peak_of = peak_of or mem.peak
    allow_s = huge_allow_s(graph, mem, mode)
    if allow_s is not None:  # no cvxpy problem at this size: the smallest of the search's candidates
        peak, S, R = smallest_candidate(graph, mem, None, allow_s, peak_of, deadline=t0 + time_limit)
        found = search(graph, mem, allow_s, np.zeros(len(graph.fwd)), None, deadline=t0 + time_limit)
        if found is not None and peak_of(found[0], found[1]) < peak:
            S, R = found[0], found[1]
            peak = peak_of(S, R)
        return int(np.ceil(peak)), False, S, R, None, None
    lower, frac_lp = min_budget_relaxation(graph, mem, mode, 0.3 * time_limit)
    P = Problem(mem, np.zeros(len(graph.fwd)), mode)
    b = P.budget_var  # in units of P.scale bytes
    problem = cp.Problem(cp.Minimize(b), P.cons + P.memory_constraints(b))
    start = mip_start(P, graph, mem, np.zeros(len(graph.fwd)), None)
    if start is not None:
        start[0][b] = np.array([start[2] / P.scale])
    if sum(v.size for v in problem.variables()) > LARGE:
        # no MIP solver at this size (see LARGE): the smallest repaired candidate (the narrow
        # ResNet-50 of the test suite spent 250 s here with HiGHS and 4 s limits)
        run = _Run(cp.USER_LIMIT, None, 0.0, [])
    else:
        run = _solve(problem, solver, max(1.0, t0 + time_limit - time.perf_counter()), verbose,
                     start=None if start is None else start[0], gap_abs=1e-4, progress=progress)
    # repaired candidates use PyTorch's implementations (M = None)
    frac = P.fractional_s()
    peak, S, R = smallest_candidate(graph, mem, frac_lp if frac is None else frac, P.allow_s, peak_of,
                                    deadline=t0 + time_limit)
    best, proven = (peak, S, R, None), False
    if P.integral():
        S, R, M = *P.matrices(), P.chosen_options()
        peak = peak_of(S, R) if M is None else peak_of(S, R, M)
        if peak <= best[0]:
            # (not `peak_of is mem.peak`: each access makes a new bound method)
            best, proven = (peak, S, R, M), run.status == cp.OPTIMAL and in_model
    peak, S, R, M = best
    proven = proven or (lower is not None and peak <= lower)
    return int(np.ceil(peak)), proven, S, R, M, lower


@dataclass
class _Relaxed:
    """The LP relaxation of a `solve_ilp`: its bound (model units: seconds of recomputation, less
    the constant time; None when not solved, or not in time), the fractional S (T, G) and M (O,)
    it found (roundings for the MIP start and the repair fallback), and, at full scale, the
    thread it runs in."""

    lp: float | None = None
    frac_s: np.ndarray | None = None
    frac_m: np.ndarray | None = None
    background: Future | None = None


def _relax(graph: OpGraph, mem: MemoryModel, recompute_s, limit: float, mode: str, time_limit: float,
           large: bool) -> _Relaxed:
    """The LP relaxation: a bound, and roundings for the MIP start and for the repair fallback.  At
    full scale (``large``) it runs in a thread next to the local search (12-27 s on ResNet-50 at
    batch 184, 91,000 columns), and its roundings are not used (the search beat them): `_collect`
    takes its bound; below, it may use all of the limit but 1 s."""
    if large:
        return _Relaxed(background=relaxation_in_background(graph, mem, recompute_s, limit, mode, time_limit - 5.0))
    return _Relaxed(*lp_relaxation(graph, mem, recompute_s, limit, mode, max(1.0, time_limit - 1.0)))


def _collect(relaxed: _Relaxed, deadline: float) -> bool:
    """Take the bound of a relaxation run in the background (`_relax`), waited for until
    ``deadline`` (`time.perf_counter` seconds); False where there is none to wait for."""
    if relaxed.background is None:
        return False
    relaxed.lp, _, _ = relaxation_result(relaxed.background, deadline)
    return True


def _show_relaxation(progress, lp: float | None, constant_s: float, t0: float, waited: bool) -> None:
    """The progress line of the LP relaxation: its bound (seconds, ``constant_s`` included), or,
    for one ``waited`` for in the background, that it had no answer in time."""
    if progress is not None and (lp is not None or waited):
        text = "no answer in time" if lp is None else f"bound {lp + constant_s:.6g} s"
        progress(f"  LP relaxation: {text} ({time.perf_counter() - t0:.1f} s)")


def _polish_until(t0: float, time_limit: float, large: bool) -> float:
    """When the local search's improvement of the start stops (`time.perf_counter` seconds).

    It runs until a fifth of the limit (at least 2 s) is left for CBC: at full scale (more than
    `LARGE` variables, an iterated search) CBC finds no better schedule, so the improved start is
    the answer; on small graphs the descent ends at once and CBC proves the optimum.  And it gets
    at least a quarter of the limit, even when the LP relaxation took all of it (the demo's
    ResNet-50 under load: its schedule was then an unimproved checkpoint set, +63 %)."""
    return max(t0 + time_limit - (1.5 if large else max(2.0, 0.2 * time_limit)),
               time.perf_counter() + 0.25 * time_limit)


def _mip(problem: cp.Problem, start, large: bool, n_vars: int, solver: str, time_limit: float, verbose: bool,
         gap_abs: float, progress, constant_s: float, shown_start: float | None) -> _Run:
    """CBC (or ``solver``) from ``start`` (`mip_start`'s answer or None) in ``time_limit`` seconds.

    Not run above `LARGE` variables: CBC did not answer within a minute at that size (ResNet-50 at
    batch 184, 60,000-91,000 variables: preprocessing alone outlasted every share of the limit), so
    the local search's schedule stands, with the LP relaxation's bound; without one (nothing
    repaired fits: GPT-2 below 52 % of its plain peak, where CBC ran 6-24 s for nothing), the repair
    fallback and the smallest-budget search answer (`_fallback`).  ``shown_start``: the start's
    objective as the progress line shows it (seconds)."""
    if large:
        if progress is not None and shown_start is not None:
            progress(f"  {n_vars} variables: {solver.upper()} skipped, the local search's schedule stands "
                     f"({shown_start:.6g} s)")
        return _Run(cp.USER_LIMIT, None, 0.0, [])
    return _solve(problem, solver, time_limit, verbose, start=None if start is None else start[0],
                  gap_abs=gap_abs, progress=progress, shown_offset=constant_s)


@dataclass
class _Chosen:
    """The schedule `solve_ilp` returns: S (T, G) kept groups, R (T, N) recomputations, M (O,) the
    chosen implementation options (None without options), O (G,) offloaded groups (None: the
    schedule's effective ones), how it was found beyond the solver (``"+repair"``, ``"+start"``)
    and whether it is a heuristic's (no proof from the solver)."""

    S: np.ndarray
    R: np.ndarray
    M: np.ndarray | None = None
    O: np.ndarray | None = None
    via: str = ""
    heuristic: bool = False


def _from_solver(P: Problem, graph: OpGraph, mem: MemoryModel, frac_s, recompute_s, budget: int,
                 peak_of) -> _Chosen | None:
    """The solver's integer schedule, if it has one the simulator (``peak_of``) fits in ``budget``
    (the ILP's memory bounds the simulator's, tested, but a schedule is only returned once the
    simulator agrees); replaced by a repaired rounding of the LP relaxation (``frac_s``) that the
    simulator fits and that recomputes less (the ILP's memory, an upper bound, may have rejected it).
    None without one."""
    if not P.integral():
        return None
    S, R = P.matrices()
    M, O = P.chosen_options(), P.chosen_offload()
    with_o = {} if O is None else {"O": O}
    if peak_of is not None and (peak_of(S, R, **with_o) if M is None else peak_of(S, R, M, **with_o)) > budget:
        return None
    if M is not None:
        return _Chosen(S, R, M, O)
    alt = round_and_repair(graph, mem, frac_s, P.allow_s, float(budget), recompute_s, peak_of or mem.peak)
    if alt is not None and (alt[2] + offload_s(mem, alt[0], alt[1])
                            < float(np.asarray(recompute_s, dtype=float) @ R.sum(axis=0))
                            + offload_s(mem, S, R, O) - 1e-12):
        return _Chosen(alt[0], alt[1], via="+repair", heuristic=True)
    return _Chosen(S, R, None, O)


def _fallback(P: Problem, graph: OpGraph, mem: MemoryModel, start, frac_s, recompute_s, budget: int,
              mode: str, solver: str, time_limit: float, verbose: bool, peak_of, smallest: bool,
              large: bool) -> _Chosen | None:
    """A schedule where the solver has no integer one that fits: infeasible for the ILP's
    (pessimistic) memory, or stopped by its time limit.  With implementation options: the improved
    start with PyTorch's implementations, else None (the caller, `solver.portfolio.solve_full`,
    fixes the implementations and repairs).  Without: the cheapest of the repaired roundings of
    the LP relaxation (`solver.repair`) whose simulated peak fits and the improved start, else the
    smallest-budget schedule.

    Raises:
        InfeasibleBudgetError: nothing fits (the smallest feasible budget named when ``smallest``).
    """
    if mem.n_options:
        if start is None:
            return None
        return _Chosen(start[3], start[4], mem.default_options() > 0.5, via="+start", heuristic=True)
    # at full scale the start's search saw these candidates already (by the ILP's memory) and took
    # all of the limit: simulating them again took 12 s past it on a 24-layer GPT-2
    best = (None if large and start is not None else
            round_and_repair(graph, mem, frac_s, P.allow_s, float(budget), recompute_s, peak_of or mem.peak))
    if start is not None and (best is None or start[1] < best[2]):  # the improved start
        best = (start[3], start[4], start[1])
    if best is None and not smallest:
        raise InfeasibleBudgetError(int(budget), None, mode)
    if best is None:
        least, proven, S_min, R_min, _, lower = solve_min_budget(graph, mem, mode, solver, time_limit, verbose, peak_of)
        if least > budget:
            raise InfeasibleBudgetError(int(budget), least, mode, exact=proven, lower_bytes=lower)
        best = (S_min, R_min, None)
    return _Chosen(best[0], best[1], via="+repair", heuristic=True)


def _no_costlier_than_known(graph: OpGraph, mem: MemoryModel, recompute_s, allow_s: np.ndarray, budget: int,
                            peak_of, chosen: _Chosen, start) -> _Chosen:
    """The cheapest of ``chosen``, the MIP start (`mip_start`'s tuple, or None) and the block-level
    schedules (`solver.structured`) that the ILP's memory puts over ``budget`` by at most
    `NEAR_SLACK` (`simulated_fits`), of those the simulator (``peak_of``) fits in ``budget`` bytes.

    A solver stopped by its time limit may return an incumbent costlier than its start (or none,
    and a repaired rounding stands), and the ILP's memory bounds the simulator's from above, so
    per-block checkpointing at its own simulated peak can lie outside the ILP's feasible set: so
    that the answer never recomputes more than the schedules the search knows, whatever the time
    limit (docs/design.md, "Deep networks").  Recompute-or-store only: with implementation
    options or offload ``chosen`` is returned as it is."""
    if peak_of is None or mem.n_options or mem.offload is not None or chosen.M is not None:
        return chosen
    best, cost = chosen, float(np.asarray(recompute_s, dtype=float) @ chosen.R.sum(axis=0))
    if start is not None and start[1] < cost and peak_of(start[3], start[4]) <= budget:
        best, cost = _Chosen(start[3], start[4], via="+start", heuristic=True), start[1]
    # the grown policy is not built again: the search's start holds it and its mixes
    cands = [(c.S, c.R, c.peak, c.cost)
             for c in structured_candidates(graph, mem, recompute_s, allow_s, budget, grow=False)]
    near = simulated_fits(cands, float(budget), peak_of)
    if near and near[0][3] < cost:
        best = _Chosen(near[0][0], near[0][1], via="+blocks", heuristic=True)
    return best


def _no_integer(P: Problem, run: _Run, relaxed: _Relaxed, constant_s: float, solver: str, n_vars: int,
                n_cons: int) -> ILPResult:
    """The answer with implementation options and no integer schedule: the implementations the LP
    relaxation leans to (CBC's values when it has some), and the bound (the LP relaxation's or
    CBC's), which still bounds the joint problem for the caller (`solver.portfolio.solve_full`)."""
    frac = (relaxed.frac_m if P.m is None or P.m.value is None
            else np.clip(np.asarray(P.m.value, dtype=float), 0, 1))
    bound = None if run.bound is None else run.bound + constant_s
    return ILPResult(S=None, R=None, objective_s=float("nan"), bound_s=bound, gap=None, status="no_integer",
                     solve_time_s=run.seconds, build_time_s=P.build_time_s, n_variables=int(n_vars),
                     n_constraints=int(n_cons), solver=solver.upper(), M=frac, history=run.history)


def _offloads(mem: MemoryModel, chosen: _Chosen, budget: int, time_limit: float) -> np.ndarray | None:
    """The groups ``chosen`` offloads: the ILP's, or for a heuristic's schedule its effective ones,
    less those the budget does not need (in the ILP's memory, which bounds the simulator's)."""
    if mem.offload is None or chosen.O is not None:
        return chosen.O
    S, R = chosen.S, chosen.R
    O = mem.offload.effective(S, R)
    return mem.offload.trimmed(O, lambda O2: mem.peak(S, R, O=O2) <= budget,
                               time.perf_counter() + max(1.0, 0.05 * time_limit))


def _objective_s(P: Problem, problem: cp.Problem, mem: MemoryModel, chosen: _Chosen, start, recompute_s,
                 constant_s: float) -> float:
    """Seconds of ``chosen``: its recomputation (and offload) time, its implementations' time where
    it has options (the start's: its recomputation plus PyTorch's implementations; the solver's: the
    ILP's objective), plus ``constant_s``."""
    if chosen.M is not None and chosen.heuristic:
        return start[1] + float(P.opt_time @ chosen.M) + constant_s
    if chosen.M is not None:
        return float(problem.value) + constant_s
    return (float(np.asarray(recompute_s, dtype=float) @ chosen.R.sum(axis=0)) + constant_s
            + offload_s(mem, None, chosen.R, chosen.O))


def _proof(obj: float, status: str, run_bound: float | None, constant_s: float, gap: float) -> tuple:
    """(bound s, gap found, `ILPResult.status`) of a schedule of ``obj`` seconds: proven optimal,
    within ``gap``, stopped by the time limit, or a heuristic's (``status`` the solver's, or
    ``"heuristic"``; ``run_bound`` the solver's or the LP relaxation's bound, model units)."""
    optimal = status == cp.OPTIMAL
    if optimal:
        return obj, 0.0, "optimal"
    bound = None if run_bound is None else run_bound + constant_s
    found = None if bound is None else max(0.0, (obj - bound) / obj) if obj > 0 else 0.0
    if status == "heuristic":
        return bound, found, "heuristic"
    return bound, found, "gap" if found is not None and found <= gap else "time_limit"


def solve_ilp(graph: OpGraph, mem: MemoryModel, recompute_s: np.ndarray, budget: int, mode: str = "normal",
              solver: str = "CBC", time_limit: float = 60.0, constant_s: float = 0.0,
              verbose: bool = False, peak_of=None, gap: float = 0.0, progress=None,
              relaxation: bool = True, smallest: bool = True) -> ILPResult:
    """Minimise recomputation time under a memory budget (bytes).

    The solve is started from the cheapest repaired checkpoint schedule whose ILP memory fits
    (`mip_start`), so a solve stopped by its time limit returns at least that schedule, with its gap.
    In order: the LP relaxation (`_relax`), the start improved by local search (`mip_start`, until
    `_polish_until`), the MIP solver (`_mip`), the schedule (`_from_solver`, else `_fallback`),
    its offloads (`_offloads`), its seconds and proof (`_objective_s`, `_proof`).

    Args:
        recompute_s: (N,) seconds to recompute each forward node.
        budget: bytes; the ILP's memory expressions (an upper bound of the executor's) must fit.
        mode: "normal" (recompute or store), "none" (keep everything: plain PyTorch) or a mode
            with implementation choices (``mem`` then carries the options).
        solver: "CBC" (default), "HIGHS" or "SCIP".
        time_limit: seconds (wall clock); the best schedule found by then is returned with its gap.
        constant_s: forward + backward time added to the objective (seconds).
        gap: stop once the schedule is proven within this fraction of the best bound (the
            objective counts ``constant_s``); 0 solves to optimality.
        progress: ``progress(str)``: the incumbent and the bound as the solve goes (CBC).
        relaxation: solve the LP relaxation first (a bound, and roundings that start the search).
            Without it, the search starts from the checkpoint schedules alone and has the LP's
            time: `solver.portfolio.solve_full` takes its bound from the joint ILP and skips it for
            its fixed-implementation solves at full scale, where the search beat the roundings
            (see `solver.repair.improve`) and the LP took 8-25 s of a 60 s limit.
        peak_of: ``peak_of(S (T, G), R (T, N)) -> bytes``, the simulator's exact peak of a schedule.
            When the ILP (whose memory is an upper bound) finds nothing, repaired candidates and the
            smallest-budget schedule are accepted if this peak fits the budget (status "heuristic").
        smallest: when nothing fits, search the smallest budget (`solve_min_budget`) for the error
            and for a schedule the simulator fits; `solver.portfolio.solve_full` searches once itself.

    Raises:
        InfeasibleBudgetError: no schedule fits; names the smallest feasible budget (None
            without ``smallest``).
        RuntimeError: the solver found no schedule within the time limit.
    """
    t0 = time.perf_counter()
    allow_s = huge_allow_s(graph, mem, mode)
    if allow_s is not None:
        return _search_only(graph, mem, allow_s, recompute_s, budget, mode, solver, time_limit, constant_s,
                            peak_of, progress, smallest, t0)
    P = Problem(mem, recompute_s, mode)
    # 1e-6 below the budget: solvers accept violations up to their tolerance
    limit = float(budget) - 1e-6 * P.scale
    problem = cp.Problem(cp.Minimize(P.time_objective()), P.cons + P.memory_constraints(limit))
    n_vars = sum(v.size for v in problem.variables())
    n_cons = sum(c.size for c in problem.constraints)
    large = n_vars > LARGE  # see LARGE

    relaxed = _relax(graph, mem, recompute_s, limit, mode, time_limit, large) \
        if mode != "none" and relaxation else _Relaxed()
    _show_relaxation(progress, relaxed.lp, constant_s, t0, waited=False)
    # the search checks its candidates exactly: at the budget itself (per-block checkpointing at its
    # own peak is one), not at the solver's tolerance below it
    start = (mip_start(P, graph, mem, recompute_s, float(budget), relaxed.frac_s, _polish_until(t0, time_limit, large),
                    iterate=large) if mode != "none" else None)
    if _collect(relaxed, t0 + time_limit):
        _show_relaxation(progress, relaxed.lp, constant_s, t0, waited=True)
    shown_start = (None if start is None else
                   start[1] + constant_s + (float(P.opt_time @ mem.default_options()) if mem.n_options else 0.0))
    run = _mip(problem, start, large, n_vars, solver, max(1.0, time_limit - (time.perf_counter() - t0)), verbose,
               gap * constant_s, progress, constant_s, shown_start)
    if relaxed.lp is not None and (run.bound is None or run.bound < relaxed.lp):
        run.bound = relaxed.lp
    chosen = _from_solver(P, graph, mem, relaxed.frac_s, recompute_s, budget, peak_of)
    if chosen is None:
        chosen = _fallback(P, graph, mem, start, relaxed.frac_s, recompute_s, budget, mode, solver, time_limit,
                           verbose, peak_of, smallest, large)
        if chosen is None:
            return _no_integer(P, run, relaxed, constant_s, solver, n_vars, n_cons)
    chosen = _no_costlier_than_known(graph, mem, recompute_s, P.allow_s, budget, peak_of, chosen, start)
    if mode == "none":
        chosen.S = chosen.S | P.allow_s
    chosen.O = _offloads(mem, chosen, budget, time_limit)
    obj = _objective_s(P, problem, mem, chosen, start, recompute_s, constant_s)
    bound, gap_found, kind = _proof(obj, "heuristic" if chosen.heuristic else run.status, run.bound, constant_s, gap)
    return ILPResult(S=mem.group_to_node(chosen.S), R=chosen.R, M=chosen.M, O=chosen.O, objective_s=obj,
                     bound_s=bound, gap=gap_found, status=kind, solve_time_s=run.seconds,
                     build_time_s=P.build_time_s, n_variables=int(n_vars), n_constraints=int(n_cons),
                     solver=solver.upper() + chosen.via, history=run.history)
