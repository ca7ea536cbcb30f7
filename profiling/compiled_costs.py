"""Costs of the compiled step: a node's seconds once Inductor compiles the schedule's modules.

Inductor calls a library for the nodes that count floating-point operations (matrix products,
convolutions, attention: `monet.profiling.costs.node_flops` > 0) and for the ops it has no
lowering for (its fallbacks, `monet.compat.inductor_fallback`), and generates fused kernels for
all the others (elementwise ops, reductions, normalisations).  A generated node that is
recomputed runs inside a kernel that reads its inputs anyway, the kernel of its reader: what it
adds is its arithmetic.  So (docs/design.md, "Note [Compiled costs]")::

    every node        time_s      = t_kernel                  the step computes it once
    library node      recompute_s = t_kernel                  the library kernel again
    generated node    recompute_s = elements * 2 / F          one multiply-add per output element
    random node       recompute_s = 0                         it reads its saved draws

``t_kernel`` is the node's seconds in the table the costs start from (the quick profile on the
CPU, the roofline on a GPU), ``F`` the roofline's arithmetic rate (`DeviceSpec.flops_per_s`).
Plain ``torch.compile``'s step, the reference of the predicted overhead, is then the
keep-everything schedule's sum of the kernels' seconds.  Workspace bytes are the table's, and a
convolution's gain the copies Inductor's layout optimization makes around its library call
(`layout_copy_bytes`) where the step runs channels-last (`monet.compiled.channels_last`).
"""
from __future__ import annotations

import pandas as pd

from monet import compat
from monet.compiled import CONVOLUTIONS, channels_last
from monet.graph import OpGraph, tensors_in
from monet.profiling.costs import DeviceSpec, make_table, node_flops

#: FLOP per output element that a fused recomputation of a generated node adds (a multiply-add)
FUSED_FLOP_PER_ELEMENT = 2


def is_library_node(fx_node) -> bool:
    """Whether Inductor runs this joint-graph node as a library kernel (see the module docstring)."""
    return node_flops(fx_node) > 0 or compat.inductor_fallback(fx_node.target)


def compiled_costs(graph: OpGraph, table: pd.DataFrame, spec: DeviceSpec) -> pd.DataFrame:
    """The cost table of ``graph``'s compiled step from ``table`` (one ``"default"`` row per node:
    the kernels' seconds and workspace bytes), by the equations of the module docstring.

    Args:
        table: the kernels' seconds (``time_s``) and the workspace bytes.
        spec: the device's roofline, whose ``flops_per_s`` prices a fused recomputation.

    Raises:
        ValueError: ``graph`` has no joint graph (loaded from a solution file).
    """
    if graph.joint is None:
        raise ValueError("compiled costs need the traced joint graph (graph.joint is None); capture the model again")
    by_name = {n.name: n for n in graph.joint.graph.nodes}
    nodes = {(n.kind, n.id): by_name[n.name] for n in list(graph.fwd) + list(graph.bwd)}
    random = {("fwd", n.id) for n in graph.fwd if n.random}
    layout = channels_last(graph)
    rows = []
    for row in table[table["impl"] == "default"].to_dict("records"):
        key = (row["kind"], int(row["node"]))
        fx_node = nodes[key]
        if key in random:
            row["recompute_s"] = 0.0
        elif is_library_node(fx_node):
            row["recompute_s"] = row["time_s"]
        else:
            elements = sum(t.numel() for t in tensors_in(fx_node.meta.get("val")))
            row["recompute_s"] = elements * FUSED_FLOP_PER_ELEMENT / spec.flops_per_s
        if layout:
            row["workspace_bytes"] = int(row["workspace_bytes"]) + layout_copy_bytes(fx_node)
        row["source"] = f"compiled:{row['source']}"
        rows.append(row)
    return make_table(rows)


def layout_copy_bytes(fx_node) -> int:
    """Bytes of the channels-last copies Inductor makes for a convolution node of the joint graph
    where it runs convolutions channels-last (its layout optimization; 0 for any other node): the weight, a parameter in eager PyTorch's layout, copied once in the forward
    (``aten.convolution``) and in the backward (``aten.convolution_backward``) where the weight's
    gradient is also computed channels-last and copied to the parameter's layout; and the input
    where it is one of the graph's inputs (the model's input), not a value Inductor computed
    channels-last (docs/design.md, "Note [Compiled schedule]")."""
    name = str(fx_node.target)
    if name not in CONVOLUTIONS:
        return 0
    backward = name == CONVOLUTIONS[1]
    x, w = (fx_node.args[1], fx_node.args[2]) if backward else (fx_node.args[0], fx_node.args[1])
    copies = (2 if backward else 1) * _bytes_of(w)
    if getattr(x, "op", None) == "placeholder":
        copies += _bytes_of(x)
    return copies


def _bytes_of(node) -> int:
    return sum(t.numel() * t.element_size() for t in tensors_in(node.meta.get("val")))


__all__ = ["FUSED_FLOP_PER_ELEMENT", "compiled_costs", "is_library_node", "layout_copy_bytes"]
