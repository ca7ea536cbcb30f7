"""Chen et al.'s sqrt(n) checkpointing as a schedule over the `OpGraph`: `solve_chen`.

Chen, Xu, Zhang and Guestrin, "Training Deep Nets with Sublinear Memory Cost" (arXiv 1604.06174,
2016), Sec. 4: divide the n forward nodes into k = sqrt(n) segments, keep only each segment's
output through the backward pass, and recompute a segment's inside once, when the backward pass
first needs it; the activations then cost O(sqrt(n)).  Here the segments are evenly spaced *by
count* over the forward nodes whose values a backward node reads (in topological order), as
Chen's Sec. 4.1 does for a chain of n layers: by count rather than by bytes, so the schedule is
the textbook one (`profiling.baselines.chen_sqrt_checkpoint` is the same idea as a
`torch.utils.checkpoint` wrapper, measured beside monet by the benchmarks).  A recomputed node is kept from the
stage that first recomputes it until its last reader, as ``torch.utils.checkpoint`` keeps a
segment's recomputed activations for that segment's backward.

It has no budget knob: the schedule is fixed by the graph, and a budget below its peak is an
`InfeasibleBudgetError` that names the peak.
"""
from __future__ import annotations

import numpy as np

from monet.graph import OpGraph
from monet.profiling.costs import CostArrays
from monet.solution import RunInfo, Solution
from monet.solver.deadline import Deadline
from monet.solver.formulation import allowed
from monet.solver.ilp import InfeasibleBudgetError
from monet.solver.memory_model import MemoryModel
from monet.solver.repair import checkpointed, chen_checkpoints
from monet.solver.finish import finish_solution, memory_model


def chen_matrices(graph: OpGraph, mem: MemoryModel) -> tuple[np.ndarray, np.ndarray]:
    """(S (T, G) kept groups, R (T, N) recomputed nodes) of Chen's sqrt(n) schedule: the
    checkpoints' groups kept throughout, every other value recomputed (with what it needs) in the
    first stage that reads it and kept from then on (`solver.repair.repair` places the
    recomputations and drops what no later stage reads)."""
    return checkpointed(graph, mem, np.isin(mem.group_node, chen_checkpoints(mem)), allowed(mem)[2])


def solve_chen(graph: OpGraph, costs: CostArrays, budget: int, *, deadline: Deadline,
               info: RunInfo | dict | None = None, **_) -> Solution:
    """Chen et al. 2016's sqrt(n) schedule (Sec. 4; see the module docstring) as a `Solution` in
    recompute-or-store mode ("normal"), solver "chen-sqrt(n)".

    Its objective (seconds) is plain PyTorch's time plus the recomputation; its predicted peak
    (bytes) is the simulator's.  Takes no search time (``deadline`` is read for the solve time);
    other options (for the common signature) are ignored.

    Raises:
        InfeasibleBudgetError: the schedule's peak exceeds ``budget`` bytes; names the peak, the
            budget this schedule needs (a solver that searches may need less).
    """
    mem = memory_model(graph, costs)
    S, R = chen_matrices(graph, mem)
    cost = float(np.asarray(costs.fwd_recompute, dtype=float) @ R.sum(axis=0))
    sol = finish_solution(graph, costs, mem.group_to_node(S), R, budget=budget, mode="normal", status="heuristic",
                          solver="chen-sqrt(n)", objective_s=costs.total_time + cost, bound_s=None, gap=None,
                          solve_time_s=deadline.elapsed(), info=info, check=False)
    if sol.meta.predicted_peak_bytes > budget:
        raise InfeasibleBudgetError(budget, sol.meta.predicted_peak_bytes, "normal (Chen's sqrt(n) schedule)")
    return sol
