"""Calibration of a solved schedule on the CPU (`monet.profiling.calibration`, issue 18: a predicted
overhead that holds): the ratio's arithmetic, its independence of the machine's speed on the day,
the recompute seconds of a schedule, the solve again with scaled costs (normal and full mode, the
variants' measured costs reused), and that `Plan.solve` calibrates only where it should."""
from __future__ import annotations

import copy

import numpy as np
import pytest
import torch

from monet.plan import prepare
from monet.profiling import calibration
from monet.profiling.calibration import (RATIO_MAX, RATIO_MIN, RATIO_TOLERANCE, calibrated_solve, calibration_ratio,
                                         measure_schedule, recompute_seconds, scaled_costs)
from monet.profiling.costs import CostArrays
from monet.profiling.dispatch import FACTOR_FLOOR, keep_all
from monet.solver.choices import full_model
from monet.solver.solve import min_budget, solve
from usernet import UserNet

FULL = "inplace_conv_multiway_newnode"


def _costs(total: float) -> CostArrays:
    return CostArrays(fwd_time=np.array([total / 2]), fwd_recompute=np.array([total / 2]),
                      fwd_workspace=np.zeros(1, dtype=np.int64), bwd_time=np.array([total / 2]),
                      bwd_workspace=np.zeros(1, dtype=np.int64))


def test_ratio_arithmetic():
    costs = _costs(1.0)  # the keep-everything iteration: 1 s at the costs' occasion
    # predicted: 0.4 s of recomputation (objective 1.4 s); measured: 0.3 s over keeping everything
    assert calibration_ratio(1.3, 1.0, costs, 1.4, 0.4) == pytest.approx(0.75)
    # the same schedule on a machine a fifth slower today: the same ratio
    assert calibration_ratio(1.2 * 1.3, 1.2, costs, 1.4, 0.4) == pytest.approx(0.75)
    # implementations predicted to add 0.1 s are not charged to the recomputation
    assert calibration_ratio(1.4, 1.0, costs, 1.5, 0.4) == pytest.approx(0.75)
    assert calibration_ratio(5.0, 1.0, costs, 1.4, 0.4) == RATIO_MAX
    assert calibration_ratio(0.9, 1.0, costs, 1.4, 0.4) == RATIO_MIN
    # too little recomputation to measure, or no time to measure it against
    assert calibration_ratio(1.3, 1.0, costs, 1.0 + FACTOR_FLOOR / 2, FACTOR_FLOOR / 2) is None
    assert calibration_ratio(1.3, 0.0, costs, 1.4, 0.4) is None


def test_scaled_costs_scale_the_recomputation_only():
    costs = _costs(2.0)
    scaled = scaled_costs(costs, 0.5)
    assert scaled.fwd_recompute.tolist() == [0.5] and costs.fwd_recompute.tolist() == [1.0]
    assert scaled.fwd_time.tolist() == costs.fwd_time.tolist() and scaled.total_time == costs.total_time
    assert scaled.source[-1] == "calibrated x0.50"


@pytest.fixture(scope="module")
def plan(tmp_path_factory):
    torch.manual_seed(0)
    return prepare(UserNet(), torch.randn(32, 3, 32, 32), cost="analytic", progress=False,
                   cache_dir=tmp_path_factory.mktemp("costs"))


@pytest.fixture(scope="module")
def budget(plan):
    """Bytes a tenth of the way from the smallest feasible budget in normal mode to plain PyTorch's
    peak: some recomputation (a sixth of the iteration with analytic costs)."""
    least, _ = min_budget(plan.graph, plan.costs, "normal", time_limit=5)
    return least + (plan.eager_peak_bytes - least) // 10


def _solve(plan, costs, budget, mode="normal"):
    return solve(plan.graph, costs, budget, mode, time_limit=10, device="cpu", cost_fn=plan.cost_fn)


def test_recompute_seconds_are_the_objective_over_keeping_everything(plan, budget):
    sol = _solve(plan, plan.costs, budget)
    assert sol.schedule.recompute_count() > 0
    assert recompute_seconds(plan.graph, plan.costs, sol) == pytest.approx(
        sol.meta.objective_s - plan.costs.total_time, rel=1e-9)


def _measured_at(costs, sol, recompute, ratio, keep_s=0.02):
    """(M, K) that `calibration_ratio` turns into ``ratio`` for ``sol``."""
    total = costs.total_time
    implementations = sol.meta.objective_s - total - recompute
    return keep_s * (1 + (ratio * recompute + implementations) / total), keep_s


@pytest.mark.parametrize("mode", ["normal", FULL])
def test_solved_again_with_the_measured_recomputation(plan, budget, monkeypatch, mode):
    calls = []
    cost_fn = plan.cost_fn

    def counting(*a, **k):
        calls.append(a[1])
        return cost_fn(*a, **k)

    sol = solve(plan.graph, plan.costs, budget, mode, time_limit=10, device="cpu", cost_fn=counting)
    recompute = recompute_seconds(plan.graph, plan.costs, sol, "cpu", counting)
    assert recompute > 0
    built = len(calls)
    monkeypatch.setattr(calibration, "measure_schedule",
                        lambda *a, **k: _measured_at(plan.costs, sol, recompute, 0.5))
    seen = []

    def again(costs):
        seen.append(costs)
        return solve(plan.graph, costs, sol.meta.budget_bytes, mode, time_limit=10, device="cpu", cost_fn=counting)

    out = calibrated_solve(plan.module, plan.inputs, plan.graph, plan.costs, sol, again, keep=object(),
                           device="cpu", cost_fn=counting)
    assert len(seen) == 1
    np.testing.assert_allclose(seen[0].fwd_recompute, 0.5 * plan.costs.fwd_recompute)
    assert out.meta.cost_source.endswith("calibrated x0.50")
    assert out.meta.budget_bytes == sol.meta.budget_bytes and out.meta.predicted_peak_bytes <= budget
    # the first schedule is feasible at the calibrated costs, so the one solved again is no slower
    assert out.meta.objective_s <= plan.costs.total_time + 0.5 * recompute + 1e-9
    assert len(calls) == built  # full mode: the variants' costs were reused, not built again
    if mode == FULL:
        options, _ = full_model(plan.graph, seen[0], mode, "cpu", counting)
        first, _ = full_model(plan.graph, plan.costs, mode, "cpu", counting)
        for a, b in zip(options, first):
            np.testing.assert_allclose(a.fwd_recompute, 0.5 * np.asarray(b.fwd_recompute))


def test_a_measurement_that_agrees_keeps_the_schedule(plan, budget, monkeypatch):
    sol = _solve(plan, plan.costs, budget)
    recompute = recompute_seconds(plan.graph, plan.costs, sol)
    monkeypatch.setattr(calibration, "measure_schedule",
                        lambda *a, **k: _measured_at(plan.costs, sol, recompute, 1 + RATIO_TOLERANCE / 2))
    out = calibrated_solve(plan.module, plan.inputs, plan.graph, plan.costs, sol,
                           lambda _c: pytest.fail("solved again"), keep=object())
    assert out is sol
    # nothing recomputed: nothing to time
    everything = _solve(plan, plan.costs, plan.eager_peak_bytes)
    monkeypatch.setattr(calibration, "measure_schedule", lambda *a, **k: pytest.fail("timed"))
    assert calibrated_solve(plan.module, plan.inputs, plan.graph, plan.costs, everything,
                            lambda _c: pytest.fail("solved again"), keep=object()) is everything


def test_plan_calibrates_measured_cpu_costs_only(plan, budget, monkeypatch):
    assert not plan.calibrates  # analytic costs: nothing measured to calibrate
    timed = []

    def measured(model, inputs, graph, sol, keep, repeats=None):
        timed.append(sol)
        return _measured_at(plan.costs, sol, recompute_seconds(plan.graph, plan.costs, sol), 2 * RATIO_MAX)

    monkeypatch.setattr(calibration, "measure_schedule", measured)
    monkeypatch.setattr("monet.profiling.dispatch.keep_all", lambda *a, **k: object())
    plan.solve(budget, time_limit=10)
    assert timed == []
    calibrating = copy.copy(plan)
    calibrating.calibrates = True
    sol = calibrating.solve(budget, time_limit=10)
    assert len(timed) == 1 and sol.meta.cost_source.endswith(f"calibrated x{RATIO_MAX:.2f}")
    calibrating.solve(budget, time_limit=10, calibrate=False)
    assert len(timed) == 1


def test_measure_schedule_times_and_leaves_the_model_as_it_was(plan, budget):
    sol = _solve(plan, plan.costs, budget)
    model = plan.module
    before = {k: v.clone() for k, v in model.state_dict().items()}
    keep = keep_all(model, plan.inputs, plan.graph, plan.costs)
    m, k = measure_schedule(model, plan.inputs, plan.graph, sol, keep, repeats=2)
    assert m > 0 and k > 0
    after = model.state_dict()
    assert all(torch.equal(before[name], after[name]) for name in before)
    assert all(p.grad is None for p in model.parameters())
