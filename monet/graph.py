"""The `OpGraph`: forward and backward nodes of an AOTAutograd joint graph, with their tensor sizes.

AOTAutograd traces a model's forward and backward into one ATen-level FX graph (the *joint* graph):
placeholders ``primals_*`` (parameters, buffers, inputs) and ``tangents_*`` (gradients of the
outputs), then the forward ops, then the backward ops, and one output node returning the forward
outputs followed by the gradients.  This module turns that graph into the nodes the ILP reasons
about (MONeT, Shah et al. ICLR 2021, Sec. 4):

* a **forward node** is one ATen op of the forward pass (an ancestor of a forward output), with the
  zero-cost nodes that hang off it folded in: ``getitem`` of its tuple, views, ``detach``, ``t``.
* a **backward node** is one ATen op of the backward pass, in the order autograd ran it.
* a **value** is one tensor storage: produced by a node (one per output of a multi-output op) and
  aliased by the views of it.  Sizes come from the traced shapes and dtypes.

Memory is counted per storage, exactly as the executor holds it: a storage is allocated when its
producer runs and freed after the last use of any of its aliases (see `monet.simulate`).
"""
from __future__ import annotations

import hashlib
import operator
import dataclasses
from dataclasses import dataclass, field

import torch
import torch.fx as fx

from monet import mixed_precision

PRIMAL = "primals"
TANGENT = "tangents"


def is_random(node: fx.Node) -> bool:
    """True for ops that draw random numbers (dropout, rand, bernoulli ...): recomputed with the
    generator state saved before they ran in the forward pass (`monet.rng`)."""
    target = node.target
    if getattr(target, "_monet_random", False):  # an implementation kernel wrapping a random op
        return True
    return isinstance(target, torch._ops.OpOverload) and torch.Tag.nondeterministic_seeded in target.tags


# ops that return a view of their input although their schema declares no alias: _unsafe_view
# (matmul's reshape of a fresh mm result, GPT-2's 37 forward ones among them the 1.5 GiB logits)
# shares its input's storage in eager mode; counted as an allocation it made GPT-2 small's plain
# peak 2.4 GiB too high in the memory model
_UNANNOTATED_VIEWS = (torch.ops.aten._unsafe_view.default,)


def is_alias(node: fx.Node) -> bool:
    """True for nodes whose output aliases an input: views, getitem, detach, _unsafe_view."""
    if node.op != "call_function":
        return False
    target = node.target
    if target is operator.getitem:
        return True
    if isinstance(target, torch._ops.OpOverload):
        if target.is_view or target in _UNANNOTATED_VIEWS:
            return True
        returns = target._schema.returns
        return bool(returns) and all(r.alias_info is not None and not r.alias_info.is_write for r in returns)
    return False


def tensors_in(val) -> list[torch.Tensor]:
    """The tensors of a node's ``meta["val"]``: ``[val]`` for a tensor, the tensors of a (nested)
    list or tuple in order, ``[]`` for anything else (a SymInt, None)."""
    if isinstance(val, torch.Tensor):
        return [val]
    if isinstance(val, (list, tuple)):
        return [t for v in val for t in tensors_in(v)]
    return []


def tensor_bytes(t: torch.Tensor) -> int:
    """Bytes of the storage behind a (fake or real) tensor, from its shape and dtype."""
    try:
        return int(t.untyped_storage().nbytes())
    except Exception:  # noqa: BLE001 - tensors without a storage (sparse, nested): numel * itemsize
        return int(t.numel() * t.element_size())


def op_name(node: fx.Node) -> str:
    """A readable operator name: ``aten.convolution.default``."""
    t = node.target
    if isinstance(t, torch._ops.OpOverload):
        return f"{t.namespace}.{t._schema.name.split('::')[-1]}.{t._overloadname}"
    if getattr(t, "__module__", "").startswith("monet."):  # an operator implementation's kernel
        return f"monet.{t.__name__}"
    return getattr(t, "__name__", str(t))


@dataclass
class Value:
    """One tensor storage of the joint graph.

    ``name`` is the FX node that owns it: the op node for a single-output op, the ``getitem`` node
    for each output of a multi-output op, the placeholder for inputs.  ``nbytes`` in bytes.
    """

    name: str
    nbytes: int
    producer: str  # FX name of the op node that allocates it ("" for placeholders)


@dataclass
class Node:
    """A forward or backward node: one ATen op and the zero-cost nodes folded into it.

    ``fx_names`` are the joint graph's node names executed for this node, in graph order (the op,
    its ``getitem`` nodes).  ``outputs`` are the FX names of the values it allocates; ``out_bytes``
    their total in bytes.  ``fwd_inputs`` are the ids of the forward nodes whose values it reads
    (through views too), ``reads`` the values themselves.  For a forward node, ``saved`` are the
    values a backward node or another forward node reads (what must be kept or recomputed for the
    backward pass), ``saved_bytes`` their size, and ``bwd_read`` those a backward node reads.
    """

    id: int
    kind: str  # "fwd" or "bwd"
    name: str
    op: str
    fx_names: list[str]
    outputs: list[str]
    out_bytes: int
    fwd_inputs: tuple[int, ...]
    random: bool = False
    saved: list[str] = field(default_factory=list)
    saved_bytes: int = 0
    reads: tuple[str, ...] = ()  # forward values (storage roots) this node reads
    bwd_read: list[str] = field(default_factory=list)  # saved values some backward node reads


@dataclass
class OpGraph:
    """Forward nodes in topological order and backward nodes in execution order.

    Attributes:
        fwd, bwd: the nodes (see `Node`); ``fwd[i].id == i``, ``bwd[t].id == t``.
        values: every storage by FX name (see `Value`); ``alias_root`` maps each FX name to the
            value whose storage it uses.
        bwd_reads: for each backward node, the forward nodes it reads (``D(t)`` in MONeT).
        param_bytes, buffer_bytes, input_bytes: bytes of the primals, by kind.
        output_bytes: bytes of the forward outputs the caller receives (held during backward).
        tangent_bytes: bytes of the gradients of those outputs (allocated by the caller).
        fingerprint: SHA-256 over ops, shapes and dtypes (see `fingerprint`).
        joint: the joint FX graph module (not pickled into solutions).
        num_fwd_outputs: how many of the joint outputs belong to the forward.
        input_shape, input_dtype: the traced input's shape (batch first) and dtype ("float32").
        impls: the non-default operator implementations applied (`monet.impls.apply_impls`).
        autocast: the autocast setting the graph was traced under, ``("cpu", "bfloat16")`` or
            None (`monet.mixed_precision`); it is the summary's last line, so part of the fingerprint.
        loss_output: some forward output is a 0-dimensional tensor (a loss): see `fwd_tangent_bytes`.
        primal_sources: what feeds each ``primals_*`` placeholder, set by the capture: the model's
            parameter or buffer name, a lifted constant tensor, or the index of an input leaf
            (`monet.frontend.primal_sources`); None for a graph built otherwise.
        device: the device type the step runs on, which decides how bytes are counted
            (`monet.profiling.cuda_bytes.memory_terms`): ``"cuda"`` (allocator blocks, library
            workspaces), else exact bytes (``"cpu"``; ``"meta"`` for a capture on the meta device,
            counted as on CPU unless the caller sets ``"cuda"``).  Not part of the fingerprint.
        cuda_capability: the GPU's compute capability (major, minor) when known (a capture on a
            CUDA device; set by hand for a meta capture), for the cuBLAS workspace size.
        library_bytes: bytes held outside the graph's nodes through the step (the BLAS workspaces
            of a CUDA graph, set by `monet.profiling.cuda_bytes.sized_graph`; 0 otherwise).
        exported: ``(call key, module)``: the Dynamo export the capture traced
            (`monet.inputs.call_key` of its inputs, `monet.frontend.export`'s module), which the
            first trace of a wrapper made from this capture takes instead of exporting the model
            again (`monet.frontend.rebind` gives it to a copy of the model); None for a graph made
            otherwise.  Not part of the fingerprint.
        compiled: the step runs compiled by Inductor (`monet.compiled`): a recomputed random op
            reads its saved outputs instead of replaying the generator (docs/design.md, "Note
            [Random ops compiled]"), which the memory model counts.  Set with `for_compile`; not
            part of the fingerprint (the graph is the same; `SolutionMeta.compiled` records it).
    """

    fwd: list[Node]
    bwd: list[Node]
    values: dict[str, Value]
    alias_root: dict[str, str]
    primal_kinds: dict[str, str]
    param_bytes: int
    buffer_bytes: int
    input_bytes: int
    output_bytes: int
    tangent_bytes: int
    fingerprint: str
    summary: list[str]
    joint: fx.GraphModule | None = None
    num_fwd_outputs: int = 0
    input_shape: tuple[int, ...] = ()  # the traced input, batch dimension first
    input_dtype: str = ""
    impls: dict = field(default_factory=dict)  # "fwd:<id>"/"bwd:<id>" -> implementation (monet.impls)
    autocast: tuple[str, str] | None = None  # ("cpu", "bfloat16") when traced under torch.autocast
    loss_output: bool = False  # a forward output is a scalar: training starts backward from it
    primal_sources: list | None = None  # what feeds each primal (`monet.frontend.primal_sources`)
    device: str = "cpu"
    cuda_capability: tuple[int, int] | None = None
    library_bytes: int = 0
    exported: tuple | None = field(default=None, repr=False)
    compiled: bool = False

    @property
    def fwd_tangent_bytes(self) -> int:
        """Bytes of output gradients live during the forward pass.

        ``model(x).backward(g)`` allocates ``g`` before the iteration (all of ``tangent_bytes``);
        a model whose output holds its scalar loss (transformers given ``labels``, `WithLoss`) is
        trained with ``loss.backward()``, where autograd creates the gradients of the outputs
        (ones for the loss, zeros for the others) only when the backward pass starts: none
        during the forward pass."""
        return 0 if self.loss_output else self.tangent_bytes

    @property
    def bwd_reads(self) -> list[tuple[int, ...]]:
        return [n.fwd_inputs for n in self.bwd]

    def fwd_node_of(self) -> dict[str, int]:
        """FX name -> forward node id, for every FX name folded into a forward node."""
        return {name: n.id for n in self.fwd for name in n.fx_names}

    @property
    def portable_fingerprint(self) -> str:
        """`fingerprint` of the `portable_summary`: the same on every admitted torch release for
        one model (what recorded tables and committed files that must hold across releases use)."""
        return fingerprint(portable_summary(self.summary))

    def counted_on(self, device: str, capability: tuple[int, int] | None = None) -> "OpGraph":
        """This graph with its bytes counted as on ``device`` (a shallow copy; ``device`` and
        ``cuda_capability`` set, everything else shared).

        A capture on the meta device counts bytes as the CPU does; a schedule solved from it for a
        CUDA GPU must count them as CUDA's caching allocator does (512-byte blocks, the cuBLAS
        workspaces: `monet.profiling.cuda_bytes.memory_terms`), or its budget leaves those bytes out
        (64 MiB on an H100).

        Args:
            device: ``"cuda"`` or ``"cpu"``.
            capability: the target GPU's compute capability (major, minor), which sizes the cuBLAS
                workspace; None: unknown (the largest default, 32 MiB per thread, is counted).

        Raises:
            ValueError: for another device type.
        """
        if device not in ("cuda", "cpu"):
            raise ValueError(f"counted_on: device must be 'cuda' or 'cpu', got {device!r}")
        cap = tuple(int(c) for c in capability) if capability is not None and device == "cuda" else None
        return dataclasses.replace(self, device=device, cuda_capability=cap)

    def for_compile(self, compiled: bool = True) -> "OpGraph":
        """This graph with `compiled` set (a shallow copy, everything else shared)."""
        return dataclasses.replace(self, compiled=bool(compiled))

    def describe(self) -> str:
        amp = f", {mixed_precision.describe(self.autocast)}" if self.autocast else ""
        return (f"{len(self.fwd)} forward nodes, {len(self.bwd)} backward nodes, "
                f"parameters {self.param_bytes / 2**20:.1f} MiB{amp}, fingerprint {self.fingerprint[:12]}")


def fingerprint(lines: list[str]) -> str:
    """SHA-256 of the graph summary: one line per op with its inputs, shapes and dtypes."""
    return hashlib.sha256("\n".join(lines).encode()).hexdigest()


# ops the releases monet admits write for the same step, and the name they are compared under:
# torch 2.15's matmul decomposition reshapes its fresh mm result with _unsafe_view where 2.11-2.14
# write view (same shapes; both aliases of their input in the memory model, `is_alias`)
_SAME_ACROSS_RELEASES = {"aten._unsafe_view.default": "aten.view.default"}


def portable_summary(lines: list[str]) -> list[str]:
    """``lines`` (`OpGraph.summary`) with each op named as every admitted torch release would name
    it (`_SAME_ACROSS_RELEASES`): two graphs captured from one model on two releases have equal
    portable summaries where their schedules, costs and memory are interchangeable."""
    out = []
    for line in lines:
        for theirs, ours in _SAME_ACROSS_RELEASES.items():
            line = line.replace(f" {theirs} (", f" {ours} (", 1)
        out.append(line)
    return out


def _tensor_sig(t) -> str:
    return f"{tuple(t.shape)}/{tuple(t.stride())}:{str(t.dtype).removeprefix('torch.')}"


def op_signature(node: fx.Node) -> str:
    """What an FX op node's cost depends on, as a string: its operator, each argument's shape,
    strides and dtype (a tensor: read from its traced ``meta["val"]``) or value (anything else),
    and its outputs' shapes.  Two nodes with equal signatures run the same kernel on inputs of the
    same layout: the twelve layers of a 12-layer transformer give twelve nodes per signature, and
    a cost measured for one holds for the others (`monet.profiling.profiler`), and the chains of
    identical blocks of `monet.solver.blocks` are runs of equal signatures."""
    def arg(a):
        if isinstance(a, fx.Node):
            ts = tensors_in(a.meta.get("val"))
            return "[" + ",".join(_tensor_sig(t) for t in ts) + "]" if ts else repr(a.meta.get("val"))
        if isinstance(a, (list, tuple)):
            return "(" + ",".join(arg(x) for x in a) + ")"
        if isinstance(a, torch.device):
            return "device"
        return repr(a)

    outs = ",".join(_tensor_sig(t) for t in tensors_in(node.meta.get("val")))
    kwargs = ",".join(f"{k}={arg(v)}" for k, v in sorted(node.kwargs.items()))
    name = op_name(node) if node.op == "call_function" else str(node.target)
    return f"{name}({','.join(arg(a) for a in node.args)};{kwargs})->{outs}"


def node_signatures(graph: "OpGraph") -> dict[tuple[str, int], str]:
    """`op_signature` of every forward and backward node's op, by ``(kind, id)``; needs
    ``graph.joint``.

    Raises:
        ValueError: the graph has no joint graph (a graph loaded from a solution file)."""
    if graph.joint is None:
        raise ValueError("the graph has no joint FX graph (it was loaded, not captured): capture the model again")
    by_name = {n.name: n for n in graph.joint.graph.nodes}
    return {(n.kind, n.id): op_signature(by_name[n.name]) for n in list(graph.fwd) + list(graph.bwd)}


def _summary_line(node: fx.Node, index: dict[str, int]) -> str:
    def arg(a):
        if isinstance(a, fx.Node):
            return f"%{index[a.name]}"
        if isinstance(a, (list, tuple)):
            return "[" + ",".join(arg(x) for x in a) + "]"
        if isinstance(a, torch.device):
            return "device"  # a solution may be made on one device and run on another
        return repr(a)

    val = node.meta.get("val")
    shapes = ",".join(f"{tuple(t.shape)}:{str(t.dtype).replace('torch.', '')}" for t in tensors_in(val))
    args = ",".join(arg(a) for a in node.args)
    kwargs = ",".join(f"{k}={arg(v)}" for k, v in sorted(node.kwargs.items()) if k != "device")
    return f"{node.op} {op_name(node) if node.op == 'call_function' else node.target} ({args};{kwargs}) -> {shapes}"


def _forward_region(fwd_outs: list[fx.Node]) -> set[str]:
    """The names of the forward region: the ancestors of the forward outputs (which do not depend
    on tangents), placeholders excepted."""
    region: set[str] = set()
    stack = list(fwd_outs)
    while stack:
        n = stack.pop()
        if n.name in region or n.op == "placeholder":
            continue
        region.add(n.name)
        stack.extend(n.all_input_nodes)
    return region


def _storage(nodes: list[fx.Node]) -> tuple[dict[str, str], dict[str, Value]]:
    """(alias root of every placeholder and op: the value that owns its storage; the values that
    own storage, by name).  A multi-output op's tuple node has no storage of its own; its getitems
    do.

    Raises:
        ValueError: an op without a traced shape (``meta["val"]``)."""
    alias_root: dict[str, str] = {}
    values: dict[str, Value] = {}
    for n in nodes:
        if n.op == "placeholder":
            alias_root[n.name] = n.name
            values[n.name] = Value(n.name, sum(tensor_bytes(t) for t in tensors_in(n.meta.get("val"))), "")
        elif n.op == "call_function":
            if "val" not in n.meta:
                raise ValueError(f"node {n.name} ({op_name(n)}) has no traced shape; cannot size its memory")
            if n.target is operator.getitem:
                parent = n.args[0]
                if is_alias(parent):  # an element of a list of views (split, unbind)
                    alias_root[n.name] = alias_root[parent.name]
                else:  # one output of a multi-output op: it owns its storage
                    alias_root[n.name] = n.name
                    values[n.name] = Value(n.name, sum(tensor_bytes(t) for t in tensors_in(n.meta["val"])),
                                           parent.name)
            elif is_alias(n):
                src = n.args[0]
                alias_root[n.name] = alias_root[src.name] if isinstance(src, fx.Node) else n.name
            else:
                alias_root[n.name] = n.name
                if not isinstance(n.meta["val"], (tuple, list)):
                    values[n.name] = Value(n.name, sum(tensor_bytes(t) for t in tensors_in(n.meta["val"])), n.name)
    return alias_root, values


def _owner(n: fx.Node) -> fx.Node:
    """The op node a (possibly folded) FX node belongs to: ``n`` less its views."""
    while n.op == "call_function" and is_alias(n):
        src = n.args[0]
        if not isinstance(src, fx.Node):
            break
        n = src
    return n


def _fwd_deps(n: fx.Node, fwd_id: dict[str, int]) -> tuple[int, ...]:
    """The forward nodes (ids, sorted) whose values ``n`` reads, through views."""
    return tuple(sorted({fwd_id[o.name] for o in map(_owner, n.all_input_nodes) if o.name in fwd_id}))


def _op_nodes(nodes: list[fx.Node], region: set[str], forward: bool, values: dict[str, Value],
              fwd_id: dict[str, int]) -> list[Node]:
    """The forward (``forward``) or backward nodes: every op inside (outside) the forward region
    ``region`` that is not a view, in graph order, with the getitems of a multi-output op, the
    values it owns, their bytes, the forward nodes it reads (backward nodes) and whether it draws
    random numbers.  ``fwd_id`` gains each forward node's id."""
    produced: dict[str, list[str]] = {}  # producer's name -> its values' names, in `values`' order
    for v in values.values():
        produced.setdefault(v.producer, []).append(v.name)
    out: list[Node] = []
    for n in nodes:
        if n.op != "call_function" or (n.name in region) != forward or is_alias(n):
            continue
        outputs = produced.get(n.name, [])
        # a multi-output op's getitems run with it, wherever the joint graph placed them
        getitems = [u.name for u in n.users if u.target is operator.getitem]
        if forward:
            fwd_id[n.name] = len(out)
        out.append(Node(len(out), "fwd" if forward else "bwd", n.name, op_name(n), [n.name] + getitems, outputs,
                        sum(values[o].nbytes for o in outputs), () if forward else _fwd_deps(n, fwd_id),
                        is_random(n)))
    return out


def _reads_and_saved(nodes: list[fx.Node], fwd: list[Node], bwd: list[Node], alias_root: dict[str, str],
                     values: dict[str, Value]) -> None:
    """Set each node's ``reads`` (the forward values it reads, by root) and each forward node's
    ``saved`` (its values something reads after it ran), ``saved_bytes`` and ``bwd_read`` (those a
    backward node reads)."""
    by_name = {n.name: n for n in nodes}
    readers: dict[str, set[str]] = {}
    for n in nodes:
        if n.op != "call_function" or is_alias(n):
            continue
        for a in n.all_input_nodes:
            root = alias_root.get(a.name)
            if root is not None:
                readers.setdefault(root, set()).add(n.name)
    bwd_names = {n.name for n in bwd}
    fwd_values = {v for n in fwd for v in n.outputs}
    for node in fwd + bwd:
        node.reads = tuple(sorted({alias_root[a.name] for a in by_name[node.name].all_input_nodes
                                   if alias_root.get(a.name) in fwd_values}))
    for node in fwd:
        node.saved = [v for v in node.outputs if readers.get(v)]
        node.saved_bytes = sum(values[v].nbytes for v in node.saved)
        node.bwd_read = [v for v in node.saved if readers[v] & bwd_names]


def _device(placeholders: list[fx.Node]) -> tuple[str, tuple | None]:
    """("cuda" where any placeholder is on a CUDA device, else "cpu" or the one device type;
    the first CUDA device's compute capability, None elsewhere or without CUDA)."""
    devices = {t.device for p in placeholders for t in tensors_in(p.meta.get("val"))}
    cuda = sorted((d for d in devices if d.type == "cuda"), key=str)
    device = "cuda" if cuda else ("cpu" if any(d.type == "cpu" for d in devices) or not devices
                                  else sorted(devices, key=str)[0].type)
    return device, tuple(torch.cuda.get_device_capability(cuda[0])) if cuda and torch.cuda.is_available() else None


def build_opgraph(joint: fx.GraphModule, num_fwd_outputs: int, primal_kinds: dict[str, str],
                  autocast=None) -> OpGraph:
    """Turn an AOTAutograd joint graph into an `OpGraph`: the forward region (`_forward_region`),
    the values and their storage (`_storage`), the forward and backward nodes (`_op_nodes`), what
    each reads and saves (`_reads_and_saved`), the byte counts, the summary and its fingerprint.

    Args:
        joint: the joint forward+backward graph (``partition_fn``'s first argument); every node
            carries ``meta["val"]`` (fake tensors with shapes and dtypes).
        num_fwd_outputs: number of forward outputs at the front of the joint output list.
        primal_kinds: placeholder name -> "param" | "buffer" | "input".
        autocast: the autocast setting the joint graph was traced under (None, or
            ``(device_type, dtype)``, see `monet.mixed_precision`); the trace already holds its
            casts, this records it in the summary and the fingerprint.

    Raises:
        ValueError: if a node has no traced shape (``meta["val"]``), which the memory model needs.
    """
    nodes = list(joint.graph.nodes)
    index = {n.name: i for i, n in enumerate(nodes)}
    placeholders = [n for n in nodes if n.op == "placeholder"]
    outs = list(next(n for n in nodes if n.op == "output").args[0])
    region = _forward_region([o for o in outs[:num_fwd_outputs] if isinstance(o, fx.Node)])
    alias_root, values = _storage(nodes)
    summary = [_summary_line(n, index) for n in nodes]
    autocast = mixed_precision.normalize(autocast)
    if autocast is not None:  # last, so that summary indices stay joint-graph node indices
        summary.append(mixed_precision.summary_line(autocast))
    fwd_id: dict[str, int] = {}  # op node name -> forward node id
    fwd = _op_nodes(nodes, region, True, values, fwd_id)
    by_name = {n.name: n for n in nodes}
    for node in fwd:
        node.fwd_inputs = _fwd_deps(by_name[node.name], fwd_id)
    bwd = _op_nodes(nodes, region, False, values, fwd_id)
    _reads_and_saved(nodes, fwd, bwd, alias_root, values)

    kinds = dict(primal_kinds)

    def _bytes_of(kind):
        return sum(values[p.name].nbytes for p in placeholders if kinds.get(p.name) == kind)
    tangent_bytes = sum(values[p.name].nbytes for p in placeholders if p.name.startswith(TANGENT))
    loss_output = any(isinstance(p.meta.get("val"), torch.Tensor) and p.meta["val"].dim() == 0
                      for p in placeholders if p.name.startswith(TANGENT))
    inputs = [p for p in placeholders if kinds.get(p.name) == "input" and isinstance(p.meta.get("val"), torch.Tensor)]
    in_shape = tuple(int(d) for d in inputs[0].meta["val"].shape) if inputs else ()
    in_dtype = str(inputs[0].meta["val"].dtype).removeprefix("torch.") if inputs else ""
    device, capability = _device(placeholders)
    # The caller holds the outputs during the backward pass; each differentiable output has a
    # tangent of its own shape, so their bytes agree (mutated buffers have no tangent):
    # output_bytes = tangent_bytes.
    return OpGraph(input_shape=in_shape, input_dtype=in_dtype, fwd=fwd, bwd=bwd, values=values, alias_root=alias_root, primal_kinds=kinds,
                   param_bytes=_bytes_of("param"), buffer_bytes=_bytes_of("buffer"),
                   input_bytes=_bytes_of("input"), output_bytes=tangent_bytes, tangent_bytes=tangent_bytes,
                   fingerprint=fingerprint(summary), summary=summary, joint=joint,
                   num_fwd_outputs=num_fwd_outputs, autocast=autocast, loss_output=loss_output,
                   device=device, cuda_capability=capability)
