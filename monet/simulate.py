"""The memory simulator: replay the executor's forward and backward modules op by op.

It reads the very FX graphs of the modules `monet.executor.build_modules` hands to AOTAutograd
(`monet.executor.build_graphs`: the same graphs, without their generated code), so its accounting
follows what runs: each op allocates its outputs (bytes from the traced shapes and dtypes) plus its
workspace for the duration of the op; a storage is freed after the last use of any of its aliases
(FX frees a value after its last use; a view keeps its base alive); the backward module's inputs
are freed the same way (boxed calling convention).  Constant bytes: parameters, buffers and the
input for the whole iteration, the gradient of the outputs (allocated by the caller), and the
outputs themselves, which the caller holds during the backward pass.

Offloaded values (`monet.offload`) are on the host between ``offload`` and ``prefetch``: the
outputs of ``offload`` / ``offload_done`` and the backward module's host inputs count 0 bytes,
``prefetch`` allocates the value again, ``fetched`` is an alias of it.

Peak memory here is the quantity docs/design.md ("Measuring") measures: bytes allocated by tensors during one forward
plus backward, after warm-up, with parameter gradients set to None beforehand.

`schedule_peak` is the one peak function of a schedule: every other peak is derived from it
(`monet.solver.finish.simulated_peak_fn`, the solver's view on its matrices) or tested against it
(`monet.solver.memory_model.MemoryModel.peak`, the ILP's linear upper bound).
"""
from __future__ import annotations

import operator
from dataclasses import dataclass
from typing import Callable

import torch
import torch.fx as fx

from monet.executor import build_graphs, is_symbolic
from monet.graph import OpGraph, TANGENT, is_alias, tensor_bytes, tensors_in
from monet.inplace import aliases_first, is_inplace, storage_root
from monet.solution import Schedule


@dataclass
class SimResult:
    """Simulated peak memory, in bytes.

    ``peak_bytes`` over the whole iteration (constants included); ``fwd_peak_bytes`` and
    ``bwd_peak_bytes`` per pass; ``constant_bytes`` = parameters + buffers + input + output
    gradient (during the forward pass only `OpGraph.fwd_tangent_bytes` of the gradient) + what the
    device's libraries hold (`OpGraph.library_bytes`: CUDA's BLAS workspaces); ``saved_bytes``: what
    the forward hands to the backward; ``peak_at``: the FX node at the peak.  ``timeline``: with
    ``simulate(..., timeline=True)``, one `TimelineRow` per ``call_function`` node of the forward
    module, then of the backward module, in execution order; else None.
    """

    peak_bytes: int
    fwd_peak_bytes: int
    bwd_peak_bytes: int
    constant_bytes: int
    saved_bytes: int
    peak_at: str
    timeline: list | None = None


@dataclass
class TimelineRow:
    """One FX node of the replay, bytes live over the whole iteration (constants included).

    Attributes:
        pass_: ``"forward"`` or ``"backward"``.
        name: the FX node's name in its module.
        peak_bytes: bytes allocated while the node runs: what is live before it, its outputs and its
            workspace (for a view, a getitem or an op that allocates nothing: what is live).
        after_bytes: bytes live after it, once the values whose last use it is are freed.
        outputs_bytes: bytes its outputs take (0 for views and in-place ops).
        workspace_bytes: the workspace counted while it runs.
    """

    pass_: str
    name: str
    peak_bytes: int
    after_bytes: int
    outputs_bytes: int
    workspace_bytes: int


def replay(graph: fx.Graph, workspace: Callable[[fx.Node], int], held: set[str],
           live: dict[str, int], nbytes: Callable[[object], int] = tensor_bytes,
           timeline: list | None = None) -> tuple[int, str, dict[str, int]]:
    """Replay one FX graph; return (peak of tracked bytes, node at the peak, bytes live at the end).

    Args:
        graph: the module's graph; nodes carry ``meta['val']``.
        workspace: bytes of temporary memory an op needs while it runs.
        held: storage roots never freed here (primals, tangents: owned by the caller).
        live: storages live on entry (root name -> bytes), e.g. the saved tensors; updated.
        nbytes: bytes one (fake) tensor takes (`monet.graph.tensor_bytes`; on CUDA its allocator
            block, `monet.profiling.cuda_bytes.MemoryTerms.tensor`).
        timeline: when a list, one `TimelineRow` per ``call_function`` node is appended (bytes
            tracked here, without the caller's constants; ``pass_`` left empty).
    """
    nodes = list(graph.nodes)
    pos = {n: k for k, n in enumerate(nodes)}
    out = next(n for n in nodes if n.op == "output")
    last: dict[str, int] = {}
    for n in nodes:
        for a in n.all_input_nodes:
            r = storage_root(a).name
            last[r] = max(last.get(r, -1), len(nodes) if n is out else pos[n])
    dies_at: dict[int, list[str]] = {}  # node position -> storages whose last reader it is
    for r, at in last.items():
        dies_at.setdefault(at, []).append(r)
    peak, peak_at = sum(live.values()), "start"
    for k, n in enumerate(nodes):
        outs, ws, now = {}, 0, None
        if n.op == "call_function" and not is_alias(n) and not is_inplace(n) and not aliases_first(n):
            val = n.meta.get("val")
            multi = isinstance(val, (tuple, list))
            if multi:
                getitems = {u.args[1]: u.name for u in n.users if u.target is operator.getitem}
                outs = {getitems.get(j, f"{n.name}#{j}"): nbytes(t) if t is not None else 0
                        for j, t in enumerate(val) if isinstance(t, torch.Tensor)}
            elif getattr(n.target, "host_output", False):  # a copy in host memory (`monet.offload`)
                outs = {n.name: 0}
            else:
                outs = {n.name: sum(nbytes(t) for t in tensors_in(val))}
            ws = max(0, int(workspace(n)))
            now = sum(live.values()) + sum(outs.values()) + ws
            if now > peak:
                peak, peak_at = now, n.name
            live.update(outs)
            for name in outs:  # outputs nobody reads die with the op, or with its tuple (FX frees the
                if name not in last and name not in held:  # tuple after its last getitem)
                    if multi and n.name in last:
                        dies_at.setdefault(last[n.name], []).append(name)
                    else:
                        live.pop(name, None)
        elif timeline is not None and n.op == "call_function":
            now = sum(live.values())
        for r in dies_at.get(k, ()):  # was a scan of `last` per node: 153 s of GoogLeNet's 158 s
            if r not in held:
                live.pop(r, None)
        if timeline is not None and n.op == "call_function":
            timeline.append(TimelineRow("", n.name, now, sum(live.values()), sum(outs.values()), ws))
    return peak, peak_at, live


def _workspace_of(graph: OpGraph, terms, fwd_workspace, bwd_workspace):
    """``ws(node) -> bytes``: the workspace a node of the executor's modules holds while it runs, the
    node's entry of ``fwd_workspace`` (N,) or ``bwd_workspace`` (T,) (by its ``monet`` tag, else by
    its name; None: zero), plus a replayed random op's generator state (`monet.rng`)."""
    fwd_id = {n.name: n.id for n in graph.fwd}
    bwd_id = {n.name: n.id for n in graph.bwd}

    def node_ws(n: fx.Node) -> int:
        tag = n.meta.get("monet")
        if tag is None:
            if n.name in fwd_id and fwd_workspace is not None:
                return int(fwd_workspace[fwd_id[n.name]])
            if n.name in bwd_id and bwd_workspace is not None:
                return int(bwd_workspace[bwd_id[n.name]])
            return 0
        kind, i = tag
        if kind == "fwd" and fwd_workspace is not None:
            return int(fwd_workspace[i])
        if kind == "bwd" and bwd_workspace is not None:
            return int(bwd_workspace[i])
        return 0

    def ws(n: fx.Node) -> int:
        # a replayed random op (`monet.rng`) holds the generator's own state: a tensor, so a block
        return node_ws(n) + terms.block(getattr(n.target, "scratch_bytes", 0))

    return ws


def simulate(graph: OpGraph, fw: fx.GraphModule | fx.Graph, bw: fx.GraphModule | fx.Graph,
             fwd_workspace=None, bwd_workspace=None, timeline: bool = False) -> SimResult:
    """Simulated peak of one iteration of the executor's modules (bytes).

    Bytes are counted as the graph's device counts them (`monet.profiling.cuda_bytes.memory_terms`):
    exact tensor bytes on CPU; on CUDA each tensor as its allocator block, plus the BLAS libraries'
    workspaces held through the step.

    Args:
        graph: the `OpGraph` the modules were built from.
        fw, bw: `monet.executor.build_modules`'s result, or `monet.executor.build_graphs`'s.
        fwd_workspace, bwd_workspace: per-node workspace in bytes, indexed by forward / backward
            node id (arrays of length N and T); None means zero.
        timeline: also return the per-node `TimelineRow` list (``SimResult.timeline``), bytes over
            the whole iteration as the peaks are.
    """
    from monet.profiling.cuda_bytes import memory_terms, sized_graph

    fw_graph = fw.graph if isinstance(fw, fx.GraphModule) else fw
    bw_graph = bw.graph if isinstance(bw, fx.GraphModule) else bw
    terms = memory_terms(graph)
    sized = sized_graph(graph)
    ws = _workspace_of(graph, terms, fwd_workspace, bwd_workspace)
    constant = (sized.param_bytes + sized.buffer_bytes + sized.input_bytes + sized.tangent_bytes
                + sized.library_bytes)
    fwd_constant = constant - sized.tangent_bytes + sized.fwd_tangent_bytes
    primals = {n.name for n in fw_graph.nodes if n.op == "placeholder"}
    fwd_rows = [] if timeline else None
    fwd_peak, fwd_at, _ = replay(fw_graph, ws, primals, {}, terms.tensor, fwd_rows)

    bw_inputs = [n for n in bw_graph.nodes if n.op == "placeholder"]
    # the caller holds ``g`` of ``y.backward(g)``; of the output gradients autograd creates for
    # ``loss.backward()``, the engine holds the loss's (a scalar) through the backward pass, and the
    # others (zeros) are the backward module's own, freed after their last use
    def held_tangent(n) -> bool:
        val = n.meta.get("val")
        return not graph.loss_output or (isinstance(val, torch.Tensor) and val.dim() == 0)

    # a saved value the forward module returns as one of its own inputs (a buffer BatchNorm updated
    # in place: `monet.executor.update_buffers_in_place`) is that input, owned by the caller
    fw_out = next(n for n in fw_graph.nodes if n.op == "output").args[0]
    fw_saved = [v for v in list(fw_out)[graph.num_fwd_outputs:]]
    bw_saved = [n for n in bw_inputs if not n.name.startswith(TANGENT) and not is_symbolic(n)]
    fw_saved = [f for f in fw_saved if not (isinstance(f, fx.Node) and is_symbolic(f))]
    aliases_input = {b.name for b, f in zip(bw_saved, fw_saved) if isinstance(f, fx.Node) and f.op == "placeholder"}
    held = {n.name for n in bw_inputs if n.name in primals or n.name in aliases_input
            or (n.name.startswith(TANGENT) and held_tangent(n))}
    saved = {n.name: 0 if n.meta.get("monet_host") else terms.of(n.meta.get("val"))
             for n in bw_inputs if n.name not in held}  # offloaded values are on the host (`monet.offload`)
    saved_bytes = sum(v for k, v in saved.items() if not k.startswith(TANGENT))
    bwd_rows = [] if timeline else None
    bwd_peak, bwd_at, _ = replay(bw_graph, ws, held, dict(saved), terms.tensor, bwd_rows)
    held_tangents = sum(terms.tensor(n.meta["val"]) for n in bw_inputs
                        if n.name.startswith(TANGENT) and n.name in held)
    bwd_base = constant - sized.tangent_bytes + held_tangents + sized.output_bytes
    bwd_total = bwd_base + bwd_peak
    fwd_total = fwd_constant + fwd_peak
    rows = None
    if timeline:
        rows = [TimelineRow("forward", r.name, r.peak_bytes + fwd_constant, r.after_bytes + fwd_constant,
                            r.outputs_bytes, r.workspace_bytes) for r in fwd_rows]
        rows += [TimelineRow("backward", r.name, r.peak_bytes + bwd_base, r.after_bytes + bwd_base,
                             r.outputs_bytes, r.workspace_bytes) for r in bwd_rows]
    return SimResult(peak_bytes=max(fwd_total, bwd_total), fwd_peak_bytes=fwd_total,
                     bwd_peak_bytes=bwd_total, constant_bytes=constant, saved_bytes=saved_bytes,
                     peak_at=fwd_at if fwd_total >= bwd_total else bwd_at, timeline=rows)


def schedule_peak(graph: OpGraph, costs, schedule: Schedule, timeline: bool = False) -> SimResult:
    """The reference peak of ``schedule`` on ``graph``: `simulate` of the modules the executor builds
    from it (`monet.executor.build_modules`), in bytes.

    Args:
        graph: the `OpGraph` the schedule is for, with the implementations it chooses applied
            (``schedule.impl``; `monet.impls.apply_impls`).
        costs: per-node workspace, anything with ``fwd_workspace`` (N,) and ``bwd_workspace`` (T,)
            in bytes (a `monet.profiling.costs.CostArrays`); None: no workspace.
        timeline: also return the per-node timeline (`simulate`).

    Raises:
        monet.executor.ScheduleError: the schedule cannot run (`monet.executor.check_steps`).
    """
    fw, bw = build_graphs(graph, schedule)
    return simulate(graph, fw, bw, getattr(costs, "fwd_workspace", None), getattr(costs, "bwd_workspace", None),
                    timeline=timeline)
