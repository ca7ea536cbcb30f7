"""The full-mode portfolio: solves that share one deadline, run by one declared policy table.

`solve_full` chooses operator implementations jointly with checkpoints (MONeT, Shah et al. ICLR
2021, Sec. 4).  It runs the steps of `POLICY` in order, each when its conditions hold, each on the
seconds its row allots of one `solver.deadline.Deadline`; the fastest schedule wins.  Which step
gets how much of the limit is read from the table, nowhere else.
"""
from __future__ import annotations

import time
from dataclasses import dataclass

from monet.graph import OpGraph
from monet.profiling.costs import CostArrays
from monet.solution import RunInfo, Solution
from monet.solver.choices import (chosen_graph, chosen_impls, fastest_impls, fixed_time, full_model,
                                  lean_impls, no_recompute_bound, option_seconds, round_options)
from monet.solver.deadline import Deadline
from monet.solver.formulation import LARGE
from monet.solver.ilp import InfeasibleBudgetError, problem_size, solve_ilp
from monet.solver.relaxation import min_budget_relaxation, relaxation_in_background, relaxation_result
from monet.solver.ilp_peer import solve_normal
from monet.solver.finish import eager_peak, finish_solution, simulated_peak_fn
from monet.solver.smallest import smallest_schedule

# The conditions a step's ``when`` may name (all must hold when the step's turn comes).
CONDITIONS = {
    "options": "the mode has implementation choices for this graph",
    "no_options": "it has none: full mode is normal mode",
    "small": f"the joint ILP has at most solver.formulation.LARGE ({LARGE}) variables: CBC runs on it",
    "large": "it has more: no MIP solver, the local search finds the schedules",
    "above_lp_bound": "the budget is not below the LP relaxation's bound on the smallest budget (step 'bound')",
    "cheap_lean": "the cheap memory-lean implementation set (lean_impls, cheap=True) is not PyTorch's",
    "fastest_new": "the fastest implementation set (fastest_impls) is neither PyTorch's nor the cheap lean one",
    "nothing_fits": "no step has found a schedule yet",
}


@dataclass(frozen=True)
class Step:
    """One row of the portfolio's policy: what runs, when, and on how many seconds.

    The seconds of a step are ``of_limit`` x the time limit less ``keep_back_s``, or (``of_limit``
    0) ``of_left`` x the seconds left until the deadline (until the policy's stop margin before
    it, with ``to_stop``), split by ``weight`` among the weighted steps still to run; then at
    least ``floor_s`` and at least ``floor_of_limit`` x the limit up to ``floor_cap_s``; the
    whole limit when it is at most ``whole_limit_up_to_s``; and at most max(``cap_once_proven``)
    = max(seconds, fraction x limit) once the joint ILP's schedule is proven within the gap.
    """

    name: str  # the runner (`_Run.<name>`), and the step's name in tests
    runs: str  # what it runs, in words
    when: tuple[str, ...]  # names in CONDITIONS, all must hold
    of_limit: float = 0.0
    keep_back_s: float = 0.0
    of_left: float = 0.0
    to_stop: bool = False
    weight: float | None = None  # None: not split with other steps
    weight_large_fastest: float | None = None  # the weight above LARGE of the set faster with nothing recomputed
    floor_s: float = 1.0
    floor_of_limit: float = 0.0
    floor_cap_s: float = 0.0
    whole_limit_up_to_s: float | None = None
    cap_once_proven: tuple[float, float] | None = None  # (seconds, fraction of the limit)
    background: bool = False  # runs in a thread next to the steps after it
    terminal: bool = False  # its schedule (or error) is the answer


@dataclass(frozen=True)
class Policy:
    """The portfolio's steps, in order, and its margins (seconds)."""

    steps: tuple[Step, ...]
    # kept for building and simulating the chosen schedule after the fixed-implementation searches
    # (UNet at batch 11, 40 %: 60.2 s of 60 without it); above LARGE 3 s (GPT-2 small: 1.5 s overran
    # the limit by 0.2 s, 2 s by 0.1 s)
    stop_margin_s: float = 1.0
    stop_margin_large_s: float = 3.0
    # the background relaxation's answer is waited for until this long before the deadline
    bound_wait_margin_s: float = 0.5


# A fallback solve gets what is left of the limit, but at least half of it (up to 5 s): a schedule
# worse than normal mode's would cost more than the overrun.
_REST = dict(of_left=1.0, floor_s=1.0, floor_of_limit=0.5, floor_cap_s=5.0)

POLICY = Policy(steps=(
    Step("normal", "no implementation choices: normal mode's ILP (solver.ilp_peer.solve_normal)",
         when=("no_options",), terminal=True, **_REST),
    # below the LP relaxation's bound on the smallest budget (0.2 s for VGG-16 at batch 176) no
    # schedule fits the ILP's memory: only the smallest-budget search's schedule can (the
    # simulator's peak is a little lower), so the searches are skipped (VGG-16 at 50 % of its
    # plain peak was refused in 48 s, most of it spent on them)
    Step("bound", "the LP relaxation's bound on the smallest budget (solver.relaxation.min_budget_relaxation)",
         when=("options", "small"), of_limit=0.1, floor_s=0.0),
    Step("joint", "the joint ILP (solver.ilp.solve_ilp with the implementation options); its LP "
         "relaxation is the bound reported for every schedule",
         when=("options", "small", "above_lp_bound"), of_limit=0.4),
    # no MIP solver at this size (see LARGE): the joint ILP gives only its LP relaxation's bound,
    # computed in a thread while the fixed-implementation searches use the other core (its improved
    # start would repeat the one with PyTorch's implementations)
    Step("joint_relaxation", "the joint ILP's LP relaxation in a thread (solver.relaxation.relaxation_in_background)",
         when=("options", "large", "above_lp_bound"), of_limit=1.0, keep_back_s=5.0, background=True),
    # even a proven joint schedule runs against the fixed ones: a repaired schedule the simulator
    # fits beat the joint "optimum" by 2 % on a small GPT-2 (the ILP's memory is an upper bound).
    # Up to a 10 s limit the solve with PyTorch's implementations gets the whole limit, as a
    # normal-mode solve would (full mode must not lose to it).  Once the joint schedule is proven
    # within the gap in the ILP's memory, a fixed set can beat it only with a repaired schedule the
    # simulator fits (its start), not in CBC (VGG-16 at 60 %: proven in 1 s, then 20 s in the solve
    # with PyTorch's kernels).  Above LARGE the local search finds the schedules and stops at its
    # deadline: two thirds of the time to the set faster with nothing recomputed (ResNet-50 at
    # batch 184: the cheap lean implementations, 0.6139 s against PyTorch's 0.6245 s; with equal
    # shares PyTorch's schedule was the slower one at 70 / 50 / 33 %).
    Step("pytorch_impls", "normal mode's ILP with PyTorch's implementations fixed",
         when=("options", "above_lp_bound"), of_left=1.0, to_stop=True, weight=1.0, weight_large_fastest=2.0,
         whole_limit_up_to_s=10.0, cap_once_proven=(2.0, 0.1)),
    Step("cheap_lean_impls", "normal mode's ILP with the cheap memory-lean implementations fixed",
         when=("options", "above_lp_bound", "cheap_lean"), of_left=1.0, to_stop=True, weight=1.0,
         weight_large_fastest=2.0, cap_once_proven=(2.0, 0.1)),
    # each choice's fastest implementation, whatever it stores: with it GoogLeNet at batch 320 and
    # 33 % is within 2 % of its best schedule from a 2 s limit on
    # (BENCHMARKS.md, "Solver: the schedule a time limit buys"); the joint search reaches such
    # mixed choices only after 20 s
    Step("fastest_impls", "normal mode's ILP with each choice's fastest implementation fixed",
         when=("options", "above_lp_bound", "fastest_new"), of_left=1.0, to_stop=True, weight=1.0,
         weight_large_fastest=2.0, cap_once_proven=(2.0, 0.1)),
    Step("fallback_impls", "normal mode's ILP with the fully memory-lean implementations (or those the "
         "joint relaxation leans to) fixed", when=("options", "above_lp_bound", "nothing_fits"),
         of_left=0.5, to_stop=True),
    # nothing fits: the smallest-budget search gets what is left, before any wait for the bound
    # (GPT-2 small at 50 %: after each fixed solve's own search and the relaxation's 55 s it had
    # 5 s, found 54.7 % where a minute finds 52.1 %, and the error came at 62.6 s)
    Step("smallest", "the smallest-budget search's schedule if it fits, else its error "
         "(solver.smallest.smallest_schedule)", when=("nothing_fits",), **_REST),
))


def validate_policy(policy: Policy) -> None:
    """Check a policy table: known conditions and runners, fractions in [0, 1], positive weights,
    non-negative seconds, and the shares of the whole limit that run one after another (the
    foreground ``of_limit`` rows) summing to at most 1.

    Raises:
        ValueError: names the row and what is wrong with it."""
    if not policy.steps:
        raise ValueError("a portfolio policy needs at least one step")
    for s in policy.steps:
        where = f"policy step {s.name!r}"
        if not hasattr(_Run, s.name) or s.name.startswith("_"):
            raise ValueError(f"{where}: no runner _Run.{s.name}; name a step after a method of _Run")
        unknown = [c for c in s.when if c not in CONDITIONS]
        if unknown or not s.when:
            raise ValueError(f"{where}: conditions {unknown or '()'} are not in CONDITIONS ({', '.join(CONDITIONS)})")
        for field in ("of_limit", "of_left", "floor_of_limit"):
            if not 0.0 <= getattr(s, field) <= 1.0:
                raise ValueError(f"{where}: {field} = {getattr(s, field)!r} is not a fraction in [0, 1]")
        if (s.of_limit > 0) == (s.of_left > 0):
            raise ValueError(f"{where}: give one of of_limit (a share of the limit) and of_left (of what is left)")
        if s.weight is not None and not (s.weight > 0 and (s.weight_large_fastest or 1.0) > 0):
            raise ValueError(f"{where}: weights must be positive, got {s.weight!r}, {s.weight_large_fastest!r}")
        if min(s.floor_s, s.floor_cap_s, s.keep_back_s) < 0:
            raise ValueError(f"{where}: seconds (floor_s, floor_cap_s, keep_back_s) must be >= 0")
        if s.cap_once_proven is not None and not (s.cap_once_proven[0] >= 0 and 0 < s.cap_once_proven[1] <= 1):
            raise ValueError(f"{where}: cap_once_proven is (seconds >= 0, fraction in (0, 1]), got {s.cap_once_proven!r}")
    total = sum(s.of_limit for s in policy.steps if not s.background)
    if total > 1.0 + 1e-12:
        raise ValueError(f"the policy's shares of the whole limit sum to {total:g} > 1")
    if min(policy.stop_margin_s, policy.stop_margin_large_s, policy.bound_wait_margin_s) < 0:
        raise ValueError("the policy's margins must be >= 0 seconds")


def solve_full(graph: OpGraph, costs: CostArrays, budget: int, info: RunInfo | dict | None = None, *, mode: str,
               solver: str = "CBC", time_limit: float = 60.0, verbose: bool = False, device: str = "cpu",
               cost_fn=None, progress=None, gap: float = 0.0, policy: Policy = POLICY) -> Solution:
    """MONeT's ILP choosing operator implementations jointly with checkpoints (Sec. 4), as a
    portfolio of solves sharing one deadline of ``time_limit`` seconds (wall clock).

    ``mode`` names the implementation kinds allowed (`monet.impls.mode_tokens`).  The steps,
    their order, conditions and shares of the limit are the rows of ``policy`` (`POLICY`): the
    joint ILP on 40 % of the limit (its LP relaxation is the bound reported for every schedule,
    or `solver.choices.no_recompute_bound` when higher or when the relaxation does not finish);
    normal mode's ILP with PyTorch's, with the cheap memory-lean and with the fastest
    implementations fixed (`solver.choices.lean_impls`, `fastest_impls`), on what is left; only
    when none fits, the fully lean implementations, then the smallest-budget search.
    Above `solver.formulation.LARGE` joint variables the joint step is only its LP relaxation, in a
    thread, and the fixed solves skip their own relaxation (`solver.ilp.solve_ilp`'s
    ``relaxation``); below it, a budget under the LP relaxation's bound on the smallest budget
    (`solver.relaxation.min_budget_relaxation`) goes to the smallest-budget search at once.

    The fastest schedule is returned (status "gap" when it is within ``gap`` of the joint ILP's
    bound, else "heuristic" for a fixed-implementation one).  The limit is the solver's: it starts
    after the implementation options are built and measured.  Each step gets at least 1 s (and a
    fallback at least half the limit, up to 5 s), so the total can overrun ``time_limit`` by a
    few seconds (CBC is stopped 2 s after its share).

    Raises:
        InfeasibleBudgetError: no schedule fits; names the smallest feasible budget found, and
            the LP relaxation's bound on it.
    """
    run = _Run(graph, costs, budget, info, mode=mode, solver=solver, time_limit=time_limit, verbose=verbose,
               device=device, cost_fn=cost_fn, progress=progress, gap=gap, policy=policy)
    for step in policy.steps:
        if all(run.holds(c) for c in step.when):
            out = getattr(run, step.name)(step, run.seconds(step))
            if step.terminal:
                return out
    return run.finish()


class _Run:
    """The state of one `solve_full`: the graph, the deadline, the schedules found so far."""

    def __init__(self, graph, costs, budget, info, *, mode, solver, time_limit, verbose, device, cost_fn,
                 progress, gap, policy):
        self.graph, self.costs, self.budget, self.info = graph, costs, budget, info
        self.mode, self.solver, self.limit, self.verbose = mode, solver, time_limit, verbose
        self.device, self.cost_fn, self.progress, self.gap, self.policy = device, cost_fn, progress, gap, policy
        self.options, self.mem = full_model(graph, costs, mode, device, cost_fn, progress)
        # the limit is the solver's: measuring the implementation options (the demo's CPU profile:
        # 20-30 s of its 30 s limit) left the searches a few seconds, and the demo a +440 % schedule
        self.deadline = Deadline(time_limit)
        self.t0 = time.perf_counter()
        self.ref = dict(mode=mode, eager=eager_peak(graph, costs), eager_time=costs.plain_time,
                        gap=gap, progress=progress)
        self.large = bool(self.options) and problem_size(graph, self.mem, costs.fwd_recompute, mode)[0] > LARGE
        self.sets = {"pytorch_impls": {}, "cheap_lean_impls": lean_impls(self.options, cheap=True),
                     "fastest_impls": fastest_impls(self.options)}
        self.below_lp_bound = False
        self.res = self.sol = self.first = self.background = None
        self.stop_margin = policy.stop_margin_large_s if self.large else policy.stop_margin_s

    def holds(self, condition: str) -> bool:
        """Whether a condition of `CONDITIONS` holds now."""
        return {"options": bool(self.options), "no_options": not self.options, "small": not self.large,
                "large": self.large, "above_lp_bound": not self.below_lp_bound,
                "cheap_lean": bool(self.sets["cheap_lean_impls"]),
                "fastest_new": self.sets["fastest_impls"] not in ({}, self.sets["cheap_lean_impls"]),
                "nothing_fits": self.first is None and self.sol is None}[condition]

    def _weight(self, step: Step) -> float:
        """A weighted step's weight: above LARGE, the set faster with nothing recomputed gets
        ``weight_large_fastest`` when the sets that run differ."""
        running = [s for s in self.policy.steps if s.weight is not None and s.name in self.sets
                   and all(self.holds(c) for c in s.when)]
        base = {s.name: sum(option_seconds(o) for o in self.options
                            if o.impl == self.sets[s.name].get(o.key, "default")) for s in running}
        if self.large and len(set(base.values())) > 1 and base[step.name] == min(base.values()):
            return step.weight_large_fastest or step.weight
        return step.weight

    def seconds(self, step: Step) -> float:
        """The seconds ``step`` gets now (see `Step`)."""
        if step.of_limit:
            s = step.of_limit * self.limit - step.keep_back_s
        else:
            s = self.deadline.until(self.stop_margin if step.to_stop else 0.0) * step.of_left
            if step.weight is not None:
                later = self.policy.steps[self.policy.steps.index(step):]
                s *= self._weight(step) / sum(self._weight(x) for x in later if x.weight is not None
                                              and x.name in self.sets and all(self.holds(c) for c in x.when))
        s = max(step.floor_s, s, min(step.floor_of_limit * self.limit, step.floor_cap_s))
        if step.whole_limit_up_to_s is not None and self.limit <= step.whole_limit_up_to_s:
            s = self.limit
        if step.cap_once_proven is not None and self.sol is not None and self.sol.meta.status in ("optimal", "gap"):
            s = min(s, max(step.cap_once_proven[0], step.cap_once_proven[1] * self.limit))
        return s

    # --- the runners, one per step name of the policy -------------------------------------------

    def normal(self, step: Step, seconds: float) -> Solution:
        return solve_normal(self.graph, self.costs, self.budget, info=self.info, deadline=self.deadline.child(seconds),
                            solver=self.solver, verbose=self.verbose, **self.ref)

    def bound(self, step: Step, seconds: float) -> None:
        lower = min_budget_relaxation(self.graph, self.mem, self.mode, seconds)[0]
        self.below_lp_bound = lower is not None and self.budget < lower

    def joint(self, step: Step, seconds: float) -> None:
        g, c, mem = self.graph, self.costs, self.mem
        self.res = res = solve_ilp(g, mem, c.fwd_recompute, self.budget, mode=self.mode, solver=self.solver,
                                   time_limit=seconds, constant_s=fixed_time(g, c, self.options),
                                   verbose=self.verbose, peak_of=simulated_peak_fn(g, c, mem),
                                   gap=self.gap, progress=self.progress)
        if res.status != "no_integer":
            g2, c2 = chosen_graph(g, c, self.options, chosen_impls(self.options, res.M))
            self.sol = finish_solution(g2, c2, res.S, res.R, budget=self.budget, mode=self.mode, status=res.status,
                                       solver=res.solver, objective_s=res.objective_s, bound_s=res.bound_s,
                                       gap=res.gap, solve_time_s=time.perf_counter() - self.t0, info=self.info,
                                       eager=self.ref["eager"],
                                       eager_time=self.ref["eager_time"])

    def joint_relaxation(self, step: Step, seconds: float) -> None:
        self.background = relaxation_in_background(self.graph, self.mem, self.costs.fwd_recompute, self.budget,
                                                   self.mode, seconds)

    def _fixed(self, impls: dict[str, str], seconds: float) -> None:
        cand = _solve_fixed(self.graph, self.costs, self.options, impls, self.budget, self.info, self.solver,
                            seconds, self.verbose, self.ref, relaxation=not self.large)
        if cand is not None and (self.first is None or cand.meta.objective_s < self.first.meta.objective_s):
            self.first = cand

    def _fixed_set(self, step: Step, seconds: float) -> None:
        """The runner of a step named after its implementation set in ``self.sets``."""
        self._fixed(self.sets[step.name], seconds)

    pytorch_impls = cheap_lean_impls = fastest_impls = _fixed_set

    def fallback_impls(self, step: Step, seconds: float) -> None:
        res = self.res
        self._fixed(lean_impls(self.options) if res is None or res.M is None else round_options(self.options, res.M),
                    seconds)

    def smallest(self, step: Step, seconds: float) -> None:
        self.first = smallest_schedule(self.graph, self.costs, self.budget, self.info, self.mode, self.solver,
                                       seconds, self.device, self.cost_fn, self.ref)

    def finish(self) -> Solution:
        """The fastest schedule found, with the best bound known (see `solve_full`)."""
        if self.below_lp_bound:  # the smallest-budget search's schedule, with no joint bound
            self.first.meta.solve_time_s = time.perf_counter() - self.t0
            return self.first
        g, c, options = self.graph, self.costs, self.options
        # the best bound known: the relaxation's, or the no-recomputation time if that is higher (the
        # relaxation of GoogLeNet at batch 320, 123,000 columns, did not finish in its 24 s)
        floor = no_recompute_bound(g, c, options)
        if self.background is not None:
            lp = relaxation_result(self.background, self.deadline.end - self.policy.bound_wait_margin_s,
                                   grace=0.0)[0]  # no wait past the limit
            if self.progress is not None:
                self.progress("  joint LP relaxation: " + ("no answer in time" if lp is None
                                                           else f"bound {lp + fixed_time(g, c, options):.6g} s")
                              + f" ({time.perf_counter() - self.t0:.1f} s)")
            lp_bound = None if lp is None else lp + fixed_time(g, c, options)
        else:
            lp_bound = self.res.bound_s
        bound = floor if lp_bound is None else max(lp_bound, floor)
        sol = self.sol
        if sol is not None:
            sol.meta.solve_time_s = time.perf_counter() - self.t0
            if sol.meta.bound_s is None or sol.meta.bound_s < floor:
                sol.meta.bound_s = min(floor, sol.meta.objective_s)
                sol.meta.gap = max(0.0, 1 - sol.meta.bound_s / sol.meta.objective_s)
            return _better(sol, self.first, bound, self.gap)
        self.first.meta.solve_time_s = time.perf_counter() - self.t0
        return _better(None, self.first, bound, self.gap)


def _solve_fixed(graph, costs, options, impls: dict[str, str], budget: int, info, solver: str,
                 time_limit: float, verbose: bool, ref: dict, relaxation: bool = True) -> Solution | None:
    """The normal-mode solution on ``graph`` with the implementations ``impls`` fixed (solver
    "<name>+fixed-impls"), or None when that ILP finds the budget infeasible."""
    g, c = chosen_graph(graph, costs, options, impls)
    try:
        sol = solve_normal(g, c, budget, info=info, deadline=Deadline(time_limit), solver=solver, verbose=verbose,
                           relaxation=relaxation, smallest=False, **ref)
    except InfeasibleBudgetError:
        return None
    if impls:
        sol.meta.solver += "+fixed-impls"
    return sol


def _better(sol: Solution | None, other: Solution | None, bound_s, gap: float) -> Solution:
    """The faster (objectives in seconds) of the joint ILP's solution ``sol`` and a schedule of a
    restricted problem ``other`` (fixed implementations), measured against the joint ILP's bound:
    ``other`` is "gap" when within ``gap`` of it, else "heuristic" (its own ILP's optimality says
    nothing about the joint problem)."""
    if other is None or (sol is not None and sol.meta.objective_s <= other.meta.objective_s):
        return sol
    if sol is not None:  # its solve time counts from the start of solve_full, both solves included
        other.meta.solve_time_s = sol.meta.solve_time_s
    if bound_s is not None and other.meta.objective_s < bound_s * (1 - 1e-9):
        # a repaired schedule the simulator fits but the joint ILP's memory (an upper bound, within
        # 1 % of the simulator) does not: the ILP's bound is no bound for it
        bound_s = None
    other.meta.bound_s = bound_s
    other.meta.gap = None if bound_s is None else max(0.0, 1 - bound_s / other.meta.objective_s)
    other.meta.status = "gap" if other.meta.gap is not None and other.meta.gap <= gap else "heuristic"
    return other


validate_policy(POLICY)
