"""The search's starts on hand-built graphs (tests/synthetic.py), no capture: `repair` against a
plain reference of its contract, and the starts built for tight budgets (`drop_greedily`,
`ladder`) fitting their budget, valid, and kept by `search` whatever its deadline."""
import time

import numpy as np
import pytest

from monet.solver.finish import eager_peak, memory_model
from monet.solver.formulation import allowed
from monet.solver.repair import LADDER_RUNGS, drop_greedily, ladder, repair, rung_budgets
from monet.solver.search import search
from synthetic import blocks, chain, costs_of, joint_graph


def _setup(nodes):
    fwd, bwd = nodes
    graph, costs = joint_graph(fwd, bwd), costs_of(fwd, bwd)
    mem = memory_model(graph, costs)
    return graph, costs, mem, allowed(mem, "normal")[2]


def _reference_repair(graph, mem, keep, allow_s):
    """`repair`'s contract written out plainly: each stage holds what was kept into it, recomputes
    what its backward node reads and lacks (with the inputs that needs, recursively); then a kept
    group stays at the start of stage t only if t reads it without recomputing its node, or it is
    kept into t + 1 so."""
    T, G, N = len(graph.bwd), len(mem.groups), len(graph.fwd)
    inputs = [sorted({mem.group_of[v] for v in n.reads}) for n in graph.fwd]
    S, R = np.zeros((T, G), dtype=bool), np.zeros((T, N), dtype=bool)
    have = keep[0] & allow_s[0]
    for t, b in enumerate(graph.bwd):
        S[t], avail = have, have.copy()

        def need(g):
            if avail[g]:
                return
            i = mem.group_node[g]
            for h in inputs[i]:
                need(h)
            R[t, i] = True
            avail[mem.group_node == i] = True
        for v in b.reads:
            need(mem.group_of[v])
        if t + 1 < T:
            have = avail & keep[t + 1] & allow_s[t + 1]
    used = np.zeros((T, G), dtype=bool)
    for t, b in enumerate(graph.bwd):
        used[t, [mem.group_of[v] for v in b.reads]] = True
        for i in np.flatnonzero(R[t]):
            used[t, inputs[i]] = True
    later = np.zeros(G, dtype=bool)
    for t in range(T - 1, -1, -1):
        S[t] &= (used[t] | later) & ~R[t, mem.group_node]
        later = S[t]
    return S, R


@pytest.mark.parametrize("p", [0.1, 0.5, 0.9])
def test_repair_keeps_its_contract(p):
    graph, _, mem, allow_s = _setup(blocks(6))
    rng = np.random.default_rng(0)
    for _ in range(10):
        keep = rng.random(allow_s.shape) < p
        S, R = repair(graph, mem, keep, allow_s)
        S0, R0 = _reference_repair(graph, mem, keep, allow_s)
        assert (S == S0).all() and (R == R0).all()


def _fits_and_costs(graph, mem, allow_s, costs, budget, found):
    S, R, cost = found
    assert mem.peak(S, R) <= budget
    assert not (S & ~allow_s).any()
    assert cost == pytest.approx(float(costs.fwd_recompute @ R.sum(axis=0)))
    again_S, again_R = repair(graph, mem, S, allow_s)  # a valid schedule is its own repair
    assert (again_S == S).all() and (again_R == R).all()


@pytest.mark.parametrize("share", [0.55, 0.7, 0.85])
def test_the_ladder_fits_the_budget_with_valid_schedules(share):
    graph, costs, mem, allow_s = _setup(blocks(8))
    budget = share * mem.peak(*repair(graph, mem, allow_s, allow_s))
    found = ladder(graph, mem, allow_s, budget, costs.fwd_recompute)
    assert len(found) <= len(LADDER_RUNGS)
    for each in found:
        _fits_and_costs(graph, mem, allow_s, costs, budget, each)
    greedy = drop_greedily(graph, mem, allow_s, budget, costs.fwd_recompute)
    if greedy is not None:
        _fits_and_costs(graph, mem, allow_s, costs, budget, greedy)
    assert found or greedy is not None


def test_the_rungs_stay_below_keeping_everything():
    # far from keeping everything: multiples of the budget
    assert rung_budgets(100.0, 400.0) == pytest.approx([r * 100.0 for r in LADDER_RUNGS])
    # near it (a budget at 95 % of the keep-all peak): part of the way up, every rung under it
    near = rung_budgets(95.0, 100.0)
    assert near == sorted(near, reverse=True) and all(95.0 < b < 100.0 for b in near)
    assert rung_budgets(100.0, 100.0) == [] and rung_budgets(120.0, 100.0) == []


def test_a_start_the_greedy_cannot_reach_is_refused_not_returned_over_budget():
    graph, costs, mem, allow_s = _setup(chain([4000, 400, 4000, 400, 40], [1e-3, 5e-3, 5e-4, 5e-3, 1e-3]))
    budget = 100  # below the constants and gradients: nothing fits
    assert drop_greedily(graph, mem, allow_s, budget, costs.fwd_recompute) is None
    assert ladder(graph, mem, allow_s, budget, costs.fwd_recompute) == []


@pytest.mark.parametrize("share", [0.6, 0.8])
def test_a_small_graph_keeps_every_start_whatever_the_deadline(share):
    """Below `ALWAYS_BUILT_CELLS` the starts are built whole: a search whose deadline has passed
    returns a schedule at least as cheap as the greedy's, or where the greedy gets stuck, as each
    of the ladder's."""
    graph, costs, mem, allow_s = _setup(blocks(8))
    budget = share * eager_peak(graph, costs)
    greedy = drop_greedily(graph, mem, allow_s, budget, costs.fwd_recompute)
    starts = [greedy] if greedy is not None else ladder(graph, mem, allow_s, budget, costs.fwd_recompute)
    assert starts
    S, R, cost, peak = search(graph, mem, allow_s, costs.fwd_recompute, budget, deadline=time.perf_counter() - 1.0)
    assert peak <= budget
    assert cost <= min(c for _, _, c in starts) + 1e-12
