"""The PuLP back-end (`monet.solver.pulp_cbc`, ``solver="PULP"``, issue 36): the same optimum as
cylp's CBC on the same ILP, its MIP start used, its time limit kept (interrupted, then killed),
a crash a lost solve, and a clear error without pulp."""
from __future__ import annotations

import sys

import cvxpy as cp
import numpy as np
import pytest
import torch

import monet.solver.pulp_cbc as pc
from monet.capture import capture
from monet.profiling.costs import analytic_costs, costs_for
from monet.solver import ilp
from monet.solver.cbc import solve_cbc
from monet.solver.solve import eager_peak, solve
from usernet import UserNet

FULL = "inplace_conv_multiway_newnode"
LIMIT = 30.0  # seconds per solve: a margin, UserNet's ILPs are proven in about a second


@pytest.fixture(scope="module")
def usernet():
    torch.manual_seed(0)
    graph = capture(UserNet(), torch.randn(4, 3, 16, 16))
    costs = costs_for(graph, analytic_costs(graph))
    return graph, costs, eager_peak(graph, costs)


@pytest.mark.parametrize("mode", ["normal", FULL])
def test_pulp_reaches_cbcs_optimum_on_usernet(usernet, mode):
    graph, costs, eager = usernet
    budget = int(0.7 * eager)
    cbc = solve(graph, costs, budget, mode, solver="CBC", time_limit=LIMIT, gap=0.0)
    pulp = solve(graph, costs, budget, mode, solver="PULP", time_limit=LIMIT, gap=0.0)
    assert cbc.meta.status == "optimal" and pulp.meta.status == "optimal"
    assert pulp.meta.solver.startswith("PULP")
    assert pulp.meta.objective_s == pytest.approx(cbc.meta.objective_s, rel=1e-9)
    assert pulp.meta.objective_s > costs.total_time  # the budget makes it recompute: a real ILP
    assert pulp.meta.predicted_peak_bytes <= budget


def test_pulp_next_to_the_local_search_above_large(usernet, monkeypatch):
    """Above `LARGE` variables PULP's CBC runs next to the local search (no MIP solver runs for
    CBC there): its schedule fits and is no slower than the search's alone, and on this small
    ILP it is the optimum."""
    graph, costs, eager = usernet
    budget = int(0.7 * eager)
    exact = solve(graph, costs, budget, "normal", solver="CBC", time_limit=LIMIT, gap=0.0).meta.objective_s
    monkeypatch.setattr(ilp, "LARGE", 10)
    lines = []
    search = solve(graph, costs, budget, "normal", solver="CBC", time_limit=6, gap=0.0)
    both = solve(graph, costs, budget, "normal", solver="PULP", time_limit=6, gap=0.0, progress=lines.append)
    assert any("PuLP's CBC" in line for line in lines)  # it ran
    assert both.meta.predicted_peak_bytes <= budget
    assert both.meta.objective_s <= search.meta.objective_s * (1 + 1e-9)
    assert both.meta.objective_s == pytest.approx(exact, rel=1e-9)


def test_mixed_bounds_and_the_start_reach_the_same_optimum_as_cbc():
    """Binary, general integer (negative lower bound), free and bounded continuous columns, an
    equality, a constant: the MPS file carries them all (the two back-ends agree), and the MIP
    start is CBC's first incumbent."""
    x = cp.Variable(5, boolean=True)
    y = cp.Variable(integer=True)
    z = cp.Variable()
    w = cp.Variable(nonneg=True)
    v = np.array([3.0, 4.0, 5.0, 6.0, 7.5])
    cons = [v @ x + y <= 14.5, y >= -3, y <= 5, z >= -2.5, z + w == 1.25 + x[0], w <= 4, x[1] + x[2] <= 1]
    problem = cp.Problem(cp.Minimize(-v @ x + 0.5 * y + 2 * z - w + 1.0), cons)
    start = {x: np.array([1.0, 0, 0, 0, 0]), y: np.array([0.0])}
    cbc = solve_cbc(problem, time_limit=LIMIT, start=start)
    expect = (x.value.copy(), y.value, z.value, w.value)
    lines = []
    out = pc.solve_pulp_cbc(problem, time_limit=LIMIT, start=start, progress=lines.append, threads=2)
    assert cbc.status == out.status == "optimal"
    assert out.objective == pytest.approx(cbc.objective, abs=1e-9)
    assert np.allclose(np.round(x.value), np.round(expect[0])) and y.value == pytest.approx(expect[1])
    assert z.value == pytest.approx(expect[2]) and w.value == pytest.approx(expect[3])
    # the start, completed by CBC, is the first incumbent of both (not the optimum: it is worse)
    first = [next(best for _, best, _ in o.history if best is not None) for o in (cbc, out)]
    assert first[1] == pytest.approx(first[0], abs=1e-9) and first[1] > out.history[-1][1] + 1.0
    assert lines[0].startswith("  PuLP's CBC: 8 columns") and "2 threads" in lines[0]


def _market_split(m: int = 6, n: int = 60, seed: int = 0) -> cp.Problem:
    """Cornuejols and Dawande's market split instances: a handful of equality rows over binaries,
    far beyond branch and bound's reach at this size (hours)."""
    rng = np.random.default_rng(seed)
    A = rng.integers(0, 100, size=(m, n))
    d = A.sum(axis=1) // 2
    x = cp.Variable(n, boolean=True)
    s = cp.Variable(m, nonneg=True)
    t = cp.Variable(m, nonneg=True)
    return cp.Problem(cp.Minimize(cp.sum(s + t)), [A @ x + s - t == d])


def test_pulp_keeps_its_time_limit():
    out = pc.solve_pulp_cbc(_market_split(), time_limit=2.0)
    assert out.status in ("time_limit", "no_integer")  # not proven: it was stopped
    assert out.solve_time_s < 2.0 + pc.GRACE_S + 20.0  # generous: a loaded machine, not hours


@pytest.mark.parametrize("program, says", [
    ("import os, signal; os.kill(os.getpid(), signal.SIGSEGV)", "exit status -11"),  # CBC crashed
    # deaf to the interrupt at the limit: killed GRACE_S later
    ("import signal, time; signal.signal(signal.SIGINT, signal.SIG_IGN); time.sleep(60)", "did not answer"),
])
def test_crash_or_hang_is_a_lost_solve(monkeypatch, program, says):
    monkeypatch.setattr(pc, "_command", lambda: [sys.executable, "-c", program])
    x = cp.Variable(3, boolean=True)
    lines = []
    out = pc.solve_pulp_cbc(cp.Problem(cp.Minimize(cp.sum(x)), [cp.sum(x) >= 1]), time_limit=0.5,
                            progress=lines.append)
    assert out.status == "no_integer" and out.objective is None
    assert says in out.detail and any(says in line for line in lines)
    assert out.solve_time_s < 30


def test_without_pulp_the_solver_is_refused_with_what_to_do(usernet, monkeypatch):
    monkeypatch.setitem(sys.modules, "pulp", None)  # import pulp raises ImportError
    monkeypatch.setitem(sys.modules, "pulp.apis", None)
    with pytest.raises(pc.PulpUnavailable, match="pip install pulp"):
        pc.cbc_program()
    graph, costs, eager = usernet
    with pytest.raises(pc.PulpUnavailable, match='solver="CBC"'):
        solve(graph, costs, int(0.7 * eager), "normal", solver="PULP", time_limit=LIMIT)
