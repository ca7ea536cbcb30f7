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
from monet.steps import BACKWARD, FORWARD, FREE, KEEP, RECOMPUTE


def needed_by_stage(graph: OpGraph) -> list[set[int]]:
    """For each backward stage t, the forward nodes it reads directly (``D(t)``)."""
    return [set(n.fwd_inputs) for n in graph.bwd]


def ancestors(graph: OpGraph) -> np.ndarray:
    """(N, N) bool: ``anc[i, j]`` when forward node i depends on forward node j (transitively).
    A bit matrix rather than sets: a 96-layer GPT-2 has 3,000 forward nodes, most of them
    ancestors of most others (9 MB here, about 300 MB of Python sets)."""
    N = len(graph.fwd)
    anc = np.zeros((N, N), dtype=bool)
    for n in graph.fwd:
        inputs = list(n.fwd_inputs)
        if inputs:
            anc[n.id] = anc[inputs].any(axis=0)
            anc[n.id, inputs] = True
    return anc


def without_dead_recomputations(graph: OpGraph, S: np.ndarray, R: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(S, R) without the recomputations whose value nothing reads, and without the keeps of
    values nothing reads later: the same backward pass, never more memory or time.

    A recomputation of node i in stage t is read when backward node t reads i, when a read
    recomputation of the stage reads i (a compiled step's random op reads none: it reads its
    saved draws), or when a later stage reads i before recomputing it again
    (the value is kept until then).  Stages are swept from the last: ``demand[i]`` says that a
    later stage reads the value of i held from before it.  A schedule may hold such dead
    recomputations where a heuristic recomputes whole segments; the executor would run them (an
    FX graph runs every node) and the ILP's objective would count them.

    Args:
        S, R: (T, N) 0/1 arrays, a valid schedule (`schedule_from_matrices`'s arguments).

    Returns:
        (S, R) as bool arrays, R <= R given, S <= S given, S[t + 1] <= S[t] + R[t] still.
    """
    S = np.asarray(S) > 0.5
    R = np.asarray(R) > 0.5
    T, N = R.shape
    # a compiled step's recomputed random op reads its saved draws, not its inputs (docs/design.md,
    # "Note [Random ops compiled]")
    inputs = [np.asarray(() if graph.compiled and n.random else n.fwd_inputs, dtype=np.int64) for n in graph.fwd]
    demand = np.zeros(N, dtype=bool)  # a later stage reads the value held from before it
    R_out, S_out = np.zeros_like(R), np.zeros_like(S)
    for t in range(T - 1, -1, -1):
        need = demand.copy()
        need[list(graph.bwd[t].fwd_inputs)] = True
        recomputed = np.flatnonzero(R[t])
        for j in recomputed[::-1]:  # readers before what they read
            if need[j]:
                R_out[t, j] = True
                need[inputs[j]] = True
        demand = need & ~R_out[t]  # what this stage reads and does not recompute comes from before
        S_out[t] = S[t] & demand
    return S_out, R_out


def schedule_from_matrices(graph: OpGraph, S: np.ndarray, R: np.ndarray, offload: tuple = ()) -> Schedule:
    """The `Schedule` of a solution: what to keep, recompute and release in each stage.

    A node is recomputed where R says so, even if some of its values are kept (the ILP keeps a
    node's values read by backward nodes and those read only by recomputations separately); a
    node is released after a stage when the next stage keeps none of its values (or after the last
    stage).  Only forward nodes that a backward node or a recomputation reads are kept at all; the
    executor saves a kept value only if a stage reads it.  A compiled graph's schedule
    (``graph.compiled``) overwrites nothing in place (`Schedule.inplace` False): Inductor compiles
    the functional modules (`monet.compiled.executor_modules`), so the simulation counts every
    output as the allocation it is there.

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
    saved = tuple(np.flatnonzero(S[0] & useful).tolist())
    kept = S[0] & useful
    none = np.zeros(N, dtype=bool)
    stages = []
    for t in range(T):
        kept = kept | R[t]
        nxt = S[t + 1] & useful if t + 1 < T else none
        stages.append(Stage(backward=t, recompute=tuple(np.flatnonzero(R[t]).tolist()),
                            release=tuple(np.flatnonzero(kept & ~nxt).tolist())))
        kept = kept & nxt
    return Schedule(saved=saved, stages=stages, inplace=not graph.compiled, offload=tuple(offload))


def matrices_from_schedule(graph: OpGraph, schedule: Schedule) -> tuple[np.ndarray, np.ndarray]:
    """The (T, N) bool S and R matrices a `Schedule` corresponds to (inverse of the above), read from
    its steps (`monet.steps`): S[0] from the forward pass's keep steps, S[t + 1] = S[t] less the
    free steps of stage t plus its keep steps, R[t, i] from the recompute steps of stage t."""
    T, N = len(graph.bwd), len(graph.fwd)
    S = np.zeros((T, N), dtype=bool)
    R = np.zeros((T, N), dtype=bool)
    kept = np.zeros(N, dtype=bool)
    for step in schedule.steps():
        if step.kind == KEEP:
            kept[step.node] = True
            if step.stage == FORWARD:
                S[0, step.node] = True
        elif step.kind == FREE:
            kept[step.node] = False
        elif step.kind == RECOMPUTE:
            R[step.stage, step.node] = True
        elif step.kind == BACKWARD and step.stage + 1 < T:
            S[step.stage + 1] = kept  # provisional: this stage's frees and keeps follow
        if step.kind in (KEEP, FREE) and step.stage != FORWARD and step.stage + 1 < T:
            S[step.stage + 1, step.node] = kept[step.node]
    return S, R
