"""Implementation choices for the ILP: variant graphs, their costs, and the chosen graph.

For every implementation a mode allows (`monet.impls.impls_for`), `implementation_options`
builds the *variant graph* in which it is applied wherever it can be (`monet.impls.variant`),
costs it, and turns each node it applied to into a choice with one option per implementation
(``"default"`` first).  Implementations act locally (a node's outputs, costs and the reads of the
backward nodes it governs do not depend on the other nodes' implementations), so one variant
graph per implementation describes every combination (MONeT, Shah et al. ICLR 2021, Sec. 4).
`chosen_graph` applies one option per choice and combines the costs of the chosen options.

`full_model` caches the options and their memory model per graph (`rescaled_full_model` registers
them for costs whose recomputation was calibrated); `lean_impls`, `fastest_impls`, `fixed_time`,
`no_recompute_bound` and `round_options` are what the full-mode portfolio (`solver.portfolio`) and
the smallest-budget search (`solver.smallest`) read from the options.
"""
from __future__ import annotations

import dataclasses
from typing import Callable

import numpy as np

from monet.graph import OpGraph
from monet.impls import DEFAULT, apply_impls, impls_for, variant
from monet.profiling.costs import CostArrays
from monet.solver.memory_build import build_memory_model
from monet.solver.memory_model import Option

CostFn = Callable[[OpGraph, list[str], dict], CostArrays]


def implementation_options(graph: OpGraph, costs: CostArrays, mode: str, device: str,
                           cost_fn: CostFn, progress=None) -> list[Option]:
    """The options of every node with more than one implementation in ``mode`` on ``device``.

    Args:
        graph, costs: the captured graph and its costs (PyTorch's implementations).
        mode: a mode string (`monet.impls.mode_tokens`); "normal" gives no options.
        device: "cpu" or "cuda" (which implementations exist).
        cost_fn: ``cost_fn(variant_graph, keys, governed) -> CostArrays`` for a variant graph
            (``keys``: the nodes the implementation applied to; ``governed``: key -> backward
            node ids it rewrote), e.g. `monet.profiling.variant_costs.hybrid_cost_fn`.
        progress: optional ``progress(message)`` callback.

    Returns:
        `Option` list grouped by choice, the default option first in each choice.
    """
    per_key: dict[str, list[tuple[str, OpGraph, CostArrays, tuple[int, ...]]]] = {}
    for impl in impls_for(mode, device):
        vg, keys, governed = variant(graph, impl.name)
        if not keys:
            continue
        if progress:
            progress(f"{impl.name}: {len(keys)} nodes")
        vc = cost_fn(vg, keys, governed)
        for k in keys:
            per_key.setdefault(k, []).append((impl.name, vg, vc, governed[k]))
    options: list[Option] = []
    for c, key in enumerate(sorted(per_key, key=lambda k: (k[:3], int(k[4:])))):
        alts = per_key[key]
        kind, idx = key[:3], int(key[4:])
        gov = set().union(*(g for _, _, _, g in alts))
        if kind == "bwd":
            gov.add(idx)
        gov = tuple(sorted(gov))
        node = idx if kind == "fwd" else -1
        for name, g, cst in [(DEFAULT, graph, costs)] + [(n, g, cst) for n, g, cst, _ in alts]:
            options.append(Option(choice=c, key=key, impl=name, graph=g, node=node, governed=gov,
                                  fwd_workspace=np.asarray(cst.fwd_workspace, dtype=float),
                                  bwd_workspace=np.asarray(cst.bwd_workspace, dtype=float),
                                  fwd_time=cst.fwd_time, fwd_recompute=cst.fwd_recompute, bwd_time=cst.bwd_time))
    return options


def chosen_impls(options: list[Option], M) -> dict[str, str]:
    """``{"fwd:12": "relu.mask", ...}`` for a 0/1 option vector M (O,); defaults are left out."""
    return {o.key: o.impl for o, on in zip(options, np.asarray(M) > 0.5) if on and o.impl != DEFAULT}


def chosen_graph(graph: OpGraph, costs: CostArrays, options: list[Option], impls: dict[str, str]):
    """(graph with ``impls`` applied, its `CostArrays` combined from the chosen options)."""
    fwd_time, fwd_rec, fwd_ws = costs.fwd_time.copy(), costs.fwd_recompute.copy(), costs.fwd_workspace.copy()
    bwd_time, bwd_ws = costs.bwd_time.copy(), costs.bwd_workspace.copy()
    for o in options:
        if impls.get(o.key, DEFAULT) != o.impl or o.impl == DEFAULT:
            continue
        if o.node >= 0:
            i = o.node
            fwd_time[i], fwd_rec[i], fwd_ws[i] = o.fwd_time[i], o.fwd_recompute[i], o.fwd_workspace[i]
        for t in o.governed:
            bwd_time[t], bwd_ws[t] = o.bwd_time[t], o.bwd_workspace[t]
    out = CostArrays(fwd_time=fwd_time, fwd_recompute=fwd_rec, fwd_workspace=fwd_ws.astype(np.int64),
                     bwd_time=bwd_time, bwd_workspace=bwd_ws.astype(np.int64), source=costs.source)
    return apply_impls(graph, impls), out


def analytic_cost_fn(spec=None, workspace_device: str | None = None):
    """A ``cost_fn`` for `solver.choices.implementation_options`: analytic costs of a variant graph
    (the roofline model ``spec``, default the CPU's).  With ``workspace_device`` ("cpu", "cuda"),
    each operator is charged `monet.profiling.workspace`'s upper bound on its workspace there, as
    the ``analytic`` cost source does (`monet.profiling.sources`); without, no workspace."""
    from monet.profiling.costs import DeviceSpec, analytic_costs, costs_for
    from monet.profiling.workspace import with_workspace_bound

    def cost_fn(graph: OpGraph, _keys, _governed) -> CostArrays:
        table = analytic_costs(graph, spec or DeviceSpec.cpu_default())
        if workspace_device is not None:
            table = with_workspace_bound(table, graph, workspace_device)
        return costs_for(graph, table)
    return cost_fn


def option_seconds(o: Option) -> float:
    """Forward and backward seconds of the nodes an implementation option governs (its costs)."""
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

    default = {o.key: option_seconds(o) for o in options if o.impl == "default"}

    def rank(o):
        if cheap and o.key in default and option_seconds(o) > 1.05 * default[o.key] + 1e-9:
            return None
        if o.impl in IMPLS and not IMPLS[o.impl].lean:
            return None
        token = IMPLS[o.impl].token if o.impl in IMPLS else ""
        ws = sum(float(o.bwd_workspace[t]) for t in o.governed) + (float(o.fwd_workspace[o.node]) if o.node >= 0 else 0)
        return (0 if token == "newnode" else 1, ws, o.impl != "default")
    return {k: v for k, (_, v) in _best_per_choice(options, rank).items() if v != "default"}


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


def rescaled_full_model(graph: OpGraph, costs: CostArrays, scaled: CostArrays, ratio: float, mode: str,
                        device: str = "cpu", cost_fn=None) -> None:
    """Register in `full_model`'s cache, for ``scaled`` (``costs`` with ``fwd_recompute`` times
    ``ratio``, `monet.profiling.calibration.scaled_costs`), the implementation options already built
    for ``costs``, their recompute seconds times ``ratio`` too: a solve with ``scaled`` then reuses
    the measured variants instead of building and measuring them again.  Nothing is registered
    where ``costs`` has no cached entry for (``mode``, ``device``, ``cost_fn``)."""
    cache = graph.__dict__.setdefault("_monet_full_models", {})
    entry = cache.get((mode, device, id(costs), id(cost_fn)))
    if entry is None:
        return
    options = [dataclasses.replace(o, fwd_recompute=np.asarray(o.fwd_recompute, dtype=float) * ratio)
               for o in entry[2]]
    cache[(mode, device, id(scaled), id(cost_fn))] = (scaled, cost_fn, options,
                                                       dataclasses.replace(entry[3], options=options))


def fixed_time(graph: OpGraph, costs: CostArrays, options) -> float:
    """Seconds of forward and backward time that no implementation option governs: the constant
    part of the joint ILP's objective."""
    governed = {t for o in options for t in o.governed}
    chosen_nodes = {o.node for o in options if o.node >= 0}
    return float(sum(costs.fwd_time[i] for i in range(len(graph.fwd)) if i not in chosen_nodes)
                 + sum(costs.bwd_time[t] for t in range(len(graph.bwd)) if t not in governed))


def _best_per_choice(options, rank) -> dict[str, tuple]:
    """{choice key: (rank, implementation)} of the option of least ``rank(option)`` in each choice
    (ties: the first listed, PyTorch's first); an option ranked None is left out."""
    best: dict[str, tuple] = {}
    for o in options:
        r = rank(o)
        if r is not None and (o.key not in best or r < best[o.key][0]):
            best[o.key] = (r, o.impl)
    return best


def fastest_impls(options) -> dict[str, str]:
    """The fastest implementation of each choice with nothing recomputed (`option_seconds`), PyTorch's
    ("default") left out.  Its schedules can beat both PyTorch's and the lean sets' at a budget
    where what each option stores matters less than its time (design.md, "Full mode is a
    portfolio")."""
    return {k: impl for k, (_, impl) in _best_per_choice(options, option_seconds).items() if impl != DEFAULT}


def no_recompute_bound(graph: OpGraph, costs: CostArrays, options) -> float:
    """A lower bound (seconds) on any full-mode schedule's iteration time: the forward and backward
    time with the fastest implementation of every choice and no recomputation.  Valid whatever
    the budget; at loose budgets the LP relaxation's bound equals it (ResNet-50 at batch 184, 70 %:
    0.6139 s both), and it stands in when the relaxation does not finish in time."""
    return fixed_time(graph, costs, options) + sum(s for s, _ in _best_per_choice(options, option_seconds).values())


def round_options(options, M_frac) -> dict[str, str]:
    """The option with the largest relaxed value in each choice: {choice key: implementation name},
    PyTorch's ("default") left out; ``M_frac`` (O,) is the LP relaxation's M."""
    best: dict[str, tuple[float, str]] = {}
    for o, v in zip(options, M_frac):
        if o.key not in best or v > best[o.key][0]:
            best[o.key] = (float(v), o.impl)
    return {k: name for k, (_, name) in best.items() if name != "default"}


