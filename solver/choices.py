"""Implementation choices for the ILP: variant graphs, their costs, and the chosen graph.

For every implementation a mode allows (`monet.impls.impls_for`), `implementation_options`
builds the *variant graph* in which it is applied wherever it can be (`monet.impls.variant`),
costs it, and turns each node it applied to into a choice with one option per implementation
(``"default"`` first).  Implementations act locally (a node's outputs, costs and the reads of the
backward nodes it governs do not depend on the other nodes' implementations), so one variant
graph per implementation describes every combination (MONeT, Shah et al. ICLR 2021, Sec. 4).
`chosen_graph` applies one option per choice and combines the costs of the chosen options.
"""
from __future__ import annotations

from typing import Callable

import numpy as np

from monet.graph import OpGraph
from monet.impls import DEFAULT, apply_impls, impls_for, variant
from monet.profiling.costs import CostArrays
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
            node ids it rewrote), e.g. `monet.profiling.profiler.hybrid_cost_fn`.
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
