"""Calibration of a solved schedule on the CPU: time its recomputation, correct the costs, solve again.

The CPU cost sources charge each recomputation its measured operator time times one recompute factor
per graph (`monet.profiling.dispatch.recompute_factor`), measured once on Chen's sqrt(n) schedule.
On a shared CPU that factor, measured on one schedule on one occasion, did not hold for another
schedule on another occasion: torchvision's EfficientNet-B0 measured 0.99 one day and 0.75 the next,
and its 50 % schedules were then predicted 8-11 points under their measured overhead. So where the
costs are measured on the CPU, `calibrated_solve` times the solved schedule itself against the
executor keeping everything and plain PyTorch (interleaved, each iteration set against plain
PyTorch's of its turn: `dispatch.paired_medians`), takes the ratio of its measured recomputation to
the predicted one (`calibration_ratio`), and solves once more with every recompute second times that
ratio (`scaled_costs`); that schedule is timed too, and the faster of the two is returned, predicted
with its own measured recomputation. So on the CPU the predicted overhead of a returned schedule is
calibrated on that schedule, minutes (not days) before: what the cost model alone predicts is in the
log ("predicted ... %") and in BENCHMARKS.md's tables.

The measured time is brought to the speed of the occasion the costs were measured on: the
recomputation is taken relative to the keep-everything iteration measured with it (``(M - K) / K``)
times the costs' keep-everything time (`CostArrays.total_time`), so a machine a fifth slower now
than at costing does not inflate the ratio by a fifth.  Plain PyTorch's iteration (``P``) is
timed in the same rounds, and the reference of the predicted overhead becomes ``total_time * P /
K`` (the executor's own time over plain PyTorch's is otherwise the one measured at costing and
cached: 4.9 % of ResNet-18's iteration, a fifth of the 5 points a prediction is held to).
"""
from __future__ import annotations

import dataclasses
from typing import Callable

import numpy as np
import torch.nn as nn

from monet.profiling.costs import CostArrays

#: the ratio is clipped to [RATIO_MIN, RATIO_MAX]; where it is within RATIO_TOLERANCE of 1 the
#: first solution stands (solving again would change nothing the measurement can resolve); where
#: the predicted recomputation is under `dispatch.FACTOR_FLOOR` of the iteration, too little to
#: measure a ratio, the schedule is timed but not calibrated (`calibrated_solve`)
RATIO_MIN, RATIO_MAX, RATIO_TOLERANCE = 0.5, 2.0, 0.03

#: least timed turns per round of `measure_schedule` (of `dispatch.FACTOR_ROUNDS`): a schedule of
#: half-second iterations otherwise got `dispatch.REPEATS` (5) a round, and zoo VGG-16's full-mode
#: schedule (+600 %, 0.5 s) then measured +602 % to +663 % in three timings within minutes, where
#: the table's timing (57 turns) read +630 % to +661 % (`benchmarks/timing_spread.py zoo/vgg16 --mode full`)
MIN_TURNS = 10


def applies(cost: str, device: str) -> bool:
    """Whether schedules solved with the cost source ``cost`` (``"analytic"``, ``"hybrid"``,
    ``"profile"``) for ``device`` (``"cpu"``, ``"cuda"``, ``"cuda:N"``) are calibrated: their operator
    times are measured (`monet.profiling.sources.measures_times`) and on the CPU."""
    from monet.profiling.sources import measures_times

    return device.split(":")[0] == "cpu" and measures_times(cost, device)


def recompute_seconds(graph, costs: CostArrays, solution, device: str = "cpu", cost_fn=None) -> float:
    """Predicted seconds of ``solution``'s recomputations: ``fwd_recompute @ R.sum(0)`` (R (T, N):
    the recomputed forward nodes per backward stage), with the recompute seconds of the
    implementations the solution chose (full mode: `monet.solver.choices.chosen_graph`)."""
    from monet.solver.choices import chosen_graph, full_model

    recompute = costs.fwd_recompute
    if solution.schedule.impl:
        options, _ = full_model(graph, costs, solution.meta.mode, device, cost_fn)
        recompute = chosen_graph(graph, costs, options, dict(solution.schedule.impl))[1].fwd_recompute
    return float(np.asarray(recompute, dtype=float) @ np.asarray(solution.R, dtype=float).sum(axis=0))


def measurable(costs: CostArrays, recompute_s: float) -> bool:
    """Whether ``recompute_s`` predicted seconds of recomputation are enough to time: at least
    `dispatch.FACTOR_FLOOR` of the keep-everything iteration (``costs.total_time``, > 0)."""
    from monet.profiling.dispatch import FACTOR_FLOOR

    return costs.total_time > 0 and recompute_s >= FACTOR_FLOOR * costs.total_time


def calibration_ratio(measured_s: float, keep_s: float, costs: CostArrays, objective_s: float,
                      recompute_s: float) -> float | None:
    """Measured over predicted recomputation of a schedule, clipped to [`RATIO_MIN`, `RATIO_MAX`].

    Args:
        measured_s, keep_s: median seconds of the schedule's training iteration (``M``) and of the
            executor keeping everything (``K``), measured together.
        costs: the costs the schedule was solved with; ``total_time`` (seconds) is ``K`` at the
            costs' occasion.
        objective_s: the schedule's predicted iteration (seconds, `SolutionMeta.objective_s`).
        recompute_s: its predicted recomputation (seconds, `recompute_seconds`).

    Returns:
        ``((M - K) / K * total_time - (objective_s - total_time - recompute_s)) / recompute_s``:
        the measured extra time at the costs' speed, less what the implementations are predicted to
        add, over the predicted recomputation; None where ``recompute_s`` is under
        `dispatch.FACTOR_FLOOR` of ``total_time`` (too little to measure) or a time is not positive.
    """
    total = costs.total_time
    if keep_s <= 0 or not measurable(costs, recompute_s):
        return None
    extra = (measured_s - keep_s) / keep_s * total
    implementations = objective_s - total - recompute_s
    return float(min(RATIO_MAX, max(RATIO_MIN, (extra - implementations) / recompute_s)))


def calibrated_bound(bound_s: float | None, ratio: float, total_s: float, mode: str) -> float | None:
    """The solver's lower bound on the iteration (seconds) at costs whose recompute seconds are all
    times ``ratio``: in normal mode the objective is ``total_s`` plus the recomputation, so
    ``total_s + ratio * (bound_s - total_s)``; in full mode (implementations' times unscaled)
    ``bound_s`` where ``ratio >= 1`` and ``ratio * bound_s`` below (every time is >= 0).  None
    without a bound.  The bound is the uncalibrated problem's: of the first schedule's solve."""
    if bound_s is None:
        return None
    if mode == "normal":
        return total_s + ratio * (float(bound_s) - total_s)
    return float(bound_s) if ratio >= 1.0 else ratio * float(bound_s)


def scaled_costs(costs: CostArrays, ratio: float, plain_time_s: float | None = None) -> CostArrays:
    """``costs`` with every recompute second (``fwd_recompute``) times ``ratio``, a
    ``"calibrated x<ratio>"`` entry in ``source``, and ``plain_time_s`` (seconds, the reference of
    the predicted overhead, `plain_reference_s`) where given."""
    plain = costs.plain_time_s if plain_time_s is None else float(plain_time_s)
    return dataclasses.replace(costs, fwd_recompute=np.asarray(costs.fwd_recompute, dtype=float) * float(ratio),
                               source=tuple(costs.source) + (f"calibrated x{ratio:.2f}",), plain_time_s=plain)


def plain_reference_s(costs: CostArrays, keep_s: float, plain_s: float) -> float:
    """Plain PyTorch's iteration at the costs' speed, seconds: ``total_time * P / K`` (``P``, ``K``:
    plain PyTorch's and the keep-everything executor's median iterations measured together)."""
    return costs.total_time * float(plain_s) / float(keep_s)


def timing_seconds(costs: CostArrays, turns: int = MIN_TURNS, traces: int = 1, trace_s: float = 0.0) -> float:
    """Seconds `measure_schedule` needs, about: ``traces`` traces of the model (``trace_s`` each:
    an export and a trace, as long as the capture took), the warm-up iterations and
    `dispatch.FACTOR_ROUNDS` rounds of ``turns`` turns of three iterations (the schedule, the
    executor keeping everything, plain PyTorch), each iteration taken as the costs' plain one
    (``costs.plain_time``, else ``total_time``) times 1.1 (the schedule's recomputation)."""
    from monet.profiling.dispatch import FACTOR_ROUNDS, WARMUP

    iteration = 1.1 * float(costs.plain_time or costs.total_time)
    return traces * trace_s + (3 * WARMUP + 1 + 3 * FACTOR_ROUNDS * turns) * iteration


def untimed_note(costs: CostArrays, seconds: float, traces: int = 1, trace_s: float = 0.0) -> str | None:
    """The log line that says a schedule is not timed, where `timing_seconds` (``traces`` traces
    of ``trace_s`` seconds) exceeds the ``seconds`` left for it; else None."""
    need = timing_seconds(costs, traces=traces, trace_s=trace_s)
    if need <= seconds:
        return None
    return (f"not timed: the time limit leaves {seconds:.1f} s, timing the schedule takes about {need:.0f} s; "
            "the cost model's prediction stands (a larger time limit times it)")


def timing_fits(costs: CostArrays, seconds: float, traces: int, trace_s: float, log: Callable[[str], None]) -> bool:
    """Whether timing a schedule (`timing_seconds`) fits in the ``seconds`` that a solve leaves
    it, decided before the solve; where not, ``log`` says that it will not be timed and that the
    solver gets the whole time limit."""
    note = untimed_note(costs, seconds, traces, trace_s)
    if note:
        log(f"{note}; the solver gets the whole time limit")
    return note is None


def measure_schedule(model: nn.Module, inputs, graph, solution, keep: nn.Module,
                     repeats: int | None = None, deadline=None) -> tuple[float, float, float] | None:
    """``(M, K, P)``: median seconds of a training iteration of ``model`` run by ``solution`` (on a
    copy of it, `dispatch.own_copy`), by ``keep`` (`dispatch.keep_all` of the same graph, another
    copy) and by plain PyTorch (``model`` itself),
    interleaved on the CPU in `dispatch.FACTOR_ROUNDS` rounds, ``M`` and ``K`` as ``P`` times their
    median ratio to ``P`` within a turn (`dispatch.paired_medians`), under the
    autocast setting ``graph`` was captured with; ``model`` is left as it was
    (`dispatch.restored`).  ``repeats``: timed iterations per side and round (None: about
    `dispatch.TARGET_S` seconds of the schedule's, at least `MIN_TURNS`).  ``deadline`` (a
    `monet.solver.deadline.Deadline`, or None): the turns are cut to what it leaves time for, and
    where that is under `MIN_TURNS` nothing is timed and None is returned.

    Plain PyTorch is the reference because the predicted overhead is ``M / P - 1``
    (`calibrated_solve`: ``total_time * (M / K)`` over ``total_time * (P / K)``), so it is
    the median of each turn's ratio to plain PyTorch, the estimate `monet check` and the
    BENCHMARKS tables measure (`monet.profiling.measure.paired_overhead`).  With ``K`` as the
    reference it was ``median(M / K) / median(P / K)``: +29.7 % to +34.5 % in four timings of
    the zoo's UNet normal-mode schedule where the paired ``median(M / P)`` of the table read
    +22.9 % to +31.6 % in twelve."""
    import time

    from monet.inputs import ExampleInputs
    from monet.profiling.dispatch import FACTOR_ROUNDS, WARMUP, paired_medians, restored, timed_executor, warm_up

    inputs = ExampleInputs.of(inputs)
    scheduled = timed_executor(model, solution, graph)
    amp = graph.autocast  # each forward pass under it (`monet.profiling.measure.training_step`)
    with restored(model, inputs):
        t0 = time.perf_counter()
        turns = warm_up((scheduled, keep, model), scheduled, inputs, repeats, WARMUP, amp)
        repeats = max(MIN_TURNS, turns) if repeats is None else turns
        if deadline is not None:  # a turn is three iterations: about the warm-up's per iteration, thrice
            turn_s = 3 * (time.perf_counter() - t0) / (3 * WARMUP + 1)
            repeats = min(repeats, int(deadline.left() / (FACTOR_ROUNDS * max(turn_s, 1e-6))))
            if repeats < MIN_TURNS:
                return None
        return paired_medians((scheduled, keep, model), inputs, repeats, reference=2, autocast=amp)


def calibrated_solve(model: nn.Module, inputs, graph, costs: CostArrays, solution,
                     solve_again: Callable[..., object], *, keep: nn.Module | None = None,
                     device: str = "cpu", cost_fn=None, log: Callable[[str], None] | None = None,
                     deadline=None, make_keep: Callable[[], nn.Module] | None = None, trace_s: float = 0.0):
    """The schedule to run, calibrated on the CPU (see the module docstring): ``solution`` timed
    (`measure_schedule`); where its recomputation measures within `RATIO_TOLERANCE` of the
    predicted one, or in normal mode (where scaling every recompute second alike does not change
    which schedule is best), ``solution``; else ``solve_again(scaled_costs(costs, ratio, plain))``, the
    schedule solved again at the same budget with the measured recompute costs, timed too, and of
    the two the one measured faster (a schedule the measurement shows slower is not chosen).
    The returned solution's ``objective_s`` and ``eager_time_s`` (so its predicted overhead) are
    its own measurement's (``total_time * M / K`` and `plain_reference_s`), even where the ratio is
    clipped (zoo VGG-16's full-mode schedule at 71 %, 8 recomputations, measured under half its
    predicted recomputation: scaled by the clipped x0.50 it was predicted +60.6 % and measured +50.1 %
    and +47.7 %), its ``cost_source`` ends in
    ``calibrated x<its ratio>``, and its bound the first solve's at the calibrated costs
    (`calibrated_bound`), with the gap to it.  A schedule with too little recomputation to measure
    a ratio (under `dispatch.FACTOR_FLOOR` of the iteration) but some, or other implementations
    than PyTorch's, is timed all the same and predicted as measured (``objective_s``: the costs'
    keep-everything seconds times ``M / K``; ``cost_source`` ending in ``timed``), without a second
    solve: the executor's own time over plain PyTorch's, cached from the costing, moved by 2-5
    points between occasions (ResNet-18's full mode, 5 recomputations, predicted +7.4 % and
    measured +1.9 %).  So is a schedule that recomputes nothing and runs PyTorch's
    implementations (the executor keeping everything): its predicted overhead is the executor's
    own time over plain PyTorch's on this occasion (zoo VGG-16's, cached at costing, was +2.3 %
    where the table measured -6.2 % and +1.8 %).

    Args:
        model, inputs: the module ``graph`` was captured from and its example inputs.
        graph, costs: the graph and the (CPU, measured) costs ``solution`` was solved with.
        solution: the `Solution` to time.
        solve_again: ``solve_again(costs, deadline)`` solves at ``solution``'s budget and mode with
            the costs it is given, within the `Deadline` it is given.
        keep: `dispatch.keep_all` of ``graph`` made before (None: ``make_keep()``, or made here;
            each trace takes seconds).
        deadline: a `monet.solver.deadline.Deadline` the timing and the second solve share (None:
            no limit).  Where it leaves less than `timing_seconds` asks (``trace_s``: the seconds
            of one trace, about the capture's) or too little to time `MIN_TURNS` turns,
            ``solution`` is returned as the cost model predicts it (said in the log); the second
            solve gets half of what is left after the first timing, and is timed only if time
            remains.
        device, cost_fn: as ``solution`` was solved with (full mode: the variants' costs, which
            `monet.solver.choices.rescaled_full_model` carries over to the calibrated costs).
        log: progress messages.

    Returns:
        A `Solution` at ``solution``'s budget.
    """
    from monet.profiling.dispatch import keep_all
    from monet.solver.choices import rescaled_full_model

    from monet.solver.deadline import Deadline

    log = log or (lambda _m: None)
    note = None if deadline is None else untimed_note(costs, deadline.left(), 1 if keep is not None else 2, trace_s)
    if note:
        log(note)
        return solution
    recompute = recompute_seconds(graph, costs, solution, device, cost_fn)
    keep = keep if keep is not None else make_keep() if make_keep is not None else keep_all(model, inputs, graph, costs)

    def timed(sol, objective_s: float, recompute_s: float):
        log(f"timing the schedule ({sol.schedule.recompute_count()} recomputations) against keeping everything "
            "and plain PyTorch ...")
        measured = measure_schedule(model, inputs, graph, sol, keep, deadline=deadline)
        if measured is None:
            log(f"not timed: the time limit leaves {deadline.left():.1f} s, too little for {MIN_TURNS} turns; "
                "the cost model's prediction stands (a larger time_limit times the schedule)")
            return sol, None, None
        m, k, p = measured
        ratio = calibration_ratio(m, k, costs, objective_s, recompute_s)
        log(f"measured {100 * (m / k - 1):+.1f} % over keeping everything (predicted "
            f"{100 * (objective_s / costs.total_time - 1):+.1f} %), keeping everything {100 * (k / p - 1):+.1f} % "
            f"over plain PyTorch (predicted {100 * (costs.total_time / costs.plain_time - 1):+.1f} %): "
            + ("too little recomputation to calibrate" if ratio is None else f"recomputation x{ratio:.2f}"))
        # predicted as measured: the iteration at the costs' speed (with a ratio inside its clip this
        # is objective_s + (ratio - 1) * recompute_s; a clipped one scales the costs of a second solve
        # only); the bound where still below it
        objective = costs.total_time * m / k
        bound = (solution.meta.bound_s if ratio is None
                 else calibrated_bound(solution.meta.bound_s, ratio, costs.total_time, solution.meta.mode))
        bound = bound if bound is not None and bound <= objective else None
        meta = dataclasses.replace(sol.meta, objective_s=objective, eager_time_s=plain_reference_s(costs, k, p),
                                   bound_s=bound, gap=None if bound is None else max(0.0, 1 - bound / objective),
                                   cost_source="+".join(costs.source)
                                   + ("+timed" if ratio is None else f"+calibrated x{ratio:.2f}"))
        return dataclasses.replace(sol, meta=meta), ratio, m / k

    first, ratio, measured = timed(solution, solution.meta.objective_s, recompute)
    if ratio is None:  # not timed, or too little recomputation to measure a ratio: not solved again
        return first
    if abs(ratio - 1.0) <= RATIO_TOLERANCE or solution.meta.mode == "normal":
        # normal mode: the objective is a constant plus the recompute seconds, and scaling all of
        # them does not change which schedule is best: no second solve
        return first
    log(f"solving again with the recomputation costs x{ratio:.2f} ...")
    scaled = scaled_costs(costs, ratio)
    if solution.schedule.impl or solution.meta.mode != "normal":
        rescaled_full_model(graph, costs, scaled, ratio, solution.meta.mode, device, cost_fn)
    again = solve_again(scaled, Deadline(0.5 * deadline.left()) if deadline is not None else None)
    if again.schedule == solution.schedule:
        log("the same schedule")
        return first
    # its objective at the uncalibrated costs: the scaled recomputation taken back out
    recompute_again = recompute_seconds(graph, costs, again, device, cost_fn)
    second, _, measured_again = timed(again, again.meta.objective_s - (ratio - 1.0) * recompute_again,
                                      recompute_again)
    if measured_again is None:  # no time left to time it: the measured one stands
        return first
    if measured_again <= measured:
        return second
    log(f"the schedule solved again measured slower ({100 * (measured_again - 1):+.1f} % against "
        f"{100 * (measured - 1):+.1f} % over keeping everything): the first stands")
    return first


__all__ = ["timing_seconds", "timing_fits", "untimed_note", "MIN_TURNS", "RATIO_MAX", "RATIO_MIN", "RATIO_TOLERANCE", "calibrated_solve", "calibrated_bound", "calibration_ratio", "measurable", "measure_schedule",
           "plain_reference_s", "recompute_seconds", "scaled_costs"]
