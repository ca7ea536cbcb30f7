"""The registry of operator implementations and the graph surgery that applies them.

An implementation (MONeT, Shah et al. ICLR 2021, Sec. 4 "operator implementations") is attached to
one node of the joint graph, its *anchor*: a forward node (ReLU, BatchNorm, max-pool, dropout,
convolution, attention) or a backward node (``convolution_backward``).  Applying it rewrites the anchor, and
for a forward anchor the backward node that reads what the anchor stored, in place: each replaced
FX node gets a new node at the same position, so forward and backward node ids of the `OpGraph`
do not change, only what the nodes compute, store and read.  The forward, the backward and the
memory formula of each implementation live in its family's module (``monet.impls.activation``,
``batchnorm``, ``pooling``, ``dropout``, ``conv``, ``attention``); adding one touches one file.

MONeT's mode strings name which kinds of implementation the solver may choose (`MODE_TOKENS`):
``conv`` (convolution algorithms), ``multiway`` (input- or output-activated: what a node stores),
``newnode`` (intermediate-activated: a new compact tensor such as a 1-bit mask), ``inplace``
(ReLU and add overwrite their input when it has no later user; applied by the executor) and
``attention`` (the backend of ``scaled_dot_product_attention``: math, which stores the
probabilities, or a fused kernel, which recomputes them; `monet.impls.attention`).
"""
from __future__ import annotations

import operator
from dataclasses import dataclass
from typing import Callable

import torch
import torch.fx as fx
from torch.utils._pytree import tree_map

from monet import compat
from monet.graph import OpGraph, build_opgraph, op_name

MODE_TOKENS = ("inplace", "conv", "multiway", "newnode", "attention")
#: MONeT's mode strings, and ``attention`` (SDPA backends); "full" is an alias of the last.
MODES = ("none", "normal", "inplace_normal", "conv_normal", "multiway", "newnode", "attention",
         "inplace_conv_multiway_newnode_attention")
DEFAULT = "default"


def mode_tokens(mode: str) -> frozenset[str]:
    """The implementation kinds a mode string allows: ``"inplace_conv_normal"`` -> {inplace, conv}.

    Raises:
        ValueError: an unknown mode or token (the message lists the valid ones).
    """
    if mode == "full":
        mode = MODES[-1]
    if mode in ("none", "normal"):
        return frozenset()
    tokens = set(mode.split("_")) - {"normal"}
    bad = tokens - set(MODE_TOKENS)
    if bad or not mode:
        raise ValueError(f"unknown mode {mode!r}: use none, normal, or tokens from {', '.join(MODE_TOKENS)} joined "
                         f"by '_' (MONeT's modes: {', '.join(MODES)}; 'full' = {MODES[-1]})")
    return frozenset(tokens)


@dataclass(frozen=True)
class Impl:
    """One implementation of an operator.

    Attributes:
        name: unique name, ``family.variant`` (e.g. ``"relu.mask"``), stored in schedules.
        token: the mode token that allows it (`MODE_TOKENS`).
        kind: ``"fwd"`` or ``"bwd"``: the kind of its anchor node.
        ops: ATen op names (`monet.graph.op_name`) of the nodes it can anchor on.
        rewrite: ``rewrite(graph, anchor) -> bool`` rewrites the anchor (and for a forward anchor its
            backward node) in place; False when this anchor does not qualify (nothing changed).
        devices: device types it runs on.
        stores: what it keeps for the backward pass, with its size (documentation and tables).
        lean: False for an implementation that stores more than PyTorch's kernel (attention's math
            backend keeps the probabilities): never the memory-lean candidate of the smallest-budget
            search (`monet.solver.solve.lean_impls`).
    """

    name: str
    token: str
    kind: str
    ops: tuple[str, ...]
    rewrite: Callable[[fx.Graph, fx.Node], bool]
    devices: tuple[str, ...] = ("cpu", "cuda")
    stores: str = ""
    lean: bool = True


IMPLS: dict[str, Impl] = {}


def register(impl: Impl) -> Impl:
    """Add an implementation to the registry (module import time)."""
    if impl.name in IMPLS:
        raise ValueError(f"implementation {impl.name!r} registered twice")
    if impl.token not in MODE_TOKENS or impl.kind not in ("fwd", "bwd"):
        raise ValueError(f"implementation {impl.name!r}: bad token {impl.token!r} or kind {impl.kind!r}")
    IMPLS[impl.name] = impl
    return impl


def impls_for(mode: str, device: str = "cpu") -> list[Impl]:
    """The registered implementations a mode allows on a device type ("cpu" or "cuda")."""
    tokens = mode_tokens(mode)
    dev = device.split(":")[0]
    return [i for i in IMPLS.values() if i.token in tokens and dev in i.devices]


# ----------------------------------------------------------------------------------------------
# graph surgery
# ----------------------------------------------------------------------------------------------


def fake_value(fn, args, kwargs=None):
    """Run ``fn`` on the traced (fake) values of FX arguments: the ``meta['val']`` of a new node."""
    kwargs = kwargs or {}
    vals = tree_map(lambda a: a.meta["val"] if isinstance(a, fx.Node) else a, (args, kwargs))
    mode = compat.detect_fake_mode([v for v in torch.utils._pytree.tree_leaves(vals) if isinstance(v, torch.Tensor)])
    if mode is None:
        return fn(*vals[0], **vals[1])
    with mode:
        return fn(*vals[0], **vals[1])


def replace(graph: fx.Graph, old: fx.Node, fn, args, kwargs=None, n_outputs: int | None = None,
            val=None) -> list[fx.Node]:
    """Put ``fn(*args)`` where ``old`` is and return its output nodes (getitems for a tuple).

    The new node takes ``old``'s position (so node ids do not move), its stack trace and a traced
    value: ``val`` where the caller knows it (a rewrite whose result is the old node's, shapes,
    dtypes and strides), else ``fn`` run on the arguments' traced values (`fake_value`: about a
    millisecond per node).  The caller rewires users (`rewire`) and erases ``old``.
    """
    with graph.inserting_before(old):
        new = graph.call_function(fn, tuple(args), kwargs or {})
        new.meta = {k: v for k, v in old.meta.items() if k != "val"}
        new.meta["val"] = fake_value(fn, args, kwargs) if val is None else val
    if n_outputs is None:
        return [new]
    outs = []
    with graph.inserting_after(new):
        for k in reversed(range(n_outputs)):
            g = graph.call_function(operator.getitem, (new, k))
            g.meta["val"] = new.meta["val"][k]
            outs.append(g)
    return outs[::-1]


def getitem_users(node: fx.Node) -> dict[int, fx.Node]:
    """Output index -> the getitem node reading it, for a multi-output op."""
    return {u.args[1]: u for u in node.users if u.op == "call_function" and u.target is operator.getitem}


def users_with_op(node: fx.Node, op: str) -> list[fx.Node]:
    """The users of ``node`` (through views too) whose op name is ``op``."""
    from monet.graph import is_alias

    found, stack, seen = [], [node], set()
    while stack:
        n = stack.pop()
        for u in n.users:
            if u in seen:
                continue
            seen.add(u)
            if is_alias(u) and u.target is not operator.getitem:
                stack.append(u)
            elif u.op == "call_function" and op_name(u) == op:
                found.append(u)
    return found


def replace_stashing(graph: fx.Graph, anchor: fx.Node, fn, args, bwds: list[fx.Node], bwd_fn, bwd_args) -> None:
    """Replace a two-output op (its value, and what its backward reads: a mask, indices) by
    ``fn(*args) -> (value, stash)``, and each backward node ``b`` in ``bwds`` by
    ``bwd_fn(*bwd_args(b, stash))``; the old nodes are erased."""
    outs = getitem_users(anchor)
    new_out, stash = replace(graph, anchor, fn, args, n_outputs=2)
    for b in bwds:
        swap(graph, b, bwd_fn, bwd_args(b, stash))
    if 0 in outs:
        outs[0].replace_all_uses_with(new_out)
        graph.erase_node(outs[0])
    graph.erase_node(outs[1])
    graph.erase_node(anchor)


def unused():
    """What a backward node that a rewrite made useless computes: nothing (its id is kept)."""
    return None


def swap(graph: fx.Graph, old: fx.Node, fn, args=None, kwargs=None, val=None) -> fx.Node:
    """Replace ``old`` by ``fn(*args)`` (default: ``old``'s own arguments), same users; returns it.
    ``val``: the new node's traced value where the caller knows it (`replace`)."""
    new = replace(graph, old, fn, old.args if args is None else args, old.kwargs if kwargs is None else kwargs,
                  val=val)[0]
    old.replace_all_uses_with(new)
    graph.erase_node(old)
    return new


# ----------------------------------------------------------------------------------------------
# implementation assignments
# ----------------------------------------------------------------------------------------------


def copy_joint(joint: fx.GraphModule) -> fx.GraphModule:
    """A copy of the joint graph to rewrite: read, never run, so its code is not generated
    (`monet.compat.lazy_graph_module`)."""
    g = fx.Graph()
    out = g.graph_copy(joint.graph, {})
    g.output(out)
    return compat.lazy_graph_module(joint, g)


def _anchor(graph: OpGraph, key: str) -> str:
    kind, _, idx = key.partition(":")
    nodes = graph.fwd if kind == "fwd" else graph.bwd if kind == "bwd" else None
    if nodes is None or not idx.isdigit() or int(idx) >= len(nodes):
        raise ValueError(f"bad implementation key {key!r}: expected 'fwd:<id>' or 'bwd:<id>' of this graph")
    return nodes[int(idx)].name


def rebuild(graph: OpGraph, joint: fx.GraphModule, impls: dict[str, str]) -> OpGraph:
    joint.graph.lint()
    joint.recompile()
    out = build_opgraph(joint, graph.num_fwd_outputs, graph.primal_kinds)
    if len(out.fwd) != len(graph.fwd) or len(out.bwd) != len(graph.bwd):
        raise RuntimeError(f"internal error: implementations {sorted(set(impls.values()))} changed the node count "
                           f"({len(graph.fwd)}/{len(graph.bwd)} -> {len(out.fwd)}/{len(out.bwd)})")
    # a schedule is bound to the captured graph, whatever implementations it runs
    out.fingerprint, out.summary = graph.fingerprint, graph.summary
    out.input_shape, out.input_dtype, out.autocast = graph.input_shape, graph.input_dtype, graph.autocast
    out.primal_sources, out.exported = graph.primal_sources, graph.exported
    out.device, out.cuda_capability = graph.device, graph.cuda_capability  # how its bytes are counted
    out.impls = dict(impls)
    return out


def apply_impls(graph: OpGraph, impls: dict[str, str]) -> OpGraph:
    """The graph with the given implementations: ``{"fwd:12": "relu.mask", "bwd:40": ...}``.

    Node ids are unchanged; ``graph`` is not modified (its joint graph is copied).  The result
    keeps ``graph``'s fingerprint: a solution is bound to the captured graph.

    Raises:
        ValueError: an unknown implementation, a bad key, or an implementation that does not apply
            to its node (the solution was made for another graph or another monet version).
    """
    if not impls:
        return graph
    joint = copy_joint(graph.joint)
    by_name = {n.name: n for n in joint.graph.nodes}
    for key, name in sorted(impls.items()):
        if name == DEFAULT:
            continue
        impl = IMPLS.get(name)
        if impl is None:
            raise ValueError(f"unknown implementation {name!r} for {key}; known: {', '.join(sorted(IMPLS))}")
        anchor = by_name.get(_anchor(graph, key))
        if anchor is None or not key.startswith(impl.kind) or op_name(anchor) not in impl.ops \
                or not impl.rewrite(joint.graph, anchor):
            raise ValueError(f"implementation {name!r} does not apply to {key} ({anchor and op_name(anchor)})")
    return rebuild(graph, joint, {k: v for k, v in impls.items() if v != DEFAULT})


def variant(graph: OpGraph, name: str) -> tuple[OpGraph, list[str], dict[str, tuple[int, ...]]]:
    """``graph`` with implementation ``name`` applied wherever it applies.

    Returns (variant graph, the keys it applied to, key -> ids of the backward nodes that rewrite
    replaced: the nodes the choice *governs*).  The solver compares each node's implementations
    across such variant graphs (one per implementation): implementations act locally, so a node's
    costs, outputs and the reads of its backward nodes are the same whichever implementations the
    other nodes use.
    """
    impl = IMPLS[name]
    joint = copy_joint(graph.joint)
    by_name = {n.name: n for n in joint.graph.nodes}
    nodes = graph.fwd if impl.kind == "fwd" else graph.bwd
    keys, created = [], {}
    for node in nodes:
        anchor = by_name[node.name]
        before = {n.name for n in joint.graph.nodes}
        if op_name(anchor) in impl.ops and impl.rewrite(joint.graph, anchor):
            key = f"{impl.kind}:{node.id}"
            keys.append(key)
            created[key] = {n.name for n in joint.graph.nodes} - before
    if not keys:
        return graph, [], {}
    out = rebuild(graph, joint, {k: name for k in keys})
    bwd_ids = {n.name: n.id for n in out.bwd}
    governed = {k: tuple(sorted(bwd_ids[n] for n in names if n in bwd_ids)) for k, names in created.items()}
    return out, keys, governed
