"""A schedule's `Solution`, simulated; plain PyTorch's schedule and peak; the memory model of a graph.

The helpers every solver (`solver.checkpoint_all`, `solver.chen`, `solver.greedy`,
`solver.rounding`, `solver.ilp_peer`, `solver.portfolio`) shares: `finish_solution` turns keep /
recompute matrices into the `Solution` whose predicted peak is the simulator's (`monet.simulate`),
so solvers are compared on the same accounting.
"""
from __future__ import annotations

import hashlib
import time

import numpy as np
import torch

import monet
from monet.graph import OpGraph
from monet.profiling.costs import CostArrays
from monet.matrices import schedule_from_matrices, without_dead_recomputations
from monet.simulate import schedule_peak
from monet.solver.choices import chosen_graph, chosen_impls
from monet.solution import RunInfo, Solution, SolutionMeta
from monet.solver.memory_build import build_memory_model
from monet.solver.memory_model import MemoryModel
from monet.solver.offload import build_offload_model


def finish_solution(graph: OpGraph, costs: CostArrays, S, R, *, budget: int, mode: str, status: str, solver: str,
                    objective_s: float, bound_s, gap, solve_time_s: float, info: RunInfo | dict | None,
                    eager: int | None = None, eager_time: float | None = None, offload: tuple = (),
                    offload_bandwidth: float | None = None, check: bool = True) -> Solution:
    """The `Solution` of (S (T, N), R (T, N) bool: kept at the start of / recomputed in each backward
    stage) on ``graph`` (with its implementations, ``graph.impls``), simulated: its
    ``meta.predicted_peak_bytes`` is the simulator's peak (`monet.simulate`).  Recomputations and
    keeps that nothing reads are dropped first (`monet.matrices.without_dead_recomputations`; not
    with ``offload``), and their seconds taken off ``objective_s``.
    ``eager`` (bytes) and ``eager_time`` (seconds) are plain PyTorch's peak and iteration time, the
    references of the reported saving and overhead; by default those of ``graph`` itself, which is
    wrong when ``graph`` carries implementations other than PyTorch's.  ``offload``: the
    `Schedule.offload` entries, planned at ``offload_bandwidth`` bytes/s.

    Raises:
        RuntimeError: with ``check``, a simulated peak above ``budget`` bytes (an internal error
            for schedules whose memory an ILP's expressions bound); without it (schedules with
            no budget knob: keep everything, Chen's sqrt(n)) the caller compares the peak."""
    if not offload:  # an offloaded value's keeps carry its transfers: left as they are
        S, R, removed = np.asarray(S) > 0.5, np.asarray(R) > 0.5, np.asarray(R) > 0.5
        S, R = without_dead_recomputations(graph, S, R)
        objective_s -= float(np.asarray(costs.fwd_recompute, dtype=float) @ (removed & ~R).sum(axis=0))
    schedule, sim = simulated_schedule(graph, costs, S, R, offload)
    if check and sim.peak_bytes > budget:  # cannot happen: the ILP's memory bounds the simulator's
        raise RuntimeError(f"internal error: the schedule's simulated peak {sim.peak_bytes} bytes exceeds the "
                           f"budget {budget}; please report this with the model")
    eager = eager_peak(graph, costs) if eager is None else eager
    eager_time = costs.plain_time if eager_time is None else eager_time
    shape = graph.input_shape
    info = RunInfo.of(info)
    meta = SolutionMeta(model=info.model, batch_size=info.batch_size if info.batch_size is not None else
                        (shape[0] if shape else 0),
                        input_shape=info.input_shape if info.input_shape is not None else shape[1:],
                        dtype=info.dtype if info.dtype is not None else graph.input_dtype,
                        budget_bytes=budget, mode=mode, device=info.device,
                        cost_source="+".join(costs.source), predicted_peak_bytes=sim.peak_bytes, eager_peak_bytes=eager,
                        objective_s=objective_s, bound_s=bound_s, gap=gap, solve_time_s=solve_time_s,
                        status=status, solver=solver, torch_version=torch.__version__,
                        monet_version=monet.__version__, fingerprint=graph.fingerprint,
                        graph_summary=graph.summary, n_fwd=len(graph.fwd), n_bwd=len(graph.bwd),
                        eager_time_s=eager_time, inputs_spec=info.inputs_spec,
                        offload_bandwidth=offload_bandwidth if offload else None, loss=info.loss,
                        compiled=graph.compiled)
    return Solution(schedule=schedule, S=np.asarray(S, dtype=bool), R=np.asarray(R, dtype=bool), meta=meta)


def keep_all_matrices(graph: OpGraph) -> tuple[np.ndarray, np.ndarray]:
    """S = every useful forward node kept in every stage, R = nothing recomputed: plain PyTorch."""
    T, N = len(graph.bwd), len(graph.fwd)
    return np.ones((T, N), dtype=bool), np.zeros((T, N), dtype=bool)


def eager_simulation(graph: OpGraph, costs: CostArrays):
    """The simulation (`monet.simulate.SimResult`: peak and saved bytes) of plain PyTorch: the
    keep-everything schedule, out of place (the joint graph's ops as traced, `Schedule.inplace`
    False: the reference a budget's percentage and the ILP's rows are of; the executor keeping
    everything in place peaks at or under it).  Kept on the graph per workspace (the costs'
    ``fwd_workspace`` and ``bwd_workspace``): a 96-layer GPT-2 took 8 s to simulate, and one solve
    asked for it three times."""
    key = _workspace_key(costs)
    known = graph.__dict__.setdefault("_eager_simulations", {})
    if key not in known:
        S, R = keep_all_matrices(graph)
        known.clear()  # one entry: the costs of one graph seldom change
        t0 = time.perf_counter()
        schedule = schedule_from_matrices(graph, S, R)
        schedule.inplace = False
        known[key] = schedule_peak(graph, costs, schedule)
        graph.__dict__["_simulation_s"] = time.perf_counter() - t0
    return known[key]


def eager_peak(graph: OpGraph, costs: CostArrays) -> int:
    """Simulated peak (bytes) of plain PyTorch (`eager_simulation`)."""
    return eager_simulation(graph, costs).peak_bytes


def simulation_seconds(graph: OpGraph) -> float:
    """Seconds one simulation of a schedule on ``graph`` took (`eager_simulation`'s, the first one made;
    0.0 before it): what a solver keeps in hand to simulate the schedule it found (a 96-layer
    GPT-2: 4-6 s on 2 cores)."""
    return float(graph.__dict__.get("_simulation_s", 0.0))


def _workspace_key(costs) -> tuple | None:
    return (np.asarray(costs.fwd_workspace).tobytes(), np.asarray(costs.bwd_workspace).tobytes()) \
        if costs is not None else None


def simulated_schedule(graph: OpGraph, costs, S, R, offload: tuple = ()):
    """``(schedule, SimResult)``: the `monet.solution.Schedule` of (S (T, N), R (T, N)) on ``graph``
    (its implementations, ``offload`` entries; in place, `Schedule.inplace`) and its `monet.simulate.schedule_peak`.
    The last one simulated on ``graph`` is kept: a solver checks its schedule's peak, and
    `finish_solution` then asks for the same one (a 96-layer GPT-2: 5 s each)."""
    schedule = schedule_from_matrices(graph, S, R, offload)
    schedule.impl = dict(graph.impls)
    digest = hashlib.blake2b(np.asarray(S, dtype=bool).tobytes(), digest_size=16)
    digest.update(np.asarray(R, dtype=bool).tobytes())
    key = (digest.hexdigest(), np.asarray(S).shape, repr(offload), repr(sorted(schedule.impl.items())),
           _workspace_key(costs))
    last = graph.__dict__.get("_last_simulated")
    if last is not None and last[0] == key:
        return schedule, last[1]
    sim = schedule_peak(graph, costs, schedule)
    graph.__dict__["_last_simulated"] = (key, sim)
    return schedule, sim


def memory_model(graph: OpGraph, costs: CostArrays, offload_bandwidth: float | None = None) -> MemoryModel:
    """The `MemoryModel` of ``graph`` with its costs' workspace, and with offload to host memory
    at ``offload_bandwidth`` bytes/s (`solver.offload`; None or 0: none)."""
    mem = build_memory_model(graph, costs.fwd_workspace, costs.bwd_workspace)
    if offload_bandwidth:
        mem.offload = build_offload_model(graph, mem, costs.fwd_time, costs.bwd_time, offload_bandwidth)
    return mem


def simulated_peak_fn(graph: OpGraph, costs, mem):
    """The solver's view of `monet.simulate.schedule_peak`: ``peak_of(S (T, G), R (T, N), M (O,) = None, O (G,) =
    None) -> bytes``, the peak of the schedule the executor would run for the ILP's matrices.

    Args:
        graph, costs: the captured `OpGraph` and its `CostArrays` (PyTorch's implementations).
        mem: the `monet.solver.memory_model.MemoryModel` whose groups S's columns are.

    ``peak_of`` builds the schedule with the implementations M chooses (None: PyTorch's), with the
    groups O offloaded to host memory (None: `MemoryModel.offloaded`, the allowed groups the
    schedule keeps through their windows), and returns its `schedule_peak`.
    """
    def peak_of(S_groups, R, M=None, O=None):
        g, c = graph, costs
        if M is not None and mem.n_options:
            g, c = chosen_graph(graph, costs, mem.options, chosen_impls(mem.options, M))
        O = mem.offloaded(S_groups, R, O)
        entries = () if O is None else mem.offload.entries(O)
        return simulated_schedule(g, c, mem.group_to_node(S_groups), R, entries)[1].peak_bytes
    return peak_of
