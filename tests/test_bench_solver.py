"""The solver benchmark's best-known table (`benchmarks/bench_solver.py`): a row
meets the target within 1 % of the best schedule known, and ``--record-best`` keeps the lowest."""
from __future__ import annotations

import bench_solver as bs


def _row(budget="50", value=1.0, solve_s=30.0, **kw):
    return dict(model="resnet50", batch=184, budget=f"{budget} %", formulation="fast", solve_s=solve_s,
                _key=budget, _value=value, **kw)


def test_rows_are_held_against_the_best_known():
    best = {("resnet50", 184, "50"): 1.0, ("resnet50", 184, "min"): 100.0}
    within, over, late = _row(value=1.0099), _row(value=1.0101), _row(value=1.0, solve_s=61.0)
    for r in (within, over, late):
        bs._against_best(r, best, time_limit=60.0)
    assert within["meets target"] == "yes" and abs(within["vs_best"] - 0.0099) < 1e-9
    assert over["meets target"] == "no" and late["meets target"] == "no"
    smallest = _row("min", value=101.5)
    bs._against_best(smallest, best, 60.0)
    assert smallest["meets target"] == "no" and abs(smallest["vs_best"] - 0.015) < 1e-9


def test_infeasible_meets_only_when_proven_and_no_schedule_is_known():
    best = {("resnet50", 184, "40"): 1.0}
    refused_known = _row("40", value=None, _proven_infeasible=True)
    proven = _row("33", value=None, _proven_infeasible=True)
    unproven = _row("33", value=None, _proven_infeasible=False)
    for r in (refused_known, proven, unproven):
        bs._against_best(r, best, 60.0)
    assert refused_known["meets target"] == "no"  # a schedule is known there: refusing it is a miss
    assert proven["meets target"] == "yes (proven infeasible)" and unproven["meets target"] == "no"


def test_record_best_keeps_the_lowest(tmp_path):
    path = tmp_path / "best.csv"
    first = bs.record_best_known([_row(value=1.0), _row("min", value=200.0)], "cmd A", path)
    assert len(first) == 2
    again = bs.record_best_known([_row(value=1.1), _row("min", value=150.0)], "cmd B", path)
    assert [(e["budget"], e["best"], e["found_by"]) for e in again] == [("min", 150.0, "cmd B")]
    table = bs.load_best_known(path)
    assert table == {("resnet50", 184, "50"): 1.0, ("resnet50", 184, "min"): 150.0}
    assert bs.record_best_known([_row(value=None)], "cmd C", path) == []  # a refused row records nothing


def test_time_to_best_is_the_first_announced_schedule_within_the_target():
    points = [(2.0, 1.05), (5.0, 1.009), (7.0, 1.0), (9.0, 0.5)]  # 0.5: a budget, not an objective
    assert bs._time_to_best(points, known=1.0, value=1.0, solve_s=60.0) == 5.0
    assert bs._time_to_best([(3.0, 1.02)], known=1.0, value=1.005, solve_s=60.0) == 60.0  # only at the end
    assert bs._time_to_best(points, known=1.0, value=1.02, solve_s=60.0) is None  # returned a worse one
    assert bs._time_to_best(points, known=None, value=1.0, solve_s=60.0) is None
    row = _row(value=1.0, _points=[(4.0, 1.0)])
    bs._against_best(row, {("resnet50", 184, "50"): 1.0}, 60.0)
    assert row["to_best_s"] == 4.0


def test_trace_keeps_the_objectives_its_lines_announce():
    trace = bs._Trace()
    for line in ("  LP relaxation: bound 0.62 s (3.1 s)", "     4.0 s  incumbent 0.6312  bound 0.62, gap 1.00 %",
                 "  85980 variables: CBC skipped, the local search's schedule stands (0.631187 s)"):
        trace(line)
    assert [v for _, v in trace.points] == [0.6312, 0.631187]
