"""Turn fractional keep decisions into a valid schedule (rounding with repair).

A MIP solver stopped by its time limit may hold no integer schedule yet; CBC through cvxpy then
returns the fractional point of its last relaxation.  DESIGN.md lists "the LP relaxation for a
bound and for rounding": `round_and_repair` keeps a group where its fractional ``S`` exceeds a
threshold and then *repairs*: whatever a stage reads that is not kept is recomputed in that stage,
with the inputs that recomputation needs, recursively.  The result always satisfies the ILP's
dependency constraints; it is returned only if its memory (the ILP's own expression) fits.
"""
from __future__ import annotations

import numpy as np

from monet.graph import OpGraph
from monet.solver.memory_model import MemoryModel


def repair(graph: OpGraph, mem: MemoryModel, keep: np.ndarray, allow_s: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """A valid (S (T, G), R (T, N)) that keeps groups where ``keep`` (T, G) says and recomputes the rest.

    Groups of random nodes (dropout) are kept from the forward pass while needed: they cannot be
    recomputed.
    """
    T, N, G = len(graph.bwd), len(graph.fwd), len(mem.groups)
    gnode = mem.group_node
    random_groups = np.array([graph.fwd[i].random for i in gnode], dtype=bool)
    keep = np.asarray(keep, dtype=bool) | (random_groups[None, :] & allow_s)
    node_groups: list[list[int]] = [[] for _ in range(N)]
    for g, i in enumerate(gnode):
        node_groups[i].append(g)
    input_groups = [sorted({mem.group_of[v] for v in n.reads}) for n in graph.fwd]
    S = np.zeros((T, G), dtype=bool)
    R = np.zeros((T, N), dtype=bool)
    have = keep[0] & allow_s[0]
    for t, bnode in enumerate(graph.bwd):
        S[t] = have
        avail = have.copy()
        todo: list[int] = []

        def need(g: int) -> None:
            if avail[g]:
                return
            i = gnode[g]
            for h in input_groups[i]:
                need(h)
            todo.append(i)
            for h in node_groups[i]:
                avail[h] = True

        for v in bnode.reads:
            need(mem.group_of[v])
        R[t, todo] = True
        if t + 1 < T:
            have = avail & keep[t + 1] & allow_s[t + 1]
    return S, R


def candidate_keeps(mem: MemoryModel, frac_s: np.ndarray | None, T: int,
                    thresholds=(0.5, 0.9, 0.99, 0.999, 0.3, 0.1, 0.01)):
    """Keep matrices (T, G) to repair: roundings of a fractional S, and checkpoint sets.

    The checkpoint sets keep every k-th group through the whole backward pass and recompute the
    rest in each stage that reads it (Chen et al. 2016's segments, for k up to sqrt(G) and beyond).
    """
    G = len(mem.groups)
    if frac_s is not None:
        for thr in thresholds:
            yield frac_s > thr
    for k in range(1, max(2, int(np.sqrt(G))) * 2 + 1):
        keep = np.zeros(G, dtype=bool)
        keep[::k] = True
        yield np.broadcast_to(keep, (T, G))


def round_and_repair(graph: OpGraph, mem: MemoryModel, frac_s: np.ndarray | None, allow_s: np.ndarray,
                     budget: float, recompute_s: np.ndarray):
    """The cheapest repaired candidate (see `candidate_keeps`) that fits ``budget`` bytes, or None.

    Returns (S (T, G), R (T, N), recompute seconds) or None when no candidate fits.
    """
    best = None
    for keep in candidate_keeps(mem, frac_s, len(graph.bwd)):
        S, R = repair(graph, mem, keep, allow_s)
        if mem.peak(S, R) <= budget:
            cost = float(np.asarray(recompute_s) @ R.sum(axis=0))
            if best is None or cost < best[2]:
                best = (S, R, cost)
    return best
