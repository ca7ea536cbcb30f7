"""The solve pipeline: graph + costs + budget -> `Solution` (schedule, matrices, metadata).

Every solver here has one signature, ``solve_x(graph, costs, budget, ...) -> Solution`` (DESIGN.md,
"Shape of the code"), so the ILP and the baselines are compared on the same inputs:

* `solve_none`: keep everything, recompute nothing (plain PyTorch);
* `solve_normal`: MONeT's ILP, recompute-or-store (`monet.solver.ilp`).
"""
from __future__ import annotations

import re
import time

import numpy as np
import torch

import monet
from monet.executor import build_modules
from monet.graph import OpGraph
from monet.profiling.costs import CostArrays
from monet.schedule import schedule_from_matrices
from monet.simulate import simulate
from monet.solution import Solution, SolutionMeta
from monet.solver.ilp import InfeasibleBudgetError, solve_ilp, solve_min_budget
from monet.solver.memory_model import MemoryModel, build_memory_model

MODES = ("none", "normal")
_UNITS = {"": 1, "B": 1, "KB": 2 ** 10, "KIB": 2 ** 10, "MB": 2 ** 20, "MIB": 2 ** 20,
          "GB": 2 ** 30, "GIB": 2 ** 30, "TB": 2 ** 40, "TIB": 2 ** 40}


def parse_budget(text: str | int, eager_peak_bytes: int | None = None) -> int:
    """A budget in bytes from "6GB", "6GiB", "6000MiB", "123456" or "50%".

    "GB" means 2^30 bytes, as in MONeT's tables.  "50%" is half of ``eager_peak_bytes`` (the
    simulated plain-PyTorch peak).

    Raises:
        ValueError: unparsable text, a non-positive budget, or a percentage without a peak.
    """
    if isinstance(text, (int, np.integer)):
        value = int(text)
    else:
        s = str(text).strip().upper().replace(" ", "")
        m = re.fullmatch(r"([0-9]*\.?[0-9]+)%", s)
        if m:
            if eager_peak_bytes is None:
                raise ValueError(f"budget {text!r} is relative: the plain-PyTorch peak is needed")
            value = int(float(m.group(1)) / 100.0 * eager_peak_bytes)
        else:
            m = re.fullmatch(r"([0-9]*\.?[0-9]+)([A-Z]*)", s)
            if not m or m.group(2) not in _UNITS:
                raise ValueError(f"cannot read budget {text!r}: use bytes, 6GB (= 6 x 2^30 bytes), "
                                 "6GiB, 6000MiB or a percentage like 50%")
            value = int(float(m.group(1)) * _UNITS[m.group(2)])
    if value <= 0:
        raise ValueError(f"budget must be positive, got {text!r}")
    return value


def _finish(graph: OpGraph, costs: CostArrays, S, R, *, budget: int, mode: str, status: str, solver: str,
            objective_s: float, bound_s, gap, solve_time_s: float, info: dict) -> Solution:
    schedule = schedule_from_matrices(graph, S, R)
    fw, bw = build_modules(graph, schedule)
    sim = simulate(graph, fw, bw, costs.fwd_workspace, costs.bwd_workspace)
    if mode != "none" and sim.peak_bytes > budget:  # cannot happen: the ILP's memory bounds the simulator's
        raise RuntimeError(f"internal error: the schedule's simulated peak {sim.peak_bytes} bytes exceeds the "
                           f"budget {budget}; please report this with the model")
    eager = eager_peak(graph, costs)
    eager_time = float(costs.fwd_time.sum() + costs.bwd_time.sum())
    shape = graph.input_shape
    meta = SolutionMeta(model=info.get("model", ""), batch_size=info.get("batch_size", shape[0] if shape else 0),
                        input_shape=info.get("input_shape", shape[1:]), dtype=info.get("dtype", graph.input_dtype),
                        budget_bytes=budget, mode=mode, device=info.get("device", "cpu"),
                        cost_source="+".join(costs.source), predicted_peak_bytes=sim.peak_bytes, eager_peak_bytes=eager,
                        objective_s=objective_s, bound_s=bound_s, gap=gap, solve_time_s=solve_time_s,
                        status=status, solver=solver, torch_version=torch.__version__,
                        monet_version=monet.__version__, fingerprint=graph.fingerprint,
                        graph_summary=graph.summary, n_fwd=len(graph.fwd), n_bwd=len(graph.bwd),
                        eager_time_s=eager_time)
    return Solution(schedule=schedule, S=np.asarray(S, dtype=bool), R=np.asarray(R, dtype=bool), meta=meta)


def keep_all_matrices(graph: OpGraph) -> tuple[np.ndarray, np.ndarray]:
    """S = every useful forward node kept in every stage, R = nothing recomputed: plain PyTorch."""
    T, N = len(graph.bwd), len(graph.fwd)
    return np.ones((T, N), dtype=bool), np.zeros((T, N), dtype=bool)


def eager_peak(graph: OpGraph, costs: CostArrays) -> int:
    """Simulated peak (bytes) of plain PyTorch: the keep-everything schedule."""
    S, R = keep_all_matrices(graph)
    fw, bw = build_modules(graph, schedule_from_matrices(graph, S, R))
    return simulate(graph, fw, bw, costs.fwd_workspace, costs.bwd_workspace).peak_bytes


def memory_model(graph: OpGraph, costs: CostArrays) -> MemoryModel:
    return build_memory_model(graph, costs.fwd_workspace, costs.bwd_workspace)


def simulated_peak_fn(graph: OpGraph, costs: CostArrays, mem: MemoryModel):
    """``peak_of(S (T, G), R (T, N)) -> bytes``: the simulator's peak of the schedule the executor would run."""
    def peak_of(S_groups, R):
        schedule = schedule_from_matrices(graph, mem.group_to_node(S_groups), R)
        fw, bw = build_modules(graph, schedule)
        return simulate(graph, fw, bw, costs.fwd_workspace, costs.bwd_workspace).peak_bytes
    return peak_of


def solve_none(graph: OpGraph, costs: CostArrays, budget: int, info: dict | None = None, **_) -> Solution:
    """Keep everything (mode ``none``).  Raises InfeasibleBudgetError if even that does not fit."""
    S, R = keep_all_matrices(graph)
    const = float(costs.fwd_time.sum() + costs.bwd_time.sum())
    sol = _finish(graph, costs, S, R, budget=budget, mode="none", status="optimal", solver="none",
                  objective_s=const, bound_s=const, gap=0.0, solve_time_s=0.0, info=info or {})
    if sol.meta.predicted_peak_bytes > budget:
        raise InfeasibleBudgetError(budget, sol.meta.predicted_peak_bytes, "none")
    return sol


def solve_normal(graph: OpGraph, costs: CostArrays, budget: int, info: dict | None = None, *,
                 solver: str = "CBC", time_limit: float = 60.0, verbose: bool = False) -> Solution:
    """MONeT's ILP in recompute-or-store mode; see `monet.solver.ilp.solve_ilp` (same errors)."""
    mem = memory_model(graph, costs)
    const = float(costs.fwd_time.sum() + costs.bwd_time.sum())
    t0 = time.perf_counter()
    res = solve_ilp(graph, mem, costs.fwd_recompute, budget, mode="normal", solver=solver,
                    time_limit=time_limit, constant_s=const, verbose=verbose,
                    peak_of=simulated_peak_fn(graph, costs, mem))
    return _finish(graph, costs, res.S, res.R, budget=budget, mode="normal", status=res.status, solver=res.solver,
                   objective_s=res.objective_s, bound_s=res.bound_s, gap=res.gap,
                   solve_time_s=time.perf_counter() - t0, info=info or {})


SOLVE = {"none": solve_none, "normal": solve_normal}


def min_budget(graph: OpGraph, costs: CostArrays, mode: str = "normal", solver: str = "CBC",
               time_limit: float = 60.0) -> tuple[int, bool]:
    """Smallest feasible budget of a mode, in bytes, and whether the solver proved it minimal."""
    if mode == "none":
        return eager_peak(graph, costs), True
    mem = memory_model(graph, costs)
    least, proven, _, _ = solve_min_budget(graph, mem, mode, solver, time_limit,
                                           peak_of=simulated_peak_fn(graph, costs, mem))
    return least, proven


def solve(graph: OpGraph, costs: CostArrays, budget: int | None, mode: str = "normal", *,
          solver: str = "CBC", time_limit: float = 60.0, info: dict | None = None,
          verbose: bool = False) -> Solution:
    """Solve at ``budget`` bytes, or at the smallest feasible budget when ``budget`` is None.

    Raises:
        ValueError: unknown mode.
        InfeasibleBudgetError: the budget is below the smallest feasible one (named in the message).
    """
    if mode not in SOLVE:
        raise ValueError(f"unknown mode {mode!r}; available: {', '.join(MODES)} "
                         "(operator implementations and in-place modes come in a later version)")
    if budget is None:
        budget, _ = min_budget(graph, costs, mode, solver, time_limit)
    return SOLVE[mode](graph, costs, int(budget), info, solver=solver, time_limit=time_limit, verbose=verbose)
