"""In-place ReLU, hardtanh and add (MONeT's ``inplace`` mode token, Shah et al. ICLR 2021, Sec. 4).

AOTAutograd's joint graph is functional: ``relu_`` in a model becomes ``relu``, which allocates its
output while its input is still live.  After the executor has built a forward or backward module,
`make_inplace` turns ``relu``/``hardtanh``/``add`` into their in-place forms wherever the
overwritten input is an intermediate of that module (not an input of the module, not a view) with
no later user and the output has its shape, dtype and strides; the op then allocates nothing.  The
simulator (`monet.simulate`) treats an in-place op as an alias of its input, so predictions follow.
"""
from __future__ import annotations

import operator

import torch
import torch.fx as fx

from monet.graph import is_alias

aten = torch.ops.aten
_INPLACE = {aten.relu.default: aten.relu_.default, aten.hardtanh.default: aten.hardtanh_.default,
            aten.add.Tensor: aten.add_.Tensor}


def is_inplace(node: fx.Node) -> bool:
    """True for an op that writes into its first argument and returns it (``relu_``, ``add_``)."""
    t = node.target
    if node.op != "call_function" or not isinstance(t, torch._ops.OpOverload):
        return False
    returns = t._schema.returns
    return bool(returns) and all(r.alias_info is not None and r.alias_info.is_write for r in returns)


def aliases_first(node: fx.Node) -> bool:
    """An op marked ``alias_of_first``: it returns its first argument (`monet.offload.fetched`)."""
    return getattr(node.target, "alias_of_first", False)


def storage_root(node: fx.Node) -> fx.Node:
    """The node that allocated the storage ``node``'s output lives in: followed back through views
    (`monet.graph.is_alias`, but not ``getitem``) and in-place ops (`is_inplace`) to their first
    argument, and through ops marked ``alias_of_first`` (`monet.offload.fetched`: returns its first
    argument); an element of a list of views (``getitem`` of an aliasing op) has its list's root."""
    while node.op == "call_function" and ((is_alias(node) and node.target is not operator.getitem)
                                          or is_inplace(node) or aliases_first(node)):
        src = node.args[0]
        if not isinstance(src, fx.Node):
            break
        node = src
    if node.op == "call_function" and node.target is operator.getitem:
        parent = node.args[0]
        if is_alias(parent):  # an element of a list of views
            return storage_root(parent)
    return node


def _same_layout(a, b) -> bool:
    return (isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor) and a.shape == b.shape
            and a.dtype == b.dtype and a.stride() == b.stride())


def make_inplace(graph: fx.Graph) -> int:
    """Rewrite eligible ops of ``graph`` to their in-place forms; returns how many were rewritten."""
    nodes = list(graph.nodes)
    pos = {n: k for k, n in enumerate(nodes)}
    last: dict[fx.Node, int] = {}
    for n in nodes:
        for a in n.all_input_nodes:
            r = storage_root(a)
            last[r] = max(last.get(r, -1), pos[n])
    count = 0
    for n in nodes:
        new = _INPLACE.get(n.target) if n.op == "call_function" else None
        if new is None:
            continue
        args = list(n.args)
        cands = [0] + ([1] if n.target is aten.add.Tensor and not n.kwargs else [])
        for k in cands:
            x = args[k] if k < len(args) else None
            if not isinstance(x, fx.Node):
                continue
            r = storage_root(x)
            if (r.op != "call_function" or not (x is r or is_inplace(x)) or last.get(r) != pos[n]
                    or sum(a is x for a in args) != 1 or not _same_layout(x.meta.get("val"), n.meta.get("val"))):
                continue
            if k == 1:
                args[0], args[1] = args[1], args[0]  # a + b == b + a, bitwise
            n.target, n.args = new, tuple(args)
            last[r] = max(pos[n], last.get(n, pos[n]))  # the storage now lives as long as n's value
            count += 1
            break
    return count
