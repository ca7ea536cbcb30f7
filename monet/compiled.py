"""The compiled path: a schedule's forward and backward modules compiled by Inductor.

``monet.optimize(model, batch, budget, compile=True)`` captures the same ATen graph as for the
eager step (`monet.capture`), costs it as Inductor runs it (`monet.profiling.compiled_costs`),
solves the schedule on it, and hands the executor's forward and backward modules
(`executor_modules`) to Inductor's compiler instead of running them node by node.  The schedule's
decisions are in those modules' graphs: what the forward returns for the backward (the kept
values), the recomputed nodes copied into the backward, and where each value is last read.  Each
module is decomposed with Inductor's table and passes first (`decomposed`); Inductor fuses and
orders what it is given, under `COMPILE_OPTIONS` and with horizontal fusion only within one stage
(`same_stage`), which keep those decisions (docs/design.md, "Note [Compiled schedule]").
"""
from __future__ import annotations

import torch.fx as fx

from monet import compat
from monet.executor import build_modules
from monet.graph import OpGraph
from monet.solution import Schedule

#: Inductor's options for the schedule's modules (docs/design.md, "Note [Compiled schedule]")
COMPILE_OPTIONS: dict = {"reorder_for_peak_memory": False}

#: the executor's marks on its modules' nodes that the decomposition keeps: the node each comes
#: from (``monet``) and the stage of the backward it is computed in (``monet_stage``)
TAGS = ("monet", "monet_stage")


def executor_modules(graph: OpGraph, schedule: Schedule) -> tuple[fx.GraphModule, fx.GraphModule]:
    """The forward and backward modules of ``schedule`` as Inductor takes them: functional (no
    in-place ReLU or add, `monet.inplace`, and BatchNorm's running statistics returned, not
    updated in place: Inductor plans its own buffer reuse and input mutations).

    Raises:
        ScheduleError: see `monet.executor.build_modules`.
    """
    functional = Schedule(schedule.saved, schedule.stages, schedule.impl, inplace=False, offload=schedule.offload)
    return build_modules(graph, functional, buffers_in_place=False)


def compilers(user_outputs: int):
    """(forward compiler, backward compiler) for AOTAutograd (the wrapper's trace,
    `monet.wrapper.ScheduledModule`): each compiles the module it is given (`decomposed`) with
    Inductor under `COMPILE_OPTIONS` and `same_stage`, and returns the compiled callable (boxed
    calling convention).  ``user_outputs``: how many of the forward module's
    outputs the caller receives (`OpGraph.num_fwd_outputs`); their strides are eager PyTorch's."""
    def compile_module(gm, example_inputs, backward: bool):
        module = decomposed(gm, example_inputs)
        with compat.inductor_config(**COMPILE_OPTIONS), \
                compat.inductor_horizontal_fusion(same_stage, "monet.compiled.same_stage"):
            return compat.inductor_compile(module, example_inputs, backward=backward, user_outputs=user_outputs)

    return (lambda gm, inputs: compile_module(gm, inputs, False)), (lambda gm, inputs: compile_module(gm, inputs, True))


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
    stages = {n.meta.get("monet_stage") for n in (*origins1, *origins2)} - {None}
    return len(stages) <= 1


__all__ = ["COMPILE_OPTIONS", "TAGS", "compilers", "decomposed", "executor_modules", "same_stage"]
