"""The schedule search without a MIP solver: structured, repaired and greedy candidates improved
by local search (`search`), the simulator's slack, and a MIP start from its schedule (`mip_start`)."""
from __future__ import annotations

import time

import numpy as np

from monet.graph import OpGraph
from monet.solver.formulation import HUGE, Problem, allowed
from monet.solver.memory_model import MemoryModel
from monet.solver.repair import bounded, drop_greedily, improve, ladder, replay, repaired_candidates
from monet.solver.structured import structured_candidates
from monet.solver.windows import drop_windows


def offload_s(mem: MemoryModel, S, R, O=None) -> float:
    """Seconds of exposed transfer of the offloaded groups O (G,), or of the schedule's effective
    ones (`solver.offload.OffloadModel.effective` of S (T, G), R (T, N)) when O is None; 0 without
    offload."""
    if mem.offload is None:
        return 0.0
    return mem.offload.cost(mem.offload.effective(S, R) if O is None else O)


def search(graph: OpGraph, mem: MemoryModel, allow_s: np.ndarray, recompute_s, budget: float | None,
           frac_s=None, deadline: float | None = None, iterate: bool = False, peak_of=None):
    """The cheapest schedule the search finds without a MIP solver: repaired candidates
    (`solver.repair.candidate_keeps`: roundings of the LP relaxation's ``frac_s`` and checkpoint
    sets), the block-level candidates of chains of identical blocks (`solver.structured`), and with
    a budget also `solver.repair.drop_greedily` and `solver.windows.drop_windows`, with PyTorch's
    implementations, whose ILP memory fits ``budget`` bytes (None: the one with the smallest peak).
    Until ``deadline`` (a `time.perf_counter` value) the fitting candidates are improved by
    `solver.repair.improve`: a descent from each, then (``iterate``) an iterated local search from
    the best.

    With ``peak_of`` (the simulator's peak of (S, R), `solver.finish.simulated_peak_fn`), the
    block-level candidates whose ILP memory is over the budget by at most `NEAR_SLACK` are
    simulated too (the `NEAR_CHECKS` cheapest): the ILP's memory bounds the simulator's from above
    (it does not credit the executor's in-place ReLU and add), and where the simulator, which the
    executor's measured peak equals, fits one in the budget and it recomputes less than the
    search's schedule, it is taken (its ILP peak then exceeds the budget); and where the simulator
    puts the schedule below its ILP memory, part of the time (`SLACK_SHARE`; all of it when a
    simulated block-level candidate beats every one the ILP fits) searches that slack
    (`improve_in_simulated_slack`).  At the peak
    transformers' per-block checkpointing measured on a 24-layer Llama, the ILP's memory put
    monet's per-block checkpointing 1.3 % over and the search paid +93 % instead of +19 %.

    Returns (S (T, G), R (T, N), recompute seconds, ILP peak bytes) or None.
    """
    # schedules of whole blocks on chains of identical blocks (`solver.structured`): per-block
    # checkpointing and its neighbours; then the repaired candidates in at most a fifth of the time
    # (on a 96-layer GPT-2 they took 35 s and fit worse)
    # (the grown block policy in at most half of the time on a graph the deadline bounds)
    until = None if deadline is None else time.perf_counter() + GROW_SHARE * (deadline - time.perf_counter())
    cands = [(c.S, c.R, c.peak, c.cost) for c in structured_candidates(graph, mem, recompute_s, allow_s, budget, until)]
    near = simulated_fits(cands, budget, peak_of)
    share = None if deadline is None or not cands else time.perf_counter() + 0.2 * (deadline - time.perf_counter())
    cands += repaired_candidates(graph, mem, frac_s, allow_s, recompute_s, share)
    if budget is not None:
        cands = [c for c in cands if c[2] <= budget]
        # and those that drop values only where memory is short: the greedy
        # (`solver.repair.drop_greedily`) and the window knapsack (`solver.windows`), each run
        # whole below `ALWAYS_BUILT_CELLS`, else in at most a fifth of the time; and where the
        # greedy gets stuck, the greedy down a ladder of budgets (`solver.repair.ladder`), likewise: at
        # tight budgets theirs are the starts the others are far from (docs/design.md, "Note
        # [Search at tight budgets]")
        limited = bounded(deadline, allow_s)

        def share():
            return time.perf_counter() + 0.2 * (deadline - time.perf_counter()) if limited else None
        found = [drop_greedily(graph, mem, allow_s, budget, recompute_s, share()),
                 drop_windows(graph, mem, allow_s, budget, recompute_s, share())]
        if found[0] is None:  # the greedy got stuck: walk it down (`ladder`)
            found += ladder(graph, mem, allow_s, budget, recompute_s, share())
        cands += [(S, R, mem.peak(S, R), cost) for S, R, cost in (f for f in found if f is not None)]
        cands.sort(key=lambda c: c[3])
    if not cands and not near:
        return None
    if budget is None:
        S, R, peak, cost = min(cands, key=lambda c: c[2])
        return S, R, cost, peak
    # nothing the ILP's memory fits but a block-level schedule the simulator fits (a 96-layer
    # Llama at transformers' per-block peak: per-block checkpointing 0.3 % over by the ILP's count,
    # 0.1 % under by the simulator's): that schedule, and the slack search from it
    S, R, peak, cost = cands[0] if cands else near[0]
    # a descent from each candidate (cheapest first) in 40 % of the time, then an iterated
    # local search from the best (`solver.repair.improve`); where the simulator's peak of the best
    # sits below its ILP memory, both in 1 - SLACK_SHARE of the time and a search in that slack
    # (`improve_in_simulated_slack`) in the rest
    # (when a block-level schedule the simulator fits is cheaper than every candidate the ILP's
    # memory fits, a 24-layer BERT's +43 % against +1,000 %, that slack gets all the time)
    share = 1.0 if not peak_of else 0.0 if near and (not cands or near[0][3] < cost) else 1.0 - SLACK_SHARE
    ends = None if deadline is None else time.perf_counter() + share * (deadline - time.perf_counter())
    first_phase = None if deadline is None else time.perf_counter() + (0.4 if iterate else 1.0) * (
        ends - time.perf_counter())
    for k, (S2, R2, _, _) in enumerate(cands):
        now = time.perf_counter()
        if deadline is None or now >= first_phase:
            break
        S2, R2, c2 = improve(graph, mem, S2, R2, budget, recompute_s, allow_s,
                             now + (first_phase - now) / (len(cands) - k))
        if c2 < cost:
            S, R, cost = S2, R2, c2
    slack = None
    if peak_of is not None and deadline is not None:
        base = (near[0][0], near[0][1]) if near and near[0][3] < cost else (S, R)
        slack = _simulated_slack(mem, *base, budget, peak_of)
        if slack[0] <= SLACK_MIN * budget or deadline - time.perf_counter() < 4 * slack[2]:
            slack, ends = None, deadline  # nothing to gain, or no time to simulate: all to the search
    if iterate and cands and deadline is not None and time.perf_counter() < ends:  # from a start the ILP fits
        S2, R2, c2 = improve(graph, mem, S, R, budget, recompute_s, allow_s, ends, rng=np.random.default_rng(0))
        if c2 < cost:
            S, R, cost, slack = S2, R2, c2, None if slack is None else _simulated_slack(mem, S2, R2, budget, peak_of)
    if near and near[0][3] < cost:
        S, R, _, cost = near[0]
    if slack is not None:
        S, R, cost = improve_in_simulated_slack(graph, mem, S, R, cost, budget, recompute_s, allow_s, deadline,
                                                 peak_of, slack)
    return S, R, cost, mem.peak(S, R)


#: the share of `search`'s time the grown block policy (`solver.structured.Structure.grown`) may
#: take on a graph the deadline bounds
GROW_SHARE = 0.5
#: how far over the budget (a fraction) the ILP's memory of a block-level candidate may be for
#: `search` and `_no_costlier_than_known` to simulate it, and how many such candidates they simulate at most
#: (a 4-layer Llama's per-block checkpointing: 7 % over by the ILP's memory, under by the simulator's)
NEAR_SLACK, NEAR_CHECKS = 0.10, 3
#: the share of `search`'s time after its candidates spent searching in the simulator's slack, and
#: the smallest slack (a fraction of the budget) worth it
SLACK_SHARE, SLACK_MIN = 0.4, 0.001


def _simulated_slack(mem: MemoryModel, S, R, budget: float, peak_of) -> tuple[float, float, float]:
    """(bytes the ILP's memory of (S (T, G), R (T, N)) over-counts the simulator's peak, that
    simulated peak in bytes, seconds the simulation took)."""
    t0 = time.perf_counter()
    simulated = peak_of(S, R)
    return mem.peak(S, R) - simulated, simulated, time.perf_counter() - t0


def improve_in_simulated_slack(graph: OpGraph, mem: MemoryModel, S, R, cost: float, budget: float, recompute_s,
                                allow_s, deadline: float, peak_of, slack: tuple | None = None):
    """``(S, R, seconds)``: the schedule (S (T, G), R (T, N)) that recomputes ``cost`` seconds, or
    a cheaper one that the simulator (``peak_of``) fits in ``budget`` bytes.

    The ILP's memory bounds the simulator's from above, by a few MiB on a deep transformer (it
    does not credit the executor's in-place ReLU and add, nor values freed inside a stage), and
    not by the same amount on every schedule.  So: a descent (`solver.repair.improve`) with the
    budget raised by what the ILP over-counts on the schedule (``slack``: its `_simulated_slack`,
    simulated when None), its moves recorded, then a bisection over them with the simulator for
    the last that fits; again from there while its own over-count and ``deadline`` (a
    `time.perf_counter` value) allow.  At the peak transformers' per-layer checkpointing measured
    on a 24-layer BERT, every schedule the ILP's memory fits recomputes over +1,000 %, the
    block-level per-layer checkpointing that the simulator fits (2.3 MiB over in the ILP's memory)
    +42.7 %, and this finds +35.4 % (halving the raise instead of the bisection landed 0.15 MiB
    over at every raise).
    """
    raise_by, simulated, sim_s = _simulated_slack(mem, S, R, budget, peak_of) if slack is None else slack
    if simulated > budget:  # cannot happen: every candidate fits one way or the other
        return S, R, cost
    while raise_by > SLACK_MIN * budget and deadline - time.perf_counter() > 4 * sim_s:
        moves: list = []
        until = time.perf_counter() + 0.5 * (deadline - time.perf_counter() - 2 * sim_s)
        improve(graph, mem, S, R, budget + raise_by, recompute_s, allow_s, until, trail=moves)
        lo, hi, fits_at = 0, len(moves) + 1, simulated  # after `lo` moves it fits, after `hi` not
        probe = len(moves)  # all of them first
        while hi - lo > 1 and deadline - time.perf_counter() > 1.5 * sim_s:
            peak = peak_of(*replay(S, R, moves[:probe]))
            if peak <= budget:
                lo, fits_at = probe, peak
            else:
                hi = probe
            probe = (lo + hi) // 2
        if lo == 0:
            break
        S, R = replay(S, R, moves[:lo])
        cost, simulated = moves[lo - 1].cost, fits_at
        raise_by = mem.peak(S, R) - simulated
    return S, R, cost


def simulated_fits(cands: list, budget: float | None, peak_of) -> list:
    """Of ``cands`` ((S, R, ILP peak, seconds)), those over ``budget`` by the ILP's memory by at most
    `NEAR_SLACK` that ``peak_of`` fits in it, cheapest first (at most `NEAR_CHECKS` simulated)."""
    if budget is None or peak_of is None:
        return []
    over = sorted((c for c in cands if budget < c[2] <= (1.0 + NEAR_SLACK) * budget), key=lambda c: c[3])
    return [c for c in over[:NEAR_CHECKS] if peak_of(c[0], c[1]) <= budget]


def mip_start(P: Problem, graph: OpGraph, mem: MemoryModel, recompute_s, budget: float | None, frac_s=None,
           deadline: float | None = None, iterate: bool = False):
    """A MIP start: the schedule of `search` as values of ``P``'s variables.

    Returns ({variable: values}, recompute seconds, ILP peak bytes, S (T, G), R (T, N)) or None.
    A start gives CBC an incumbent before its first LP, so a solve stopped early still has a
    schedule and a gap.
    """
    found = search(graph, mem, P.allow_s, recompute_s, budget, frac_s, deadline, iterate)
    if found is None:
        return None
    S, R, cost, peak = found
    start = {}
    if P.s is not None:
        start[P.s] = S.ravel()[P.s_idx]
    if P.r is not None:
        start[P.r] = R.ravel()[P.r_idx]
    if P.m is not None:
        start[P.m] = mem.default_options()
    if P.o is not None:  # the allowed groups the schedule keeps through their windows (its peak's)
        start[P.o] = mem.offload.effective(S, R)[P.o_idx].astype(float)
    return start, cost, peak, S, R


def huge_allow_s(graph: OpGraph, mem: MemoryModel, mode: str) -> np.ndarray | None:
    """``allow_s`` of `allowed` when the ILP would have more than `HUGE` R and S variables in
    recompute-or-store mode (no implementation options, no offload), else None: the cue for the
    search alone."""
    if mode != "normal" or mem.n_options or mem.offload is not None:
        return None
    _, allow_r, allow_s = allowed(mem, mode)
    return allow_s if int(allow_r.sum()) + int(allow_s.sum()) > HUGE else None
