"""``lm_loss="auto"``, `monet.optimize`'s default: a language model's own loss or the chunked one
(`monet.lm_loss`), whichever schedule is faster under the budget.

A language model trained with labels keeps its (B, T, V) logits for the backward pass and
allocates as much again for their gradient.  Where those are a large part of plain PyTorch's peak
(`worth_chunking`), the model is captured a second time with the chunked loss, each graph is
solved in a share of the time limit, and the faster schedule that fits is kept; where neither
fits, the error names the smallest budget of each.  The chunked loss returns no logits in
training, which the log says when it is chosen.
"""
from __future__ import annotations

import time
from typing import Callable

from monet.lm_loss import logits_bytes
from monet.solver.ilp import InfeasibleBudgetError
from monet.terms import fmt_size

#: the chunked loss is weighed where the logits and their gradient are at least this fraction of
#: plain PyTorch's simulated peak; below it chunking buys little memory, and a second capture
#: costs its seconds
WEIGH_FRACTION = 0.1
#: the share of the solve's time limit the model's own loss gets; the chunked loss gets the rest
OWN_SHARE = 0.5
#: seconds the chunked loss's solve gets at least, whatever the own loss's solve left
MIN_SOLVE_S = 5.0


def worth_chunking(plan) -> int:
    """Bytes of the logits of ``plan``'s model (`monet.lm_loss.logits_bytes` of its Dynamo export)
    where they and their gradient are at least `WEIGH_FRACTION` of its plain peak, else 0 (no
    language-model loss to chunk, or too small to matter)."""
    if plan.graph.exported is None:
        return 0
    size = logits_bytes(plan.graph.exported[1])
    return size if 2 * size >= WEIGH_FRACTION * plan.eager_peak_bytes else 0


def choose_lm_loss(own, budget, time_limit: float, chunked: Callable[[], object], solve: dict, log):
    """(plan, solution): the faster of ``own`` (the `monet.plan.Plan` of the model's own loss)
    solved in `OWN_SHARE` of ``time_limit`` seconds and the plan ``chunked()`` captures with the
    chunked loss solved in the rest, among those that fit ``budget`` (as `monet.optimize` takes
    it; a percentage is of the own loss's plain peak, for both).  ``solve``: `Plan.solve`'s other
    keyword arguments; ``log``: where the choice is said.

    Raises:
        InfeasibleBudgetError: neither fits; the message names the smallest budget of each, and
            ``min_budget_bytes`` is the smaller."""
    start = time.perf_counter()
    smallest, budget_bytes, reserved = own.schedule_budget(budget, solve.get("optimizer"),
                                                            solve.get("accumulate_grads", False),
                                                            solve.get("reserved_bytes", 0))
    asked = budget if smallest else budget_bytes + reserved  # in bytes for both plans
    found, errors = [], []
    for name, plan in (("the model's own loss", own), ("the chunked loss", None)):
        seconds = OWN_SHARE * time_limit if plan is own else max(time_limit - (time.perf_counter() - start),
                                                                 MIN_SOLVE_S)
        plan = plan if plan is not None else chunked()
        try:
            sol = plan.solve(asked, time_limit=seconds, **solve)
        except InfeasibleBudgetError as e:
            errors.append((name, e))
            continue
        found.append((sol.meta.predicted_peak_bytes if smallest else sol.meta.objective_s, name, plan, sol))
    if not found:
        raise _both_infeasible(errors, solve.get("mode", "normal"))
    _, name, plan, sol = min(found, key=lambda f: f[0])
    each = ", ".join(f"{n}: {fmt_size(s.meta.predicted_peak_bytes)}, predicted {_overhead(s)}" for _, n, _, s in found)
    gone = " (the model returns no logits in training; lm_loss=None keeps them)" if plan is not own else ""
    log(f'lm_loss="auto": {name} gives the {"smaller" if smallest else "faster"} schedule ({each}){gone}')
    return plan, sol


def _overhead(sol) -> str:
    ovh = sol.meta.predicted_overhead()
    return "-" if ovh is None else f"{100 * ovh:+.1f} %"


def _both_infeasible(errors: list, mode: str) -> InfeasibleBudgetError:
    """The error of two infeasible solves in ``mode``, naming each one's smallest budget."""
    (_, first), *_ = errors
    known = [(e.min_budget_bytes, n) for n, e in errors if e.min_budget_bytes is not None]
    least = min(known)[0] if known else None
    err = InfeasibleBudgetError(first.budget_bytes, least, mode, exact=False)
    each = "; ".join(f"computing {n}, {fmt_size(b)} ({b} bytes)" for b, n in known)
    err.args = (f"{err}; the smallest budget found {each}" if each else str(err),)
    return err


__all__ = ["MIN_SOLVE_S", "OWN_SHARE", "WEIGH_FRACTION", "choose_lm_loss", "worth_chunking"]
