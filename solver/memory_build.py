"""The ILP's memory terms of a graph (`build_memory_model`): the kept-value groups, the forward
pass's rows, the backward stages' reads, outputs and recomputation rows, and the generator states
of random nodes, as `monet.solver.memory_model` defines them."""
from __future__ import annotations

import dataclasses
import operator

import numpy as np

from monet.graph import OpGraph, tensors_in
from monet.profiling.cuda_bytes import memory_terms, sized_graph
from monet.rng import random_op_device, state_meta
from monet.matrices import ancestors
from monet.solver.memory_model import MemoryModel, Option


class _Index:
    """Per-graph lookups: value name -> output slot (a getitem's index, else 0) and -> forward node."""

    def __init__(self):
        self._cache: dict[int, tuple[dict, dict]] = {}

    def _of(self, g: OpGraph):
        if id(g) not in self._cache:
            slots = {n.name: int(n.args[1]) for n in g.joint.graph.find_nodes(op="call_function",
                                                                              target=operator.getitem)}
            self._cache[id(g)] = (slots, g.fwd_node_of())
        return self._cache[id(g)]

    def slot(self, g: OpGraph, name: str) -> int:
        return self._of(g)[0].get(name, 0)

    def node(self, g: OpGraph, name: str) -> int:
        return self._of(g)[1][g.values[name].producer]


def rng_state_bytes(graph: OpGraph) -> np.ndarray:
    """(N,) bytes of the generator state saved for each forward node that draws random numbers
    (0 for the others), on the device it draws on (`monet.rng`; in a graph traced for Inductor
    the draw's output itself, docs/design.md "Note [Random ops compiled]"), counted as the graph's device
    counts a tensor (`monet.profiling.cuda_bytes.memory_terms`): exact on the CPU (5,056 bytes), an
    allocator block on a CUDA graph (512 for a CUDA generator's 16 bytes, 5,120 for the CPU
    generator's 5,056), as the simulator counts the saved state and the one a replay holds."""
    out = np.zeros(len(graph.fwd))
    random = {n.name: n.id for n in graph.fwd if n.random}
    if random:
        terms = memory_terms(graph)
        for fx_node in graph.joint.graph.nodes:
            if fx_node.name in random:
                # compiled: the draw's own output is what is saved (Note [Random ops compiled])
                states = tensors_in(fx_node.meta["val"]) if graph.compiled else [state_meta(random_op_device(fx_node))]
                out[random[fx_node.name]] = sum(terms.tensor(t) for t in states)
    return out


def last_readers(graph: OpGraph):
    """Last forward reader (node id; N = a forward output) and last backward reader of every value."""
    joint, root = graph.joint, graph.alias_root
    N, T = len(graph.fwd), len(graph.bwd)
    fwd_main = {n.name: n.id for n in graph.fwd}
    bwd_main = {n.name: n.id for n in graph.bwd}
    last_f: dict[str, int] = {}
    last_b: dict[str, int] = {}
    for n in joint.graph.nodes:
        if n.op == "call_function" and (n.name in fwd_main or n.name in bwd_main):
            for a in n.all_input_nodes:
                r = root.get(a.name, a.name)
                if n.name in fwd_main:
                    last_f[r] = max(last_f.get(r, -1), fwd_main[n.name])
                else:
                    last_b[r] = max(last_b.get(r, -1), bwd_main[n.name])
    outs = list(next(n for n in joint.graph.nodes if n.op == "output").args[0])
    for o in outs[:graph.num_fwd_outputs]:
        if o is not None:
            last_f[root.get(o.name, o.name)] = N
    for o in outs[graph.num_fwd_outputs:]:
        if o is not None:
            last_b[root.get(o.name, o.name)] = T
    return last_f, last_b


def _bwd_live(graph: OpGraph, last_b: dict | None = None, readers: set | None = None) -> np.ndarray:
    """(T,) bytes of backward values (gradients) live at the start of each backward stage: from
    the stage after the node that makes them to their last backward reader (only values whose
    last reader is in ``readers``, when given)."""
    last_b = last_readers(graph)[1] if last_b is None else last_b
    live = np.zeros(len(graph.bwd))
    for node in graph.bwd:
        for v in node.outputs:
            last = last_b.get(v, node.id)
            if readers is None or last in readers:
                live[node.id + 1:last + 1] += graph.values[v].nbytes
    return live


def _choices(options: list[Option]) -> tuple[list[list[int]], dict[int, int], dict[int, int]]:
    """(each choice's options, in order; forward node -> its choice; governed backward node -> the
    choice that governs it) of ``options``."""
    choices: list[list[int]] = []
    for o, opt in enumerate(options):
        if opt.choice == len(choices):
            choices.append([])
        choices[opt.choice].append(o)
    fwd_choice = {opt.node: opt.choice for opt in options if opt.node >= 0}
    governed = {t: opt.choice for opt in options for t in opt.governed}
    return choices, fwd_choice, governed


class _Groups:
    """The kept-value groups (the columns of S): a value saved under every option of its node is
    common, keyed ``(node, slot)``; one that exists only under one implementation is a group of its
    own, keyed ``(node, slot, impl)``.  ``keys``, ``node``, ``option`` (-1: any), ``saved_bytes``
    per group; ``position``: key -> group; ``of``: a base-graph value's name -> its group."""

    def __init__(self, graph: OpGraph, options: list[Option], choices: list[list[int]], fwd_choice: dict):
        self.index, self.fwd_choice = _Index(), fwd_choice
        self.common = {i: set.intersection(*[set(self._saved_sig(options[o].graph, i)) for o in choices[c]])
                       for i, c in fwd_choice.items()}
        self.keys, self.node, self.option, self.saved_bytes = [], [], [], []
        self.position: dict = {}
        self.of: dict[str, int] = {}
        for node in graph.fwd:
            for v in node.saved:
                k = self.key(graph, v)
                opt = -1 if len(k) == 2 else choices[fwd_choice[node.id]][0]
                self.of[v] = self._add(k, node.id, opt, graph.values[v].nbytes)
        for o, opt in enumerate(options):
            if opt.node < 0 or opt.impl == "default":
                continue
            for v in opt.graph.fwd[opt.node].saved:
                k = self.key(opt.graph, v)
                if len(k) == 3:
                    self._add(k, opt.node, o, opt.graph.values[v].nbytes)

    def _saved_sig(self, g: OpGraph, i: int) -> dict:
        return {(self.index.slot(g, v), g.values[v].nbytes): v for v in g.fwd[i].outputs}

    def _add(self, key, node: int, option: int, nbytes: int) -> int:
        if key not in self.position:
            self.position[key] = len(self.keys)
            self.keys.append(key)
            self.node.append(node)
            self.option.append(option)
            self.saved_bytes.append(nbytes)
        return self.position[key]

    def key(self, g: OpGraph, name: str) -> tuple:
        """The group key of a value of graph ``g`` (the base graph or an option's variant)."""
        i = self.index.node(g, name)
        slot = self.index.slot(g, name)
        if i not in self.fwd_choice or (slot, g.values[name].nbytes) in self.common[i]:
            return (i, slot)
        return (i, slot, g.impls.get(f"fwd:{i}", "default"))


def _forward_memory(graph: OpGraph, options: list[Option], groups: _Groups, fws: np.ndarray,
                    last_f: dict, constant: float) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``fwd_const`` (N,), ``fwd_keep`` (N, G), ``fwd_opt`` (N, O): the bytes live while each
    forward node runs (module docstring, "Forward pass"); ``fws`` (N,) the base graph's
    workspace, ``constant`` the bytes of parameters, buffers, inputs, tangents and libraries.

    Raises:
        ValueError: an option's own value read by a forward node."""
    N, G, O = len(graph.fwd), len(groups.keys), len(options)
    fwd_const, fwd_keep, fwd_opt = np.zeros(N), np.zeros((N, G)), np.zeros((N, O))
    for node in graph.fwd:
        for v in node.outputs:
            b = graph.values[v].nbytes
            specific = node.id in groups.fwd_choice and len(groups.key(graph, v)) == 3
            last = last_f.get(v, node.id)
            if specific and last > node.id:
                raise ValueError(f"value {v} of forward node {node.id} depends on its implementation but a "
                                 f"forward node reads it")
            fwd_const[node.id + 1:last + 1] += b
            if v in groups.of and not specific:
                fwd_keep[last + 1:, groups.of[v]] += b
            if not specific:
                fwd_const[node.id] += b
        if node.id not in groups.fwd_choice:
            fwd_const[node.id] += fws[node.id]
    for o, opt in enumerate(options):
        if opt.node < 0:
            continue
        g, i = opt.graph, opt.node
        for v in g.fwd[i].outputs:
            k = groups.key(g, v)
            if len(k) == 3:
                fwd_opt[i, o] += g.values[v].nbytes
                if k in groups.position:
                    fwd_keep[i + 1:, groups.position[k]] += g.values[v].nbytes
        fwd_opt[i, o] += max(0.0, float(opt.fwd_workspace[i]))
    fwd_const += constant - graph.tangent_bytes + graph.fwd_tangent_bytes  # see OpGraph.fwd_tangent_bytes
    return fwd_const, fwd_keep, fwd_opt


def _options_live(graph: OpGraph, options: list[Option], last_b: dict) -> np.ndarray:
    """``live_opt`` (T, O): what each option changes in the backward values live at the start of
    each stage.

    Backward values whose lifetimes an option changes: in MobileNetV2 (in-place ReLU6) the base
    graph clones each ReLU6 input at the start of the backward pass and holds it until the
    ReLU6's backward, 29 % of the plain peak at stage 40, where the 1-bit mask variant holds
    none; counted from the base graph alone, the joint ILP's memory of the mask schedule was
    0.957 of the plain peak where the variant graph's own was 0.663.  An option adds its variant
    graph's difference over the values whose last reader is a backward node of its own choice
    (a variant graph differs from the base graph elsewhere too: each ReLU6 mask variant of
    MobileNetV2 holds none of the clones, so whole-graph differences counted them 35 times)."""
    T = len(graph.bwd)
    live_opt = np.zeros((T, len(options)))
    own: dict[int, set] = {}
    for opt in options:
        own.setdefault(opt.choice, set()).update(opt.governed)
    for o, opt in enumerate(options):
        if opt.impl != "default" and len(opt.graph.bwd) == T and own[opt.choice]:
            live_opt[:, o] = (_bwd_live(opt.graph, readers=own[opt.choice])
                              - _bwd_live(graph, last_b, readers=own[opt.choice]))
    return live_opt


def _backward_outputs(graph: OpGraph, options: list[Option], governed: dict, bws: np.ndarray) \
        -> tuple[np.ndarray, np.ndarray]:
    """``bwd_extra`` (T,), ``bwd_opt`` (T, O): each backward node's outputs and workspace (``bws``,
    the base graph's), under the option chosen where an option governs the node."""
    bwd_extra = np.array([n.out_bytes for n in graph.bwd], dtype=float) + bws
    bwd_opt = np.zeros((len(graph.bwd), len(options)))
    for t in governed:
        bwd_extra[t] = 0.0
    for o, opt in enumerate(options):
        for t in opt.governed:
            bwd_opt[t, o] = opt.graph.bwd[t].out_bytes + max(0.0, float(opt.bwd_workspace[t]))
    return bwd_extra, bwd_opt


def _recompute_memory(graph: OpGraph, options: list[Option], fws: np.ndarray, rng_bytes: np.ndarray) \
        -> tuple[np.ndarray, np.ndarray, list]:
    """``out_bytes`` (N,) of a recomputed node (the larger of its options'), ``fwd_workspace`` (N,)
    while recomputing it (a choice node's in ``rec_ws`` instead: (node, option, bytes)), plus the
    generator's current state that a recomputed random node holds while it replays the saved one."""
    out_bytes = np.array([n.out_bytes for n in graph.fwd], dtype=float)
    rec_ws = []
    fws_rec = fws.copy()
    for o, opt in enumerate(options):
        if opt.node >= 0:
            out_bytes[opt.node] = max(out_bytes[opt.node], opt.graph.fwd[opt.node].out_bytes)
            fws_rec[opt.node] = 0.0
            if opt.fwd_workspace[opt.node] > 0:
                rec_ws.append((opt.node, o, float(opt.fwd_workspace[opt.node]) + rng_bytes[opt.node]))
    return out_bytes, fws_rec + rng_bytes, rec_ws


def _stage_reads(graph: OpGraph, options: list[Option], groups: _Groups, choices: list[list[int]],
                 governed: dict, out_bytes: np.ndarray) -> dict:
    """What each stage reads: ``reads`` (rows of (t, group, option or -1)), ``bwd_read_group``
    (T, G), ``bwd_read_bytes`` (T, N: the bytes of node i's values that backward node t reads, at
    most its outputs) and ``read_edges`` (rows of (group, forward node reading it when it is
    recomputed))."""
    N, T, G = len(graph.fwd), len(graph.bwd), len(groups.keys)
    reads = []
    for t, node in enumerate(graph.bwd):
        if t in governed:
            for o in choices[governed[t]]:
                g = options[o].graph
                reads += [(t, groups.position[groups.key(g, v)], o) for v in g.bwd[t].reads]
        else:
            reads += [(t, groups.of[v], -1) for v in node.reads]
    reads = np.array(reads, dtype=int).reshape(-1, 3)
    gnode = np.array(groups.node, dtype=int)
    bwd_read_group = np.zeros((T, G), dtype=bool)
    bwd_read_group[reads[:, 0], reads[:, 1]] = True
    rt, rg = np.nonzero(bwd_read_group)
    bwd_read_bytes = np.zeros((T, N))
    np.add.at(bwd_read_bytes, (rt, gnode[rg]), np.array(groups.saved_bytes, dtype=float)[rg])
    # a compiled step's recomputed random op reads its saved draws, not its inputs (docs/design.md,
    # "Note [Random ops compiled]")
    read_edges = np.array(sorted({(groups.of[v], node.id) for node in graph.fwd for v in node.reads
                                  if not (graph.compiled and node.random)}), dtype=int).reshape(-1, 2)
    return dict(reads=reads, bwd_read_group=bwd_read_group, read_edges=read_edges,
                bwd_read_bytes=np.minimum(bwd_read_bytes, out_bytes[None, :]))


def build_memory_model(graph: OpGraph, fwd_workspace=None, bwd_workspace=None,
                       options: list[Option] | None = None) -> MemoryModel:
    """The `MemoryModel` of a graph, with per-node workspace in bytes (None = zero): its groups
    (`_Groups`), the forward pass (`_forward_memory`), the backward stages (`_bwd_live`,
    `_options_live`, `_backward_outputs`), recomputation (`_recompute_memory`) and what each stage
    reads (`_stage_reads`).

    Args:
        graph: the base graph (PyTorch's implementations).
        fwd_workspace, bwd_workspace: (N,), (T,) bytes of temporaries in the base graph.
        options: implementation options (`solver.choices.implementation_options`); each choice's
            options in a row, its first option ``"default"``.  None: no choices (``normal`` mode).

    Raises:
        ValueError: an option whose own values are read by a forward node (implementations may
            only add values that backward nodes read).
    """
    options = options or []
    # bytes as the device counts them (CUDA: allocator blocks, library workspaces; CPU: unchanged),
    # the same sizes the simulator uses (`monet.profiling.cuda_bytes.sized_graph`)
    given_options, graph = options, sized_graph(graph)
    options = [o if sized_graph(o.graph) is o.graph else dataclasses.replace(o, graph=sized_graph(o.graph))
               for o in options]
    N, T = len(graph.fwd), len(graph.bwd)
    fws = np.zeros(N) if fwd_workspace is None else np.maximum(np.asarray(fwd_workspace, dtype=float), 0)
    bws = np.zeros(T) if bwd_workspace is None else np.maximum(np.asarray(bwd_workspace, dtype=float), 0)
    last_f, last_b = last_readers(graph)
    choices, fwd_choice, governed = _choices(options)
    groups = _Groups(graph, options, choices, fwd_choice)
    constant = graph.param_bytes + graph.buffer_bytes + graph.input_bytes + graph.tangent_bytes + graph.library_bytes
    fwd_const, fwd_keep, fwd_opt = _forward_memory(graph, options, groups, fws, last_f, constant)
    rng_bytes = rng_state_bytes(graph)
    bwd_extra, bwd_opt = _backward_outputs(graph, options, governed, bws)
    out_bytes, fws_rec, rec_ws = _recompute_memory(graph, options, fws, rng_bytes)
    return MemoryModel(fwd_const=fwd_const, fwd_keep=fwd_keep, fwd_opt=fwd_opt,
                       bwd_const=constant + graph.output_bytes + _bwd_live(graph, last_b),
                       bwd_extra=bwd_extra, bwd_opt=bwd_opt, live_opt=_options_live(graph, options, last_b),
                       saved_bytes=np.array(groups.saved_bytes, dtype=float), out_bytes=out_bytes,
                       fwd_workspace=fws_rec, constant=constant, groups=groups.keys,
                       group_node=np.array(groups.node, dtype=int), group_of=groups.of,
                       group_option=np.array(groups.option, dtype=int), rec_ws=rec_ws,
                       options=given_options, choices=choices, rng_state_bytes=rng_bytes,
                       ancestors=ancestors(graph),
                       **_stage_reads(graph, options, groups, choices, governed, out_bytes))
