"""A compiled schedule held to its budget by measurement (docs/design.md, "Note [Compiled memory]").

Inductor fuses the schedule's modules into kernels whose buffers no node-by-node count follows
exactly: a fused kernel holds the inputs of its first op until its last, and an elementwise chain
inlined across stages holds a recomputed value past its stage.  So `hold_budget` measures the
compiled step once (which compiles it: the first training step then runs at once); where its
peak is over the budget it measures the same schedule pinned to its stages
(`monet.compiled.compilers`' ``pinned``), and where that is over too, solves again at a budget
lowered by the excess, or, where that is below the smallest feasible budget, measures the
smallest schedule.
"""
from __future__ import annotations

import dataclasses
from typing import Callable

from monet.inputs import ExampleInputs
from monet.profiling.dispatch import restored
from monet.profiling.measure import step_peak
from monet.solution import Solution
from monet.solver.ilp import InfeasibleBudgetError
from monet.terms import fmt_size

#: how many schedules `hold_budget` solves at most: the excess of the first is most of the next
#: one's, so a second solve almost always fits
TRIES = 3


def pinned(sol: Solution) -> Solution:
    """``sol`` compiled pinned to its stages (``meta.compile_pinned``; the schedule is the same)."""
    return dataclasses.replace(sol, meta=dataclasses.replace(sol.meta, compile_pinned=True))


def hold_budget(sol: Solution, budget: int | None, measure: Callable[[Solution], int],
                resolve: Callable[[int], Solution], log: Callable[[str], None],
                pin: Callable[[Solution], Solution] = pinned, tries: int = TRIES) -> Solution:
    """The solution whose measured peak is at or under ``budget`` bytes, starting from ``sol``.

    Args:
        sol: the schedule solved at ``budget``.
        budget: bytes; None for the smallest budget (``budget="min"``): the schedule is kept and
            its budget raised to its measured peak where that is higher.
        measure: the peak in bytes of one training step of a solution (compiled and run).
        resolve: the schedule at a budget in bytes; below the smallest feasible budget, the
            schedule at the smallest (its ``meta.budget_bytes`` then above the one asked).
        log: where each measurement and new solve is said.
        pin: the same solution compiled pinned to its stages (default `pinned`).
        tries: schedules solved at most.

    Returns:
        A solution with ``meta.measured_peak_bytes`` set, at or under ``meta.budget_bytes``, which
        is ``budget`` (or the measured peak, for the smallest budget).

    Raises:
        InfeasibleBudgetError: no schedule measured under ``budget`` within ``tries``, the
            smallest schedule among them; ``min_budget_bytes`` is then the least measured peak,
            a budget that schedule fits.
    """
    target, tried, pinning = budget, False, False  # pinned measured yet; the schedules since pinned
    least = smallest = None  # the least measured peak; whether the schedule is the smallest one
    for attempt in range(tries):
        sol = pin(sol) if pinning and not sol.meta.compile_pinned else sol
        peak = _measured(sol, measure)
        if peak > (sol.meta.budget_bytes if budget is None else budget) and not tried:
            tried = True
            tight = pin(sol)
            tight_peak = _measured(tight, measure)
            log(f"the compiled step measured {fmt_size(peak)}; pinned to its stages, {fmt_size(tight_peak)}")
            if tight_peak < peak:
                sol, peak, pinning = tight, tight_peak, True
        least = peak if least is None else min(least, peak)
        if budget is None:
            if peak > sol.meta.budget_bytes:
                log(f"the compiled step measured {fmt_size(peak)}, over the smallest budget's prediction "
                    f"{fmt_size(sol.meta.budget_bytes)}: its budget is the measured peak, {peak} bytes")
                sol.meta.budget_bytes = peak
            return sol
        if peak <= budget:
            sol.meta.budget_bytes = budget
            return sol
        excess = peak - budget
        target -= excess
        if attempt + 1 == tries or smallest:
            break
        log(f"the compiled step measured {fmt_size(peak)}, {fmt_size(excess)} over the budget "
            f"{fmt_size(budget)}: solving again at {fmt_size(target)}")
        sol = resolve(target)
        smallest = sol.meta.budget_bytes > target
        if smallest:
            log(f"{fmt_size(target)} is below the smallest budget: measuring the smallest schedule "
                f"({fmt_size(sol.meta.budget_bytes)} simulated)")
    raise InfeasibleBudgetError(budget, least, sol.meta.mode, exact=False)


def compiled_peak(wrapper, module, inputs, autocast=None) -> int:
    """The peak in bytes of one training step of ``wrapper`` (a `monet.wrapper.MONeTWrapper` of
    ``module``; its first step compiles it) on ``inputs`` (`monet.profiling.measure.step_peak`),
    with ``module``'s parameters and gradients and the inputs' gradients left as they were
    (`monet.profiling.dispatch.restored`): what `hold_budget`'s ``measure`` runs."""
    with restored(module, ExampleInputs.of(inputs)):
        return step_peak(wrapper, inputs, autocast=autocast)


def _measured(sol: Solution, measure: Callable[[Solution], int]) -> int:
    sol.meta.measured_peak_bytes = peak = int(measure(sol))
    return peak


__all__ = ["TRIES", "compiled_peak", "hold_budget", "pinned"]
