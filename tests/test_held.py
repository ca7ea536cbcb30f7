"""A compiled schedule held to its budget by measurement (`monet.held.hold_budget`).

The loop on stand-ins (a measured peak per schedule, a solver that records the budgets it is
asked): a schedule measured under its budget is kept; one measured over is solved again at the
budget lowered by the excess, or the smallest schedule below the smallest feasible budget; one
that cannot be brought under is refused with the least measured peak as the budget it fits; the
smallest budget becomes the measured peak.  Then on a real compiled step (a 4-layer transformers
GPT-2 at its smallest budget, whose Inductor kernels hold more than the memory model counts):
the measured peak is at or under the budget the solution states.
"""
from __future__ import annotations

import copy
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

from ci import long_only
from monet.held import TRIES, hold_budget
from monet.solver.ilp import InfeasibleBudgetError

MiB = 2 ** 20


def _sol(name: str, budget: int, pinned: bool = False):
    return SimpleNamespace(name=name, meta=SimpleNamespace(budget_bytes=budget, mode="normal", measured_peak_bytes=None,
                                                           compile_pinned=pinned))


class Solver:
    """Solutions named by the budget they were solved at; ``peaks``: the measured peak of each
    (``pinned``: of each pinned to its stages, default the same)."""

    def __init__(self, peaks: dict[int, int], smallest: int = 0, pinned: dict[int, int] | None = None):
        self.peaks, self.pinned, self.smallest = peaks, pinned or peaks, smallest
        self.asked, self.logged = [], []

    def measure(self, sol) -> int:
        return (self.pinned if sol.meta.compile_pinned else self.peaks)[sol.meta.budget_bytes]

    def resolve(self, budget: int):
        self.asked.append(budget)
        if budget < self.smallest:  # as `Plan._held`'s: the smallest schedule
            return _sol("smallest", self.smallest)
        return _sol(f"at {budget}", budget)

    def pin(self, sol):
        return _sol(sol.name, sol.meta.budget_bytes, pinned=True)

    def hold(self, sol, budget):
        return hold_budget(sol, budget, self.measure, self.resolve, self.logged.append, pin=self.pin)


def test_a_schedule_measured_under_its_budget_is_kept():
    solver = Solver({100 * MiB: 99 * MiB})
    first = _sol("first", 100 * MiB)
    held = solver.hold(first, 100 * MiB)
    assert held is first and held.meta.measured_peak_bytes == 99 * MiB and held.meta.budget_bytes == 100 * MiB
    assert solver.asked == [] and solver.logged == []


def test_a_schedule_measured_over_is_pinned_to_its_stages_where_that_fits():
    solver = Solver({100 * MiB: 102 * MiB}, pinned={100 * MiB: 99 * MiB})
    held = solver.hold(_sol("first", 100 * MiB), 100 * MiB)
    assert held.name == "first" and held.meta.compile_pinned and held.meta.measured_peak_bytes == 99 * MiB
    assert solver.asked == [] and "pinned to its stages, 99.00 MiB" in solver.logged[0]


def test_a_schedule_measured_over_is_solved_again_below_by_the_excess():
    solver = Solver({100 * MiB: 103 * MiB, 97 * MiB: 99 * MiB})
    held = solver.hold(_sol("first", 100 * MiB), 100 * MiB)
    assert solver.asked == [97 * MiB]
    assert held.name == f"at {97 * MiB}" and held.meta.measured_peak_bytes == 99 * MiB
    assert not held.meta.compile_pinned, "pinning did not lower the first one: the next is not pinned"
    assert held.meta.budget_bytes == 100 * MiB, "the solution states the budget it was asked for"
    assert "3.00 MiB over" in solver.logged[-1]


def test_where_pinning_lowers_the_peak_the_schedule_solved_again_is_pinned():
    solver = Solver({100 * MiB: 104 * MiB, 98 * MiB: 101 * MiB}, pinned={100 * MiB: 102 * MiB, 98 * MiB: 99 * MiB})
    held = solver.hold(_sol("first", 100 * MiB), 100 * MiB)
    assert solver.asked == [98 * MiB] and held.meta.compile_pinned and held.meta.measured_peak_bytes == 99 * MiB


def test_a_schedule_never_measured_under_is_refused_with_the_budget_it_fits():
    peaks = {100 * MiB: 102 * MiB, 98 * MiB: 101 * MiB, 97 * MiB: 100 * MiB + 1}
    solver = Solver(peaks)
    with pytest.raises(InfeasibleBudgetError) as e:
        solver.hold(_sol("first", 100 * MiB), 100 * MiB)
    assert solver.asked == [98 * MiB, 97 * MiB] and len(solver.asked) == TRIES - 1
    assert e.value.min_budget_bytes == 100 * MiB + 1 and str(100 * MiB + 1) in str(e.value)


def test_below_the_smallest_budget_the_smallest_schedule_is_measured():
    """Near the floor the schedules' excesses differ: the smallest one can fit where the lowered
    budget is infeasible."""
    solver = Solver({100 * MiB: 104 * MiB, 98 * MiB: 99 * MiB}, smallest=98 * MiB)
    held = solver.hold(_sol("first", 100 * MiB), 100 * MiB)
    assert solver.asked == [96 * MiB] and held.name == "smallest"
    assert held.meta.measured_peak_bytes == 99 * MiB and held.meta.budget_bytes == 100 * MiB
    assert "below the smallest budget" in solver.logged[-1]


def test_a_smallest_schedule_measured_over_is_refused_with_the_least_measured_peak():
    solver = Solver({100 * MiB: 104 * MiB, 98 * MiB: 103 * MiB}, smallest=98 * MiB)
    with pytest.raises(InfeasibleBudgetError) as e:
        solver.hold(_sol("first", 100 * MiB), 100 * MiB)
    assert solver.asked == [96 * MiB], "no schedule is smaller: nothing is solved again"
    assert e.value.budget_bytes == 100 * MiB and e.value.min_budget_bytes == 103 * MiB


def test_the_smallest_budget_becomes_the_measured_peak():
    solver = Solver({40 * MiB: 41 * MiB})
    held = solver.hold(_sol("smallest", 40 * MiB), None)
    assert held.meta.budget_bytes == 41 * MiB == held.meta.measured_peak_bytes and solver.asked == []
    solver = Solver({40 * MiB: 39 * MiB})
    held = solver.hold(_sol("smallest", 40 * MiB), None)
    assert held.meta.budget_bytes == 40 * MiB and held.meta.measured_peak_bytes == 39 * MiB


@long_only("a compiled 4-layer GPT-2 at its smallest budget", 55,
           "the short suite holds the loop on stand-ins here and tests/test_compiled_step.py a compiled step's measured peak")
def test_a_compiled_gpt2_at_its_smallest_budget_measures_under_it():
    """GPT-2 (4 layers, hidden 128, 2 x 256 tokens, analytic costs): at the smallest budget the
    simulation fits, 16,436,488 bytes, Inductor's kernels measured 18,014,216."""
    pytest.importorskip("transformers")
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
    from depth import build

    from monet.inputs import ExampleInputs
    from monet.plan import prepare
    from monet.profiling.measure import step_peak

    model, inputs = build("gpt2", 4, 128, 256, 2, 1024, dropout=0.0)
    plan = prepare(copy.deepcopy(model), inputs, compile=True, progress=False, cost="analytic")
    sol = plan.solve(1, time_limit=20, if_infeasible="smallest")
    assert sol.schedule.recompute_count() > 0 and sol.meta.measured_peak_bytes is not None
    peak = step_peak(plan.wrap(sol, copy.deepcopy(model)), ExampleInputs.of(inputs))
    assert peak <= sol.meta.budget_bytes, f"measured {peak} bytes over the budget {sol.meta.budget_bytes}"
    assert peak == sol.meta.measured_peak_bytes
