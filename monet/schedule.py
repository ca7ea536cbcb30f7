"""From the ILP's matrices to the explicit `Schedule`, and back.

MONeT's variables (Shah et al., ICLR 2021, Sec. 4): ``S[t, i] = 1`` when the output of forward
node ``i`` is in memory at the start of backward stage ``t``; ``R[t, i] = 1`` when node ``i`` is
(re)computed in stage ``t``.  Stage 0 of the paper (the forward pass) computes everything, so here
row ``t`` of S and R is backward stage ``t`` (0-based), both of shape (T, N).
"""
from __future__ import annotations

import numpy as np

from monet.graph import OpGraph
from monet.solution import Schedule, Stage
from monet.steps import KEEP, RECOMPUTE


def needed_by_stage(graph: OpGraph) -> list[set[int]]:
    """For each backward stage t, the forward nodes it reads directly (``D(t)``)."""
    return [set(n.fwd_inputs) for n in graph.bwd]


def ancestors(graph: OpGraph) -> list[set[int]]:
    """For each forward node, all forward nodes it depends on (transitively)."""
    anc: list[set[int]] = []
    for n in graph.fwd:
        s: set[int] = set()
        for j in n.fwd_inputs:
            s.add(j)
            s |= anc[j]
        anc.append(s)
    return anc


def schedule_from_matrices(graph: OpGraph, S: np.ndarray, R: np.ndarray, offload: tuple = ()) -> Schedule:
    """The `Schedule` of a solution: what to keep, recompute and release in each stage.

    A node is recomputed where R says so, even if some of its values are kept (the ILP keeps a
    node's values read by backward nodes and those read only by recomputations separately); a
    node is released after a stage when the next stage keeps none of its values (or after the last
    stage).  Only forward nodes that a backward node or a recomputation reads are kept at all; the
    executor saves a kept value only if a stage reads it.

    Args:
        S, R: (T, N) 0/1 arrays (values within 1e-6 of 0 or 1 are rounded).
        offload: `Schedule.offload` entries (values moved to host memory), passed through.
    """
    S = np.asarray(S) > 0.5
    R = np.asarray(R) > 0.5
    T, N = len(graph.bwd), len(graph.fwd)
    if S.shape != (T, N) or R.shape != (T, N):
        raise ValueError(f"S and R must have shape (T, N) = {(T, N)}; got {S.shape} and {R.shape}")
    useful = np.array([n.saved_bytes > 0 for n in graph.fwd], dtype=bool)
    saved = tuple(int(i) for i in np.flatnonzero(S[0] & useful))
    kept = set(saved)
    stages = []
    for t in range(T):
        rec = tuple(int(i) for i in np.flatnonzero(R[t]))
        kept |= set(rec)
        nxt = set(int(i) for i in np.flatnonzero(S[t + 1] & useful)) if t + 1 < T else set()
        release = tuple(sorted(kept - nxt))
        kept &= nxt
        stages.append(Stage(backward=t, recompute=rec, release=release))
    return Schedule(saved=saved, stages=stages, offload=tuple(offload))


def matrices_from_schedule(graph: OpGraph, schedule: Schedule) -> tuple[np.ndarray, np.ndarray]:
    """The (T, N) bool S and R matrices a `Schedule` corresponds to (inverse of the above), read from
    its steps (`monet.steps`): S[t + 1, i] from the keep steps of stage t (S[0] from the forward
    pass's), R[t, i] from the recompute steps of stage t."""
    T, N = len(graph.bwd), len(graph.fwd)
    S = np.zeros((T, N), dtype=bool)
    R = np.zeros((T, N), dtype=bool)
    for step in schedule.steps():
        if step.kind == KEEP and step.stage + 1 < T:
            S[step.stage + 1, step.node] = True
        elif step.kind == RECOMPUTE:
            R[step.stage, step.node] = True
    return S, R
