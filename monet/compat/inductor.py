"""PyTorch's private APIs for the compiled step (`monet.compiled`): Inductor's decompositions,
graph passes, compiler, options and fusion choices (`monet.compat`)."""
from __future__ import annotations

import contextlib

import torch
import torch.fx as fx

from monet.compat.graphs import detect_fake_mode


def inductor_decompositions() -> dict:
    """The decomposition table ``torch.compile``'s Inductor backend traces its graphs with
    (``torch._inductor.decomposition.select_decomp_table()``; the same call in 2.11-2.15)."""
    from torch._inductor.decomposition import select_decomp_table

    return select_decomp_table()


def inductor_decomposed(gm: fx.GraphModule, example_inputs) -> fx.GraphModule:
    """``gm`` traced again with `inductor_decompositions` (``make_fx(..., tracing_mode="real")`` of
    an ``fx.Interpreter`` run on the fake ``example_inputs``, as Inductor's pattern matcher traces
    its patterns, ``torch._inductor.pattern_matcher.fwd_only``): the ATen ops Inductor lowers.
    The new nodes keep the ``meta["custom"]`` of the node they come from
    (``torch.fx.traceback.preserve_node_meta``); placeholders and outputs are ``gm``'s, one
    placeholder per input, whatever ``gm``'s calling convention.  Same entries in 2.11-2.15."""
    from torch._dispatch.python import enable_python_dispatcher
    from torch.fx.experimental.proxy_tensor import make_fx
    from torch.fx.traceback import preserve_node_meta

    def run(*args):
        return fx.Interpreter(gm).run(*args)

    fake = detect_fake_mode(example_inputs)
    with enable_python_dispatcher(), preserve_node_meta(), (fake if fake is not None else contextlib.nullcontext()):
        return make_fx(run, inductor_decompositions(), tracing_mode="real")(*example_inputs)


def inductor_graph_passes(gm: fx.GraphModule, example_inputs) -> fx.GraphModule:
    """Inductor's passes over a graph before it is compiled, in place (pattern rewrites, no-op
    removal, constant folding, random ops drawn from Inductor's seeds: what
    ``torch._inductor.compile_fx`` runs on a joint graph before partitioning it, and on an
    inference graph before compiling it); returns the graph module.
    ``torch._inductor.compile_fx._recursive_joint_graph_passes(gm, skip_invoke_subgraph,
    input_device)`` in 2.13 and 2.14, under the graph's fake mode (``V.set_fake_mode``), which its
    random-op pass reads."""
    from torch._inductor.compile_fx import _recursive_joint_graph_passes
    from torch._inductor.virtualized import V

    devices = [t.device for t in example_inputs if isinstance(t, torch.Tensor)]
    with V.set_fake_mode(detect_fake_mode(example_inputs)):
        return _recursive_joint_graph_passes(gm, input_device=devices[0] if devices else None)


def inductor_fallback(target) -> bool:
    """Whether Inductor runs ``target`` (an FX node's target) as a fallback kernel, the eager one:
    an ATen op in ``torch._inductor.lowering.fallbacks``, or any target it has neither a lowering
    (``lowerings``) nor a decomposition (`inductor_decompositions`) for (a custom op).  The same
    registries in 2.11-2.15."""
    from torch._inductor import lowering

    if not isinstance(target, torch._ops.OpOverload):
        return False
    return target in lowering.fallbacks or (target not in lowering.lowerings
                                            and target not in inductor_decompositions())


def inductor_compile(gm: fx.GraphModule, example_inputs, backward: bool, eager_outputs=()):
    """``gm`` compiled by Inductor (``torch._inductor.compile_fx.compile_fx_inner``, the inner
    compiler of ``torch.compile``'s forward and backward): a callable with AOTAutograd's boxed
    calling convention.  ``eager_outputs``: the positions of the forward's outputs whose strides
    must be eager PyTorch's (the meta ``user_visible_output_idxs`` that ``compile_fx_forward``
    sets; the others may take any layout).  Signature ``(gm, example_inputs, **kwargs)`` with
    ``is_backward`` in 2.11-2.15."""
    from torch._inductor.compile_fx import compile_fx_inner
    from torch._inductor.virtualized import V

    if not backward:
        out = next(iter(gm.graph.find_nodes(op="output")))
        outputs = out.args[0]
        out.meta["user_visible_output_idxs"] = [k for k in sorted(set(eager_outputs))
                                                if isinstance(outputs[k], fx.Node)]
    fake = detect_fake_mode(example_inputs) or detect_fake_mode(
        [p.meta.get("val") for p in gm.graph.find_nodes(op="placeholder")])
    with V.set_fake_mode(fake):
        return compile_fx_inner(gm, example_inputs, is_backward=backward)


@contextlib.contextmanager
def forward_strides_to_backward():
    """A context in which AOTAutograd compiles the backward for the strides the compiled forward
    gave its saved values (Inductor's layout optimization lays a convolution's output out
    channels-last).  AOTAutograd reads those strides from a ``torch._guards.TracingContext``,
    which Dynamo provides under ``torch.compile`` and nothing does for ``aot_module``: here one
    with a fake mode of its own, which AOTAutograd then traces with
    (``TracingContext.report_output_strides`` in ``_aot_stage2b_fw_compile``, the placeholders
    restrided in ``_aot_stage2b_bw_compile``; the same in 2.11-2.15)."""
    from torch._guards import TracingContext, tracing
    from torch._subclasses.fake_tensor import FakeTensorMode

    with tracing(TracingContext(FakeTensorMode())):
        yield


def inductor_realize(node: fx.Node) -> None:
    """Make Inductor write ``node``'s value to a buffer of its own where the node is, rather than
    compute it inside the kernels of its readers (inline it): the node's
    ``meta["inductor_realize_to_strides"]``, which ``GraphLowering.run_node`` reads (the same in
    2.11-2.15; Inductor's own ``decompose_mem_bound_mm`` pass sets it)."""
    node.meta["inductor_realize_to_strides"] = True


def inductor_config(**patches):
    """``torch._inductor.config.patch(**patches)``: a context with Inductor's options set (names as
    in ``torch/_inductor/config.py``, e.g. ``reorder_for_peak_memory``)."""
    from torch._inductor import config

    return config.patch(**patches)


def inductor_fusion_rule(horizontal, vertical, key: str):
    """A context under which Inductor fuses two kernels only where the rule allows it: two that
    share inputs but no data (a horizontal fusion) where ``horizontal(origins1, origins2)`` holds,
    a producer and its consumer (a vertical fusion) where ``vertical(origins1, origins2)`` holds,
    each argument the FX nodes a kernel computes (producer first).  ``key`` names the rule in
    Inductor's compiled-graph cache key (a graph compiled under another rule is not reused).
    Inductor asks its choices handler (``torch._inductor.choices.InductorChoices``'s
    ``can_fuse_horizontal`` and ``can_fuse_vertical(scheduler, node1, node2, shared_data_score)``,
    set with ``V.set_choices_handler``); the cache key holds the uuid of
    ``config.post_grad_custom_post_pass`` (a ``CustomGraphPass``), here a pass that runs the user's
    own, if any, and changes nothing else.  The same entries in 2.11-2.15."""
    from torch._inductor import config
    from torch._inductor.custom_graph_pass import CustomGraphPass
    from torch._inductor.virtualized import V

    base = type(V.choices)
    user_pass = config.post_grad_custom_post_pass

    def origins(snode) -> set:
        return {o for n in snode.get_nodes() for o in getattr(getattr(n, "node", None), "origins", ())}

    class Choices(base):
        @staticmethod
        def can_fuse_horizontal(scheduler, node1, node2, shared_data_score):
            return (base.can_fuse_horizontal(scheduler, node1, node2, shared_data_score)
                    and horizontal(origins(node1), origins(node2)))

        @staticmethod
        def can_fuse_vertical(scheduler, node1, node2, shared_data_score):
            return (base.can_fuse_vertical(scheduler, node1, node2, shared_data_score)
                    and vertical(origins(node1), origins(node2)))

    class Keyed(CustomGraphPass):
        def __call__(self, graph):
            if user_pass is not None:
                user_pass(graph)

        def uuid(self):
            return (key, user_pass.uuid() if user_pass is not None else None)

    @contextlib.contextmanager
    def rule():
        with V.set_choices_handler(Choices()), config.patch(post_grad_custom_post_pass=Keyed()):
            yield

    return rule()


def inductor_source(compiled) -> str:
    """The Python wrapper code Inductor generated for a compiled module (`inductor_compile`'s
    result, a ``CompiledFxGraph``: its ``source_code``), with the ``# Topologically Sorted Source
    Nodes: [...]`` comments that name the FX nodes each kernel computes; "" where it has none."""
    return getattr(compiled, "source_code", None) or ""


__all__ = ["inductor_decompositions", "inductor_decomposed", "inductor_graph_passes", "inductor_fallback", "inductor_compile", "inductor_realize", "forward_strides_to_backward", "inductor_config", "inductor_fusion_rule", "inductor_source"]
