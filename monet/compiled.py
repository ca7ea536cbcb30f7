"""The compiled path: a schedule's forward and backward modules compiled by Inductor.

``monet.optimize(model, batch, budget, compile=True)`` captures the joint graph that
``torch.compile`` would compile (Inductor's decompositions and joint-graph passes:
`monet.frontend.trace`), solves the schedule on it, and hands the executor's forward and backward
modules (`monet.executor.build_modules`) to Inductor's compiler instead of running them node by
node.  The schedule's decisions are in those modules' graphs: what the forward returns for the
backward (the kept values), the recomputed nodes copied into the backward, and where each value is
last read.  Inductor fuses and orders what it is given; `COMPILE_OPTIONS` are the options under
which it keeps those decisions (docs/design.md, "Note [Compiled schedule]").
"""
from __future__ import annotations

import re

import torch.fx as fx

from monet import compat
from monet.executor import build_modules
from monet.graph import OpGraph
from monet.solution import Schedule

#: Inductor's options for the schedule's modules (docs/design.md, "Note [Compiled schedule]")
COMPILE_OPTIONS: dict = {"reorder_for_peak_memory": False}


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
    """(forward compiler, backward compiler) for AOTAutograd (`monet.frontend.trace`): each
    compiles the module it is given with Inductor under `COMPILE_OPTIONS` and returns the compiled
    callable (boxed calling convention).  ``user_outputs``: how many of the forward module's
    outputs the caller receives (`OpGraph.num_fwd_outputs`); their strides are eager PyTorch's."""
    def compile_module(gm, example_inputs, backward: bool):
        module = decomposed(gm, example_inputs)
        with compat.inductor_config(**COMPILE_OPTIONS), \
                compat.inductor_horizontal_fusion(same_stage, "monet.compiled.same_stage"):
            code = compat.inductor_compile(module, example_inputs, backward=backward, user_outputs=user_outputs)
        code.monet_module = module  # what Inductor compiled (`missing_recomputations` reads it)
        return code

    return (lambda gm, inputs: compile_module(gm, inputs, False)), (lambda gm, inputs: compile_module(gm, inputs, True))


def decomposed(gm: fx.GraphModule, example_inputs) -> fx.GraphModule:
    """An executor module in the ATen ops Inductor lowers (`monet.compat.inductor_decomposed`), after
    the graph passes Inductor runs before compiling (`monet.compat.inductor_graph_passes`), each
    node marked as the node it comes from is (``meta["monet"]``: a recomputation, a backward node);
    ``gm`` is left as it is."""
    for n in gm.graph.nodes:
        tags = {k: n.meta[k] for k in TAGS if k in n.meta}
        if tags:
            n.meta["custom"] = {**n.meta.get("custom", {}), **tags}
    out = compat.inductor_graph_passes(compat.inductor_decomposed(gm, example_inputs), example_inputs)
    for n in out.graph.nodes:
        if n.op == "call_function":
            n.meta.update({k: v for k, v in n.meta.get("custom", {}).items() if k in TAGS})
    return out


#: the executor's marks on its modules' nodes that the decomposition keeps: the node each comes
#: from (``monet``) and the stage of the backward it is computed in (``monet_stage``)
TAGS = ("monet", "monet_stage")


def same_stage(origins1, origins2) -> bool:
    """Whether two kernels computing the FX nodes ``origins1`` and ``origins2`` compute nodes of at
    most one stage of the backward (nodes without a stage, the forward's, count for none): the
    horizontal fusions Inductor may make (docs/design.md, "Note [Compiled schedule]")."""
    stages = {n.meta.get("monet_stage") for n in (*origins1, *origins2)} - {None}
    return len(stages) <= 1


def recomputed_names(bw: fx.GraphModule) -> list[str]:
    """FX names of the recomputed forward nodes in a backward module of the executor (the nodes it
    marks ``("fwd", i)``), in order."""
    return [n.name for n in bw.graph.nodes if n.meta.get("monet", ("",))[0] == "fwd"]


_SOURCE_NODES = re.compile(r"#\s*(?:Topologically Sorted )?Source Nodes:\s*\[([^\]]*)\]")


def source_nodes(code: str) -> set[str]:
    """The FX node names the ``Source Nodes`` comments of Inductor's wrapper code list: the nodes
    its kernels and extern calls compute."""
    return {name.strip() for m in _SOURCE_NODES.finditer(code) for name in m.group(1).split(",") if name.strip()}


def missing_recomputations(bw: fx.GraphModule, compiled) -> list[str]:
    """The recomputed nodes of the executor's backward module ``bw`` (`recomputed_names`) that the
    code Inductor compiled from it (``compiled``, the result of `compilers`' backward compiler)
    does not compute: each one a recomputation Inductor dropped or merged with another (empty when
    the schedule's recomputations all survived).  Inductor's ``Source Nodes`` comments name the
    nodes of ``bw`` each kernel comes from, through the decomposition (its nodes' ``from_node``)."""
    computed = source_nodes(compat.inductor_source(compiled))
    return [name for name in recomputed_names(bw) if name not in computed]


__all__ = ["COMPILE_OPTIONS", "compilers", "executor_modules", "missing_recomputations", "recomputed_names",
           "source_nodes"]
