"""Backward ops that read a forward value for its shape only, given a stand-in without bytes.

``aten.nll_loss_backward(grad, self, target, ...)`` reads of ``self`` (the log-probabilities)
its sizes, dtype and device, not its elements: its gradient is zero but at the targets.  Read as
it is, the log-probabilities (batch x tokens x vocabulary for a language model) are a value the
backward needs, so a schedule keeps them from the forward to the loss's backward; compiled, the
decomposed op reads nothing of them, and the kept value stays allocated through the whole
backward (Inductor frees an input after its last read, and an input never read is never freed).
`standin_shape_reads` gives such an argument a zero-stride expand of a one-element zero instead,
in the joint graph, before the graph is built (docs/design.md, "Note [Shape-only reads]").
"""
from __future__ import annotations

import torch
from torch import fx

aten = torch.ops.aten

#: backward ops and the position of the argument they read for its shape, dtype and device only
SHAPE_ONLY = {aten.nll_loss_backward.default: 1, aten.nll_loss2d_backward.default: 1}


def standin_shape_reads(joint: fx.GraphModule) -> int:
    """Replace, in ``joint`` (the joint graph AOTAutograd traced, every node with ``meta["val"]``),
    each `SHAPE_ONLY` argument by ``aten.expand(aten.full([], 0), shape)`` of its dtype and device,
    computed just before the op: 1 element allocated where the value was read.  The op's result
    is unchanged (its output strides come from the shape, not from the argument's strides).
    Returns the number of arguments replaced."""
    changed = 0
    for node in list(joint.graph.nodes):
        pos = SHAPE_ONLY.get(node.target)
        src = node.args[pos] if pos is not None and len(node.args) > pos else None
        val = src.meta.get("val") if isinstance(src, fx.Node) else None
        if not isinstance(val, torch.Tensor):
            continue
        with joint.graph.inserting_before(node):
            zero = joint.graph.call_function(aten.full.default, ([], 0),
                                             {"dtype": val.dtype, "layout": torch.strided, "device": val.device,
                                              "pin_memory": False})
            zero.meta["val"] = val.new_zeros(())
            standin = joint.graph.call_function(aten.expand.default, (zero, list(val.shape)))
            standin.meta["val"] = zero.meta["val"].expand(val.shape)
        node.args = (*node.args[:pos], standin, *node.args[pos + 1:])
        changed += 1
    if changed:
        joint.graph.lint()
        joint.recompile()
    return changed


__all__ = ["SHAPE_ONLY", "standin_shape_reads"]
