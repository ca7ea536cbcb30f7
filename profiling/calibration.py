"""Calibration of a solved schedule on the CPU: time its recomputation, correct the costs, solve again.

The CPU cost sources charge each recomputation its measured operator time times one recompute
factor per graph (`monet.profiling.dispatch.recompute_factor`), measured once on Chen's sqrt(n)
schedule.  On a shared CPU that factor, measured on one schedule on one occasion, did not hold for
another schedule on another occasion: torchvision's EfficientNet-B0 measured 0.99 one day and 0.75
the next, and its 50 % schedules were then predicted 8-11 points under their measured overhead
(BENCHMARKS.md, "Real models", run of 2026-11-26 03:12).  So where the costs are measured on the
CPU, `calibrated_solve` times the solved schedule itself against the executor keeping everything
(interleaved, `dispatch.median_round`), takes the ratio of its measured recomputation to the
predicted one (`calibration_ratio`), and solves once more with every recompute second times that
ratio (`scaled_costs`): the schedule returned, at the same budget, is predicted with a
recomputation cost measured on a schedule like it, minutes (not days) before.

The measured time is brought to the speed of the occasion the costs were measured on: the
recomputation is taken relative to the keep-everything iteration measured with it (``(M - K) / K``)
times the costs' keep-everything time (`CostArrays.total_time`), so a machine a fifth slower now
than at costing does not inflate the ratio by a fifth.
"""
from __future__ import annotations

import dataclasses
from typing import Callable

import numpy as np
import torch.nn as nn

from monet import mixed_precision
from monet.profiling.costs import CostArrays

#: the ratio is clipped to [RATIO_MIN, RATIO_MAX]; where it is within RATIO_TOLERANCE of 1 the
#: first solution stands (solving again would change nothing the measurement can resolve); where
#: the predicted recomputation is under `dispatch.FACTOR_FLOOR` of the iteration, too little to
#: measure, there is no calibration
RATIO_MIN, RATIO_MAX, RATIO_TOLERANCE = 0.5, 2.0, 0.03


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
    from monet.profiling.dispatch import FACTOR_FLOOR

    total = costs.total_time
    if keep_s <= 0 or total <= 0 or recompute_s < FACTOR_FLOOR * total:
        return None
    extra = (measured_s - keep_s) / keep_s * total
    implementations = objective_s - total - recompute_s
    return float(min(RATIO_MAX, max(RATIO_MIN, (extra - implementations) / recompute_s)))


def scaled_costs(costs: CostArrays, ratio: float) -> CostArrays:
    """``costs`` with every recompute second (``fwd_recompute``) times ``ratio``, and a
    ``"calibrated x<ratio>"`` entry in ``source``."""
    return dataclasses.replace(costs, fwd_recompute=np.asarray(costs.fwd_recompute, dtype=float) * float(ratio),
                               source=tuple(costs.source) + (f"calibrated x{ratio:.2f}",))


def measure_schedule(model: nn.Module, inputs, graph, solution, keep: nn.Module,
                     repeats: int | None = None) -> tuple[float, float]:
    """``(M, K)``: median seconds of a training iteration of ``model`` run by ``solution`` and by
    ``keep`` (`dispatch.keep_all` of the same graph), interleaved on the CPU in
    `dispatch.FACTOR_ROUNDS` rounds (`dispatch.median_round`), under the autocast setting ``graph``
    was captured with; ``model`` is left as it was (`dispatch.restored`).  ``repeats``: timed
    iterations per side and round (None: about `dispatch.TARGET_S` seconds of the schedule's)."""
    from monet.inputs import ExampleInputs
    from monet.profiling.dispatch import WARMUP, median_round, restored, warm_up
    from monet.wrapper import MONeTWrapper

    inputs = ExampleInputs.of(inputs)
    scheduled = MONeTWrapper(model, solution)
    with restored(model), mixed_precision.context(graph.autocast):
        repeats = warm_up((scheduled, keep), scheduled, inputs, repeats, WARMUP)
        return median_round(scheduled, keep, inputs, repeats)


def calibrated_solve(model: nn.Module, inputs, graph, costs: CostArrays, solution,
                     solve_again: Callable[[CostArrays], object], *, keep: nn.Module | None = None,
                     device: str = "cpu", cost_fn=None, log: Callable[[str], None] | None = None):
    """``solution``, or where its measured recomputation differs from the predicted one by more
    than `RATIO_TOLERANCE`, ``solve_again(scaled_costs(costs, ratio))``: the schedule at the same
    budget solved with the calibrated costs (see the module docstring).

    Args:
        model, inputs: the module ``graph`` was captured from and its example inputs.
        graph, costs: the graph and the (CPU, measured) costs ``solution`` was solved with.
        solution: the `Solution` to time.
        solve_again: solves at ``solution``'s budget and mode with the costs it is given.
        keep: `dispatch.keep_all` of ``graph`` made before (None: made here; each trace takes seconds).
        device, cost_fn: as ``solution`` was solved with (full mode: the variants' costs, which
            `monet.solver.choices.rescaled_full_model` carries over to the calibrated costs).
        log: progress messages.

    Returns:
        A `Solution`; ``meta.cost_source`` ends in ``calibrated x<ratio>`` where it was solved again.
    """
    from monet.profiling.dispatch import keep_all
    from monet.solver.choices import rescaled_full_model

    log = log or (lambda _m: None)
    recompute = recompute_seconds(graph, costs, solution, device, cost_fn)
    if calibration_ratio(2.0, 1.0, costs, solution.meta.objective_s, recompute) is None:
        return solution  # too little recomputation to measure
    keep = keep_all(model, inputs, graph, costs) if keep is None else keep
    log(f"timing the schedule ({solution.schedule.recompute_count()} recomputations) against keeping everything ...")
    m, k = measure_schedule(model, inputs, graph, solution, keep)
    ratio = calibration_ratio(m, k, costs, solution.meta.objective_s, recompute)
    measured_pct = 100 * (m / k - 1)
    predicted_pct = 100 * (solution.meta.objective_s / costs.total_time - 1)
    if ratio is None or abs(ratio - 1.0) <= RATIO_TOLERANCE:
        log(f"measured {measured_pct:+.1f} % over keeping everything, predicted {predicted_pct:+.1f} %: "
            "the costs stand")
        return solution
    log(f"measured {measured_pct:+.1f} % over keeping everything, predicted {predicted_pct:+.1f} %: "
        f"recomputation costs x{ratio:.2f}, solving again ...")
    scaled = scaled_costs(costs, ratio)
    if solution.schedule.impl or solution.meta.mode != "normal":
        rescaled_full_model(graph, costs, scaled, ratio, solution.meta.mode, device, cost_fn)
    return solve_again(scaled)


__all__ = ["RATIO_MAX", "RATIO_MIN", "RATIO_TOLERANCE", "calibrated_solve", "calibration_ratio", "measure_schedule",
           "recompute_seconds", "scaled_costs"]
