"""A compiled schedule held to its budget by measurement (docs/design.md, "Note [Compiled memory]").

Inductor fuses the schedule's modules into kernels whose buffers no node-by-node count follows
exactly: a fused kernel holds the inputs of its first op until its last, and an elementwise chain
inlined across stages holds a recomputed value past its stage.  The memory model bounds most
schedules (`monet.solver.finish.predicted_peak`), but not all.  So `hold_budget` measures the
compiled step once (which compiles it: the first training step then runs at once) and, where its
peak is over the budget, solves again at a budget lowered by the excess.
"""
from __future__ import annotations

from typing import Callable

from monet.solution import Solution
from monet.terms import fmt_size
from monet.solver.ilp import InfeasibleBudgetError

#: how many schedules `hold_budget` measures at most: the excess of the first is most of the
#: next one's, so a second solve almost always fits
TRIES = 3


def hold_budget(sol: Solution, budget: int | None, measure: Callable[[Solution], int],
                resolve: Callable[[int], Solution], log: Callable[[str], None], tries: int = TRIES) -> Solution:
    """The solution whose measured peak is at or under ``budget`` bytes, starting from ``sol``.

    Args:
        sol: the schedule solved at ``budget``.
        budget: bytes; None for the smallest budget (``budget="min"``): the schedule is kept and
            its budget raised to its measured peak where that is higher.
        measure: the peak in bytes of one training step of a solution (compiled and run).
        resolve: the schedule at a budget in bytes (raises `InfeasibleBudgetError` below the
            smallest).
        log: where each measurement and new solve is said.
        tries: schedules measured at most.

    Returns:
        A solution with ``meta.measured_peak_bytes`` set, at or under ``meta.budget_bytes``, which
        is ``budget`` (or the measured peak, for the smallest budget).

    Raises:
        InfeasibleBudgetError: no schedule measured under ``budget`` within ``tries``, or the
            lowered budget is below the smallest feasible one; ``min_budget_bytes`` is then the
            last schedule's measured peak, a budget that schedule fits.
    """
    target = budget
    for attempt in range(tries):
        peak = int(measure(sol))
        sol.meta.measured_peak_bytes = peak
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
        if attempt + 1 == tries:
            break
        log(f"the compiled step measured {fmt_size(peak)}, {fmt_size(excess)} over the budget "
            f"{fmt_size(budget)}: solving again at {fmt_size(target)}")
        try:
            sol = resolve(target)
        except InfeasibleBudgetError:
            raise InfeasibleBudgetError(budget, peak, sol.meta.mode, exact=False) from None
    raise InfeasibleBudgetError(budget, peak, sol.meta.mode, exact=False)


__all__ = ["TRIES", "hold_budget"]
