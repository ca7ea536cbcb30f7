"""The measured iterations that calibrate the predicted overhead (`monet.profiling.calibration`).

The predicted overhead of a schedule is (K + R) / P - 1 where the cost source measured times (P:
plain PyTorch's iteration, K: the executor's with nothing recomputed, R: the schedule's extra
predicted seconds), else R / (the operators' seconds).  These tests hold the formula, where it
is used (`monet.plan`), that measuring leaves the model as it was, and that solution files
written before the fields existed still give a prediction.
"""
from __future__ import annotations

import copy
import dataclasses
import pickle

import pytest
import torch
from torch import nn

from monet.plan import prepare
from monet.profiling.calibration import IterationTimes, calibrate, keep_all_solution, measure_iterations


def small_cnn() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU(),
                         nn.Conv2d(8, 8, 3, padding=1), nn.ReLU(), nn.Flatten(), nn.Linear(8 * 8 * 8, 4))


@pytest.fixture(scope="module")
def plan():
    x = torch.randn(4, 3, 8, 8, generator=torch.Generator().manual_seed(0))
    return prepare(small_cnn(), x, progress=False)


def test_prepare_on_cpu_measures_iterations_and_solutions_record_them(plan):
    assert isinstance(plan.iterations, IterationTimes)
    assert plan.iterations.plain_s > 0 and plan.iterations.executor_s > 0
    sol = plan.solve("100%", time_limit=10)
    m = sol.meta
    assert (m.plain_iteration_s, m.executor_iteration_s) == (plan.iterations.plain_s, plan.iterations.executor_s)
    extra = m.objective_s - m.eager_time_s
    assert m.predicted_overhead() == pytest.approx((m.executor_iteration_s + extra) / m.plain_iteration_s - 1)


def test_analytic_costs_measure_no_iteration():
    x = torch.randn(2, 3, 8, 8)
    p = prepare(small_cnn(), x, cost="analytic", progress=False)
    assert p.iterations is None
    m = p.solve("100%", time_limit=10).meta
    assert m.plain_iteration_s is None and m.executor_iteration_s is None
    assert m.predicted_overhead() == pytest.approx(m.objective_s / m.eager_time_s - 1)


def test_predicted_overhead_formula(plan):
    sol = plan.solve("100%", time_limit=10)
    m = copy.deepcopy(sol.meta)
    m.objective_s, m.eager_time_s = 1.5, 1.0  # half a second of recomputation predicted
    m.plain_iteration_s, m.executor_iteration_s = 2.0, 2.2
    assert m.predicted_overhead() == pytest.approx((2.2 + 0.5) / 2.0 - 1)  # +35 %, not +50 %
    m.plain_iteration_s = None
    assert m.predicted_overhead() == pytest.approx(0.5)
    m.eager_time_s = None
    assert m.predicted_overhead() is None


def test_a_file_without_the_fields_still_predicts(plan):
    sol = calibrate(plan.solve("100%", time_limit=10), IterationTimes(plain_s=1.0, executor_s=1.0))
    state = dataclasses.asdict(sol.meta)
    del state["plain_iteration_s"], state["executor_iteration_s"]
    old = object.__new__(type(sol.meta))
    old.__dict__.update(state)  # as an unpickled file written before the fields existed
    assert old.plain_iteration_s is None  # the class default
    assert old.predicted_overhead() == pytest.approx(old.objective_s / old.eager_time_s - 1)
    again = pickle.loads(pickle.dumps(sol))
    assert again.meta.plain_iteration_s == 1.0


def test_measuring_leaves_the_model_as_it_was(plan):
    module = plan.module
    before = {k: v.clone() for k, v in module.state_dict().items()}
    rng = torch.get_rng_state()
    measure_iterations(module, plan.inputs, plan.graph, plan.costs, repeats=2, warmup=1)
    after = module.state_dict()
    assert all(torch.equal(before[k], after[k]) for k in before)  # BatchNorm's running statistics too
    assert torch.equal(rng, torch.get_rng_state())
    assert all(p.grad is None for p in module.parameters())


def test_keep_all_solution_recomputes_nothing(plan):
    sol = keep_all_solution(plan.graph, plan.costs)
    assert sol.schedule.recompute_count() == 0
    assert sol.meta.predicted_peak_bytes == plan.eager_peak_bytes
    assert sol.meta.objective_s == pytest.approx(plan.costs.total_time)


def test_bad_repeats_are_refused(plan):
    with pytest.raises(ValueError, match="repeats"):
        measure_iterations(plan.module, plan.inputs, plan.graph, plan.costs, repeats=0)
