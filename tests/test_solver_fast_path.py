"""The solver's fast path (pruned ILP, LP relaxation, MIP start, CBC through its C interface) against
MONeT's formulation as written (`ilp.plain_solve`: no pruning, no start, CBC through cvxpy), both
solved to optimality on small graphs, in normal and in full mode."""
from __future__ import annotations


import numpy as np
import pytest
from ci import skip_unless_long
import torch

from monet.capture import capture
from monet.profiling.costs import analytic_costs, costs_for
from monet.solver import formulation, ilp, relaxation
from monet.solver.cbc import solve_cbc
from monet.solver.finish import simulated_peak_fn
from monet.solver.solve import analytic_cost_fn, eager_peak, fixed_time, full_model, memory_model, solve
from monet.zoo.models import get_model
from usernet import UserNet

FULL = "inplace_conv_multiway_newnode"


@pytest.fixture(scope="module", params=["user", "resnet"])
def case(request):
    torch.manual_seed(0)
    if request.param == "user":
        model, x = UserNet(), torch.randn(4, 3, 16, 16)
    else:
        model, x = get_model("resnet50", base_width=4, layers=(1, 1, 0, 0), num_classes=10), torch.randn(4, 3, 32, 32)
    graph = capture(model, x)
    costs = costs_for(graph, analytic_costs(graph))
    return graph, costs, eager_peak(graph, costs)


# Whether a budget has a schedule, with analytic costs (deterministic: it does not depend on the
# machine).  The small ResNet has none at 70 % of its plain peak in either formulation.
FEASIBLE = {("user", 0.85): True, ("user", 0.7): True, ("resnet", 0.85): True, ("resnet", 0.7): False}


@pytest.mark.parametrize("frac", [0.85, 0.7])
def test_fast_path_matches_plain_ilp_in_normal_mode(case, frac, request):
    graph, costs, eager = case
    mem = memory_model(graph, costs)
    budget = int(frac * eager)
    const = float(costs.fwd_time.sum() + costs.bwd_time.sum())
    # the limit is a margin, not a decision: both are proven in seconds
    plain = ilp.plain_solve(graph, mem, costs.fwd_recompute, budget, "normal", "CBC", 300, constant_s=const)

    def fast_solve(**kw):
        return ilp.solve_ilp(graph, mem, costs.fwd_recompute, budget, "normal", solver="CBC", time_limit=300,
                             constant_s=const, peak_of=simulated_peak_fn(graph, costs, mem), **kw)

    if not FEASIBLE[request.node.callspec.params["case"], frac]:
        # both refuse: the unpruned formulation proves it, the pruned one says so with an error
        # (without its smallest-budget search, which the last test of this file covers)
        assert plain["status"] == "infeasible", plain
        with pytest.raises(ilp.InfeasibleBudgetError):
            fast_solve(smallest=False)
        return
    assert plain["status"] == "optimal", plain
    # the pruned ILP must not refuse a budget the unpruned formulation solves (a defect seen once
    # on the small ResNet at 70 %, before the exact memory model: it now turns this test red)
    fast = fast_solve()
    assert plain["n_variables"] > ilp.problem_size(graph, mem, costs.fwd_recompute, "normal")[0]
    # The pruned ILP allows R[t, i] only for ancestors of what stage t reads: a restriction, not an
    # exact reduction (recomputing early, while the inputs are still kept, can be cheaper).  On
    # UserNet at 85 % it cost 0.3 % of the iteration time; the test bounds the loss at 1 %.
    assert fast.objective_s <= plain["objective_s"] * 1.01
    # every returned schedule fits in the simulator
    assert simulated_peak_fn(graph, costs, mem)(mem.node_to_group(fast.S), fast.R) <= budget


@pytest.mark.parametrize("case", ["user"], indirect=True)
def test_fast_path_matches_plain_ilp_in_full_mode(case):
    """On UserNet, where both are proven optimal in about a second (the limit is a margin).  The
    small ResNet's unpruned full-mode ILP was not proven within 120 s on a shared 2-core machine
    (the test then skipped after 211 s), so whether it was compared depended on the machine."""
    graph, costs, eager = case
    options, mem = full_model(graph, costs, FULL, "cpu", analytic_cost_fn())
    budget = int(0.8 * eager)
    fixed = fixed_time(graph, costs, options)
    plain = ilp.plain_solve(graph, mem, costs.fwd_recompute, budget, FULL, "CBC", 300, constant_s=fixed)
    fast = ilp.solve_ilp(graph, mem, costs.fwd_recompute, budget, FULL, solver="CBC", time_limit=300,
                         constant_s=fixed, peak_of=simulated_peak_fn(graph, costs, mem))
    assert plain["status"] == "optimal" and fast.status == "optimal", (plain, fast.status)
    assert fast.objective_s <= plain["objective_s"] * 1.01  # see the normal-mode test


@pytest.mark.parametrize("frac", [0.9, 0.75, 0.6])
def test_every_schedule_fits_its_budget_and_reports_a_gap(case, frac, request):
    if request.node.callspec.params["case"] == "resnet" and frac > 0.6:
        skip_unless_long("the small ResNet at 90 % and 75 %", 40, "the short suite solves UserNet at every budget and the ResNet at 60 %")
    graph, costs, eager = case
    try:
        sol = solve(graph, costs, int(frac * eager), FULL, solver="CBC", time_limit=20, gap=0.02)
    except ilp.InfeasibleBudgetError as e:  # a refusal names a larger smallest budget
        assert e.min_budget_bytes > int(frac * eager)
        return
    assert sol.meta.predicted_peak_bytes <= int(frac * eager)
    assert sol.meta.status != "no_integer"  # the solver's own "no schedule" never reaches a solution
    if sol.meta.bound_s is not None:  # whatever the status, a bound comes with the gap it leaves
        obj, bound = sol.meta.objective_s, sol.meta.bound_s
        assert bound <= obj * (1 + 1e-9) and sol.meta.gap == pytest.approx(max(0.0, (obj - bound) / obj), abs=1e-9)
    if sol.meta.status in ("optimal", "gap"):
        assert sol.meta.gap is not None and sol.meta.gap <= 0.02 + 1e-9
        assert sol.meta.bound_s <= sol.meta.objective_s * (1 + 1e-9)


def test_cbc_driver_uses_the_start_and_reports_bound_and_progress():
    import cvxpy as cp

    x = cp.Variable(6, boolean=True)
    w = np.array([3.0, 4.0, 5.0, 6.0, 7.0, 8.0])
    problem = cp.Problem(cp.Minimize(-w @ x), [w @ x <= 15, x[0] + x[1] <= 1])
    lines = []
    out = solve_cbc(problem, time_limit=10, start={x: np.array([1, 0, 0, 0, 0, 1.0])}, progress=lines.append)
    assert out.status == "optimal"
    assert out.objective == pytest.approx(-15.0) and out.bound == pytest.approx(-15.0)
    assert np.isclose(w @ np.round(x.value), 15.0) and np.round(x.value[:2]).sum() <= 1
    assert lines and "incumbent" in lines[-1]
    infeasible = cp.Problem(cp.Minimize(cp.sum(x)), [cp.sum(x) >= 7])
    assert solve_cbc(infeasible, time_limit=10).status in ("infeasible", "no_integer")


@pytest.mark.parametrize("child, says", [
    ("import os, signal; os.kill(os.getpid(), signal.SIGSEGV)", "exit status -11"),  # CBC crashed
    ("import time; time.sleep(60)", "did not answer"),  # CBC ran past its deadline
])
def test_cbc_crash_or_hang_is_a_lost_solve_not_a_dead_process(monkeypatch, child, says):
    import sys

    import cvxpy as cp

    import monet.solver.cbc as cbc

    monkeypatch.setattr(cbc, "_worker_command", lambda: [sys.executable, "-c", child])
    x = cp.Variable(3, boolean=True)
    problem = cp.Problem(cp.Minimize(cp.sum(x)), [cp.sum(x) >= 1])
    lines = []
    out = cbc.solve_cbc(problem, time_limit=0.5, progress=lines.append)
    assert out.status == "no_integer" and out.objective is None
    assert says in out.detail and any(says in line for line in lines)
    assert out.solve_time_s < 30


def test_relaxation_charges_every_recomputation_and_every_read(case, request):
    """The joint LP relaxation (full mode, a budget that forces recomputation) is a lower bound
    that cannot be bought with fractional implementation choices: each recomputed node costs at
    least its cheapest option's time times its R, and a value read under several options of one
    choice is there as much as those options are chosen together.  With one row per option
    (``Q >= t_o (R + M[o] - 1)``, ``R + S >= M[o]``), M split 0.99 / 0.01 or 0.2 x 5 made
    recomputation free and kept inputs at a fifth: ResNet-50's bound at 70 % was the
    no-recomputation time."""
    import cvxpy as cp

    graph, costs, eager = case
    if request.node.callspec.params["case"] == "resnet":
        skip_unless_long("the ResNet's full-mode relaxation", 44, "the short suite relaxes the other cases")
    options, mem = full_model(graph, costs, FULL, "cpu", analytic_cost_fn())
    for budget in (0.6 * eager, 0.7 * eager, 0.8 * eager):  # the smallest the relaxation fits
        P = formulation.Problem(mem, costs.fwd_recompute, FULL, relax=True, recompute_rows=False)
        lp = cp.Problem(cp.Minimize(P.time_objective()), P.cons + P.memory_constraints(budget))
        lp.solve(solver=cp.SCIPY, scipy_options={"method": "highs"})
        if lp.status == cp.OPTIMAL:
            break
    assert lp.status == cp.OPTIMAL
    value, M, S = float(lp.value), np.asarray(P.m.value), P.fractional_s()
    R = np.zeros(P.T * P.N)
    R[P.r_idx] = P.r.value
    R = R.reshape(P.T, P.N)
    least = {}
    for o in options:
        if o.node >= 0:
            least[o.node] = min(least.get(o.node, np.inf), o.fwd_recompute[o.node])
    rec = np.asarray(costs.fwd_recompute, dtype=float).copy()
    for i, t in least.items():
        rec[i] = t
    assert R.sum() > 0  # the budget needs recomputation
    assert value - P.opt_time @ M >= rec @ R.sum(axis=0) - 1e-9
    # reads: S + R covers the options that read a value, summed per choice
    readers: dict[tuple, set] = {}
    for t, g, o in mem.reads:
        if o >= 0:
            readers.setdefault((t, g, options[o].choice), set()).add(o)
    assert any(len(opts) > 1 for opts in readers.values())
    for (t, g, _), opts in readers.items():
        assert S[t, g] + R[t, mem.group_node[g]] >= sum(M[o] for o in opts) - 1e-6
    # and it is still a relaxation: below the ILP's optimum where the fast path proves one
    fixed = fixed_time(graph, costs, options)
    res = ilp.solve_ilp(graph, mem, costs.fwd_recompute, int(budget), FULL, solver="CBC", time_limit=60,
                        constant_s=fixed)
    if res.status == "optimal":
        assert value + fixed <= res.objective_s * (1 + 1e-6)


@pytest.mark.parametrize("start", ["greedy", "windows"])
def test_drop_starts_fit_the_budget_and_drop_nothing_at_the_plain_peak(case, start):
    """`solver.repair.drop_greedily` and `solver.windows.drop_windows` return schedules whose ILP
    memory (and simulated peak) fits, recomputing nothing when keeping everything fits."""
    import time

    from monet.solver.repair import drop_greedily
    from monet.solver.windows import drop_windows

    make = drop_greedily if start == "greedy" else drop_windows
    graph, costs, eager = case
    mem = memory_model(graph, costs)
    P = formulation.Problem(mem, costs.fwd_recompute, "normal")
    S, R, cost = make(graph, mem, P.allow_s, eager, costs.fwd_recompute, time.perf_counter() + 60)
    assert cost == 0 and not R.any()
    peak_of = simulated_peak_fn(graph, costs, mem)
    found = 0
    for frac in (0.9, 0.8, 0.65):  # either may stop without a schedule (a heuristic), not with a wrong one
        out = make(graph, mem, P.allow_s, frac * eager, costs.fwd_recompute, time.perf_counter() + 60)
        if out is None:
            continue
        found += 1
        S, R, cost = out
        assert cost > 0 and cost == pytest.approx(float(np.asarray(costs.fwd_recompute) @ R.sum(axis=0)))
        assert mem.peak(S, R) <= frac * eager
        assert peak_of(S, R) <= frac * eager
    assert found  # at least the looser budget is met


def test_relaxation_in_background_gives_the_relaxation(case):
    graph, costs, eager = case
    mem = memory_model(graph, costs)
    direct = relaxation.lp_relaxation(graph, mem, costs.fwd_recompute, 0.85 * eager, "normal", 60)
    import time
    future = relaxation.relaxation_in_background(graph, mem, costs.fwd_recompute, 0.85 * eager, "normal", 60)
    threaded = relaxation.relaxation_result(future, time.perf_counter() + 60)
    assert direct[0] is not None and threaded[0] == pytest.approx(direct[0])


def test_min_budget_lower_bound_is_below_the_proven_minimum_and_refuses_below_it(case, request):
    """The LP relaxation of the budget-minimising ILP bounds its optimum from below (proven by CBC
    on UserNet in under a second; the small ResNet's is not proven in 80 s, so there only the
    schedule found bounds it), and a budget under that bound is refused as infeasible with the
    bound in the message."""
    if request.node.callspec.params["case"] == "resnet":
        skip_unless_long("the small ResNet's smallest-budget bound", 24,
                   "the short suite bounds UserNet's, and tests/test_solver_synthetic.py proves hand-checked smallest budgets")
    graph, costs, eager = case
    mem = memory_model(graph, costs)
    lower, frac = relaxation.min_budget_relaxation(graph, mem, "normal", 60)
    assert frac is not None and frac.shape == (len(graph.bwd), len(mem.groups))
    # UserNet's is proven in about a second, so its limit is a margin (CBC returns at the proof);
    # the small ResNet's is not proven in 80 s, and 10 s give it a schedule to bound
    user = request.node.callspec.params["case"] == "user"
    least, proven, S, R, _, lower2 = ilp.solve_min_budget(graph, mem, "normal", "CBC", 300 if user else 10)
    assert lower2 == pytest.approx(lower)
    if user:
        assert proven, "CBC should prove the smallest budget of a graph this small"
    assert 0 < lower <= least * (1 + 1e-6) and mem.peak(S, R) <= least
    assert lower > mem.constant  # parameters, input and output gradient at least
    with pytest.raises(ilp.InfeasibleBudgetError, match="infeasible: in the ILP's memory model no schedule "
                                                        f"fits below {int(lower)} bytes") as e:
        solve(graph, costs, int(0.99 * lower), "normal", time_limit=20)
    assert e.value.lower_bytes == pytest.approx(lower) and e.value.min_budget_bytes >= lower * (1 - 0.02)
