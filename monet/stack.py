"""Deep stacks of identical layers: find them, copy a model with fewer of them, and export the deep
model from the export of that copy.

The models people train are deep stacks of one block (transformers' ``model.layers``,
``transformer.h``, ``encoder.layer``).  Dynamo's export runs the model's Python bytecode once per
layer: a 96-layer GPT-2 (hidden 256, 2 x 256 tokens) took 56-76 s to capture on 2 cores, most of
it in Dynamo, although its layers are one block 96 times.  `export_stack` exports a copy that keeps
only the first `KEEP` layers (`shallow_copy`), checks that the copy's graph is a prefix, one run of
nodes per layer and a suffix, with every layer after the first the same nodes as the one before it
(the same operators, constants and parameter names within the layer, reading the layer before it
where that one read its own predecessor), and writes the deep model's graph from it: the prefix,
the first layer, the second layer's nodes once per further layer (each reading its predecessor and
its own parameters), the suffix.  AOTAutograd traces that graph as it would trace Dynamo's own
export of the deep model, so the joint graph (and its fingerprint) is the same.

Where anything of that does not hold (a layer whose nodes depend on its index, such as alternating
attention types, a suffix that reads every layer's output, a stack Dynamo does not name in its
``nn_module_stack``), the model is exported whole, as before.
"""
from __future__ import annotations

import contextlib
import copy
import re
import time
import warnings
import weakref
from dataclasses import dataclass

import torch.fx as fx
import torch.nn as nn

#: stacks with fewer identical layers are exported (and costed) whole
MIN_LAYERS = 32
#: layers of the copy an export is written from: the first (it reads the prefix), two to compare
#: (the second and third), and the last (what the suffix reads)
KEEP = 4


def _layer_key(module: nn.Module) -> tuple:
    """What makes two layers identical here: class, parameters' and buffers' names, shapes, dtypes."""
    tensors = list(module.named_parameters(remove_duplicate=False)) + list(module.named_buffers(remove_duplicate=False))
    return (type(module),) + tuple((n, tuple(t.shape), t.dtype) for n, t in tensors)


def repeated_layers(model: nn.Module, min_layers: int | None = None) -> tuple[str, int] | None:
    """``(qualified name, length)`` of the longest ``nn.ModuleList`` of ``model`` whose members are
    identical layers (one class; the same parameter and buffer names, shapes and dtypes), if it has
    at least ``min_layers`` (None: `MIN_LAYERS`); else None."""
    min_layers = MIN_LAYERS if min_layers is None else min_layers
    best = None
    for name, m in model.named_modules():
        if not isinstance(m, nn.ModuleList) or len(m) < min_layers or (best and len(m) <= best[1]):
            continue
        first = _layer_key(m[0])
        if all(_layer_key(layer) == first for layer in m):
            best = (name, len(m))
    return best


@contextlib.contextmanager
def _truncated(model: nn.Module, name: str, keep: int):
    """``model`` with its ``nn.ModuleList`` ``name`` cut to its first ``keep`` layers, restored after."""
    parent_name, _, attr = name.rpartition(".")
    parent = model.get_submodule(parent_name) if parent_name else model
    full = getattr(parent, attr)
    setattr(parent, attr, nn.ModuleList(list(full)[:keep]))
    try:
        yield
    finally:
        setattr(parent, attr, full)


def shallow_copy(model: nn.Module, name: str, keep: int) -> nn.Module:
    """A deep copy of ``model`` whose ``nn.ModuleList`` ``name`` holds only its first ``keep``
    layers (only their parameters are copied); ``model`` is left as it was."""
    with _truncated(model, name, keep):
        return copy.deepcopy(model)


# ----------------------------------------------------------------------------------------------
# the copy's graph, cut into prefix, layers and suffix
# ----------------------------------------------------------------------------------------------


class NotRepeatable(ValueError):
    """The copy's graph is not a prefix, one identical run of nodes per layer and a suffix."""


@dataclass
class Segments:
    """The nodes of an exported graph of a stack: ``prefix`` (placeholders, embeddings, masks),
    ``layers`` (one run of nodes per layer, in order) and ``suffix`` (final norm, head, loss, output)."""

    prefix: list[fx.Node]
    layers: list[list[fx.Node]]
    suffix: list[fx.Node]


def _layer_index(node: fx.Node, name: str) -> int | None:
    """The index of the layer of ``name`` that ``node`` was traced in (Dynamo's ``nn_module_stack``:
    ``L['self'].transformer.h.3`` or ``...h[3]``), else None."""
    pattern = re.compile(r"(?:^|\.)" + re.escape(name) + r"\.(\d+)$")
    for entry in (node.meta.get("nn_module_stack") or {}).values():
        path = entry[0] if isinstance(entry, tuple) else str(entry)
        path = re.sub(r"\[(\d+)\]", r".\1", re.sub(r"^L\['self'\]\.?", "", path))
        m = pattern.search(path)
        if m:
            return int(m.group(1))
    return None


def segments(gm: fx.GraphModule, name: str, kept: int) -> Segments:
    """Cut ``gm`` (an export of a model whose stack ``name`` holds ``kept`` layers) into `Segments`.

    Raises:
        NotRepeatable: the layers' nodes are not ``kept`` runs, in order, between a prefix and a
            suffix that belong to no layer."""
    prefix, layers, suffix = [], [], []
    for node in gm.graph.nodes:
        k = _layer_index(node, name)
        if k is None:
            (suffix if layers else prefix).append(node)
        elif suffix or k not in (len(layers) - 1, len(layers)):
            raise NotRepeatable(f"the nodes of layer {k} of {name} are not one run between the layers before "
                                "and after it")
        elif k == len(layers):
            layers.append([node])
        else:
            layers[-1].append(node)
    if len(layers) != kept:
        raise NotRepeatable(f"{len(layers)} of the {kept} layers of {name} have nodes in the graph")
    return Segments(prefix, layers, suffix)


def _names(model: nn.Module) -> dict[int, str]:
    """Qualified name of each parameter and buffer of ``model``, by id (the first name where tied)."""
    names: dict[int, str] = {}
    for n, t in list(model.named_parameters(remove_duplicate=False)) + list(model.named_buffers(remove_duplicate=False)):
        names.setdefault(id(t), n)
    return names


def _describe(nodes: list[fx.Node], before: list[fx.Node] | None, outer: set[fx.Node], tensor_name, layer: str):
    """What a layer's nodes compute, independent of which layer they are: per node its op, target
    (a parameter or buffer by its name within the layer), constants, and each node argument as
    ("own", position), ("before", position in the layer before) or ("outer", the prefix's node).

    Raises:
        NotRepeatable: a node reads another layer than its own and the one before it."""
    own = {n: k for k, n in enumerate(nodes)}
    prev = {n: k for k, n in enumerate(before or [])}

    def ref(a):
        if isinstance(a, fx.Node):
            if a in own:
                return ("own", own[a])
            if a in prev:
                return ("before", prev[a])
            if a in outer:
                return ("outer", a.name)
            raise NotRepeatable(f"{a.name} is read by a layer two or more layers after its own")
        if isinstance(a, (tuple, list)):
            return type(a)(ref(x) for x in a)
        if isinstance(a, dict):
            return tuple((k, ref(v)) for k, v in a.items())
        if isinstance(a, slice):
            return ("slice", ref(a.start), ref(a.stop), ref(a.step))
        return ("const", type(a).__name__, repr(a))

    out = []
    for n in nodes:
        target = n.target
        if n.op == "get_attr":
            full = tensor_name(n.target)
            target = full[len(layer) + 1:] if full.startswith(layer + ".") else ("outer", full)
        out.append((n.op, target, ref(n.args), ref(dict(n.kwargs))))
    return out


# ----------------------------------------------------------------------------------------------
# the deep graph
# ----------------------------------------------------------------------------------------------


def _flat(name: str) -> str:
    return "p_" + name.replace(".", "_")


def _tensor_names(gm: fx.GraphModule, small: nn.Module):
    """``tensor_name(attribute)``: the qualified name in ``small`` of the parameter or buffer that
    ``gm`` (an export of ``small``) holds as ``attribute``.

    Raises (when called):
        NotRepeatable: ``gm`` reads a tensor that is no parameter or buffer of ``small``."""
    small_names = _names(small)
    attr_name = {attr: small_names[id(t)]
                 for attr, t in list(gm.named_parameters(remove_duplicate=False)) + list(gm.named_buffers(remove_duplicate=False))
                 if id(t) in small_names}

    def tensor_name(target: str) -> str:
        if target not in attr_name:
            raise NotRepeatable(f"the graph reads {target}, which is no parameter or buffer of the model")
        return attr_name[target]
    return tensor_name


def _check_repeats(seg: Segments, name: str, tensor_name) -> None:
    """Raise `NotRepeatable` unless every layer of ``seg`` after the first is the same nodes as
    layer 1 (`_describe`) and the suffix reads no layer but the last."""
    outer = set(seg.prefix)
    template = _describe(seg.layers[1], seg.layers[0], outer, tensor_name, f"{name}.1")
    for k in range(2, len(seg.layers)):
        other = _describe(seg.layers[k], seg.layers[k - 1], outer, tensor_name, f"{name}.{k}")
        if other != template:
            diff = next((i for i, (a, b) in enumerate(zip(template, other)) if a != b), min(len(template), len(other)))
            where = seg.layers[k][diff].name if diff < len(seg.layers[k]) else "its end"
            raise NotRepeatable(f"layer {k} of {name} is not layer 1's nodes again (first difference at {where})")
    last = set(seg.layers[-1])
    for n in seg.suffix:
        for a in n.all_input_nodes:
            if a not in outer and a not in last and a not in seg.suffix:
                raise NotRepeatable(f"{n.name} after the layers reads {a.name} of a layer before the last")


class _DeepGraph:
    """The deep model's graph being written from the copy's: nodes copied with the parameters and
    buffers they read renamed from the copy's layer to the deep model's (`copy_node`), registered
    on ``root`` under flat names, in first-use order."""

    def __init__(self, gm: fx.GraphModule, model: nn.Module, name: str, tensor_name):
        self.name, self.tensor_name = name, tensor_name
        self.tensors = dict(model.named_parameters(remove_duplicate=False))
        self.tensors.update(model.named_buffers(remove_duplicate=False))
        self.root = nn.Module()
        self.used: dict[str, str] = {}  # flat attribute -> model's qualified name
        self.graph = fx.Graph()
        with warnings.catch_warnings():  # torch 2.13's pytree warns of its own LeafSpec when copied
            warnings.filterwarnings("ignore", message=".*LeafSpec.*", category=FutureWarning)
            self.graph._codegen = copy.deepcopy(gm.graph._codegen)

    def attr_of(self, qualified: str) -> str:
        """The flat attribute of the deep model's tensor ``qualified`` (registered on first use).

        Raises:
            NotRepeatable: the model has no such parameter or buffer."""
        if qualified not in self.tensors:
            raise NotRepeatable(f"the model has no parameter or buffer {qualified}")
        flat = _flat(qualified)
        if flat not in self.used:
            self.used[flat] = qualified
            t = self.tensors[qualified]
            (self.root.register_parameter if isinstance(t, nn.Parameter) else self.root.register_buffer)(flat, t)
        return flat

    def in_layer(self, qualified: str, source: int | None, index: int | None) -> str:
        """``qualified``, read by a node copied from layer ``source`` into layer ``index``: a tensor
        of layer ``source`` becomes the same tensor of layer ``index``; any other stays as it is."""
        own = f"{self.name}.{source}."
        if index is None or not qualified.startswith(own):
            return qualified  # the prefix's, the suffix's, or one the layers share
        return f"{self.name}.{index}.{qualified[len(own):]}"

    def copy_node(self, n: fx.Node, arg, index: int | None, source: int | None = None) -> fx.Node:
        """``n`` copied (its inputs mapped by ``arg``) from the copy's layer ``source`` into the deep
        model's layer ``index`` (None: outside the layers)."""
        new = self.graph.node_copy(n, arg)
        if n.op == "get_attr":
            new.target = self.attr_of(self.in_layer(self.tensor_name(n.target), source, index))
        return new


def repeat_layers(gm: fx.GraphModule, small: nn.Module, model: nn.Module, name: str, count: int) -> fx.GraphModule:
    """The export of ``model`` (whose ``nn.ModuleList`` ``name`` holds ``count`` identical layers)
    written from ``gm``, an export of ``small`` (`shallow_copy` of ``model`` with `KEEP` of them):
    its prefix, first layer, its second layer's nodes once for each of layers 1 to ``count - 1``, and
    its suffix reading the last.  Parameters and buffers are ``model``'s own, in ``model``'s order.

    Raises:
        NotRepeatable: ``gm`` is not such a graph (`segments`), or its layers after the first are not
            the same nodes (the message names the first that differs)."""
    from monet.frontend import _canonical_order

    kept = len(small.get_submodule(name))
    if kept < 3 or count < kept:
        raise NotRepeatable(f"{kept} layers of {name} exported for {count}: need at least 3, at most {count}")
    seg = segments(gm, name, kept)
    tensor_name = _tensor_names(gm, small)
    _check_repeats(seg, name, tensor_name)
    deep = _DeepGraph(gm, model, name, tensor_name)
    env: dict[fx.Node, fx.Node] = {}
    for n in seg.prefix:
        env[n] = deep.copy_node(n, lambda a: env[a], None)
    previous = []
    for n in seg.layers[0]:
        env[n] = deep.copy_node(n, lambda a: env[a], 0, 0)
        previous.append(env[n])
    source, before = seg.layers[1], {n: k for k, n in enumerate(seg.layers[0])}
    for index in range(1, count):  # layer 1's nodes again, each reading the layer before it
        local: dict[fx.Node, fx.Node] = {}

        def arg(a, local=local, previous=previous):
            if a in local:
                return local[a]
            return previous[before[a]] if a in before else env[a]

        for n in source:
            local[n] = deep.copy_node(n, arg, index, 1)
        previous = [local[n] for n in source]
    for k, n in enumerate(seg.layers[-1]):
        env[n] = previous[k]
    for n in seg.suffix:  # a tensor of the copy's last layer is the deep model's last layer's
        env[n] = deep.copy_node(n, lambda a: env[a], count - 1, kept - 1)
    out = fx.GraphModule(deep.root, deep.graph)
    out.meta.update(getattr(gm, "meta", {}))
    _canonical_order(out, model)
    return out


@dataclass
class _Kept:
    """The copy the last `export_stack(keep_copy=True)` exported: ``model`` a weak reference to the
    deep model, ``name`` its stack's, ``copy`` the `KEEP`-layer copy, ``key`` the call key
    (`monet.frontend.call_key`) it was exported for, ``export`` its export until taken (None
    after)."""

    model: weakref.ref
    name: str
    copy: nn.Module
    key: object
    export: object


#: the kept copy (at most one), until `take_copy` or `forget_copy`
_KEPT: list[_Kept] = []


def export_stack(model: nn.Module, inputs, log=None, keep_copy: bool = False):
    """``monet.frontend.export(model, inputs)``, written from the export of a `KEEP`-layer copy
    (`repeat_layers`) where ``model`` has a stack of at least `MIN_LAYERS` identical layers and its
    graph repeats; else exported whole (``model`` is then exported as it is, or the export kept
    for it is taken: `take_copy`).  ``log``: a callable taking one line for the log.
    ``keep_copy``: keep the copy and its export for `take_copy` (the costs measure on that copy),
    until `forget_copy`; it holds `KEEP` layers' parameters.

    Raises:
        monet.frontend.CaptureError: as `monet.frontend.export`."""
    from monet import mixed_precision
    from monet.frontend import export
    from monet.inputs import call_key

    key = call_key(inputs, mixed_precision.current(inputs.first.device.type))
    kept = _KEPT[0] if _KEPT else None
    if kept is not None and kept.copy is model and kept.key == key and kept.export is not None:
        gm, kept.export = kept.export, None  # taken once: a capture may rewrite it in place
        return gm
    found = repeated_layers(model)
    if found is None:
        return export(model, inputs)
    name, count = found
    t0 = time.perf_counter()
    small = shallow_copy(model, name, KEEP)
    small_gm = export(small, inputs)
    try:
        gm = repeat_layers(small_gm, small, model, name, count)
    except NotRepeatable as e:
        if log is not None:
            log(f"{name}: {e}; exporting all {count} layers")
        return export(model, inputs)
    if log is not None:
        log(f"exported {KEEP} of the {count} layers of {name} and repeated the second "
            f"({time.perf_counter() - t0:.1f} s)")
    if keep_copy:
        _KEPT[:] = [_Kept(weakref.ref(model), name, small, key, small_gm)]
    return gm


def take_copy(model: nn.Module, name: str, keep: int) -> nn.Module | None:
    """The `KEEP`-layer copy of ``model``'s stack ``name`` that `export_stack` kept (``keep_copy``),
    if it kept one for this model with ``keep`` layers, else None.  Capturing it with the inputs
    the model was captured with reuses its export (`export_stack`)."""
    kept = _KEPT[0] if _KEPT else None
    if kept is not None and kept.model() is model and kept.name == name and len(kept.copy.get_submodule(name)) == keep:
        return kept.copy
    return None


def forget_copy() -> None:
    """Drop the copy `export_stack` kept (its parameters)."""
    _KEPT.clear()


__all__ = ["KEEP", "MIN_LAYERS", "NotRepeatable", "Segments", "export_stack", "forget_copy", "repeat_layers",
           "repeated_layers", "segments", "shallow_copy", "take_copy"]
