"""The time between operators (`monet.profiling.dispatch`: a predicted overhead that holds).

Per-operator times miss what MONeT's executor spends between operators (about 1 ms per iteration
on the CPU), and every recomputed operator pays its share again.  These tests hold the arithmetic,
that measuring leaves the user's model as it was, the cache, that the CPU ``hybrid`` costs carry
the term on every node, the implementation variants' included, so that the schedule keeping
everything is predicted at the executor's measured iteration, and that the predicted overhead is
taken against plain PyTorch's measured iteration.
"""
from __future__ import annotations

import json

import pandas as pd
import pytest
import torch
from torch import nn

from monet.capture import capture
from monet.profiling.costs import costs_for, make_table
from monet.profiling.dispatch import (FACTOR_FLOOR, FACTOR_MAX, FACTOR_MIN, FIELDS, between_operators_s,
                                      iteration_record, measure_iterations, operator_scale, recompute_factor)
from monet.profiling.variant_costs import hybrid_cost_fn
from monet.profiling.sources import (between_operators, cost_table, iterations, plain_iteration, quick_dir,
                                     quick_profile, RECORD_SUFFIX, solver_costs)
from monet.solver.choices import implementation_options, option_seconds

FULL = "inplace_conv_multiway_newnode"


def _row(kind, node, time_s, impl="default"):
    return dict(kind=kind, node=node, op="aten.relu.default", impl=impl, time_s=time_s, recompute_s=time_s,
                workspace_bytes=0, flops=0, bytes_moved=0, source="test")


def test_between_operators_arithmetic():
    table = make_table([_row("fwd", 0, 1.0), _row("fwd", 1, 2.0), _row("bwd", 0, 3.0), _row("bwd", 1, 4.0),
                        _row("fwd", 0, 50.0, impl="variant")])  # a variant row is not part of the iteration
    assert between_operators_s(14.0, table) == pytest.approx(1.0)  # (14 - 10) / 4
    assert between_operators_s(10.0, table) == 0.0
    assert between_operators_s(5.0, table) == 0.0  # never negative
    assert between_operators_s(1.0, make_table([])) == 0.0


def test_operator_scale_arithmetic():
    # operators timed one by one summing to more than the executor's iteration are scaled to it;
    # where they sum to less, the time between operators makes up the rest and nothing is scaled
    table = make_table([_row("fwd", 0, 1.0), _row("bwd", 0, 3.0), _row("fwd", 0, 50.0, impl="variant")])
    assert operator_scale(2.0, table) == pytest.approx(0.5)  # 2 / (1 + 3)
    assert operator_scale(4.0, table) == 1.0 and operator_scale(9.0, table) == 1.0
    assert operator_scale(1.0, make_table([])) == 1.0
    # either the scale is below 1 or time is added between operators, never both
    for k in (2.0, 4.0, 9.0):
        assert operator_scale(k, table) == 1.0 or between_operators_s(k, table) == 0.0


def test_recompute_factor_arithmetic():
    m = dict(chen_iteration_s=1.8, chen_executor_s=1.0, chen_recompute_s=0.9, chen_recomputations=10)
    assert recompute_factor(m, 0.01) == pytest.approx(0.8)  # (1.8 - 1.0) / (0.9 + 10 * 0.01)
    assert recompute_factor({**m, "chen_iteration_s": 1.1}, 0.01) == FACTOR_MIN  # clipped
    assert recompute_factor({**m, "chen_iteration_s": 9.0}, 0.01) == FACTOR_MAX
    # the operators' times scaled by 0.5: the same measured recomputation is twice their share
    assert recompute_factor({**m, "chen_iteration_s": 1.5}, 0.0, 0.5) == pytest.approx(0.5 / 0.45)
    too_little = {**m, "chen_recompute_s": FACTOR_FLOOR / 2, "chen_recomputations": 0}
    assert recompute_factor(too_little, 0.0) == 1.0  # too little recomputation to measure a factor


def bn_net() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU(), nn.Dropout(0.5),
                         nn.Flatten(), nn.Linear(8 * 8 * 8, 4)).train()


def test_measuring_leaves_the_model_as_it_was():
    model = bn_net()
    x = torch.randn(2, 3, 8, 8)
    graph = capture(model, x)
    for p in model.parameters():
        p.grad = torch.full_like(p, 7.0)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    rng = torch.get_rng_state()
    measured = measure_iterations(model, x, graph, analytic_table(graph), repeats=2, warmup=1)
    assert all(measured[k] > 0 for k in ("executor_iteration_s", "plain_iteration_s", "chen_iteration_s",
                                         "chen_executor_s"))
    assert measured["chen_recomputations"] > 0 and measured["chen_recompute_s"] > 0
    after = model.state_dict()
    for k, v in before.items():  # batch-norm statistics and the step counter restored
        assert torch.equal(after[k], v), k
    assert all(torch.equal(p.grad, torch.full_like(p, 7.0)) for p in model.parameters())
    assert torch.equal(torch.get_rng_state(), rng)  # dropout drew from a forked generator
    with pytest.raises(ValueError, match="repeats"):
        measure_iterations(model, x, graph, analytic_table(graph), repeats=0)


def analytic_table(graph):
    from monet.profiling.costs import analytic_costs

    return analytic_costs(graph)


def test_cached_once_per_graph_and_refused_when_corrupt(tmp_path):
    model = bn_net()
    x = torch.randn(2, 3, 8, 8)
    graph = capture(model, x)
    table = quick_profile(model, x, graph, "cpu", tmp_path)
    path = tmp_path / "iterations.json"
    record = iteration_record(model, x, graph, table, "cpu", path)
    assert set(record) == set(FIELDS) and json.loads(path.read_text()) == record
    assert record["between_operators_s"] == pytest.approx(
        between_operators_s(record["executor_iteration_s"], table))
    assert record["operators_s"] == pytest.approx(table["time_s"].sum())
    assert record["operator_scale"] == pytest.approx(operator_scale(record["executor_iteration_s"], table))

    class Refuses(nn.Module):  # a second call must not run the model again
        def forward(self, *a):
            raise AssertionError("the cached value was not used")

    assert iteration_record(Refuses(), x, graph, table, "cpu", path) == record
    assert iteration_record(Refuses(), x, graph, table, "cuda") is None  # the CPU's work overlaps a GPU's
    path.write_text("{not json")
    with pytest.raises(ValueError, match="iterations.json.*delete it"):
        iteration_record(model, x, graph, table, "cpu", path)


def test_cpu_hybrid_costs_predict_the_measured_iterations(tmp_path):
    """With the term on every node, the schedule keeping everything is predicted at the executor's
    measured iteration, whichever way the measured times fall (time added between operators where
    the iteration is longer than their sum, every time scaled down where it is shorter), and the
    overhead's reference is plain PyTorch's measured iteration.  Only identities between the
    measured numbers are asserted, so that a loaded machine passes as an idle one does (the
    else branch asserted the operators' sum, which a scale below 1 does not keep)."""
    model = bn_net()
    x = torch.randn(2, 3, 8, 8)
    graph = capture(model, x)
    quick = quick_profile(model, x, graph, "cpu", tmp_path)
    between = between_operators("hybrid", model, x, graph, "cpu", tmp_path)
    record = iterations("hybrid", model, x, graph, "cpu", tmp_path)
    assert list(quick_dir("cpu", tmp_path).glob("*" + RECORD_SUFFIX))
    table, costs = solver_costs("hybrid", model, x, graph, "cpu", cache_dir=tmp_path)
    assert table.equals(cost_table("hybrid", model, x, graph, "cpu", cache_dir=tmp_path))
    scale = record["operator_scale"]
    assert scale == 1.0 or between == 0.0  # never both
    assert costs.total_time == pytest.approx(record["executor_iteration_s"], rel=1e-9)
    if between > 0 or scale != 1.0:
        assert table["source"].str.contains("us-between-x").all()
    merged = table.merge(quick, on=["kind", "node"], suffixes=("", "_quick"))
    expected = record["recompute_factor"] * (scale * merged["recompute_s_quick"] + between)
    assert (merged["recompute_s"] - expected).abs().max() < 1e-12
    assert costs.plain_time_s == record["plain_iteration_s"] == plain_iteration("hybrid", model, x, graph, "cpu", tmp_path)
    assert costs.plain_time == costs.plain_time_s
    assert between_operators("analytic", model, x, graph, "cpu", tmp_path) == 0.0
    assert plain_iteration("analytic", model, x, graph, "cpu", tmp_path) is None
    assert plain_iteration("hybrid", model, x, graph, "cuda", tmp_path) is None
    assert solver_costs("analytic", model, x, graph, "cpu")[1].plain_time_s is None


def test_predicted_overhead_is_against_plain_pytorch(tmp_path):
    """The schedule keeping everything is predicted at the executor's overhead over plain PyTorch
    (K / P - 1): the reference is the measured plain iteration, not the nodes' sum."""
    from monet.solver.solve import eager_peak, solve

    model = bn_net()
    x = torch.randn(2, 3, 8, 8)
    graph = capture(model, x)
    _, costs = solver_costs("hybrid", model, x, graph, "cpu", cache_dir=tmp_path)
    sol = solve(graph, costs, eager_peak(graph, costs), "none")
    assert sol.meta.eager_time_s == costs.plain_time_s
    assert sol.meta.predicted_overhead() == pytest.approx(costs.total_time / costs.plain_time_s - 1)
    least = solve(graph, costs, None, "normal", time_limit=10)  # at the smallest budget
    assert least.meta.eager_time_s == costs.plain_time_s


def test_variants_carry_the_same_time_between_operators(tmp_path, monkeypatch):
    """A variant's node is still a node: its measured seconds carry the term, so an implementation
    does not look ``between_s`` cheaper than PyTorch's kernel for being measured alone.  The
    variants' own timings are fixed (1 ms a node), so that the two cost functions differ by the
    term alone."""
    from monet.profiling import profiler

    measured = profiler.profile_costs
    monkeypatch.setattr(profiler, "profile_costs", lambda *a, **k: measured(*a, **k).assign(time_s=1e-3))
    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU(), nn.Conv2d(8, 8, 3, padding=1))
    x = torch.randn(2, 3, 8, 8)
    graph = capture(model, x)
    base = quick_profile(model, x, graph, "cpu", tmp_path)
    costs = costs_for(graph, base)
    seconds = {}
    for between in (0.0, 1.0):
        fn = hybrid_cost_fn(model, x, graph, base, "cpu", measure="measured", between_s=between, repeats=1, warmup=0)
        options = [o for o in implementation_options(graph, costs, FULL, "cpu", fn) if o.impl != "default"]
        assert options, "the net has implementation choices in full mode"
        seconds[between] = pd.Series({(o.key, o.impl): option_seconds(o) for o in options})
    # every variant moves at least one node to a measured row, which now costs one second more
    assert (seconds[1.0] - seconds[0.0] >= 1.0 - 1e-9).all()


def test_chen_rounds_give_the_median_round_and_k_is_paired_over_all_of_them(monkeypatch):
    """Chen's schedule, the executor keeping everything and plain PyTorch are timed together in
    `FACTOR_ROUNDS` rounds: the round with the median difference M - K2 counts (one round's load
    spike does not set a graph's cached factor), and K / P is the median over the turns of all three
    rounds (one round's five pairs read a 24-layer GPT-2's K / P 1.205)."""
    from monet.profiling import measure
    from monet.profiling.dispatch import FACTOR_ROUNDS

    assert FACTOR_ROUNDS == 3
    # three rounds of three turns: (M, K, P) per turn; M - K medians .5, .1, .3
    rounds = iter([[[0.1], [0.1], [0.1]],  # the timed warm-up turn: the three rounds fit (`turn_plan`)
                   [[1.5, 1.5, 1.5], [1.0, 2.0, 1.0], [0.9, 1.0, 1.0]],
                   [[1.1, 1.1, 1.1], [1.0, 1.0, 1.0], [1.0, 1.0, 1.0]],
                   [[1.3, 1.3, 1.3], [1.0, 1.0, 1.1], [1.0, 1.0, 1.0]]])
    monkeypatch.setattr(measure, "interleaved_times_of", lambda steps, *a, **k: len(steps) == 3 and next(rounds))
    model = bn_net()
    x = torch.randn(2, 3, 8, 8)
    graph = capture(model, x)
    measured = measure_iterations(model, x, graph, analytic_table(graph), repeats=1, warmup=0)
    assert measured["plain_iteration_s"] == 1.0  # the median of P over the nine turns
    # K / P over the nine turns: 1.11, 2, 1, 1, 1, 1, 1, 1, 1.1: median 1.0 (the first round alone: 1.11)
    assert measured["executor_iteration_s"] == pytest.approx(1.0)
    assert (measured["chen_iteration_s"], measured["chen_executor_s"]) == (1.3, 1.0)  # differences .5, .1, .3


def test_paired_medians_set_each_iteration_against_the_reference_of_its_turn(monkeypatch):
    """A slowdown that ends in the middle of a turn hits the schedule's iteration of that turn and
    not the keep-everything one after it: medians of each side apart would put the schedule at 3.6x
    (three slow iterations of five against two), the iterations set against the reference of their
    turn keep its 1.2x."""
    from monet.profiling import measure
    from monet.profiling.dispatch import paired_medians

    def times(steps, repeats, warmup, device):  # one round of five turns: schedule, keep, plain
        slow = [3.0, 3.0, 3.0, 1.0, 1.0]  # the schedule's third iteration is still slow ...
        after = [3.0, 3.0, 1.0, 1.0, 1.0]  # ... the keep-everything and plain ones after it are not
        return [[1.2 * v for v in slow], after, [0.9 * v for v in after]]

    monkeypatch.setattr(measure, "interleaved_times_of", times)
    m, k, p = paired_medians((None, None, None), None, repeats=5, rounds=1, reference=1)
    assert k == pytest.approx(1.0)  # the reference's median
    assert m / k == pytest.approx(1.2) and p / k == pytest.approx(0.9)


def test_the_table_overhead_sets_each_iteration_against_plain_pytorch_of_its_turn(monkeypatch):
    """`measure.step_overhead` / `measure.overhead`: a slowdown caught by three of the schedule's five
    iterations and two of plain PyTorch's puts the medians taken apart at 3x, the ratios of each
    turn at the schedule's 1.25x."""
    from monet.profiling import measure

    def times(steps, repeats, warmup, device):
        assert len(steps) == 2 and repeats == 5
        return [[1.25 * v for v in (3.0, 3.0, 3.0, 1.0, 1.0)], [3.0, 3.0, 1.0, 1.0, 1.0]]

    monkeypatch.setattr(measure, "interleaved_times_of", times)
    frac, mc, mp = measure.paired_overhead(None, None, repeats=5)
    assert frac == pytest.approx(0.25) and (mc, mp) == (3.75, 1.0)  # the medians themselves, as measured
    x = torch.zeros(2, 3)
    frac, _, _ = measure.overhead(torch.nn.Identity(), torch.nn.Identity(), x, None, repeats=5)
    assert frac == pytest.approx(0.25)


def test_paired_ratio_refuses_lists_it_cannot_pair():
    from monet.profiling.measure import paired_ratio

    assert paired_ratio([2.0, 3.0, 9.0], [1.0, 1.0, 3.0]) == pytest.approx(3.0)
    with pytest.raises(ValueError, match="one length"):
        paired_ratio([1.0, 2.0], [1.0])
    with pytest.raises(ValueError, match="one length"):
        paired_ratio([], [])
    with pytest.raises(ValueError, match="not positive"):
        paired_ratio([1.0], [0.0])


def test_interleaved_times_take_the_clock_given():
    """``clock``: the seconds are its differences (here a clock that advances 2 per reading, so
    every call takes 2 "seconds"), each callable called once per turn after the warm-up."""
    from monet.profiling.measure import interleaved_times_of

    ticks = iter(range(0, 1000, 2))
    calls = []
    times = interleaved_times_of((lambda: calls.append("a"), lambda: calls.append("b")), repeats=3, warmup=1,
                                 clock=lambda: next(ticks))
    assert times == [[2, 2, 2], [2, 2, 2]]
    assert calls == ["a", "b"] * 4


def test_turn_plan_times_long_iterations_in_about_measure_s():
    """`turn_plan`: short iterations keep `FACTOR_ROUNDS` rounds of their turns; iterations of
    seconds are timed in fewer turns (three rounds, or one) that fit in `MEASURE_S` (a 12-layer
    GPT-2 small's 54 iterations took 310 s), never under `MIN_TURNS` turns a round."""
    from monet.profiling.dispatch import FACTOR_ROUNDS, MEASURE_S, MIN_TURNS, REPEATS, turn_plan

    assert turn_plan(0.1, REPEATS) == (FACTOR_ROUNDS, REPEATS, 1)
    for turn_s in (0.5, 1.0, 3.5, 4.0, 5.0, 10.0, 17.0, 60.0, 300.0):
        rounds, repeats, discard = turn_plan(turn_s, REPEATS)
        turns = rounds * (repeats + discard)
        assert rounds in (1, FACTOR_ROUNDS) and repeats >= MIN_TURNS  # a median round, or one round
        assert turns * turn_s <= MEASURE_S or (rounds, discard, repeats) == (1, 0, MIN_TURNS)
        assert discard == (rounds > 1)  # one round follows the warm-up directly
        # the median of three rounds wherever each keeps MIN_TURNS turns in the time
        assert (rounds == FACTOR_ROUNDS) == (FACTOR_ROUNDS * (MIN_TURNS + 1) * turn_s <= MEASURE_S)
        if MIN_TURNS < repeats < REPEATS:  # neither at the floor nor at the cap: as many turns as fit
            assert rounds * (repeats + 1 + discard) * turn_s > MEASURE_S


def test_measure_iterations_times_one_round_where_iterations_take_seconds(monkeypatch):
    """With a turn of 20 s (the timed warm-up turn), one round of `MIN_TURNS` turns is timed, none
    discarded (plain PyTorch warmed up with the executors), and K, P, M come from it."""
    from monet.profiling import dispatch, measure

    calls = []

    def times(steps, repeats, warmup, device):
        calls.append((repeats, warmup))
        if len(calls) == 1:  # the timed warm-up turn: 20 s
            return [[20 / 3]] * 3
        return [[1.5] * repeats, [1.1] * repeats, [1.0] * repeats]

    monkeypatch.setattr(measure, "interleaved_times_of", times)
    warmed = []
    monkeypatch.setattr(dispatch, "warm_up", lambda modules, ref, inputs, repeats, warmup, autocast=None:
                        warmed.extend(modules) or repeats)
    model = bn_net()
    x = torch.randn(2, 3, 8, 8)
    graph = capture(model, x)
    measured = measure_iterations(model, x, graph, analytic_table(graph))
    assert calls == [(1, 0), (dispatch.MIN_TURNS, 0)]  # the timed warm-up turn, then one round
    # no turn discarded: plain PyTorch is warmed up with the executors (its second iteration was slow)
    assert len(warmed) == 3 and any(m is model for m in warmed)
    assert measured["plain_iteration_s"] == 1.0
    assert measured["executor_iteration_s"] == pytest.approx(1.1)
    assert (measured["chen_iteration_s"], measured["chen_executor_s"]) == (1.5, 1.1)
