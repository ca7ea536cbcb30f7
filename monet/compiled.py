"""The compiled path: a schedule's forward and backward modules compiled by Inductor.

``monet.optimize(model, batch, budget, compile=True)`` captures the same ATen graph as for the
eager step (`monet.capture`), costs it as Inductor runs it (`monet.profiling.compiled_costs`),
solves the schedule on it, and hands the executor's forward and backward modules
(`executor_modules`) to Inductor's compiler instead of running them node by node.  The schedule's
decisions are in those modules' graphs: what the forward returns for the backward (the kept
values), the recomputed nodes copied into the backward, and where each value is last read.  Each
module is decomposed with Inductor's table and passes first (`decomposed`); Inductor fuses and
orders what it is given, under `COMPILE_OPTIONS`, with horizontal fusion only within one stage
(`same_stage`) and vertical fusion only across neighbouring stages (`near_stages`), which keep
those decisions (docs/design.md, "Note [Compiled schedule]").
"""
from __future__ import annotations

import torch
import torch.fx as fx

from monet import compat
from monet.executor import build_modules
from monet.graph import OpGraph
from monet.solution import Schedule

#: Inductor's options for the schedule's modules (docs/design.md, "Note [Compiled schedule]")
COMPILE_OPTIONS: dict = {"reorder_for_peak_memory": False, "realize_reads_threshold": 0}

#: the dtypes a CPU convolution library (oneDNN) takes channels-last; any other (float64) runs
#: ATen's im2col convolution, which copies a channels-last operand back to eager's layout
CHANNELS_LAST_DTYPES = (torch.float32, torch.bfloat16, torch.float16)

#: the convolution ops of a joint graph
CONVOLUTIONS = ("aten.convolution.default", "aten.convolution_backward.default")

#: the executor's marks on its modules' nodes that the decomposition keeps: the node each comes
#: from (``monet``), the stage of the backward it is computed in (``monet_stage``) and its segment
#: (``monet_segment``, `monet.executor.emit_backward`)
TAGS = ("monet", "monet_stage", "monet_segment")


def executor_modules(graph: OpGraph, schedule: Schedule) -> tuple[fx.GraphModule, fx.GraphModule]:
    """The forward and backward modules of ``schedule`` as Inductor takes them: functional (no
    in-place ReLU or add, `monet.inplace`, and BatchNorm's running statistics returned, not
    updated in place: Inductor plans its own buffer reuse and input mutations).

    Raises:
        ScheduleError: see `monet.executor.build_modules`.
    """
    functional = Schedule(schedule.saved, schedule.stages, schedule.impl, inplace=False, offload=schedule.offload)
    return build_modules(graph, functional, buffers_in_place=False)


def channels_last(graph: OpGraph) -> bool:
    """Whether the compiled step runs ``graph``'s convolutions channels-last (Inductor's
    ``layout_optimization``): on CUDA, and on the CPU where every convolution's input is in a
    dtype of `CHANNELS_LAST_DTYPES`; False for a graph without convolutions, or without its joint
    graph (docs/design.md, "Note [Compiled schedule]")."""
    if graph.joint is None:
        return False
    convs = [n for n in graph.joint.graph.nodes if str(n.target) in CONVOLUTIONS]
    if not convs:
        return False
    return graph.device == "cuda" or all(getattr(n.args[0].meta.get("val"), "dtype", None) in CHANNELS_LAST_DTYPES
                                         for n in convs)


def compilers(forward_outputs: int, layout: bool, pinned: bool = False):
    """(forward compiler, backward compiler) for AOTAutograd (the wrapper's trace,
    `monet.wrapper.ScheduledModule`): each compiles the module it is given (`decomposed`) with
    Inductor under `COMPILE_OPTIONS`, `same_stage` and `near_stages`, and returns the compiled
    callable (boxed calling convention).  ``forward_outputs``: how many of the forward module's
    outputs come before the saved values (the graph's ``num_fwd_outputs``: the model's outputs and
    its updated buffers), which keep the strides eager PyTorch gives them, as do the saved inputs
    (`eager_strided`).  The other saved values take the layout Inductor picks (channels-last for
    a convolution's), and the backward is compiled for
    those strides where the first call runs under `monet.compat.forward_strides_to_backward`
    (docs/design.md, "Note [Compiled schedule]").  ``layout``: Inductor's layout optimization on
    (`channels_last`) or off.  ``pinned``: the backward is pinned to the schedule's segments
    (`realize_across_segments`, `one_segment`), as a solution measured over its budget unpinned
    asks (docs/design.md, "Note [Compiled memory]")."""
    vertical, key = ((one_segment, "monet.compiled.same_stage+one_segment") if pinned else
                     (near_stages, "monet.compiled.same_stage+near_stages"))

    def compile_module(gm, example_inputs, backward: bool):
        module = decomposed(gm, example_inputs)
        if backward and pinned:
            realize_across_segments(module)
        with compat.inductor_config(**COMPILE_OPTIONS, layout_optimization=layout), \
                compat.inductor_fusion_rule(same_stage, vertical, key):
            return compat.inductor_compile(module, example_inputs, backward=backward,
                                           eager_outputs=() if backward else eager_strided(module, forward_outputs))

    return (lambda gm, inputs: compile_module(gm, inputs, False)), (lambda gm, inputs: compile_module(gm, inputs, True))


def eager_strided(forward: fx.GraphModule, forward_outputs: int) -> list[int]:
    """The positions of ``forward``'s outputs that keep eager PyTorch's strides when compiled: the
    first ``forward_outputs`` (the model's outputs and updated buffers) and every saved value that
    is one of the module's inputs (a parameter, the model's input), which is then returned as it
    is; in another layout it would be a copy held until the backward reads it."""
    outputs = next(iter(forward.graph.find_nodes(op="output"))).args[0]
    return [k for k, v in enumerate(outputs)
            if k < forward_outputs or (isinstance(v, fx.Node) and v.op == "placeholder")]


def decomposed(gm: fx.GraphModule, example_inputs) -> fx.GraphModule:
    """An executor module in the ATen ops Inductor lowers (`monet.compat.inductor_decomposed`), after
    the graph passes Inductor runs before compiling (`monet.compat.inductor_graph_passes`), each
    node carrying the `TAGS` of the node it comes from; ``gm`` is left as it is (but for the tags'
    copy in each node's ``meta["custom"]``, which the decomposition keeps)."""
    for n in gm.graph.nodes:
        tags = {k: n.meta[k] for k in TAGS if k in n.meta}
        if tags:
            n.meta["custom"] = {**n.meta.get("custom", {}), **tags}
    out = compat.inductor_graph_passes(compat.inductor_decomposed(gm, example_inputs), example_inputs)
    for n in out.graph.nodes:
        if n.op == "call_function":
            n.meta.update({k: v for k, v in n.meta.get("custom", {}).items() if k in TAGS})
    return out


def same_stage(origins1, origins2) -> bool:
    """Whether two kernels computing the FX nodes ``origins1`` and ``origins2`` compute nodes of at
    most one stage of the backward (nodes without a stage, the forward's, count for none): the
    horizontal fusions Inductor may make (docs/design.md, "Note [Compiled schedule]")."""
    return len(_stages(origins1) | _stages(origins2)) <= 1


def near_stages(producer, consumer) -> bool:
    """Whether a kernel computing the FX nodes ``consumer`` may fuse into the one computing
    ``producer`` (a vertical fusion): their nodes lie in stages of the backward at most one apart
    (nodes without a stage, the forward's, count for none).  A fused kernel runs where its first
    node was, so a consumer from a later stage would be computed early and its output held across
    the stages between (docs/design.md, "Note [Compiled schedule]")."""
    stages = _stages(producer) | _stages(consumer)
    return not stages or max(stages) - min(stages) <= 1


def one_segment(producer, consumer) -> bool:
    """`near_stages`, and the nodes of both kernels in one segment of the backward (a stage that
    recomputes is a segment of its own, a run of stages that recompute nothing is one:
    ``meta["monet_segment"]``, `monet.executor.emit_backward`): a pinned step fuses no kernel
    across a stage that recomputes, which would hold that stage's recomputed values, or the
    values it reads, beside the next stage's (docs/design.md, "Note [Compiled memory]")."""
    return near_stages(producer, consumer) and len(_tags(producer, "monet_segment")
                                                   | _tags(consumer, "monet_segment")) <= 1


def realize_across_segments(gm: fx.GraphModule) -> list[str]:
    """Make Inductor write to a buffer of its own, where the node is, every value of the backward
    module ``gm`` that another segment reads (`monet.compat.inductor_realize`; segments as in
    `one_segment`).  Inductor otherwise computes a single-reader elementwise value inside its
    reader's kernel whatever the stages between, so that a chain of backward nodes becomes one
    kernel after a later stage's recomputation, and the earlier stages' recomputed values live
    until it (docs/design.md, "Note [Compiled memory]").  Returns the names of the nodes marked."""
    marked = []
    for n in gm.graph.nodes:
        seg = n.meta.get("monet_segment") if n.op == "call_function" else None
        if seg is not None and any(u.meta.get("monet_segment", seg) != seg for u in n.users):
            compat.inductor_realize(n)
            marked.append(n.name)
    return marked


def _stages(origins) -> set:
    return _tags(origins, "monet_stage")


def _tags(origins, key: str) -> set:
    return {n.meta.get(key) for n in origins} - {None}


__all__ = ["CHANNELS_LAST_DTYPES", "COMPILE_OPTIONS", "CONVOLUTIONS", "TAGS", "channels_last", "compilers", "decomposed", "eager_strided", "executor_modules", "near_stages", "one_segment", "realize_across_segments", "same_stage"]
