"""The solve pipeline: graph + costs + budget -> `Solution` (schedule, matrices, metadata).

Every solver here has one signature, ``solve_x(graph, costs, budget, ...) -> Solution`` (DESIGN.md,
"Shape of the code"), so the ILP and the baselines are compared on the same inputs:

* `solve_none`: keep everything, recompute nothing (plain PyTorch);
* `solve_normal`: MONeT's ILP, recompute-or-store (`monet.solver.ilp`);
* `solve_full`: the ILP choosing operator implementations too (MONeT's other modes).

``offload_bandwidth`` (bytes/s) makes offload to host memory a third choice of the normal-mode ILP
(`monet.solver.offload`; off by default and on CPU).
"""
from __future__ import annotations

import re
import time

import numpy as np
import torch

import monet
from monet.graph import OpGraph
from monet.profiling.costs import CostArrays
from monet.schedule import schedule_from_matrices
from monet.simulate import schedule_peak, simulated_peak_fn
from monet.solution import Solution, SolutionMeta
from monet.impls import MODES, mode_tokens
from monet.solver.choices import chosen_graph, chosen_impls, implementation_options
from monet.solver.ilp import (LARGE, InfeasibleBudgetError, min_budget_relaxation, problem_size,
                              relaxation_in_background, relaxation_result, solve_ilp, solve_min_budget)
from monet.solver.memory_model import MemoryModel, build_memory_model
from monet.solver.offload import build_offload_model

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
            objective_s: float, bound_s, gap, solve_time_s: float, info: dict, inplace: bool = False,
            eager: int | None = None, eager_time: float | None = None, offload: tuple = (),
            offload_bandwidth: float | None = None) -> Solution:
    """The `Solution` of (S, R) on ``graph`` (with its implementations, ``graph.impls``), simulated.
    ``eager`` (bytes) and ``eager_time`` (seconds) are plain PyTorch's peak and iteration time, the
    references of the reported saving and overhead; by default those of ``graph`` itself, which is
    wrong when ``graph`` carries implementations other than PyTorch's.  ``offload``: the
    `Schedule.offload` entries, planned at ``offload_bandwidth`` bytes/s."""
    schedule = schedule_from_matrices(graph, S, R, offload)
    schedule.impl, schedule.inplace = dict(graph.impls), inplace
    sim = schedule_peak(graph, costs, schedule)
    if mode != "none" and sim.peak_bytes > budget:  # cannot happen: the ILP's memory bounds the simulator's
        raise RuntimeError(f"internal error: the schedule's simulated peak {sim.peak_bytes} bytes exceeds the "
                           f"budget {budget}; please report this with the model")
    eager = eager_peak(graph, costs) if eager is None else eager
    eager_time = costs.total_time if eager_time is None else eager_time
    shape = graph.input_shape
    meta = SolutionMeta(model=info.get("model", ""), batch_size=info.get("batch_size", shape[0] if shape else 0),
                        input_shape=info.get("input_shape", shape[1:]), dtype=info.get("dtype", graph.input_dtype),
                        budget_bytes=budget, mode=mode, device=info.get("device", "cpu"),
                        cost_source="+".join(costs.source), predicted_peak_bytes=sim.peak_bytes, eager_peak_bytes=eager,
                        objective_s=objective_s, bound_s=bound_s, gap=gap, solve_time_s=solve_time_s,
                        status=status, solver=solver, torch_version=torch.__version__,
                        monet_version=monet.__version__, fingerprint=graph.fingerprint,
                        graph_summary=graph.summary, n_fwd=len(graph.fwd), n_bwd=len(graph.bwd),
                        eager_time_s=eager_time, inputs_spec=info.get("inputs_spec"),
                        offload_bandwidth=offload_bandwidth if offload else None)
    return Solution(schedule=schedule, S=np.asarray(S, dtype=bool), R=np.asarray(R, dtype=bool), meta=meta)


def keep_all_matrices(graph: OpGraph) -> tuple[np.ndarray, np.ndarray]:
    """S = every useful forward node kept in every stage, R = nothing recomputed: plain PyTorch."""
    T, N = len(graph.bwd), len(graph.fwd)
    return np.ones((T, N), dtype=bool), np.zeros((T, N), dtype=bool)


def same_kernels_solution(graph: OpGraph, costs: CostArrays, sol: Solution, device: str = "cpu",
                          cost_fn=None) -> Solution:
    """A keep-everything solution (no recomputation) with ``sol``'s operator implementations: the
    reference that tells the schedule's effect on gradients (none: bitwise on CPU) from the
    implementations' (other arithmetic, e.g. PyTorch's native convolution instead of oneDNN's).

    ``graph``/``costs`` are the captured graph and its costs that ``sol`` was solved from (with
    ``device`` and ``cost_fn`` as for `solve`); its meta is ``sol``'s, with mode "none".
    """
    import dataclasses

    impls = dict(sol.schedule.impl)
    if impls:
        options, _ = full_model(graph, costs, sol.meta.mode, device, cost_fn)
        graph, costs = chosen_graph(graph, costs, options, impls)
    S, R = keep_all_matrices(graph)
    schedule = schedule_from_matrices(graph, S, R)
    schedule.impl, schedule.inplace = dict(graph.impls), False
    meta = dataclasses.replace(sol.meta, mode="none", status="optimal", objective_s=sol.meta.eager_time_s or 0.0)
    return Solution(schedule=schedule, S=S, R=R, meta=meta)


def eager_peak(graph: OpGraph, costs: CostArrays) -> int:
    """Simulated peak (bytes) of plain PyTorch: the keep-everything schedule."""
    S, R = keep_all_matrices(graph)
    return schedule_peak(graph, costs, schedule_from_matrices(graph, S, R)).peak_bytes


def memory_model(graph: OpGraph, costs: CostArrays, offload_bandwidth: float | None = None) -> MemoryModel:
    """The `MemoryModel` of ``graph`` with its costs' workspace, and with offload to host memory
    at ``offload_bandwidth`` bytes/s (`solver.offload`; None or 0: none)."""
    mem = build_memory_model(graph, costs.fwd_workspace, costs.bwd_workspace)
    if offload_bandwidth:
        mem.offload = build_offload_model(graph, mem, costs.fwd_time, costs.bwd_time, offload_bandwidth)
    return mem


def solve_none(graph: OpGraph, costs: CostArrays, budget: int, info: dict | None = None, **_) -> Solution:
    """Keep everything (mode ``none``).  Raises InfeasibleBudgetError if even that does not fit."""
    S, R = keep_all_matrices(graph)
    const = costs.total_time
    sol = _finish(graph, costs, S, R, budget=budget, mode="none", status="optimal", solver="none",
                  objective_s=const, bound_s=const, gap=0.0, solve_time_s=0.0, info=info or {})
    if sol.meta.predicted_peak_bytes > budget:
        raise InfeasibleBudgetError(budget, sol.meta.predicted_peak_bytes, "none")
    return sol


def solve_normal(graph: OpGraph, costs: CostArrays, budget: int, info: dict | None = None, *,
                 solver: str = "CBC", time_limit: float = 60.0, verbose: bool = False, mode: str = "normal",
                 inplace: bool = False, eager: int | None = None, eager_time: float | None = None,
                 gap: float = 0.0, progress=None, relaxation: bool = True, smallest: bool = True,
                 offload_bandwidth: float | None = None) -> Solution:
    """MONeT's ILP in recompute-or-store mode; see `monet.solver.ilp.solve_ilp` (same errors and
    ``relaxation``); with ``offload_bandwidth`` (bytes/s) offload to host memory is a third choice
    (`solver.offload`).

    ``graph`` may carry implementations already (``graph.impls``, fixed by `solve_full`); ``mode``
    is the label stored in the solution, ``inplace`` turns on in-place ReLU/add in the executor.
    """
    mem = memory_model(graph, costs, offload_bandwidth)
    const = costs.total_time
    t0 = time.perf_counter()
    kw = dict(mode="normal", solver=solver, constant_s=const, verbose=verbose,
              peak_of=simulated_peak_fn(graph, costs, mem, inplace), gap=gap, progress=progress,
              relaxation=relaxation)
    if mem.offload is not None and problem_size(graph, mem, costs.fwd_recompute, "normal")[0] > LARGE:
        res = _solve_offload_policies(graph, mem, costs, budget, time_limit, smallest, kw)
    else:
        res = solve_ilp(graph, mem, costs.fwd_recompute, budget, time_limit=time_limit, smallest=smallest, **kw)
    entries = () if res.O is None else mem.offload.entries(res.O)
    return _finish(graph, costs, res.S, res.R, budget=budget, mode=mode, status=res.status, solver=res.solver,
                   objective_s=res.objective_s, bound_s=res.bound_s, gap=res.gap,
                   solve_time_s=time.perf_counter() - t0, info=info or {}, inplace=inplace, eager=eager,
                   eager_time=eager_time, offload=entries, offload_bandwidth=offload_bandwidth)


def _solve_offload_policies(graph: OpGraph, mem: MemoryModel, costs: CostArrays, budget: int, time_limit: float,
                            smallest: bool, kw: dict):
    """Above `LARGE` variables no MIP solver runs and the local search (`solver.repair.improve`),
    which sees memory but not transfer time, finds the schedule: it is run with two offload
    policies (`solver.offload`), on half of the time each, and the faster schedule (transfer time
    included) is returned: the copies that compute hides completely
    (`OffloadModel.hidden_policy`; two thirds of the time: at budgets where it fits, it competes
    with the recompute-only search, whose schedules it contains), then every candidate.

    Raises:
        InfeasibleBudgetError: nothing fits with every candidate offloadable.
    """
    full = mem.offload
    best = None
    policies, weights = [full.hidden_policy(), full.candidate], [2.0, 1.0]
    t_end = time.perf_counter() + time_limit
    try:
        for k, allowed in enumerate(policies):
            mem.offload = full.with_allowed(allowed)
            last = k == len(policies) - 1
            share = max(1.0, (t_end - time.perf_counter()) * weights[k] / sum(weights[k:]))
            try:
                res = solve_ilp(graph, mem, costs.fwd_recompute, budget, time_limit=share,
                                smallest=smallest and last and best is None, **kw)
            except InfeasibleBudgetError:
                if last and best is None:
                    raise
                continue
            if best is None or res.objective_s < best[0].objective_s:
                best = (res, mem.offload)
    finally:
        mem.offload = full if best is None else best[1]
    return best[0]


def analytic_cost_fn(spec=None):
    """A ``cost_fn`` for `solver.choices.implementation_options`: analytic costs of a variant graph."""
    from monet.profiling.costs import DeviceSpec, analytic_costs, costs_for

    def cost_fn(graph: OpGraph, _keys, _governed) -> CostArrays:
        return costs_for(graph, analytic_costs(graph, spec or DeviceSpec.cpu_default()))
    return cost_fn


def _option_seconds(o) -> float:
    """Forward and backward seconds of the nodes an implementation option governs."""
    return sum(float(o.bwd_time[t]) for t in o.governed) + (float(o.fwd_time[o.node]) if o.node >= 0 else 0.0)


def lean_impls(options, cheap: bool = False) -> dict[str, str]:
    """A memory-lean implementation per choice: a compact new value (mask, offsets) where there is
    one, else the option with the least workspace (ties: PyTorch's); never an implementation that
    stores more than PyTorch's kernel (``Impl.lean`` False: attention's math backend).

    With ``cheap``, only options at most 5 % slower than PyTorch's kernel on their nodes are
    candidates (by the costs of ``options``): the lean options can be slow, and the right ones
    depend on the device.  On CPU (ResNet-50, batch 8, 96x96) the 1-bit ReLU mask's backward took
    22x threshold_backward's time (5.3 ms vs 0.24 ms for 8x256x24x24) and the chunked convolution
    backward 6x; on a GPU the mask costs a few percent.
    """
    from monet.impls import IMPLS

    default = {o.key: _option_seconds(o) for o in options if o.impl == "default"}
    best: dict[str, tuple] = {}
    for o in options:
        if cheap and o.key in default and _option_seconds(o) > 1.05 * default[o.key] + 1e-9:
            continue
        if o.impl in IMPLS and not IMPLS[o.impl].lean:
            continue
        token = IMPLS[o.impl].token if o.impl in IMPLS else ""
        ws = sum(float(o.bwd_workspace[t]) for t in o.governed) + (float(o.fwd_workspace[o.node]) if o.node >= 0 else 0)
        rank = (0 if token == "newnode" else 1, ws, o.impl != "default")
        if o.key not in best or rank < best[o.key][0]:
            best[o.key] = (rank, o.impl)
    return {k: v for k, (_, v) in best.items() if v != "default"}


def full_model(graph: OpGraph, costs: CostArrays, mode: str, device: str = "cpu", cost_fn=None, progress=None):
    """(implementation options, `MemoryModel` with them) for a mode (`solver.choices`).

    Cached on the graph per (mode, device, costs, cost_fn): a solve and a smallest-budget search
    of the same graph build the variant graphs and measure their operators once.
    """
    cache = graph.__dict__.setdefault("_monet_full_models", {})
    key = (mode, device, id(costs), id(cost_fn))
    if key not in cache:
        options = implementation_options(graph, costs, mode, device, cost_fn or analytic_cost_fn(), progress)
        cache[key] = (costs, cost_fn, options,
                      build_memory_model(graph, costs.fwd_workspace, costs.bwd_workspace, options))
    return cache[key][2:]


def fixed_time(graph: OpGraph, costs: CostArrays, options) -> float:
    """Seconds of forward and backward time that no implementation option governs: the constant
    part of the joint ILP's objective."""
    governed = {t for o in options for t in o.governed}
    chosen_nodes = {o.node for o in options if o.node >= 0}
    return float(sum(costs.fwd_time[i] for i in range(len(graph.fwd)) if i not in chosen_nodes)
                 + sum(costs.bwd_time[t] for t in range(len(graph.bwd)) if t not in governed))


def no_recompute_bound(graph: OpGraph, costs: CostArrays, options) -> float:
    """A lower bound (seconds) on any full-mode schedule's iteration time: the forward and backward
    time with the fastest implementation of every choice and no recomputation.  Valid whatever
    the budget; at loose budgets the LP relaxation's bound equals it (ResNet-50 at batch 184, 70 %:
    0.6139 s both), and it stands in when the relaxation does not finish in time."""
    fastest: dict[str, float] = {}
    for o in options:
        fastest[o.key] = min(fastest.get(o.key, float("inf")), _option_seconds(o))
    return fixed_time(graph, costs, options) + sum(fastest.values())


def solve_full(graph: OpGraph, costs: CostArrays, budget: int, info: dict | None = None, *, mode: str,
               solver: str = "CBC", time_limit: float = 60.0, verbose: bool = False, device: str = "cpu",
               cost_fn=None, progress=None, gap: float = 0.0) -> Solution:
    """MONeT's ILP choosing operator implementations jointly with checkpoints (Sec. 4).

    ``mode`` names the implementation kinds allowed (`monet.impls.mode_tokens`).  The solves share
    ``time_limit`` (seconds, wall clock):

    1. the joint ILP on 40 % of the limit: its LP relaxation is the bound reported for every
       schedule (or `no_recompute_bound`, when higher or when the relaxation does not finish);
    2. the normal-mode ILP with PyTorch's implementations, and again with the cheap memory-lean
       implementations fixed (`lean_impls` with ``cheap=True``), each on half of what is left
       (up to a tenth of the limit when the joint ILP's schedule is proven within ``gap``).
       These ILPs are smaller, and CBC or the improved repaired schedules give schedules for them;
       the joint ILP on ResNet-50 (91,000 variables) finds none in a minute (see BENCHMARKS.md,
       "Solver at full scale"): its own improved start, with PyTorch's implementations, competes.
       Above `solver.ilp.LARGE` joint variables, step 1 is only the joint LP relaxation, run in
       a thread for the whole limit (`solver.ilp.relaxation_in_background`) while the solves of
       step 2 skip their own relaxation and search (`solver.ilp.solve_ilp`'s ``relaxation``).
    3. Only when none of these fits: the fully memory-lean implementations (or those the
       relaxation leans to) on half of what is left, then the smallest-budget search on the
       rest (the fixed solves do not search it themselves).  Below `solver.ilp.LARGE`, a budget
       under the LP relaxation's bound on the smallest budget (`solver.ilp.min_budget_relaxation`)
       goes to that search at once.

    The fastest schedule is returned (status "gap" when it is within ``gap`` of the joint ILP's
    bound, else "heuristic" for a fixed-implementation one).  When none fits, the smallest budget
    is searched and an `InfeasibleBudgetError` names it.  Up to a 10 s limit, the solve with
    PyTorch's implementations gets the whole limit, as a normal-mode solve would (full mode must
    not lose to it); a fallback solve gets at least half the limit (up to 5 s).  So the total can
    overrun ``time_limit`` by a few seconds (CBC is stopped 2 s after its share).

    Raises:
        InfeasibleBudgetError: no schedule fits; names the smallest feasible budget found, and
            the LP relaxation's bound on it.
    """
    inplace = "inplace" in mode_tokens(mode)
    options, mem = full_model(graph, costs, mode, device, cost_fn, progress)
    # the limit is the solver's: measuring the implementation options (the demo's CPU profile:
    # 20-30 s of its 30 s limit) left the searches a few seconds, and the demo a +440 % schedule
    t_end = time.perf_counter() + time_limit
    eager, eager_time = eager_peak(graph, costs), costs.total_time
    ref = dict(mode=mode, inplace=inplace, eager=eager, eager_time=eager_time, gap=gap, progress=progress)

    def left() -> float:
        # a fallback solve gets what is left of the limit, but at least half of it (up to 5 s):
        # a schedule worse than normal mode's would cost more than the overrun
        return max(1.0, t_end - time.perf_counter(), min(time_limit, 10.0) / 2)

    if not options:
        return solve_normal(graph, costs, budget, info, solver=solver, time_limit=left(), verbose=verbose, **ref)
    fixed = fixed_time(graph, costs, options)
    t0 = time.perf_counter()
    large = problem_size(graph, mem, costs.fwd_recompute, mode)[0] > LARGE
    if not large:
        # below the LP relaxation's bound on the smallest budget (0.2 s for VGG-16 at batch 176)
        # no schedule fits the ILP's memory: only the smallest-budget search's schedule can (the
        # simulator's peak is a little lower), so the searches below are skipped (VGG-16 at 50 %
        # of its plain peak was refused in 48 s, most of it spent on them)
        lower = min_budget_relaxation(graph, mem, mode, 0.1 * time_limit)[0]
        if lower is not None and budget < lower:
            first = _smallest_schedule(graph, costs, budget, info, mode, solver, left(), device, cost_fn, ref)
            first.meta.solve_time_s = time.perf_counter() - t0
            return first
    res = sol = background = None
    if large:
        # no MIP solver at this size (see LARGE): the joint ILP gives only its LP relaxation's
        # bound, computed in a thread over the whole limit while the fixed-implementation
        # searches below use the other core (its improved start would repeat the one with
        # PyTorch's implementations)
        background = relaxation_in_background(graph, mem, costs.fwd_recompute, budget, mode, time_limit - 5.0)
    else:
        res = solve_ilp(graph, mem, costs.fwd_recompute, budget, mode=mode, solver=solver,
                        time_limit=max(1.0, 0.4 * time_limit), constant_s=fixed, verbose=verbose,
                        peak_of=simulated_peak_fn(graph, costs, mem, inplace), gap=gap, progress=progress)
    if res is not None and res.status != "no_integer":
        g, c = chosen_graph(graph, costs, options, chosen_impls(options, res.M))
        sol = _finish(g, c, res.S, res.R, budget=budget, mode=mode, status=res.status, solver=res.solver,
                      objective_s=res.objective_s, bound_s=res.bound_s, gap=res.gap,
                      solve_time_s=time.perf_counter() - t0, info=info or {}, inplace=inplace, eager=eager,
                      eager_time=eager_time)
    # even a proven joint schedule runs against the fixed ones: a repaired schedule the simulator
    # fits beat the joint "optimum" by 2 % on a small GPT-2 (the ILP's memory is an upper bound)
    first = None
    sets = [{}, lean_impls(options, cheap=True)]
    sets = sets if sets[1] else sets[:1]
    weights = [1.0] * len(sets)
    # 1 s kept for building and simulating the chosen schedule after the searches (UNet at batch
    # 11, 40 %: 60.2 s of 60 without it)
    t_stop = t_end - 1.0
    if large:
        # the local search is what finds schedules at this size, and it stops at its deadline:
        # two thirds of the time to the set that is faster with nothing recomputed (ResNet-50 at
        # batch 184: the cheap lean implementations, 0.6139 s against PyTorch's 0.6245 s; with
        # equal shares PyTorch's schedule was the slower one at 70 / 50 / 33 %), and 3 s kept
        # for building and simulating the schedules after it (GPT-2 small: 1.5 s overran the
        # limit by 0.2 s, 2 s by 0.1 s)
        base = [sum(_option_seconds(o) for o in options if o.impl == impls.get(o.key, "default")) for impls in sets]
        weights = [2.0 if b == min(base) else 1.0 for b in base] if len(set(base)) > 1 else weights
        t_stop = t_end - 3.0
    for k, impls in enumerate(sets):
        share = max(1.0, (t_stop - time.perf_counter()) * weights[k] / sum(weights[k:]))
        if not impls and time_limit <= 10:
            share = time_limit
        if sol is not None and sol.meta.status in ("optimal", "gap"):
            # the joint schedule is proven within the gap in the ILP's memory: a fixed set can
            # beat it only with a repaired schedule the simulator fits (its start), not in CBC
            # (VGG-16 at 60 %: proven in 1 s, then 20 s in the solve with PyTorch's kernels)
            share = min(share, max(2.0, 0.1 * time_limit))
        cand = _solve_fixed(graph, costs, options, impls, budget, info, solver, share, verbose, ref,
                            relaxation=not large)
        if cand is not None and (first is None or cand.meta.objective_s < first.meta.objective_s):
            first = cand
    if first is None and sol is None:
        # nothing fits with those implementations: the leanest ones, or those the relaxation chose
        impls = lean_impls(options) if res is None or res.M is None else _round_options(options, res.M)
        first = _solve_fixed(graph, costs, options, impls, budget, info, solver,
                             max(1.0, (t_stop - time.perf_counter()) / 2), verbose, ref, relaxation=not large)
    if first is None and sol is None:
        # nothing fits: the smallest-budget search gets what is left, before any wait for the bound
        # (GPT-2 small at 50 %: after each fixed solve's own search and the relaxation's 55 s it
        # had 5 s, found 54.7 % where a minute finds 52.1 %, and the error came at 62.6 s)
        first = _smallest_schedule(graph, costs, budget, info, mode, solver, left(), device, cost_fn, ref)
    # the best bound known: the relaxation's, or the no-recomputation time if that is higher (the
    # relaxation of GoogLeNet at batch 320, 123,000 columns, did not finish in its 24 s)
    floor = no_recompute_bound(graph, costs, options)
    if background is not None:
        lp = relaxation_result(background, t_end - 0.5, grace=0.0)[0]  # no wait past the limit
        if progress is not None:
            progress("  joint LP relaxation: " + ("no answer in time" if lp is None else f"bound {lp + fixed:.6g} s")
                     + f" ({time.perf_counter() - t0:.1f} s)")
        lp_bound = None if lp is None else lp + fixed
    else:
        lp_bound = res.bound_s
    bound = floor if lp_bound is None else max(lp_bound, floor)
    if sol is not None:
        sol.meta.solve_time_s = time.perf_counter() - t0
        if sol.meta.bound_s is None or sol.meta.bound_s < floor:
            sol.meta.bound_s = min(floor, sol.meta.objective_s)
            sol.meta.gap = max(0.0, 1 - sol.meta.bound_s / sol.meta.objective_s)
        return _better(sol, first, bound, gap)
    first.meta.solve_time_s = time.perf_counter() - t0
    return _better(None, first, bound, gap)


def _smallest_schedule(graph: OpGraph, costs: CostArrays, budget: int, info, mode: str, solver: str,
                       time_limit: float, device: str, cost_fn, ref: dict) -> Solution:
    """The smallest-budget search's schedule (`_smallest`) when it fits ``budget`` bytes (status
    "heuristic", solver "<name>+min-budget").

    Raises:
        InfeasibleBudgetError: it does not fit; names the smallest budget found and the LP's bound.
    """
    least, proven, g, c, S, R, lower = _smallest(graph, costs, mode, solver, time_limit, device, cost_fn)
    if least > budget:
        raise InfeasibleBudgetError(budget, least, mode, exact=proven, lower_bytes=lower) from None
    return _finish(g, c, S, R, budget=budget, mode=mode, status="heuristic", solver=solver.upper() + "+min-budget",
                   objective_s=float(c.total_time + c.fwd_recompute @ R.sum(axis=0)), bound_s=None, gap=None,
                   solve_time_s=0.0, info=info or {}, inplace=ref["inplace"], eager=ref["eager"],
                   eager_time=ref["eager_time"])


def _solve_fixed(graph, costs, options, impls: dict[str, str], budget: int, info, solver: str,
                 time_limit: float, verbose: bool, ref: dict, relaxation: bool = True) -> Solution | None:
    """The normal-mode solution on ``graph`` with the implementations ``impls`` fixed (solver
    "<name>+fixed-impls"), or None when that ILP finds the budget infeasible."""
    g, c = chosen_graph(graph, costs, options, impls)
    try:
        sol = solve_normal(g, c, budget, info, solver=solver, time_limit=time_limit, verbose=verbose,
                           relaxation=relaxation, smallest=False, **ref)
    except InfeasibleBudgetError:
        return None
    if impls:
        sol.meta.solver += "+fixed-impls"
    return sol


def _better(sol: Solution | None, other: Solution | None, bound_s, gap: float) -> Solution:
    """The faster (objectives in seconds) of the joint ILP's solution ``sol`` and a schedule of a
    restricted problem ``other`` (fixed implementations), measured against the joint ILP's bound:
    ``other`` is "gap" when within ``gap`` of it, else "heuristic" (its own ILP's optimality says
    nothing about the joint problem)."""
    if other is None or (sol is not None and sol.meta.objective_s <= other.meta.objective_s):
        return sol
    if sol is not None:  # its solve time counts from the start of solve_full, both solves included
        other.meta.solve_time_s = sol.meta.solve_time_s
    if bound_s is not None and other.meta.objective_s < bound_s * (1 - 1e-9):
        # a repaired schedule the simulator fits but the joint ILP's memory (an upper bound, within
        # 1 % of the simulator) does not: the ILP's bound is no bound for it
        bound_s = None
    other.meta.bound_s = bound_s
    other.meta.gap = None if bound_s is None else max(0.0, 1 - bound_s / other.meta.objective_s)
    other.meta.status = "gap" if other.meta.gap is not None and other.meta.gap <= gap else "heuristic"
    return other


def _round_options(options, M_frac) -> dict[str, str]:
    """The option with the largest relaxed value in each choice."""
    best: dict[str, tuple[float, str]] = {}
    for o, v in zip(options, M_frac):
        if o.key not in best or v > best[o.key][0]:
            best[o.key] = (float(v), o.impl)
    return {k: name for k, (_, name) in best.items() if name != "default"}


def _smallest(graph: OpGraph, costs: CostArrays, mode: str, solver: str, time_limit: float, device: str,
              cost_fn=None, progress=None, offload_bandwidth: float | None = None):
    """(bytes, proven, graph with the chosen implementations, its costs, S (T, N), R (T, N), the
    LP relaxation's lower bound in bytes or None) of the smallest-budget schedule found for ``mode``: the joint ILP's, or the normal-mode one on the
    memory-lean implementations (`lean_impls`) if that is smaller.  ``time_limit`` (wall clock)
    covers both: two thirds for the joint ILP, the rest for the lean one.

    Cached on the graph per (mode, solver, device, costs, cost_fn): ``monet solve --min-budget``
    searches, then solves at the budget found, and a full-mode solve that finds nothing at that
    budget falls back to this very schedule instead of a second, time-limited search that may
    stop at a larger budget."""
    cache = graph.__dict__.setdefault("_monet_smallest", {})
    key = (mode, solver.upper(), device, id(costs), id(cost_fn), offload_bandwidth or None)
    if key not in cache:
        cache[key] = (costs, cost_fn, _search_smallest(graph, costs, mode, solver, time_limit, device, cost_fn,
                                                       progress, offload_bandwidth))
    return cache[key][2]


def _search_smallest(graph: OpGraph, costs: CostArrays, mode: str, solver: str, time_limit: float, device: str,
                     cost_fn=None, progress=None, offload_bandwidth: float | None = None):
    """`_smallest` without its cache."""
    # planned on 95 % of the limit: the steps overrun their shares by seconds they cannot stop
    # (cvxpy's canonicalisation of each LP, the last candidate's simulation); GPT-2 small's search
    # ended at 59.6-60.1 s of 60 without this margin
    time_limit *= 0.95
    t_end = time.perf_counter() + time_limit
    tokens = mode_tokens(mode)
    inplace = "inplace" in tokens
    options, mem = full_model(graph, costs, mode, device, cost_fn) if tokens - {"inplace"} else ([], None)
    if not options:
        mem = memory_model(graph, costs, offload_bandwidth)
    first = time_limit * (2 / 3 if options or mem.offload is not None else 1.0)
    peak_of = simulated_peak_fn(graph, costs, mem, inplace)
    least, proven, S, R, M, lower = solve_min_budget(graph, mem, mode, solver, first, peak_of=peak_of,
                                                     progress=progress)
    g, c = (chosen_graph(graph, costs, options, chosen_impls(options, M)) if M is not None else (graph, costs))
    best = (least, proven, g, c, mem.group_to_node(S), R, lower)
    if mem.offload is not None:
        # the recompute-only search's schedule, with the offloads it allows: above LARGE variables
        # both searches are heuristics, and the LP relaxation with offload rounds to other
        # candidates (ResNet-50 at batch 184, 400 GB/s: 19.4 % of the plain peak alone, where the
        # recompute-only search found 18.5 % without any offload)
        base = memory_model(graph, costs)
        _, _, S0, R0, _, _ = solve_min_budget(graph, base, mode, solver, max(1.0, t_end - time.perf_counter()),
                                              peak_of=simulated_peak_fn(graph, costs, base, inplace))
        least0 = int(np.ceil(peak_of(S0, R0)))
        if least0 < least:
            best = (least0, lower is not None and least0 <= lower, graph, costs, mem.group_to_node(S0), R0, lower)
    if options:
        g, c = chosen_graph(graph, costs, options, lean_impls(options))
        m = memory_model(g, c)
        lean, _, S, R, _, _ = solve_min_budget(g, m, "normal", solver, max(1.0, t_end - time.perf_counter()),
                                               peak_of=simulated_peak_fn(g, c, m, inplace), progress=progress)
        if lean < least:
            # the joint model's bound bounds every implementation set, this one's included
            best = (lean, lower is not None and lean <= lower, g, c, m.group_to_node(S), R, lower)
    return best


def min_budget(graph: OpGraph, costs: CostArrays, mode: str = "normal", solver: str = "CBC",
               time_limit: float = 60.0, device: str = "cpu", cost_fn=None, progress=None,
               offload_bandwidth: float | None = None) -> tuple[int, bool]:
    """Smallest feasible budget of a mode, in bytes, and whether the solver proved it minimal.

    For modes with implementation choices, the smaller of the joint ILP's answer and the
    normal-mode answer on the memory-lean implementations (`lean_impls`).  With
    ``offload_bandwidth`` (bytes/s; normal mode), every value that can be offloaded to host
    memory may be (`solver.offload`): the bandwidth sets the copy windows, not whether they pay.
    """
    _check_offload(mode, offload_bandwidth)
    if mode == "none":
        return eager_peak(graph, costs), True
    least, proven, *_ = _smallest(graph, costs, mode, solver, time_limit, device, cost_fn, progress,
                                  offload_bandwidth)
    return least, proven


def min_budget_lower(graph: OpGraph, costs: CostArrays, mode: str = "normal", solver: str = "CBC",
                     time_limit: float = 60.0, device: str = "cpu", cost_fn=None, progress=None) -> int | None:
    """A lower bound (bytes) on `min_budget`'s answer in the ILP's memory model: the LP relaxation
    of the budget-minimising ILP (`solver.ilp.min_budget_relaxation`), None if it gave no answer
    in time.  The same search as `min_budget` (cached on the graph: calling both searches once)."""
    if mode == "none":
        return eager_peak(graph, costs)
    lower = _smallest(graph, costs, mode, solver, time_limit, device, cost_fn, progress)[-1]
    return None if lower is None else int(np.floor(lower))


def _check_offload(mode: str, offload_bandwidth) -> None:
    """Offload is planned in normal mode only (`solver.offload`).

    Raises:
        ValueError: a negative bandwidth, or offload with another mode."""
    if offload_bandwidth is not None and offload_bandwidth < 0:
        raise ValueError(f"offload_bandwidth must be bytes per second >= 0 (0 or None: no offload), "
                         f"got {offload_bandwidth!r}")
    if offload_bandwidth and mode not in ("normal", "none"):
        raise ValueError(f"offload to host memory is planned in mode 'normal' only, not {mode!r}: "
                         f"use mode='normal' or offload_bandwidth=None")


def solve(graph: OpGraph, costs: CostArrays, budget: int | None, mode: str = "normal", *,
          solver: str = "CBC", time_limit: float = 60.0, info: dict | None = None,
          verbose: bool = False, device: str = "cpu", cost_fn=None, progress=None, gap: float = 0.0,
          offload_bandwidth: float | None = None) -> Solution:
    """Solve at ``budget`` bytes, or at the smallest feasible budget when ``budget`` is None.

    Args:
        mode: "none", "normal" or MONeT's mode strings (`monet.impls.MODES`; "full" = all).
        device: the device type the implementations are for ("cpu" or "cuda").
        cost_fn: costs of variant graphs (`solver.choices.implementation_options`); default analytic.
        time_limit: seconds of wall clock for the solver(s) at the budget; a smallest-budget
            search (``budget`` None) has its own.
        gap: stop once the schedule is proven within this fraction of the best bound (0: optimal).
        progress: ``progress(str)``, lines on the solve as it goes (incumbent, bound).
        offload_bandwidth: bytes per second (each direction) of host<->device copies: a kept
            value may then be offloaded to host memory (`solver.offload`; normal mode only).
            None or 0 (the default, and the CPU setting): no offload.  See
            `monet.solver.offload.DEFAULT_BANDWIDTHS` and
            `monet.profiling.bandwidth.measure_host_bandwidth`.

    Raises:
        ValueError: unknown mode; offload with a mode other than normal.
        InfeasibleBudgetError: the budget is below the smallest feasible one (named in the message).
    """
    mode = MODES[-1] if mode == "full" else mode
    mode_tokens(mode)  # validates
    _check_offload(mode, offload_bandwidth)
    if budget is None:
        budget, _ = min_budget(graph, costs, mode, solver, time_limit, device, cost_fn,
                               offload_bandwidth=offload_bandwidth)
    if mode == "none":
        return solve_none(graph, costs, int(budget), info)
    if mode == "normal":
        if offload_bandwidth:  # the smallest-budget search's schedule does not carry its offloads
            return solve_normal(graph, costs, int(budget), info, solver=solver, time_limit=time_limit,
                                verbose=verbose, gap=gap, progress=progress, offload_bandwidth=offload_bandwidth)
        try:
            return solve_normal(graph, costs, int(budget), info, solver=solver, time_limit=time_limit,
                                verbose=verbose, gap=gap, progress=progress, smallest=False)
        except InfeasibleBudgetError:
            # the smallest-budget search's schedule if it fits, else its error: the search is cached
            # on the graph, so a retry at the budget the error names gets that schedule, even where a
            # second time-limited search would stop at a larger budget (as on loaded machines)
            return _smallest_schedule(graph, costs, int(budget), info, mode, solver, time_limit, device, cost_fn,
                                      dict(inplace=False, eager=None, eager_time=None))
    return solve_full(graph, costs, int(budget), info, mode=mode, solver=solver, time_limit=time_limit,
                      verbose=verbose, device=device, cost_fn=cost_fn, progress=progress, gap=gap)
