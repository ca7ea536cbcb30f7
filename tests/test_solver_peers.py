"""The solver peers: one signature ``solve_x(graph, costs, budget, *, deadline)``, each
schedule's simulated peak within the budget, the ILP at least as fast as the heuristics, the
full-mode portfolio at least as fast as every peer, and its policy table validated."""
from __future__ import annotations

import dataclasses
import time

import numpy as np
import pytest
import torch
from torch import nn

from monet.capture import capture
from monet.executor import build_modules
from monet.profiling.costs import analytic_costs, costs_for
from monet.simulate import simulate
from monet.solver import portfolio
from monet.solver.checkpoint_all import solve_checkpoint_all
from monet.solver.chen import chen_checkpoints, solve_chen
from monet.solver.deadline import Deadline
from monet.solver.ilp import InfeasibleBudgetError
from monet.solver.finish import eager_peak, memory_model
from monet.solver.solve import PEERS, solve
from usernet import UserNet

FULL = "inplace_conv_multiway_newnode"
LIMIT = 20.0  # seconds per solve: a margin, the small graphs are proven in about a second


def chain():
    """A chain of convolutions (no branches): Chen's segments apply as in his Sec. 4.1."""
    torch.manual_seed(0)
    layers, c = [], 3
    for _ in range(6):
        layers += [nn.Conv2d(c, 8, 3, padding=1), nn.Tanh()]
        c = 8
    return nn.Sequential(*layers, nn.Flatten(), nn.Linear(8 * 8 * 8, 4)), torch.randn(4, 3, 8, 8)


@pytest.fixture(scope="module", params=["user", "chain"])
def case(request):
    torch.manual_seed(0)
    model, x = (UserNet(), torch.randn(4, 3, 16, 16)) if request.param == "user" else chain()
    graph = capture(model, x)
    costs = costs_for(graph, analytic_costs(graph))
    return request.param, graph, costs, eager_peak(graph, costs)


def simulated_peak(graph, costs, sol) -> int:
    """The simulator's peak (bytes) of a solution's schedule, recomputed here from the schedule."""
    fw, bw = build_modules(graph, sol.schedule)
    return simulate(graph, fw, bw, costs.fwd_workspace, costs.bwd_workspace).peak_bytes


def run_peers(graph, costs, budget):
    """{peer name: Solution or None (InfeasibleBudgetError)} at ``budget`` bytes."""
    out = {}
    for name, fn in PEERS.items():
        try:
            out[name] = fn(graph, costs, budget, deadline=Deadline(LIMIT))
        except InfeasibleBudgetError:
            out[name] = None
    return out


@pytest.mark.parametrize("frac", [1.0, 0.9])
def test_every_peer_fits_its_budget_and_the_ilp_is_fastest(case, frac):
    name, graph, costs, eager = case
    budget = int(frac * eager)
    sols = run_peers(graph, costs, budget)
    for peer, sol in sols.items():
        if sol is not None:
            assert simulated_peak(graph, costs, sol) <= budget, peer
            assert sol.meta.predicted_peak_bytes == simulated_peak(graph, costs, sol), peer
            # the objective counts the forward, backward and recomputation time
            recompute = float(costs.fwd_recompute @ np.asarray(sol.R).sum(axis=0))
            assert sol.meta.objective_s == pytest.approx(costs.total_time + recompute, rel=1e-9), peer
    ilp = sols["ilp"]
    assert ilp is not None and sols["greedy"] is not None
    assert (sols["checkpoint_all"] is None) == (frac < 1.0)  # the plain peak fits only the whole of it
    for peer in ("greedy", "rounding", "chen", "checkpoint_all"):
        if sols[peer] is not None:
            assert ilp.meta.objective_s <= sols[peer].meta.objective_s * (1 + 1e-9), peer


def test_checkpoint_all_is_plain_pytorch(case):
    _, graph, costs, eager = case
    sol = solve_checkpoint_all(graph, costs, eager, deadline=Deadline(0))
    assert sol.meta.objective_s == costs.total_time
    assert sol.meta.predicted_peak_bytes == eager and not np.asarray(sol.R).any()
    with pytest.raises(InfeasibleBudgetError) as err:
        solve_checkpoint_all(graph, costs, eager - 1, deadline=Deadline(0))
    assert err.value.min_budget_bytes == eager


def test_chen_saves_memory_on_a_chain():
    model, x = chain()
    graph = capture(model, x)
    costs = costs_for(graph, analytic_costs(graph))
    eager = eager_peak(graph, costs)
    sol = solve_chen(graph, costs, eager, deadline=Deadline(LIMIT))
    assert sol.meta.predicted_peak_bytes < eager
    assert sol.meta.objective_s > costs.total_time  # it recomputes
    R = np.asarray(sol.R)
    assert R.sum(axis=0).max() == 1  # each segment recomputed once
    n = len(np.unique(memory_model(graph, costs).group_node))
    assert 1 <= len(chen_checkpoints(memory_model(graph, costs))) <= int(np.ceil(np.sqrt(n))) + 1
    # it has no budget knob: below its peak it refuses and names the peak
    with pytest.raises(InfeasibleBudgetError) as err:
        solve_chen(graph, costs, sol.meta.predicted_peak_bytes - 1, deadline=Deadline(LIMIT))
    assert err.value.min_budget_bytes == sol.meta.predicted_peak_bytes


def test_portfolio_is_at_least_as_fast_as_every_peer(case):
    """Full mode runs the normal-mode ILP with PyTorch's implementations among its steps, so at
    the same budget and limit its schedule is no slower than any peer's (the ILP's is proven
    optimal on these graphs in about a second, far within the limit)."""
    _, graph, costs, eager = case
    budget = int(0.9 * eager)
    full = solve(graph, costs, budget, FULL, time_limit=LIMIT)
    assert full.meta.predicted_peak_bytes <= budget
    for peer, sol in run_peers(graph, costs, budget).items():
        if sol is not None:
            assert full.meta.objective_s <= sol.meta.objective_s * (1 + 1e-9), peer


@pytest.mark.parametrize("peer", list(PEERS))
def test_an_expired_deadline_answers(case, peer):
    """An expired deadline still gives a schedule that fits, or the error; never a hang (each
    solver's own floors bound it: at least 1 s for the LP and for CBC)."""
    _, graph, costs, eager = case
    deadline = Deadline(0.0)
    assert deadline.expired() and deadline.left() == 0.0
    try:
        sol = PEERS[peer](graph, costs, int(0.9 * eager), deadline=deadline)
    except InfeasibleBudgetError:
        return
    assert sol.meta.predicted_peak_bytes <= int(0.9 * eager)


def test_a_tiny_limit_in_full_mode_answers(case):
    _, graph, costs, eager = case
    try:
        sol = solve(graph, costs, int(0.9 * eager), FULL, time_limit=0.01)
    except InfeasibleBudgetError:
        return
    assert sol.meta.predicted_peak_bytes <= int(0.9 * eager)


def test_deadline():
    d = Deadline(30.0)
    assert not d.expired() and 0 < d.left() <= 30.0
    assert d.share(0.5) <= 15.0 and d.share(0.0) == 0.0
    assert d.until(40.0) < 0  # the margin is past
    child = d.child(100.0)
    assert child.left() > d.left()  # not clipped: the portfolio's floors may overrun the limit
    for bad in (-1.0, float("nan"), float("inf")):
        with pytest.raises(ValueError):
            Deadline(bad)
    with pytest.raises(ValueError):
        d.share(1.5)
    gone = Deadline(0.0)
    time.sleep(0.001)
    assert gone.expired() and gone.left() == 0.0


def test_policy_table_is_valid():
    policy = portfolio.POLICY
    portfolio.validate_policy(policy)
    names = [s.name for s in policy.steps]
    assert len(set(names)) == len(names)
    # the shares of the limit that run one after the other leave room for the fixed solves
    assert sum(s.of_limit for s in policy.steps if not s.background) <= 1.0
    for s in policy.steps:
        assert 0.0 <= s.of_limit <= 1.0 and 0.0 <= s.of_left <= 1.0, s.name
        assert set(s.when) <= set(portfolio.CONDITIONS), s.name
    # the order of the steps is the policy: the bound and the joint ILP before the fixed sets,
    # the smallest-budget search last
    assert names.index("bound") < names.index("joint") < names.index("pytorch_impls") < names.index("fallback_impls")
    assert names[-1] == "smallest"


@pytest.mark.parametrize("change", [
    dict(of_limit=0.95),  # the joint ILP's share, with the bound's 0.1: 1.05 of the limit
    dict(of_limit=-0.1),
    dict(when=("options", "sometimes")),
    dict(name="no_such_runner"),
    dict(weight=0.0),
    dict(of_limit=0.0, of_left=0.0),
])
def test_a_bad_policy_is_refused(change):
    steps = list(portfolio.POLICY.steps)
    k = [s.name for s in steps].index("joint" if "weight" not in change else "pytorch_impls")
    steps[k] = dataclasses.replace(steps[k], **change)
    with pytest.raises(ValueError):
        portfolio.validate_policy(dataclasses.replace(portfolio.POLICY, steps=tuple(steps)))


def test_shares_follow_the_table(case, monkeypatch):
    """The seconds each step gets are the table's: halving the joint ILP's share halves the
    limit it is given."""
    _, graph, costs, eager = case
    seen = {}

    def spy(name, real):
        def run(self, step, seconds):
            seen[name] = seconds
            return real(self, step, seconds)
        return run

    for name in ("bound", "joint"):
        monkeypatch.setattr(portfolio._Run, name, spy(name, getattr(portfolio._Run, name)))
    steps = tuple(dataclasses.replace(s, of_limit=0.2) if s.name == "joint" else s for s in portfolio.POLICY.steps)
    portfolio.solve_full(graph, costs, int(0.9 * eager), mode=FULL, time_limit=LIMIT,
                         policy=dataclasses.replace(portfolio.POLICY, steps=steps))
    assert seen["bound"] == pytest.approx(0.1 * LIMIT)
    assert seen["joint"] == pytest.approx(0.2 * LIMIT)


def test_the_fastest_set_is_each_choice_s_fastest_option_and_the_portfolio_beats_it(case, monkeypatch):
    """`fastest_impls` picks, per choice, an option of the least forward and backward seconds
    (`option_seconds`), leaving PyTorch's out; where that set is new, the portfolio runs it, and
    its schedule is no slower than the one the fixed set gives alone."""
    from monet.solver.choices import (analytic_cost_fn, fastest_impls, fixed_time, full_model,
                                      no_recompute_bound, option_seconds)

    _, graph, costs, eager = case
    options, _ = full_model(graph, costs, FULL, "cpu", analytic_cost_fn())
    fastest = fastest_impls(options)
    by_key = {}
    for o in options:
        by_key.setdefault(o.key, []).append(o)
    assert set(fastest) <= set(by_key)
    for key, opts in by_key.items():
        least = min(option_seconds(o) for o in opts)
        chosen = [o for o in opts if o.impl == fastest.get(key, "default")]
        assert len(chosen) == 1 and option_seconds(chosen[0]) == least, key
    assert no_recompute_bound(graph, costs, options) == pytest.approx(
        fixed_time(graph, costs, options) + sum(min(option_seconds(o) for o in opts) for opts in by_key.values()))

    ran = []
    real = portfolio._Run.fastest_impls
    monkeypatch.setattr(portfolio._Run, "fastest_impls",
                        lambda self, step, seconds: (ran.append(step.name), real(self, step, seconds)))
    budget = int(0.9 * eager)
    full = solve(graph, costs, budget, FULL, time_limit=LIMIT)
    new = fastest not in ({}, portfolio.lean_impls(options, cheap=True))
    assert ran == (["fastest_impls"] if new else [])
    if new:
        ref = dict(mode=FULL, eager=eager, eager_time=costs.plain_time, gap=0.0, progress=None)
        alone = portfolio._solve_fixed(graph, costs, options, fastest, budget, None, "CBC", LIMIT, False, ref)
        assert alone is not None and full.meta.objective_s <= alone.meta.objective_s * (1 + 1e-9)
