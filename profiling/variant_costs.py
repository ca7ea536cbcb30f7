"""Costs of an implementation's variant graph (`hybrid_cost_fn`): the nodes the implementation
changed measured on the device, the others taken from the base table, and the calibration of the
measured rows against the base graph's (`calibrated_rows`)."""
from __future__ import annotations

import pandas as pd
import torch
import torch.nn as nn

from monet.graph import OpGraph
from monet.profiling import profiler
from monet.profiling.costs import CostArrays, make_table


def hybrid_cost_fn(model: nn.Module, example_input: torch.Tensor, base_graph: OpGraph, base: pd.DataFrame,
                   device: str = "cpu", spec=None, measure: str = "hybrid", repeats: int | None = None,
                   warmup: int | None = None, between_s: float = 0.0, recompute_factor: float = 1.0,
                   in_context: bool = False, calibrate: bool = False, time_scale: float = 1.0):
    """Costs of variant graphs (``cost_fn`` of `monet.solver.choices.implementation_options`).

    Nodes an implementation changed are measured on ``device`` (`profile_costs` with ``only``);
    the other nodes keep ``base``'s row (the table of ``base_graph``, the captured graph with
    PyTorch's kernels).  ``measure``:

    * ``"hybrid"``: analytic times (``spec``) scaled by the measured ratio of the implementation's
      median time to PyTorch's kernel's on the same node, and measured workspace;
    * ``"measured"`` or ``"profile"``: measured times and workspace.

    ``between_s``: seconds added to each measured node's time (the time between operators that
    ``base``'s measured rows carry, `monet.profiling.dispatch`; 0 in ``"hybrid"`` mode, whose ratio
    scales ``base``'s time).

    ``time_scale``: the factor on those nodes' measured seconds (as ``base``'s measured rows carry
    it, `monet.profiling.dispatch.operator_scale`), before ``between_s`` is added.

    ``recompute_factor``: the factor on those nodes' recompute seconds (as ``base``'s measured rows
    carry it, `monet.profiling.dispatch.recompute_factor`).

    ``in_context``: time the changed nodes in the sequence of an iteration of the variant graph
    (`profile_costs`'s ``in_context``), as the base table's were.

    ``calibrate`` (CPU): also time a whole training iteration of the variant graph against one of
    ``base_graph`` (MONeT's executor keeping everything, `monet.profiling.dispatch.measure_variant`)
    and charge any time the variant measures beyond its nodes' predicted difference to the nodes
    it changed, evenly (`calibrated_rows`), never crediting them: per-node times missed what the
    whole iteration shows.  MobileNetV2 (batch 8, 96x96, full mode at 95 % of the plain peak) chose
    PyTorch's native convolutions and a chunked convolution backward on 69 nodes, predicted
    -12 % and measured +22 % (normal mode: +5 % predicted).

    ``repeats`` / ``warmup``: timed and discarded runs per node (default 5 / 2 for ``"profile"``,
    3 / 1 otherwise, `monet.profiling.sources.QUICK`).  Warm medians matter on the CPU: a first
    run there was 1.3-3x the warm one, enough to make a slower implementation look free.

    Returns:
        ``cost_fn(variant_graph, keys, governed) -> CostArrays``.

    Raises:
        ValueError: an unknown ``measure``.
    """
    from monet.profiling.costs import DeviceSpec, analytic_costs, costs_for

    if measure not in ("hybrid", "measured", "profile"):
        raise ValueError(f"measure must be 'hybrid', 'measured' or 'profile', got {measure!r}")
    spec = spec or DeviceSpec.cpu_default()
    default = (5, 2) if measure == "profile" else (3, 1)
    repeats = default[0] if repeats is None else repeats
    warmup = default[1] if warmup is None else warmup
    base_graph_rows = base.set_index(["kind", "node"])
    measured_base: dict = {}
    measured_base_module: dict = {}  # calibrate: the executor keeping everything on base_graph

    def cost_fn(graph: OpGraph, keys, governed) -> "CostArrays":
        changed = {(k[:3], int(k[4:])) for k in keys} | {("bwd", t) for k in keys for t in governed.get(k, ())}
        table = analytic_costs(graph, spec)
        prof = profiler.profile_costs(model, example_input, graph, device, repeats, warmup, progress=False,
                             only=changed, in_context=in_context).set_index(["kind", "node"])
        todo = changed - set(measured_base)
        if measure == "hybrid" and todo:  # PyTorch's kernel on the same nodes, for the time ratio
            measured_base.update(profiler.profile_costs(model, example_input, base_graph, device, repeats, warmup,
                                               progress=False, only=todo).set_index(["kind", "node"])["time_s"].to_dict())
        rows = []
        for r in table.to_dict("records"):
            key = (r["kind"], r["node"])
            if key in changed:
                r["workspace_bytes"] = int(prof.loc[key, "workspace_bytes"])
                if measure != "hybrid":
                    r["time_s"] = time_scale * float(prof.loc[key, "time_s"]) + between_s
                    r["recompute_s"] = recompute_factor * r["time_s"]
                elif key in measured_base and measured_base[key] > 0:
                    ratio = float(prof.loc[key, "time_s"]) / measured_base[key]
                    r["time_s"] = r["recompute_s"] = float(base_graph_rows.loc[key, "time_s"]) * ratio
                r["source"] = f"{measure}:{device}"
            else:
                b = base_graph_rows.loc[key]
                r.update(time_s=float(b["time_s"]), recompute_s=float(b["recompute_s"]),
                         workspace_bytes=int(b["workspace_bytes"]), source=str(b["source"]))
            rows.append(r)
        if calibrate:
            from monet.profiling.dispatch import keep_all, measure_variant

            if "executor" not in measured_base_module:  # traced once, for every variant
                measured_base_module["executor"] = keep_all(model, example_input, base_graph, base)
            seconds = measure_variant(model, example_input, base_graph, base, graph, make_table(rows),
                                      base=measured_base_module["executor"])
            rows = calibrated_rows(rows, changed, base, *seconds, recompute_factor=recompute_factor)
        return costs_for(graph, make_table(rows))
    return cost_fn


def calibrated_rows(rows: list[dict], changed: set, base: pd.DataFrame, variant_s: float, base_s: float,
                    recompute_factor: float = 1.0) -> list[dict]:
    """``rows`` (a variant graph's cost-table rows) with the excess of a measured whole iteration
    over their prediction charged to the ``changed`` nodes ((kind, node) pairs), evenly.

    The predicted difference is ``sum(rows' time_s) - sum(base's time_s)`` (an iteration that keeps
    everything runs each node once); the measured one ``variant_s - base_s`` (seconds, the
    executor's iterations, `monet.profiling.dispatch.measure_variant`).  Where the measurement
    exceeds the prediction, each changed node gets ``excess / len(changed)`` more ``time_s`` (and
    ``recompute_factor`` times that more ``recompute_s`` for a forward node); where it does not,
    the rows are returned unchanged: a saving seen only in a noisy whole-iteration measurement is
    not credited, so that the ILP never prefers an implementation the measurement shows slower."""
    predicted = sum(float(r["time_s"]) for r in rows) - float(base["time_s"].sum())
    excess = (variant_s - base_s) - predicted
    targets = [r for r in rows if (r["kind"], r["node"]) in changed]
    if excess <= 0 or not targets:
        return rows
    share = excess / len(targets)
    out = []
    for r in rows:
        if (r["kind"], r["node"]) in changed:
            r = dict(r, time_s=float(r["time_s"]) + share, source=f"{r['source']}+calibrated")
            if r["kind"] == "fwd":
                r["recompute_s"] = float(r["recompute_s"]) + recompute_factor * share
        out.append(r)
    return out
