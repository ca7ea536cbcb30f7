"""A budget named by an `InfeasibleBudgetError` is feasible when solved again, however the second
solve goes: the smallest-budget search is cached on the graph, and its schedule is what a solve at
that budget falls back to when the time-limited ILP finds nothing there (as on a loaded machine)."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from monet.capture import capture
from monet.profiling.costs import analytic_costs, costs_for
from monet.solver import ilp_peer as normal_mod
from monet.solver.ilp import InfeasibleBudgetError
from monet.solver.solve import eager_peak, solve
from usernet import UserNet


def test_retry_at_the_named_budget_gets_the_search_schedule(monkeypatch):
    torch.manual_seed(0)
    graph = capture(UserNet(), torch.randn(4, 3, 16, 16))
    costs = costs_for(graph, analytic_costs(graph))
    with pytest.raises(InfeasibleBudgetError) as err:
        solve(graph, costs, int(0.05 * eager_peak(graph, costs)), "normal", time_limit=20)
    least = err.value.min_budget_bytes
    assert least is not None

    def nothing_in_time(*args, **kwargs):  # a time-limited ILP that found no schedule
        raise InfeasibleBudgetError(int(args[3]), None, "normal")

    monkeypatch.setattr(normal_mod, "solve_ilp", nothing_in_time)
    sol = solve(graph, costs, least, "normal", time_limit=20)
    assert sol.meta.predicted_peak_bytes <= least
    assert sol.meta.solver.endswith("+min-budget")
    with pytest.raises(InfeasibleBudgetError) as again:  # below it: still refused, with the same budget named
        solve(graph, costs, least - 1, "normal", time_limit=20)
    assert again.value.min_budget_bytes == least


def test_an_ilp_that_spent_the_deadline_leaves_the_search_its_share(monkeypatch):
    """The ILP found nothing and left no time: the smallest-budget search still gets
    `SEARCH_SHARE` of the limit, so the error names a budget below plain PyTorch's peak (with none
    left, the search can stop at the plain peak itself)."""
    from monet.solver import solve as solve_mod
    from monet.solver.deadline import Deadline

    torch.manual_seed(0)
    graph = capture(UserNet(), torch.randn(4, 3, 16, 16))
    costs = costs_for(graph, analytic_costs(graph))
    plain = eager_peak(graph, costs)

    def nothing_in_time(*args, **kwargs):
        raise InfeasibleBudgetError(int(args[3]), None, "normal")

    given = []
    search = solve_mod.smallest_schedule

    def recorded(*args):
        given.append(args[6])  # its time limit, seconds
        return search(*args)

    monkeypatch.setattr(normal_mod, "solve_ilp", nothing_in_time)
    monkeypatch.setattr(solve_mod, "smallest_schedule", recorded)
    spent = Deadline(20)
    spent.end = spent.start  # all of it gone before the search
    with pytest.raises(InfeasibleBudgetError) as err:
        solve(graph, costs, int(0.05 * plain), "normal", deadline=spent)
    assert given == [solve_mod.SEARCH_SHARE * 20]
    assert err.value.min_budget_bytes is not None and err.value.min_budget_bytes < plain


def test_a_search_with_no_time_still_has_a_candidate_that_recomputes(monkeypatch):
    """With its deadline already passed and no LP rounding, the smallest-budget search's repaired
    candidates still hold Chen's segments, so its answer saves memory: below plain PyTorch's peak
    by the simulator, and at most Chen's own peak.  (The first of `candidate_keeps` without an LP
    rounding keeps everything; it alone was the answer of a search that ran out of time.)  On a
    graph under `ALWAYS_BUILT_CELLS` the deadline changes nothing: every candidate is built."""
    import time

    from monet.solver import formulation
    from monet.solver.chen import solve_chen
    from monet.solver.deadline import Deadline
    from monet.solver import repair
    from monet.solver.repair import repaired_candidates, smallest_candidate
    from monet.solver.finish import memory_model, simulated_peak_fn

    torch.manual_seed(0)
    graph = capture(UserNet(), torch.randn(4, 3, 16, 16))
    costs = costs_for(graph, analytic_costs(graph))
    plain = eager_peak(graph, costs)
    mem = memory_model(graph, costs)
    allow_s = formulation.allowed(mem)[2]
    past = time.perf_counter() - 1.0
    everyone = repaired_candidates(graph, mem, None, allow_s)
    # a graph this small gets every candidate whatever the deadline: no dependence on speed
    small = repaired_candidates(graph, mem, None, allow_s, deadline=past)
    assert len(small) == len(everyone) > 2
    assert all(np.array_equal(a[1], b[1]) and np.array_equal(a[0], b[0]) for a, b in zip(small, everyone))
    # as large graphs are: the deadline bounds their candidates
    monkeypatch.setattr(repair, "ALWAYS_BUILT_CELLS", 0)
    cands = repaired_candidates(graph, mem, None, allow_s, deadline=past)
    assert len(cands) == 2
    assert not cands[0][1].any()  # the first: keep everything
    assert any(R.any() for _, R, _, _ in cands)
    peak_of = simulated_peak_fn(graph, costs, mem)
    peak, S, R = smallest_candidate(graph, mem, None, allow_s, peak_of, deadline=past)
    chen = solve_chen(graph, costs, plain, deadline=Deadline(20)).meta.predicted_peak_bytes
    assert R.any() and peak <= chen < plain

