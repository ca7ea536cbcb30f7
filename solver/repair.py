"""Turn fractional keep decisions into a valid schedule (rounding with repair).

A MIP solver stopped by its time limit may hold no integer schedule yet; CBC through cvxpy then
returns the fractional point of its last relaxation.  The LP relaxation serves for a bound
and for rounding: `round_and_repair` keeps a group where its fractional ``S`` exceeds a
threshold and then *repairs*: whatever a stage reads that is not kept is recomputed in that stage,
with the inputs that recomputation needs, recursively.  The result always satisfies the ILP's
dependency constraints; it is returned only if its memory (the ILP's own expression) fits.
"""
from __future__ import annotations

import time
import weakref
from dataclasses import dataclass

import numpy as np
import scipy.sparse as sp

from monet.graph import OpGraph
from monet.solver.memory_model import MemoryModel


def repair(graph: OpGraph, mem: MemoryModel, keep: np.ndarray, allow_s: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """A valid (S (T, G), R (T, N)) that keeps groups where ``keep`` (T, G) says and recomputes the rest.

    A kept group that no later stage reads before it is recomputed again is dropped
    (`_trim`): ``keep`` may say "keep" for stages that only *might* need a group.
    """
    T, N, G = len(graph.bwd), len(graph.fwd), len(mem.groups)
    gnode = mem.group_node
    keep = np.asarray(keep, dtype=bool)
    index = reads_index(graph, mem)
    node_groups, input_groups = index.node_groups, index.input_groups
    S = np.zeros((T, G), dtype=bool)
    R = np.zeros((T, N), dtype=bool)
    group_node = gnode.tolist()
    have = keep[0] & allow_s[0]
    for t in range(T):
        S[t] = have
        avail = bytearray(have.tobytes())  # a bytearray: the recursion below indexes it fast
        todo: list[int] = []

        def need(g: int) -> None:
            i = group_node[g]
            for h in input_groups[i]:
                if not avail[h]:
                    need(h)
            todo.append(i)
            for h in node_groups[i]:
                avail[h] = 1

        for g in index.bwd_groups[t]:
            if not avail[g]:
                need(g)
        R[t, todo] = True
        if t + 1 < T:
            have = np.frombuffer(avail, dtype=bool) & keep[t + 1] & allow_s[t + 1]
    return _trim(graph, mem, S, R), R


def checkpointed(graph: OpGraph, mem: MemoryModel, keep: np.ndarray, allow_s: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(S (T, G), R (T, N)) that keeps the groups ``keep`` (G,) bool through the backward pass and
    recomputes every other value once, in the first stage that reads it (with what it needs), and
    keeps it from there until its last reader: ``torch.utils.checkpoint``'s semantics, where a
    segment is recomputed at its first unpack and its values are held until the segment's
    backward has read them (Chen et al. 2016, Sec. 4)."""
    T = len(graph.bwd)
    keep = np.broadcast_to(np.asarray(keep, dtype=bool), allow_s.shape).copy()
    _, R = repair(graph, mem, keep, allow_s)
    recomputed = R[:, mem.group_node]  # (T, G): the group's node is recomputed in stage t
    first = np.where(recomputed.any(axis=0), recomputed.argmax(axis=0), T)
    keep |= np.arange(T)[:, None] > first[None, :]
    return repair(graph, mem, keep, allow_s)


def chen_checkpoints(mem: MemoryModel) -> np.ndarray:
    """The forward nodes whose outputs Chen's sqrt(n) schedule keeps (sorted node indices): the
    last node of each of round(sqrt(n)) segments of equal count over the n nodes whose values a
    backward node reads (Chen et al. 2016, Sec. 4.1)."""
    nodes = np.unique(mem.group_node)
    n = len(nodes)
    if n == 0:
        return nodes
    k = max(1, int(round(np.sqrt(n))))  # segments
    length = int(np.ceil(n / k))
    return nodes[length - 1::length]


def _trim(graph: OpGraph, mem: MemoryModel, S: np.ndarray, R: np.ndarray) -> np.ndarray:
    """S (T, G) without the kept groups that are of no use: a group is kept at the start of stage t
    only if stage t reads it (its backward node, or a recomputation, and its node is not
    recomputed in t) or it is kept into stage t + 1 without being recomputed in t.

    The ILP's memory counts a kept group for the whole stage, and the repaired candidates kept
    every group that a later stage *might* need (``allow_s``, ancestors of what it reads): on
    ResNet-50 the keep-everything candidate had an ILP peak of 26.4 GiB against 15.0 GiB
    simulated, and the ILP rejected repaired schedules that fit.
    """
    T = S.shape[0]
    used = stage_reads(graph, mem, R)
    # kept and not recomputed in t (a stage that recomputes a group does not read the kept copy)
    held = S & ~R[:, mem.group_node]
    # out[t] = held[t] & (used[t] | out[t + 1]): held from t through a stage that reads it, that is
    # the next reading stage comes before the next stage that does not hold it
    # (int32: half the memory traffic of int64 on these (T, G) arrays, the same comparison)
    stages, end = np.arange(T, dtype=np.int32)[:, None], np.int32(T)
    next_read = np.minimum.accumulate(np.where(used, stages, end)[::-1], axis=0)[::-1]
    next_gap = np.minimum.accumulate(np.where(held, end, stages)[::-1], axis=0)[::-1]
    return held & (next_read < next_gap)


#: below this many (stage, group) cells of S (T, G), every candidate of `repaired_candidates` is
#: built, `smallest_candidate` simulates all its best, and `drop_greedily` runs to its end,
#: whatever the deadline says (a repair is linear in the cells: about 7 ms at 10,000; the greedy
#: repairs up to eight times per value it drops), so that the candidates do not depend on the
#: machine's speed (docs/design.md, "Note [Small problems are solved whole]"); above it the
#: deadline bounds them (on a 96-layer Llama they took 100 s)
ALWAYS_BUILT_CELLS = 100_000


def bounded(deadline: float | None, allow_s: np.ndarray) -> bool:
    """Whether ``deadline`` (a `time.perf_counter` value or None) bounds the candidates of a graph
    whose S has ``allow_s``'s (T, G) cells: only above `ALWAYS_BUILT_CELLS`."""
    return deadline is not None and allow_s.size > ALWAYS_BUILT_CELLS


def repaired_candidates(graph: OpGraph, mem: MemoryModel, frac_s, allow_s, recompute_s=None,
                        deadline: float | None = None):
    """Repaired candidates as (S, R, ILP peak bytes, recompute seconds): every one of
    `candidate_keeps` on graphs under `ALWAYS_BUILT_CELLS`; on larger ones, the first and Chen's
    sqrt(n) segments (`checkpointed` at `chen_checkpoints`) whatever ``deadline`` (a
    `time.perf_counter` value) says, the others while it allows.  So a search stopped before its
    first step still has the same candidates on a small graph, and one that recomputes on any (the
    first of `candidate_keeps` keeps everything when there is no ``frac_s``)."""
    def candidate(S, R):
        cost = 0.0 if recompute_s is None else float(np.asarray(recompute_s) @ R.sum(axis=0))
        return S, R, mem.peak(S, R), cost

    limited = bounded(deadline, allow_s)
    out = []
    for keep in candidate_keeps(mem, frac_s, len(graph.bwd), recompute_s):
        if out and limited and time.perf_counter() >= deadline:
            break
        out.append(candidate(*repair(graph, mem, keep, allow_s)))
    if len(mem.groups):
        out.append(candidate(*checkpointed(graph, mem, np.isin(mem.group_node, chen_checkpoints(mem)), allow_s)))
    return out


#: a candidate with more recomputations than this many per forward node is not simulated (its ILP
#: peak, an upper bound, stands): a 96-layer Llama's checkpoint sets that keep every k-th group and
#: recompute the rest in every stage that reads it held up to 2.96 million recomputations (824 per
#: node), whose simulation built an FX graph of that size and grew the process to 24 GB
SIMULATED_RECOMPUTATIONS_PER_NODE = 64


def smallest_candidate(graph: OpGraph, mem: MemoryModel, frac_s: np.ndarray | None, allow_s: np.ndarray,
                       peak_of=None, simulate_best: int = 4, deadline: float | None = None):
    """(peak bytes, S, R) of the repaired candidate with the smallest peak.

    Candidates are ranked by the ILP's memory expression (cheap), and among equal peaks by their
    number of recomputations (the 96-layer Llama's smallest peak was reached by candidates with
    52,297 and with 2,960,848 recomputations); the ``simulate_best`` best are then measured with
    ``peak_of`` (the simulator) when it is given: all of them on graphs under
    `ALWAYS_BUILT_CELLS`; on larger ones the first always and the others while ``deadline`` (a
    `time.perf_counter` value) allows (a simulation of a large graph takes seconds: eight made a
    smallest-budget search take 124 s of its 60).  The candidates themselves are built as
    `repaired_candidates` says.  A candidate with more
    than `SIMULATED_RECOMPUTATIONS_PER_NODE` recomputations per forward node keeps its ILP peak
    (an upper bound of the simulator's) instead of being simulated.
    """
    ranked = sorted(repaired_candidates(graph, mem, frac_s, allow_s, deadline=deadline),
                    key=lambda c: (c[2], int(c[1].sum())))
    if peak_of is None:
        S, R, peak, _ = ranked[0]
        return peak, S, R
    most = SIMULATED_RECOMPUTATIONS_PER_NODE * max(1, len(graph.fwd))
    limited = bounded(deadline, allow_s)
    best = None
    for k, (S, R, ilp_peak, _) in enumerate(ranked[:simulate_best]):
        if k and limited and time.perf_counter() >= deadline:
            break
        peak = peak_of(S, R) if R.sum() <= most else ilp_peak
        if best is None or peak < best[0]:
            best = (peak, S, R)
    return best


def candidate_keeps(mem: MemoryModel, frac_s: np.ndarray | None, T: int, recompute_s=None,
                    thresholds=(0.5, 0.9, 0.1)):
    """Keep matrices (T, G) to repair: roundings of a fractional S, and checkpoint sets.

    The checkpoint sets keep every k-th group through the whole backward pass and recompute the
    rest in each stage that reads it (Chen et al. 2016's segments, k = 1, 2, 3, 4, 6, 8, ...).
    With ``recompute_s`` (N,) seconds, further sets keep the groups whose node is the most
    expensive to recompute per byte (the top 90 %, 80 %, ..., 10 % of them): keep what
    convolutions and matrix products compute and recompute the cheap element-wise operators
    from it, as MONeT's and Checkmate's schedules do.
    """
    G = len(mem.groups)
    if frac_s is not None:
        for thr in thresholds:
            yield frac_s > thr
    k = 1
    while k <= max(2, 2 * int(np.sqrt(G))):
        keep = np.zeros(G, dtype=bool)
        keep[::k] = True
        yield np.broadcast_to(keep, (T, G))
        k = k + 1 if k < 4 else int(k * 1.5)
    if recompute_s is not None and G:
        per_byte = np.asarray(recompute_s, dtype=float)[mem.group_node] / np.maximum(mem.saved_bytes, 1.0)
        for q in np.arange(0.1, 1.0, 0.1):
            yield np.broadcast_to(per_byte >= np.quantile(per_byte, q), (T, G))


def round_and_repair(graph: OpGraph, mem: MemoryModel, frac_s: np.ndarray | None, allow_s: np.ndarray,
                     budget: float, recompute_s: np.ndarray, peak_of=None, simulate_at_most: int = 6):
    """The cheapest repaired candidate (see `candidate_keeps`) that fits ``budget`` bytes, or None.

    A candidate whose ILP memory expression fits needs no simulation (the expression bounds the
    simulator's peak); others are simulated with ``peak_of`` (exact), cheapest first, at most
    ``simulate_at_most`` of them.  Returns (S (T, G), R (T, N), recompute seconds) or None.
    """
    cands = sorted(repaired_candidates(graph, mem, frac_s, allow_s, recompute_s), key=lambda c: c[3])
    simulated = 0
    for S, R, ilp_peak, cost in cands:
        if ilp_peak <= budget:
            return S, R, cost
        if peak_of is not None and simulated < simulate_at_most:
            simulated += 1
            if peak_of(S, R) <= budget:
                return S, R, cost
    return None


@dataclass(frozen=True)
class ReadsIndex:
    """Who reads which group, of one graph and its memory model (built once: `reads_index`).

    Attributes:
        node_groups: for each forward node, its groups (indices, ascending).
        input_groups: for each forward node, the groups it reads (sorted indices).
        bwd_groups: for each backward stage t, the groups its backward node reads (in read order).
        bwd_used: (T, G) bool: stage t's backward node reads group g.
        node_reads: (N, G) sparse float32, 1 where forward node i reads group g.
    """

    node_groups: list
    input_groups: list
    bwd_groups: list
    bwd_used: np.ndarray
    node_reads: sp.csr_matrix


_INDEXES: dict[int, tuple] = {}  # id(mem) -> (weakref to mem, weakref to graph, ReadsIndex)


def reads_index(graph: OpGraph, mem: MemoryModel) -> ReadsIndex:
    """The `ReadsIndex` of ``graph`` and ``mem``, built on the first call and kept while both live
    (a repair, the search's unit of work, reads it on every call)."""
    cached = _INDEXES.get(id(mem))
    if cached is not None and cached[0]() is mem and cached[1]() is graph:
        return cached[2]
    N, T, G = len(graph.fwd), len(graph.bwd), len(mem.groups)
    node_groups: list[list[int]] = [[] for _ in range(N)]
    for g, i in enumerate(mem.group_node):
        node_groups[i].append(g)
    input_groups = [sorted({mem.group_of[v] for v in n.reads}) for n in graph.fwd]
    bwd_groups = [[mem.group_of[v] for v in b.reads] for b in graph.bwd]
    used = np.zeros((T, G), dtype=bool)
    for t, gs in enumerate(bwd_groups):
        used[t, gs] = True
    rows = [i for i, gs in enumerate(input_groups) for _ in gs]
    cols = [g for gs in input_groups for g in gs]
    reads = sp.csr_matrix((np.ones(len(rows), dtype=np.float32), (rows, cols)), shape=(N, G))
    index = ReadsIndex(node_groups, input_groups, bwd_groups, used, reads)
    for key in [k for k, (m, _, _) in _INDEXES.items() if m() is None]:
        del _INDEXES[key]
    _INDEXES[id(mem)] = (weakref.ref(mem), weakref.ref(graph), index)
    return index


def stage_reads(graph: OpGraph, mem: MemoryModel, R: np.ndarray) -> np.ndarray:
    """(T, G) bool: stage t reads group g (its backward node, or a node it recomputes, R (T, N))."""
    index = reads_index(graph, mem)
    used = index.bwd_used.copy()
    if index.node_reads.nnz:  # what the recomputed nodes read: R (T, N) @ reads (N, G), sparse
        used |= (sp.csr_matrix(np.asarray(R, dtype=np.float32)) @ index.node_reads).toarray() > 0
    return used


def drop_windows_of(graph: OpGraph, mem: MemoryModel, S: np.ndarray, used: np.ndarray):
    """The drop windows of a schedule: (node j, a, b, j's groups) for each run of stages [a, b)
    in which S (T, G) keeps some of j's values and no stage reads them, b reads them (``used``,
    `stage_reads`), and a is 0 or the stage after the previous read."""
    gnode = mem.group_node
    for j in np.unique(gnode[S.any(axis=0)]):
        gs = np.flatnonzero(gnode == j)
        kept = S[:, gs].any(axis=1)
        a = 0
        for b in np.flatnonzero(used[:, gs].any(axis=1)):
            if b > a and kept[a:b].any():
                yield int(j), int(a), int(b), gs
            a = b + 1


def drop_greedily(graph: OpGraph, mem: MemoryModel, allow_s: np.ndarray, budget: float,
                  recompute_s: np.ndarray, deadline: float | None = None, tries: int = 8, start=None):
    """A schedule that fits ``budget`` bytes, built from keep-everything (or from ``start``, a
    valid (S (T, G), R (T, N))) by dropping values where memory is over the budget: (S, R,
    recompute seconds), or None when no move frees bytes, ``deadline`` passes first, or the budget
    is under the `MemoryModel.floor`.

    A move drops a node's values over a window of stages [a, b) in which nothing reads them (b
    reads them: they are recomputed there, once, and kept from then on).  Each step ranks the
    moves by the bytes they would free in stages over the budget (the ILP's `MemoryModel`
    rows, the forward pass for windows from stage 0) per second of the node's recomputation,
    `repair`s the ``tries`` best (more while none frees any), and takes the one that removes the
    most excess bytes per second actually added.  This is the greedy of the rematerialisation
    heuristics (Chen et al. 2016, Sec. 4; Kirisame et al. 2021's cost per byte), on MONeT's stages.

    Why: the checkpoint sets of `candidate_keeps` recompute a value in every stage that reads
    it and drop it even where memory is not short.  On ResNet-50 at batch 184 (cheap lean
    implementations) this start, improved for 15 s, gave 0.6617 / 0.6908 s at 50 / 33 % of
    the plain peak where the checkpoint sets gave 0.6647 / 0.7286-0.7572 s.
    """
    if mem.offload is None and budget < mem.floor():  # no drop gets there
        return None
    recompute_s = np.asarray(recompute_s, dtype=float)
    T, G = allow_s.shape
    gnode = mem.group_node
    S, R = repair(graph, mem, allow_s, allow_s) if start is None else start
    later = np.arange(T)[:, None]

    def excess(S, R):
        over = np.maximum(mem.bwd_peaks(S, R) - budget, 0.0)
        return over, max(mem.fwd_peak(S[0], R=R) - budget, 0.0)

    over, fover = excess(S, R)
    while over.any() or fover > 0:
        if deadline is not None and time.perf_counter() >= deadline:
            return None
        used = stage_reads(graph, mem, R)
        moves = []
        for j, a, b, gs in drop_windows_of(graph, mem, S, used):
            freed = S[a:b][:, gs] @ mem.saved_bytes[gs]
            gain = np.minimum(over[a:b], freed).sum() + (min(fover, freed[0]) if a == 0 else 0.0)
            if gain > 0:
                moves.append((gain / max(recompute_s[j], 1e-12), j, a, b))
        best = None
        ranked = sorted(moves, reverse=True)
        for k, (_, j, a, b) in enumerate(ranked):
            if best is not None and k >= tries:  # the ``tries`` best, or on until one frees bytes
                break
            mine = gnode == j
            keep = S.copy()
            keep[a:b, mine] = False
            keep |= (later >= b) & mine[None, :] & allow_s
            S2, R2 = repair(graph, mem, keep, allow_s)
            o2, f2 = excess(S2, R2)
            freed = over.sum() + fover - o2.sum() - f2
            added = float(recompute_s @ (R2.sum(axis=0) - R.sum(axis=0)))
            if freed > 0 and (best is None or freed / max(added, 1e-12) > best[0]):
                best = (freed / max(added, 1e-12), S2, R2, o2, f2)
        if best is None:
            return None
        _, S, R, over, fover = best
    return S, R, float(recompute_s @ R.sum(axis=0))


#: the rungs of `ladder`, from the top: rung r is at budget + (r - 1) x min(budget, keep-all peak -
#: budget), so r x the budget where keeping everything needs more than twice the budget, and a
#: fraction of the way up to keeping everything where the budget is near it
LADDER_RUNGS = (1.5, 1.3)


def rung_budgets(budget: float, highest: float, rungs=LADDER_RUNGS) -> list[float]:
    """The budgets (bytes) of `ladder`'s rungs for ``budget`` under a keep-all peak of ``highest``
    bytes (see `LADDER_RUNGS`), from the top; none where keeping everything fits ``budget``."""
    room = min(budget, highest - budget)
    return [budget + (r - 1) * room for r in rungs] if room > 0 else []


def ladder(graph: OpGraph, mem: MemoryModel, allow_s: np.ndarray, budget: float, recompute_s: np.ndarray,
           deadline: float | None = None, rungs=LADDER_RUNGS) -> list:
    """Schedules that fit ``budget`` bytes, reached down a ladder of budgets: from keep-everything,
    at each rung (`rung_budgets`, descending) `drop_greedily` to the rung and `improve` there; from
    each rung, `drop_greedily` on to ``budget`` (the caller improves what it keeps).
    Returns a list of (S (T, G), R (T, N), recompute seconds), one per rung the greedy gets down
    from (maybe none).

    Why: `drop_greedily` is myopic, and the more a budget asks it to drop the further its schedule
    is from what a descent finds, down to none where no single drop frees bytes (docs/design.md,
    "Note [Search at tight budgets]").  ``deadline``: a `time.perf_counter` value (None: none)
    bounding every greedy and descent.
    """
    until = float("inf") if deadline is None else deadline
    top = repair(graph, mem, allow_s, allow_s)
    found = []
    for rung in rung_budgets(budget, mem.peak(*top), rungs):
        step = drop_greedily(graph, mem, allow_s, rung, recompute_s, deadline, start=top)
        if step is None:
            break
        top = improve(graph, mem, step[0], step[1], rung, recompute_s, allow_s, until)[:2]
        down = drop_greedily(graph, mem, allow_s, budget, recompute_s, deadline, start=top)
        if down is not None:
            found.append(down)
    return found


@dataclass(frozen=True)
class Move:
    """One move of `improve`'s descent: the flat indices of S (T, G) and R (T, N) it flipped, and the
    recomputation seconds after it."""

    s_flipped: np.ndarray
    r_flipped: np.ndarray
    cost: float


def replay(S: np.ndarray, R: np.ndarray, moves: list) -> tuple[np.ndarray, np.ndarray]:
    """(S, R) after ``moves`` (`Move`s recorded by `improve` from this S (T, G) and R (T, N))."""
    S, R = S.copy(), R.copy()
    for m in moves:
        S.ravel()[m.s_flipped] ^= True
        R.ravel()[m.r_flipped] ^= True
    return S, R


def improve(graph: OpGraph, mem: MemoryModel, S: np.ndarray, R: np.ndarray, budget: float,
            recompute_s: np.ndarray, allow_s: np.ndarray, deadline: float,
            rng: np.random.Generator | None = None, trail: list | None = None) -> tuple[np.ndarray, np.ndarray, float]:
    """Local search from a schedule that fits: recompute less while the ILP's memory
    (`MemoryModel.peak`, which bounds the simulator's) stays within ``budget`` bytes.

    *Greedy descent*: nodes are visited by the recomputation time they cost (most first).  For
    each, two moves are tried, the cheaper in memory first: keep the node's values from the first
    stage that recomputes it on (recompute once, as a checkpointed segment does), or keep them
    from the forward pass on (never recompute).  A move is a new keep matrix, `repair`ed, and
    taken if it is cheaper and fits.  Passes repeat until none improves.

    *Iterated local search* (with ``rng``): then, until ``deadline`` (a `time.perf_counter`
    value), drop the kept values of 3 random kept nodes, descend again, and keep the result if
    it is cheaper.  A move costs a few milliseconds on ResNet-50; a descent 1.5-5 s.

    ``trail``: when a list, each move the first descent takes is appended as `Move` (what it
    changed), so that the schedule after any prefix of them can be rebuilt (`replay`).

    Why: CBC finds no schedule better than its start at full scale, and the LP relaxation's
    roundings leave recomputation that memory would allow to avoid.  On ResNet-50 at batch 184
    with the cheap lean implementations, 15 s of this search from the checkpoint schedules gave
    +2.7 / +8.0 / +13.7 % predicted overhead at 70 / 50 / 33 % of the plain peak, where the
    repaired LP roundings (found in 9-25 s) gave +4.2 / +9.5 / +106 %.

    Returns (S (T, G), R (T, N), recompute seconds).
    """
    recompute_s = np.asarray(recompute_s, dtype=float)

    def descend(S, R, cost):
        improved = True
        while improved and time.perf_counter() < deadline:
            improved = False
            spent = R.sum(axis=0) * recompute_s
            for j in np.argsort(-spent, kind="stable"):
                if spent[j] <= 0 or time.perf_counter() >= deadline:
                    break
                if not R[:, j].any():  # a move taken in this pass stopped recomputing it
                    continue
                groups = np.flatnonzero(mem.group_node == j)
                first = int(np.flatnonzero(R[:, j])[0])
                for start in (first, 0):
                    keep = S.copy()
                    keep[start:, groups] = True
                    S2, R2 = repair(graph, mem, keep, allow_s)
                    c2 = float(recompute_s @ R2.sum(axis=0))
                    if c2 < cost - 1e-12 and mem.peak(S2, R2) <= budget:
                        if record is not None:
                            record.append(Move(np.flatnonzero((S2 != S).ravel()), np.flatnonzero((R2 != R).ravel()), c2))
                        S, R, cost, improved = S2, R2, c2, True
                        break
        return S, R, cost

    record = trail
    S, R, cost = descend(S, R, float(recompute_s @ R.sum(axis=0)))
    record = None
    while rng is not None and time.perf_counter() < deadline:
        kept = np.unique(mem.group_node[S.any(axis=0)])
        if not len(kept):
            break
        drop = rng.choice(kept, size=min(3, len(kept)), replace=False)
        keep = S.copy()
        keep[:, np.isin(mem.group_node, drop)] = False
        S2, R2 = repair(graph, mem, keep, allow_s)
        if mem.peak(S2, R2) > budget:
            continue
        S2, R2, c2 = descend(S2, R2, float(recompute_s @ R2.sum(axis=0)))
        if c2 < cost - 1e-12:
            S, R, cost = S2, R2, c2
    return S, R, cost
