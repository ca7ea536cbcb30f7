"""A captured joint graph as data (`graph_to_json`) and back (`graph_from_json`), with fake tensors
of the recorded device, so that a trace replays on any machine without the model's code."""
from __future__ import annotations


import numpy as np
import torch
import torch.fx as fx

from monet import compat
from monet.graph import op_name
from monet.profiling.trace_format import TraceFormatError, TraceMismatchError


# ---- the captured joint graph, as data: replayed with fake tensors of the recorded device, so a
# CUDA graph (its attention kernels are CUDA ops: a capture on the meta device decomposes GPT-2's
# scaled_dot_product_attention into matmuls instead) is simulated as it was recorded, on any machine


def _target_name(n: fx.Node) -> str:
    import operator

    if n.target is operator.getitem:
        return "operator.getitem"
    name = op_name(n)  # "aten.convolution.default" for an operator overload
    if name.count(".") < 2 or name.startswith("monet."):
        raise TraceFormatError(f"cannot record the graph's target {n.target!r}: only operator overloads and getitem")
    return name


def _resolve_target(name: str):
    import operator

    if name == "operator.getitem":
        return operator.getitem
    ns, *op, overload = name.split(".")
    try:
        return getattr(getattr(getattr(torch.ops, ns), ".".join(op)), overload)
    except (AttributeError, RuntimeError):
        raise TraceFormatError(f"operator {name} is not known to torch {torch.__version__}") from None


_ENUMS = {"mf": torch.memory_format, "layout": torch.layout}


def _enc(a):
    if isinstance(a, fx.Node):
        return {"n": a.name}
    if isinstance(a, bool) or a is None or isinstance(a, (int, str)):
        return a
    if isinstance(a, float):
        return a if np.isfinite(a) else {"f": repr(a)}
    if isinstance(a, tuple):
        return {"t": [_enc(x) for x in a]}
    if isinstance(a, list):
        return {"l": [_enc(x) for x in a]}
    if isinstance(a, dict):
        return {"d": {k: _enc(v) for k, v in a.items()}}
    if isinstance(a, torch.dtype):
        return {"dtype": str(a).removeprefix("torch.")}
    if isinstance(a, torch.device):
        return {"device": str(a)}
    if isinstance(a, torch.memory_format):
        return {"mf": str(a).removeprefix("torch.")}
    if isinstance(a, torch.layout):
        return {"layout": str(a).removeprefix("torch.")}
    if isinstance(a, torch.Tensor):
        return {"T": [list(a.shape), list(a.stride()), str(a.dtype).removeprefix("torch."), int(a.storage_offset()),
                      int(a.untyped_storage().nbytes()), str(a.device)]}
    raise TraceFormatError(f"cannot record the graph value {a!r} ({type(a).__name__})")


def _dec(a, env: dict, fake):
    if isinstance(a, list):  # a bare JSON list does not occur: lists and tuples are tagged
        raise TraceFormatError("malformed graph in the trace")
    if not isinstance(a, dict):
        return a
    (key, v), = a.items()
    if key == "n":
        return env[v]
    if key == "t":
        return tuple(_dec(x, env, fake) for x in v)
    if key == "l":
        return [_dec(x, env, fake) for x in v]
    if key == "d":
        return {k: _dec(x, env, fake) for k, x in v.items()}
    if key == "f":
        return float(v)
    if key == "dtype":
        return getattr(torch, v)
    if key == "device":
        return torch.device(v)
    if key in _ENUMS:
        return getattr(torch, v)
    if key == "T":
        shape, stride, dtype, offset, nbytes, device = v
        storage = torch.empty(nbytes, dtype=torch.uint8, device="meta").untyped_storage()
        meta = torch.empty(0, dtype=getattr(torch, dtype), device="meta").set_(storage, offset, shape, stride)
        return compat.fake_tensor_on(fake, meta, device)
    raise TraceFormatError(f"malformed graph in the trace (key {key!r})")


def graph_to_json(graph) -> dict:
    """The captured joint graph of an `OpGraph` as data (``meta.graph.joint`` of a trace): per FX
    node its kind, name, target, arguments and traced value (shapes, strides, dtypes, storage bytes,
    device), with the number of forward outputs, the primals' kinds and the autocast setting.

    Raises:
        TraceFormatError: a node whose target or argument cannot be written (not an ATen operator).
    """
    nodes = []
    for n in graph.joint.graph.nodes:
        target = _target_name(n) if n.op == "call_function" else n.target
        nodes.append([n.op, n.name, target, _enc(n.args), _enc(n.kwargs), _enc(n.meta.get("val"))])
    return {"nodes": nodes, "num_fwd_outputs": graph.num_fwd_outputs, "primal_kinds": dict(graph.primal_kinds),
            "autocast": list(graph.autocast) if graph.autocast else None}


def graph_from_json(doc: dict, fingerprint: str | None = None, capability=None):
    """The `OpGraph` `graph_to_json` wrote, rebuilt with fake tensors on the recorded devices (no GPU
    needed, nothing allocated): ``build_opgraph`` of the joint graph, its device ("cuda" for a CUDA
    recording) and ``cuda_capability``.

    Raises:
        TraceMismatchError: the rebuilt graph's fingerprint is not ``fingerprint``.
        TraceFormatError: an operator this torch does not know, or a malformed graph.
    """
    from monet.graph import build_opgraph

    fake = compat.fake_mode()
    graph, env, root = fx.Graph(), {}, torch.nn.Module()
    for op, name, target, args, kwargs, val in doc["nodes"]:
        a, k = _dec(args, env, fake), _dec(kwargs, env, fake)
        if op == "call_function":
            node = graph.create_node(op, _resolve_target(target), a, k, name=name)
        elif op == "placeholder":
            node = graph.create_node(op, target, (), {}, name=name)
        elif op == "get_attr":
            node = graph.create_node(op, target, (), {}, name=name)
            holder = root
            *path, leaf = target.split(".")
            for part in path:
                if not hasattr(holder, part):
                    holder.add_module(part, torch.nn.Module())
                holder = getattr(holder, part)
            holder.register_buffer(leaf, _dec(val, env, fake) if val is not None else None)
        elif op == "output":
            node = graph.create_node(op, target, a, k, name=name)
        else:
            raise TraceFormatError(f"malformed graph in the trace (node kind {op!r})")
        if node.name != name:
            raise TraceFormatError(f"malformed graph in the trace (node {name} became {node.name})")
        node.meta["val"] = _dec(val, env, fake)
        env[name] = node
    joint = fx.GraphModule(root, graph)
    autocast = tuple(doc["autocast"]) if doc.get("autocast") else None
    out = build_opgraph(joint, doc["num_fwd_outputs"], doc["primal_kinds"], autocast=autocast)
    if fingerprint is not None and out.fingerprint != fingerprint:
        raise TraceMismatchError(f"the trace's graph, rebuilt here, has fingerprint {out.fingerprint[:12]}, the "
                                 f"recording {fingerprint[:12]}: the trace was written by another monet or torch; "
                                 f"record it again")
    if capability is not None:
        out.cuda_capability = tuple(capability)
    return out
