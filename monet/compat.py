"""Every use of PyTorch's private or version-dependent APIs, in one module.

monet builds on AOTAutograd's joint graph, its partitioner helpers and its runtime, on Dynamo's
export, on backend flags and on the profiler's raw allocator events.  None of these is a public,
stable API: each release moves some of them.  The rest of monet imports them from here only
(`tests/test_compat.py` checks that no other module touches ``torch._functorch``, ``torch._dynamo``,
``torch._inductor``, ``torch._guards``, ``torch._subclasses``, ``torch._C._dynamo``,
``torch._C._profiler``, ``functorch`` or ``torch.fx.graph._BoxedCodeGen``), so that a new release
is one file to read and fix.  Each entry says which releases it was checked on and how they differ.

Admitted releases: torch 2.11 through 2.15 (`SUPPORTED`).  Checked on 2.11.0+cu130, 2.13.0+cpu,
2.14.1+cu130 and 2.15.0+cu132 (the entries below were read in each one's sources).  Out of that
range `check_version` warns once: the entries may then have moved.
"""
from __future__ import annotations

import contextlib
import functools
import os
import re
import sys
import tempfile
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
                  "its private APIs (monet/compat.py) may have moved", RuntimeWarning, stacklevel=2)
    return False


# ----------------------------------------------------------------------------------------------
# AOTAutograd: tracing, compilers, the partitioner's helpers
# ----------------------------------------------------------------------------------------------


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


# ----------------------------------------------------------------------------------------------
# Dynamo
# ----------------------------------------------------------------------------------------------


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
    # and DenseNet-121's export then failed in F.batch_norm on a symbolic size check (issue 40)
    static = {k: v for k, v in (("automatic_dynamic_shapes", False), ("assume_static_by_default", True))
              if hasattr(dynamo_config, k)}
    patch = dynamo_config.patch(
        ignore_logging_functions=set(dynamo_config.ignore_logging_functions) | set(ignore_logging), **limits,
        **static)
    with patch:
        gm, _guards = torch._dynamo.export(model, aten_graph=False)(*args, **kwargs)
    return gm


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


# ----------------------------------------------------------------------------------------------
# fake tensors
# ----------------------------------------------------------------------------------------------


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


# ----------------------------------------------------------------------------------------------
# backend flags
# ----------------------------------------------------------------------------------------------


@contextlib.contextmanager
def backend_flags(backend: str, **flags):
    """Set ``torch.backends.<backend>.<flag> = value`` for each ``flags`` entry that is not None
    (``cudnn``: ``enabled``, ``benchmark``, ``deterministic``; ``mkldnn``: ``enabled``) and restore
    the previous values afterwards; TF32 and precision settings are never touched.

    Not ``torch.backends.cudnn.flags()``: its signature differs between releases (2.11 has no
    ``depthwise_kernel``, 2.12 and later require it to be passed to leave it unchanged), and in
    2.11-2.15 it reads the legacy ``allow_tf32`` flag, which raises ("a mix of the legacy and new
    APIs") as soon as a user sets the per-operator ``torch.backends.cudnn.conv.fp32_precision``.
    The properties set here are public and the same in 2.11-2.15.

    Raises:
        ValueError: an unknown backend or flag.
    """
    module = {"cudnn": torch.backends.cudnn, "mkldnn": torch.backends.mkldnn}.get(backend)
    allowed = {"cudnn": ("enabled", "benchmark", "deterministic"), "mkldnn": ("enabled",)}.get(backend, ())
    if module is None or set(flags) - set(allowed):
        raise ValueError(f"backend_flags: {backend!r} with {sorted(flags)}; expected cudnn with {allowed} "
                         f"or mkldnn with ('enabled',)")
    before = {k: getattr(module, k) for k, v in flags.items() if v is not None}
    try:
        for k in before:
            setattr(module, k, bool(flags[k]))
        yield
    finally:
        for k, v in before.items():
            setattr(module, k, v)


@contextlib.contextmanager
def strict_fp32():
    """Full fp32 arithmetic on CUDA inside: TF32 off for cuDNN convolutions and cuBLAS matmuls,
    restored afterwards; a check compares gradients under the same numerics on both sides
    (docs/design.md, "What must stay true").

    2.9 and later (2.11-2.15 here) have the per-operator precision settings
    (``torch.backends.cudnn.conv.fp32_precision``, ``torch.backends.cuda.matmul.fp32_precision``:
    "ieee" is full fp32, "tf32" allows TF32, "none" defers to the parent setting); mixing them with
    the legacy ``allow_tf32`` flags raises on read, so only the new ones are set here.  cuDNN's
    default on 2.11-2.15 is "tf32" for convolutions (TF32 on Ampere and later), cuBLAS's "none"
    (full fp32 unless ``torch.set_float32_matmul_precision`` says otherwise).
    """
    settings = [(torch.backends.cudnn.conv, "fp32_precision"), (torch.backends.cuda.matmul, "fp32_precision")]
    before = [(obj, name, getattr(obj, name)) for obj, name in settings]
    try:
        for obj, name, _ in before:
            setattr(obj, name, "ieee")
        yield
    finally:
        for obj, name, value in before:
            setattr(obj, name, value)


def numerics() -> dict:
    """The settings that decide CUDA fp32 arithmetic, for reports: TF32 for cuDNN convolutions and
    cuBLAS matmuls (``fp32_precision``), ``torch.get_float32_matmul_precision()``, cuDNN's
    ``deterministic`` and ``benchmark``."""
    return {"cudnn_conv_fp32_precision": torch.backends.cudnn.conv.fp32_precision,
            "cuda_matmul_fp32_precision": torch.backends.cuda.matmul.fp32_precision,
            "float32_matmul_precision": torch.get_float32_matmul_precision(),
            "cudnn_deterministic": bool(torch.backends.cudnn.deterministic),
            "cudnn_benchmark": bool(torch.backends.cudnn.benchmark)}


# ----------------------------------------------------------------------------------------------
# the profiler's raw allocator events
# ----------------------------------------------------------------------------------------------


_KINETO_CHATTER = re.compile(r"^(USDT|STAGE):\S+ \S+ \d+:\d+ \S+\.cpp:\d+\] ")


@contextlib.contextmanager
def _stderr_without_kineto_chatter():
    """File descriptor 2 into a temporary file inside; afterwards the lines written there are
    written to stderr again, except kineto's ``USDT:``/``STAGE:`` lines."""
    sys.stderr.flush()
    saved = os.dup(2)
    with tempfile.TemporaryFile() as tmp:
        os.dup2(tmp.fileno(), 2)
        try:
            yield
        finally:
            sys.stderr.flush()
            os.dup2(saved, 2)
            os.close(saved)
            tmp.seek(0)
            kept = [line for line in tmp.read().decode(errors="replace").splitlines(keepends=True)
                    if not _KINETO_CHATTER.match(line)]
            if kept:
                sys.stderr.write("".join(kept))
                sys.stderr.flush()


@contextlib.contextmanager
def quiet_profile(**kwargs):
    """``torch.profiler.profile(**kwargs)`` without kineto's lines on stderr.

    torch 2.13-2.15 (kineto) print ``USDT: ... SyncActivityProfilerHandler.cpp:52] profiler_start``
    and ``profiler_stop`` each time a profiler starts and stops (2.11 prints them too on CPU builds;
    ``STAGE:`` lines at some log levels), whatever ``KINETO_LOG_LEVEL`` says below 6.  Kineto reads
    ``KINETO_LOG_LEVEL`` once, at the first profiler of the process: it is set to 6 (silent) here
    unless the user set it, and where a profiler ran before, the start and stop are run with
    stderr filtered (`_stderr_without_kineto_chatter`).  What the profiled code itself writes to
    stderr passes unchanged.
    """
    from torch.profiler import profile

    os.environ.setdefault("KINETO_LOG_LEVEL", "6")
    with warnings.catch_warnings():
        # torch 2.11 warns that the "Profiler clears events at the end of each cycle" once a
        # profiler has run in the process: monet reads each profiler's events before the next
        warnings.filterwarnings("ignore", message=".*[Pp]rofiler clears events.*")
        prof = profile(**kwargs)
        with _stderr_without_kineto_chatter():
            prof.__enter__()
        try:
            yield prof
        finally:
            with _stderr_without_kineto_chatter():
                prof.__exit__(None, None, None)


def allocation_events(prof) -> list:
    """(start_time_ns, bytes, ptr, device type) of every raw allocator event a finished
    ``torch.profiler.profile(profile_memory=True)`` recorded, in tree order (parents before their
    children, children in order), bytes negative for a free.

    The events come from ``prof.profiler.kineto_results.experimental_event_tree()``, nodes tagged
    ``torch._C._profiler._EventType.Allocation`` with ``extra_fields`` (``alloc_size``, ``ptr``,
    ``device``): unchanged in 2.11-2.15.  ``prof.events()`` folds them into their op's totals.

    Raises:
        RuntimeError: the event tree is no longer there (a torch outside `SUPPORTED`).
    """
    return [e[:4] for e in scoped_allocation_events(prof, None)[0]]


def scoped_allocation_events(prof, prefix: str | None) -> tuple[list, list]:
    """`allocation_events` with the scope of each: ``(events, scopes)``.

    ``events``: (start_time_ns, bytes, ptr, device type, scope) in tree order, ``scope`` the name of
    the innermost enclosing event whose name starts with ``prefix`` (a
    ``torch.profiler.record_function(name)`` around the code that allocated), None outside any (or
    when ``prefix`` is None).  ``scopes``: (name, start_time_ns, end_time_ns) of every event whose
    name starts with ``prefix``, in tree order.  Same event tree as `allocation_events` (2.11-2.15:
    a ``record_function`` is a node of the tree, the allocations made inside it its descendants).

    Raises:
        RuntimeError: the event tree is no longer there (a torch outside `SUPPORTED`).
    """
    from torch._C._profiler import _EventType

    try:
        roots = prof.profiler.kineto_results.experimental_event_tree()
    except AttributeError as exc:
        raise RuntimeError(f"torch {torch.__version__}'s profiler no longer exposes "
                           "kineto_results.experimental_event_tree(): monet/compat.py needs updating") from exc
    events, scopes = [], []
    stack = [(node, None) for node in reversed(roots)]
    while stack:  # depth-first, children in order
        node, scope = stack.pop()
        if node.tag == _EventType.Allocation:
            ef = node.extra_fields
            events.append((int(node.start_time_ns), int(ef.alloc_size), int(ef.ptr), ef.device.type, scope))
        elif prefix is not None and node.name.startswith(prefix):
            scope = node.name
            scopes.append((node.name, int(node.start_time_ns), int(node.end_time_ns)))
        stack.extend((child, scope) for child in reversed(node.children))
    return events, scopes


# ----------------------------------------------------------------------------------------------
# the CUDA caching allocator's history
# ----------------------------------------------------------------------------------------------


def cuda_memory_history(enabled: bool, max_entries: int = 2_000_000) -> None:
    """Start (``enabled``) or stop recording the CUDA caching allocator's alloc / free events:
    ``torch.cuda.memory._record_memory_history("all" | None, context=None, stacks="python",
    max_entries=max_entries)``, without stack traces (the events are attributed by
    `cuda_memory_metadata` instead).  The keyword signature is that of 2.11-2.15 (read in 2.14.1's
    torch/cuda/memory.py; the string form of ``enabled`` replaced the boolean one in 2.1)."""
    torch.cuda.memory._record_memory_history("all" if enabled else None, context=None, stacks="python",
                                             max_entries=max_entries)


def cuda_memory_snapshot() -> dict:
    """``torch.cuda.memory._snapshot()``: ``{"segments": [...], "device_traces": [[entry, ...] per
    device]}``, each trace entry a dict with ``action`` ("alloc", "free_requested",
    "free_completed", "segment_alloc", "segment_free", "oom", "snapshot"), ``addr``, ``size``
    (bytes: the allocator's block), ``stream``, ``time_us`` and, where set, ``user_metadata``
    (`cuda_memory_metadata`).  The format of 2.11-2.15 (``TraceEntry`` in torch/cuda/memory.py)."""
    return torch.cuda.memory._snapshot()


def cuda_memory_metadata(label: str) -> bool:
    """Stamp ``label`` on the CUDA allocator's trace events the calling thread generates from now on
    (``torch.cuda.memory._set_memory_metadata``; "" clears it); False where this torch has no such
    function (it came with PR #165490, October 2025: 2.10 and later, so present in 2.11-2.15 as
    read in 2.14.1's sources; not run on 2.11 here, without a GPU).  Thread-local: set it in the
    thread that allocates (autograd runs a CUDA backward pass in its own device thread)."""
    setter = getattr(torch.cuda.memory, "_set_memory_metadata", None)
    if setter is None:
        return False
    setter(label)
    return True


def boxed_list_function(fn):
    """``fn`` (one argument: the list of inputs, which it may clear to free them early) marked for
    AOTAutograd's boxed calling convention: the ``_boxed_call`` attribute its runtime checks
    (``call_func_at_runtime_with_args``; what ``make_boxed_func`` sets) in 2.11-2.15."""
    fn._boxed_call = True
    return fn


__all__ = ["SUPPORTED", "torch_version", "check_version", "aot_module", "lazy_graph_modules", "lazy_graph_module", "boxed_function", "boxed_codegen",
           "forward_outputs", "saved_for_backward_descs", "extract_subgraph", "primals_and_tangents",
           "NO_VERSION_CHECK", "activation_memory_budget", "is_compiled_module", "dynamo_export", "aot_backend",
           "forget_code", "detect_fake_mode", "is_fake", "fake_mode", "fake_tensor_on", "backend_flags", "strict_fp32",
           "numerics", "quiet_profile", "allocation_events", "scoped_allocation_events", "cuda_memory_history",
           "cuda_memory_snapshot", "cuda_memory_metadata", "boxed_list_function"]
