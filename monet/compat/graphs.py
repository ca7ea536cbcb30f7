"""PyTorch's private APIs for capture and the executor: the supported releases, AOTAutograd's
joint graph, partitioner helpers and runtime, FX's lazy and boxed modules, Dynamo's export, fake
tensors (`monet.compat`)."""
from __future__ import annotations

import contextlib
import functools
import warnings

import torch
import torch.fx as fx


#: The releases of torch monet admits (setup.py's range), as (major, minor) inclusive bounds.
SUPPORTED = ((2, 11), (2, 15))


def torch_version() -> tuple[int, int]:
    """(major, minor) of the installed torch, e.g. (2, 13) for "2.13.0+cpu"."""
    major, minor = torch.__version__.split("+")[0].split(".")[:2]
    return int(major), int("".join(c for c in minor if c.isdigit()) or 0)


@functools.lru_cache(maxsize=None)
def check_version() -> bool:
    """True when the installed torch is in `SUPPORTED`; otherwise warn once (RuntimeWarning) and
    return False.  monet still runs: the entries of this module may fail with a clear error then."""
    lo, hi = SUPPORTED
    if lo <= torch_version() <= hi:
        return True
    warnings.warn(f"monet is tested with torch {lo[0]}.{lo[1]} to {hi[0]}.{hi[1]}, this is torch {torch.__version__}: "
                  "its private APIs (monet/compat/) may have moved", RuntimeWarning, stacklevel=2)
    return False


def aot_module(gm: torch.nn.Module, partition_fn, fw_compiler=None, bw_compiler=None) -> torch.nn.Module:
    """``torch._functorch.aot_autograd.aot_module(gm, ...)``: AOTAutograd over a module, with
    ``partition_fn(joint, joint_inputs, *, num_fwd_outputs, ...)`` receiving the joint
    forward+backward graph and returning (forward module, backward module).

    ``fw_compiler`` / ``bw_compiler`` default to ``make_boxed_compiler(nop)`` (run the module as it
    is, boxed calling convention).  Same signature in 2.11-2.15; the partition function is called
    with keyword ``num_fwd_outputs`` in all of them (2.11 and 2.15 add other keywords, which
    ``partition_fn`` must accept as ``**_``).
    """
    from functorch.compile import make_boxed_compiler, nop
    from torch._functorch.aot_autograd import aot_module as _aot_module

    check_version()
    return _aot_module(gm, fw_compiler=fw_compiler or make_boxed_compiler(nop),
                       bw_compiler=bw_compiler or make_boxed_compiler(nop), partition_fn=partition_fn)


def eager_backward_autocast():
    """A context in which AOTAutograd traces the backward pass without autocast, as eager autograd
    runs it when ``loss.backward()`` is called outside ``torch.autocast`` (PyTorch's AMP recipe;
    ``transformers.Trainer`` and accelerate do so): ``torch._functorch.config.backward_pass_autocast
    = "off"``.  Its default, ``"same_as_forward"``, traces the backward under the forward's autocast,
    so the backward of an op autocast left in fp32 (the matmuls of a CPU attention computed in fp32
    with dropout) runs in bf16 in the graph and in fp32 in eager PyTorch: other gradients.  The
    setting exists in 2.11-2.15; where it does not, a null context."""
    config = torch._functorch.config
    if not hasattr(config, "backward_pass_autocast"):
        return contextlib.nullcontext()
    return config.patch(backward_pass_autocast="off")


def lazy_graph_modules():
    """A context in which the ``fx.GraphModule`` s torch makes (AOTAutograd's joint graph among
    them) generate their Python code when first called or read, not when made or changed:
    ``torch.fx._lazy_graph_module._use_lazy_graph_module(True)``, as ``torch.compile`` runs its
    passes.  monet reads the joint graph's nodes and never calls it; at 96 layers (17,000 joint
    nodes) each generation took about a second, three times per trace (AOTAutograd's, the dropout
    scale's, the lowering's).  Present in 2.11-2.15; where it is not, a null context."""
    try:
        from torch.fx._lazy_graph_module import _use_lazy_graph_module
    except ImportError:
        return contextlib.nullcontext()
    return _use_lazy_graph_module(True)


def lazy_graph_module(root: torch.nn.Module, graph: fx.Graph) -> fx.GraphModule:
    """``fx.GraphModule(root, graph)`` whose Python code is generated when it is first called or
    its code read (``torch.fx._lazy_graph_module._LazyGraphModule``), for a graph that is read,
    not run (a copy of the joint graph to rewrite); a plain ``fx.GraphModule`` where the class is
    absent.  Same in 2.11-2.15."""
    try:
        from torch.fx._lazy_graph_module import _LazyGraphModule
    except ImportError:
        return fx.GraphModule(root, graph)
    return _LazyGraphModule(root, graph)


def boxed_function(fn):
    """``functorch.compile.make_boxed_func(fn)``: ``fn`` with AOTAutograd's boxed calling convention
    (one list argument, which the callee may clear).  Unchanged in 2.11-2.15."""
    from functorch.compile import make_boxed_func

    return make_boxed_func(fn)


def boxed_codegen() -> fx.graph.CodeGen:
    """FX code generation with the boxed calling convention (``torch.fx.graph._BoxedCodeGen``):
    the generated ``forward(self, args)`` takes one list and clears it, so that a backward
    module's inputs (the saved activations) are freed after their last use inside it instead of
    at its end.  Private in 2.11-2.15 (unchanged)."""
    from torch.fx.graph import _BoxedCodeGen

    return _BoxedCodeGen()


def forward_outputs(joint: fx.GraphModule, num_fwd_outputs: int) -> tuple[list[fx.Node], list]:
    """(forward output nodes, their AOTAutograd output descriptors) of a joint graph:
    ``torch._functorch.partitioners._extract_fwd_bwd_outputs``.  It returns four lists
    (forward outputs, backward outputs, and their descriptors) in 2.11-2.15; before 2.9 it
    returned two and took no descriptors."""
    from torch._functorch.partitioners import _extract_fwd_bwd_outputs

    fwd_outputs, _bwd_outputs, fwd_descs, _bwd_descs = _extract_fwd_bwd_outputs(joint, num_fwd_outputs=num_fwd_outputs)
    return fwd_outputs, list(fwd_descs)


def saved_for_backward_descs(n: int) -> list:
    """AOTAutograd's descriptors of ``n`` values the forward saves for the backward
    (``torch._functorch._aot_autograd.descriptors.SavedForBackwardsAOTOutput``; 2.9 and later)."""
    from torch._functorch._aot_autograd.descriptors import SavedForBackwardsAOTOutput

    return [SavedForBackwardsAOTOutput(i) for i in range(n)]


def extract_subgraph(joint_graph: fx.Graph, inputs: list[fx.Node], outputs: list[fx.Node], descs: list,
                     name: str) -> fx.Graph:
    """The subgraph of ``joint_graph`` computing ``outputs`` from ``inputs`` (descriptors ``descs``):
    ``torch._functorch.partitioners._extract_graph_with_inputs_outputs``, the default
    partitioner's own helper.  Signature ``(graph, inputs, outputs, outputs_descs, subgraph,
    ignore_must_be_in_fw_bw=False)`` in 2.11-2.15."""
    from torch._functorch.partitioners import _extract_graph_with_inputs_outputs

    return _extract_graph_with_inputs_outputs(joint_graph, inputs, outputs, descs, name)


def primals_and_tangents(joint: fx.GraphModule) -> tuple[list[fx.Node], list[fx.Node]]:
    """The joint graph's placeholders split into primals (parameters, buffers, inputs) and
    tangents (the outputs' gradients), by AOTAutograd's own tests
    (``torch._functorch.partitioners._is_primal`` / ``_is_tangent``; unchanged in 2.11-2.15)."""
    from torch._functorch.partitioners import _is_primal, _is_tangent

    placeholders = list(joint.graph.find_nodes(op="placeholder"))
    return [p for p in placeholders if _is_primal(p)], [p for p in placeholders if _is_tangent(p)]


#: ``node.meta`` key with which AOTAutograd stashes a saved tensor without the version-counter
#: check (a buffer the forward mutates); the same key in 2.11-2.15.
NO_VERSION_CHECK = "saved_tensor_with_no_vc_check"


@contextlib.contextmanager
def activation_memory_budget(budget: float):
    """``torch._functorch.config.patch(activation_memory_budget=budget)``: the budget
    ``torch.compile``'s min-cut partitioner plans with (the peer of `monet.profiling.baselines`).
    The option exists in 2.4 and later, unchanged in 2.11-2.15."""
    import torch._functorch.config as functorch_config

    with functorch_config.patch(activation_memory_budget=float(budget)):
        yield


def dynamo_recompile_limit(limit: int):
    """A context in which Dynamo compiles one function up to ``limit`` times before it falls back to
    eager (``torch._dynamo.config.recompile_limit``, or ``cache_size_limit`` where that name is
    missing; a benchmark compiling several copies of one model recompiles once per copy).
    ``recompile_limit`` in 2.13."""
    config = torch._dynamo.config
    name = "recompile_limit" if hasattr(config, "recompile_limit") else "cache_size_limit"
    return config.patch(**{name: limit})


def dynamo_backend(name: str):
    """The compiler function ``torch.compile(backend=name)`` runs (``torch._dynamo.lookup_backend``,
    e.g. ``"inductor"``: Inductor's ``compile_fx``), the same call in 2.11-2.15."""
    return torch._dynamo.lookup_backend(name)


def is_compiled_module(model) -> bool:
    """True for a ``torch.compile(model)`` result (``torch._dynamo.eval_frame.OptimizedModule``,
    the same class in 2.11-2.15)."""
    from torch._dynamo.eval_frame import OptimizedModule

    return isinstance(model, OptimizedModule)


def dynamo_export(model: torch.nn.Module, args: tuple, kwargs: dict, ignore_logging: set) -> fx.GraphModule:
    """``torch._dynamo.export(model, aten_graph=False)(*args, **kwargs)``'s graph module: the call
    as one torch-level FX graph (a graph break raises).

    Run with ``ignore_logging_functions`` extended by ``ignore_logging`` (logger methods Dynamo may
    skip) and the recompile limits lifted (``recompile_limit``, ``accumulated_recompile_limit``:
    the names since 2.6; ``cache_size_limit`` before): each export leaves a cache entry on the
    forward's code object, and the ninth export of one class would otherwise be refused.  Shapes
    are static (``automatic_dynamic_shapes`` off, ``assume_static_by_default`` on): a schedule is
    for fixed shapes, and a second export with other shapes must not turn them symbolic.  The
    signature of ``torch._dynamo.export`` is the same in 2.11-2.15 (``torch.export`` is the public
    successor, but it returns an ExportedProgram without the call's output structure).
    """
    import torch._dynamo.config as dynamo_config

    check_version()
    limits = {k: 1 << 20 for k in ("recompile_limit", "accumulated_recompile_limit", "cache_size_limit")
              if hasattr(dynamo_config, k)}
    # static shapes, always: a second export of one model with other shapes (a wrapper's first call
    # after the capture, an epoch's last batch) made Dynamo's "automatic dynamic" shapes symbolic,
    # and DenseNet-121's export then failed in F.batch_norm on a symbolic size check
    static = {k: v for k, v in (("automatic_dynamic_shapes", False), ("assume_static_by_default", True))
              if hasattr(dynamo_config, k)}
    patch = dynamo_config.patch(
        ignore_logging_functions=set(dynamo_config.ignore_logging_functions) | set(ignore_logging), **limits,
        **static)
    # export overrides the config's assume_static_by_default with its own argument (default False:
    # every input size symbolic), so it is passed here too; sympy's reasoning about symbolic window
    # sizes is most of a Swin Transformer's export time
    static_arg = {"assume_static_by_default": True} if _accepts(torch._dynamo.export, "assume_static_by_default") else {}
    with patch:
        gm, _guards = torch._dynamo.export(model, aten_graph=False, **static_arg)(*args, **kwargs)
    return gm


def graph_break_counts() -> dict[str, int]:
    """Dynamo's graph breaks in this process so far: each reason's text and how often it was hit
    (``torch._dynamo.utils.counters["graph_break"]``, the same in 2.11-2.15)."""
    from torch._dynamo.utils import counters

    return dict(counters["graph_break"])


def _accepts(fn, name: str) -> bool:
    import inspect

    try:
        return name in inspect.signature(fn).parameters
    except (TypeError, ValueError):
        return False


def aot_backend(fw_compiler, bw_compiler=None):
    """A ``torch.compile`` backend that runs AOTAutograd's default partitioner with these compilers
    (``torch._dynamo.backends.common.aot_autograd``; the same in 2.11-2.15): the captured graph
    without monet, for comparisons (``benchmarks/gpu_numerics.py``)."""
    from torch._dynamo.backends.common import aot_autograd

    return aot_autograd(fw_compiler=fw_compiler, bw_compiler=bw_compiler or fw_compiler)


def forget_code(code) -> None:
    """Drop Dynamo's cache entries on a code object (``torch._C._dynamo.eval_frame.reset_code``,
    present in 2.11-2.15); a no-op where it is missing."""
    reset = getattr(torch._C._dynamo.eval_frame, "reset_code", None)
    if reset is not None:
        reset(code)


def detect_fake_mode(tensors):
    """The FakeTensorMode of ``tensors`` or the one active, else None (``torch._guards.detect_fake_mode``,
    unchanged in 2.11-2.15)."""
    from torch._guards import detect_fake_mode as _detect

    return _detect(tensors)


def fake_tensor_on(mode, meta: torch.Tensor, device: torch.device):
    """A FakeTensor of ``mode`` (`fake_mode`) with the metadata (shape, strides, dtype, storage) of
    the meta tensor ``meta`` that reports ``device`` (e.g. cuda:0, also where this torch has no CUDA):
    ``torch._subclasses.fake_tensor.FakeTensor(mode, meta, device)``, the constructor's signature in
    2.11-2.15."""
    from torch._subclasses.fake_tensor import FakeTensor

    return FakeTensor(mode, meta, torch.device(device))


def is_fake(t) -> bool:
    """True for a FakeTensor (``torch._subclasses.fake_tensor.FakeTensor``, 2.11-2.15)."""
    from torch._subclasses.fake_tensor import FakeTensor

    return isinstance(t, FakeTensor)


def fake_mode():
    """A new ``torch._subclasses.FakeTensorMode()`` (2.11-2.15)."""
    from torch._subclasses import FakeTensorMode

    return FakeTensorMode()


def real_tensors():
    """A context in which new tensors are real, also inside a FakeTensorMode (AOTAutograd's trace):
    ``torch._subclasses.fake_tensor.unset_fake_temporarily()`` (2.11-2.15)."""
    from torch._subclasses.fake_tensor import unset_fake_temporarily

    return unset_fake_temporarily()


__all__ = ["dynamo_backend", "dynamo_recompile_limit", "SUPPORTED", "torch_version", "check_version", "aot_module", "eager_backward_autocast", "lazy_graph_modules", "lazy_graph_module", "boxed_function", "boxed_codegen", "forward_outputs", "saved_for_backward_descs", "extract_subgraph", "primals_and_tangents", "NO_VERSION_CHECK", "activation_memory_budget", "is_compiled_module", "dynamo_export", "graph_break_counts", "aot_backend", "forget_code", "detect_fake_mode", "fake_tensor_on", "is_fake", "fake_mode", "real_tensors"]
