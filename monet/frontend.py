"""The capture front end: Dynamo exports the model's Python into one FX graph, AOTAutograd traces it.

Hugging Face transformers (and much of timm and torchvision) is written for ``torch.compile`` and
``torch.export``, whose front end is Dynamo: it builds attention masks with checks such as
``if not is_tracing(mask) and (mask[:, -1] == 0).all()`` that only skip their data-dependent branch
when Dynamo is tracing, takes keyword inputs and returns ``ModelOutput`` objects.  Tracing such a
model with AOTAutograd alone (``aot_module``) runs the Python as it is and fails on those checks.

So the model goes through two steps (`export`, then `trace`):

1. ``torch._dynamo.export`` turns the call ``model(*args, **kwargs)`` into one torch-level FX graph
   module (a graph break is an error that names the construct), which takes the same arguments,
   returns the same output structure (tensors, tuples, dicts, ``ModelOutput``) and holds the
   model's own parameter and buffer objects as attributes (tied weights once).  Its parameters and
   buffers are put in the model's ``named_parameters()`` / ``named_buffers()`` order, so that the
   joint graph below is the one ``aot_module(model)`` gives for a plain module (the same
   fingerprint: the zoo's solutions stay valid).
2. ``aot_module`` on that graph module yields AOTAutograd's joint forward+backward ATen graph
   (``partition_fn``), which the rest of monet reads, and runs the forward and backward modules
   the partition returns.  Dynamo is not involved at run time (no guards, no recompilation
   limits): the wrapper checks the input structure, shapes and dtypes itself.
"""
from __future__ import annotations

import contextlib
import inspect
import logging
import warnings

import torch
import torch.fx as fx
import torch.nn as nn
from monet import compat
from monet.terms import MonetWarning
from monet.inputs import ExampleInputs


class CaptureError(RuntimeError):
    """The model could not be traced; the message names the operator or construct and the fix."""


class GraphBreakError(CaptureError):
    """Dynamo could not trace the model into one graph (a graph break or data-dependent control
    flow); ``torch.compile`` would run it in pieces, and so does `monet.optimize`
    (`monet.pieces`)."""


class ShardedModelError(CaptureError, TypeError):
    """The model is sharded with FSDP2 (``fully_shard``) or holds DTensor parameters: monet cannot
    capture it as one graph (see `fsdp_refusal`)."""


FSDP2_ALTERNATIVES = (
    "Alternatives: (1) per block: wrap each block first, then shard the wrappers, "
    "`block = fully_shard(MONeTWrapper(block, block_solution))` with a schedule solved for one block "
    "(`capture(block, x_block)` with its input as the block receives it), then `fully_shard(model)`; "
    "FSDP2 then all-gathers the block's parameters before the scheduled forward and again before its "
    "scheduled backward (docs/guide.md, \"FSDP2\"); (2) DistributedDataParallel: `DDP(MONeTWrapper(model, solution))` "
    "with unsharded parameters")


def fsdp_refusal(model: nn.Module) -> str | None:
    """Why ``model`` cannot be captured as one graph under FSDP2, or None.

    A module sharded with ``torch.distributed.fsdp.fully_shard`` (an ``FSDPModule``: the model or
    any submodule) runs FSDP2's pre/post-forward hooks (all-gather, reshard, the backward's
    reduce-scatter), which torch 2.13 marks ``torch._dynamo.disable`` (``_dynamo_disable`` in
    ``torch/distributed/fsdp/_fully_shard/_fsdp_common.py``): Dynamo breaks the graph there, and
    the collectives would run outside AOTAutograd's joint graph anyway.  Outside FSDP2's forward
    its parameters are DTensor shards, not the tensors the graph computes with.
    """
    try:
        from torch.distributed.fsdp import FSDPModule
        from torch.distributed.tensor import DTensor
    except ImportError:  # a torch built without torch.distributed
        return None
    sharded = [name or "the model" for name, m in model.named_modules() if isinstance(m, FSDPModule)]
    dtensors = [name for name, t in list(model.named_parameters()) + list(model.named_buffers())
                if isinstance(t, DTensor)]
    if not sharded and not dtensors:
        return None
    what = (f"it is sharded with FSDP2's fully_shard ({', '.join(sharded[:4])}{' ...' if len(sharded) > 4 else ''} "
            f"{'is an FSDPModule' if len(sharded) == 1 else 'are FSDPModules'})" if sharded else
            f"it holds DTensor parameters ({', '.join(dtensors[:4])}{' ...' if len(dtensors) > 4 else ''})")
    return (f"monet cannot capture this model as one graph: {what}. FSDP2's hooks all-gather and "
            "reshard the parameters outside autograd's graph and torch 2.13 excludes them from Dynamo "
            "(torch._dynamo.disable in torch/distributed/fsdp/_fully_shard/_fsdp_common.py), so a "
            "fully_shard-ed model is a graph break and its DTensor shards are not the tensors its "
            f"forward computes with. {FSDP2_ALTERNATIVES}")


@contextlib.contextmanager
def _fsdp_managed_as_plain(model: nn.Module):
    """Let Dynamo trace ``model`` as a plain module while FSDP2 manages it from outside.

    ``fully_shard(MONeTWrapper(block, ...))`` marks the block and its submodules
    ``_is_fsdp_managed_module``; Dynamo then lifts their parameters as graph inputs (as
    ``torch.compile`` under FSDP2 wants), which ``torch._dynamo.export`` rejects ("Unexpectedly
    found a Parameter in the inputs").  Inside FSDP2's forward those parameters are the
    all-gathered, unsharded ``nn.Parameter`` objects FSDP2 reuses every step (it refills their
    storage before the forward and before the backward), so the graph may hold them as attributes,
    as for any module.  The marks are restored afterwards.
    """
    marked = [m for m in model.modules() if getattr(m, "_is_fsdp_managed_module", False)]
    for m in marked:
        m._is_fsdp_managed_module = False
    try:
        yield
    finally:
        for m in marked:
            m._is_fsdp_managed_module = True


def _forward_taking(model: nn.Module, name: str) -> nn.Module | None:
    """The module whose ``forward`` takes the keyword ``name``: ``model`` itself, or the model a
    wrapper passes its keyword arguments on to (``.model`` of `monet.with_loss.WithLoss`), else None."""
    seen = set()
    while isinstance(model, nn.Module) and id(model) not in seen:
        seen.add(id(model))
        try:
            params = inspect.signature(model.forward).parameters
        except (TypeError, ValueError):
            return None
        if name in params:
            return model
        if not any(p.kind == inspect.Parameter.VAR_KEYWORD for p in params.values()):
            return None
        model = getattr(model, "model", None)
    return None


_WARNED_USE_CACHE: set = set()


def cache_owner(model: nn.Module) -> nn.Module | None:
    """The module of ``model`` whose forward takes ``use_cache`` (``model`` itself, or the model
    a wrapper such as `monet.with_loss.WithLoss` passes its keyword arguments to), or None; what
    `training_inputs` reads its ``config`` from.  Reads the forwards' signatures: a caller that
    runs every step keeps it (`monet.wrapper.MONeTWrapper` does)."""
    return _forward_taking(model, "use_cache")


_UNKNOWN = object()


def training_inputs(model: nn.Module, inputs: ExampleInputs, owner=_UNKNOWN) -> ExampleInputs:
    """``inputs`` as a training call takes them: with ``use_cache=False`` added where the model's
    forward takes ``use_cache`` (transformers' causal LMs: GPT-2, Llama, Qwen2 ...) and the caller
    did not pass it, whatever its ``config.use_cache`` says (a Trainer may set it to False after
    the schedule was solved: the graph stays the same); else ``inputs`` unchanged.
    ``owner``: `cache_owner` of ``model`` when the caller has it already (per training step).

    A cache (past keys and values, for generation) is an output training does not read, and one
    Dynamo cannot return; transformers' own gradient checkpointing turns ``use_cache`` off in
    training the same way, with a warning.  So does this (a `monet.terms.MonetWarning`, once per model class and
    process).
    """
    if "use_cache" in inputs.kwargs:
        return inputs
    inner = cache_owner(model) if owner is _UNKNOWN else owner
    if inner is None:
        return inputs
    # added whatever the config says, so that the graph is the same when something (Trainer,
    # transformers' checkpointing) sets config.use_cache = False after the schedule was solved;
    # said only where the config asks for a cache
    if getattr(getattr(inner, "config", None), "use_cache", False) and type(inner) not in _WARNED_USE_CACHE:
        _WARNED_USE_CACHE.add(type(inner))
        warnings.warn(f"{type(inner).__name__} is trained with use_cache=False: its config asks for a cache of past "
                  "keys and values, which training does not read (transformers' gradient checkpointing does the "
                      "same); pass use_cache explicitly to silence this", MonetWarning, stacklevel=3)
    return ExampleInputs(inputs.args, {**inputs.kwargs, "use_cache": False})


def _logging_functions() -> set:
    """Logger methods Dynamo may skip (transformers' ``logger.warning_once`` among them): a
    model that logs while it runs would otherwise be a graph break."""
    fns = {logging.Logger.debug, logging.Logger.info, logging.Logger.warning, logging.Logger.warn}
    for name in ("warning_once", "info_once", "warning_advice"):
        fn = getattr(logging.Logger, name, None)
        if fn is not None:
            fns.add(fn)
    return fns


def _not_exporting() -> bool:
    """What transformers' ``is_torchdynamo_exporting`` answers inside `masks_as_compiled`."""
    return False


@contextlib.contextmanager
def masks_as_compiled():
    """Inside: transformers' attention masks (``transformers.masking_utils``, where loaded) are
    built as under ``torch.compile``, not as under ``torch.export``.

    ``torch._dynamo.export`` makes ``torch.compiler.is_exporting()`` true, and transformers then
    never skips a mask it could skip: called without ``attention_mask``, an encoder such as BERT
    gets a (B, 1, T, T) mask converted and added to the attention scores in every layer, where eager
    PyTorch (and ``torch.compile`` since torch 2.14) passes none.  transformers keeps the mask under
    export because an exported graph may later be called with another query length
    (pytorch/pytorch#108108); a monet graph is for the shapes and the input structure it was
    captured with (the wrapper checks both), so the skip eager PyTorch takes holds for every call.
    A mask whose values decide the skip (a padding mask passed in) is still kept: transformers
    does not read tensor values while Dynamo traces.  The same gradients, bit for bit (a mask of
    zeros added changes no score; tests/test_transformers_masks.py); 16 layers of BERT at 2 x 256
    tokens lose 67 of 449 forward nodes."""
    import sys

    masking = sys.modules.get("transformers.masking_utils")
    if masking is None or not hasattr(masking, "is_torchdynamo_exporting"):
        yield
        return
    was = masking.is_torchdynamo_exporting
    masking.is_torchdynamo_exporting = _not_exporting
    try:
        yield
    finally:
        masking.is_torchdynamo_exporting = was


@contextlib.contextmanager
def _train_mode(model: nn.Module):
    was = model.training
    model.train()
    try:
        yield
    finally:
        model.train(was)


def _canonical_order(gm: fx.GraphModule, model: nn.Module) -> None:
    """Reorder ``gm``'s parameters and buffers (registered flat on it by Dynamo, in the order the
    forward first used them) into ``model``'s ``named_parameters()`` / ``named_buffers()`` order.

    Tensors Dynamo lifted that are neither (plain tensor attributes of a module) keep their place
    after the model's own.
    """
    rank_p = {id(p): k for k, (_, p) in enumerate(model.named_parameters())}
    rank_b = {id(b): k for k, (_, b) in enumerate(model.named_buffers())}
    n = len(rank_p) + len(rank_b)
    gm._parameters = dict(sorted(gm._parameters.items(), key=lambda kv: rank_p.get(id(kv[1]), n)))
    gm._buffers = dict(sorted(gm._buffers.items(), key=lambda kv: rank_b.get(id(kv[1]), n)))


def _user_code(text: str) -> str:
    """`` at file:line: `code` ``: the last model frame Dynamo's message names ("from user code")."""
    import re

    if "from user code" not in text:
        return ""
    tail = text.split("from user code", 1)[1]
    frames = re.findall(r'File "([^"]+)", line (\d+), in [^\n]*\n\s*([^\n]*)', tail)
    if not frames:
        return ""
    path, line, code = frames[-1]
    return f" at {path}:{line}: `{code.strip()}`"


def is_graph_break(e: BaseException) -> bool:
    """Whether an export failed where ``torch.compile`` would break the graph: Dynamo's
    ``Unsupported`` (print, ``.item()``, a branch on a value, setting ``requires_grad`` ...) or a
    data-dependent guard."""
    text = str(e)
    return ("graph break" in text.lower() or "Unsupported" in type(e).__name__ or "Unsupported" in text[:200]
            or "DataDependent" in text or "data-dependent" in text or "GuardOnDataDependentSymNode" in text)


def describe_export_failure(e: BaseException) -> str:
    """One paragraph naming what Dynamo could not export, where in the model, and what to do."""
    text = str(e).strip()
    first = text.splitlines()[0] if text else type(e).__name__
    if "DynamicCache" in text or "Cache'>" in text:
        return ("the model returns a cache object (transformers' DynamicCache: past key/values for "
                "generation), which training does not use: call the model with use_cache=False "
                "(or set model.config.use_cache = False)")
    if "graph break" in text.lower() or "Unsupported" in type(e).__name__ or "Unsupported" in text[:200]:
        explanation = " ".join(line.strip() for line in text.splitlines()[:6] if line.strip())
        return (f"Dynamo could not trace the model into one graph (a graph break): {explanation}. "
                "one graph, as torch.compile(fullgraph=True) needs, does not hold the whole forward; "
                "monet.optimize trains such a model in pieces with the code between them run eagerly "
                "(monet.pieces), or change that construct in the model to capture it whole")
    if "DataDependent" in text or "data-dependent" in text or "GuardOnDataDependentSymNode" in text:
        return (f"{type(e).__name__}: {first}. The model reads tensor values in Python (data-dependent "
                "control flow such as `if x.sum() > 0`, .item(), .tolist(), nonzero); make the control "
                "flow independent of the data or move it out of the model")
    return f"{type(e).__name__}: {first}"


def export(model: nn.Module, inputs: ExampleInputs) -> fx.GraphModule:
    """``model(*inputs.args, **inputs.kwargs)`` as one torch-level FX graph module (Dynamo), traced
    in training mode (dropout, batch statistics), the model's mode restored afterwards.

    The result is called like the model and returns the same output structure; its parameters and
    buffers are the model's own objects, in the model's order.  Nothing of the inputs' size is
    allocated: Dynamo traces with fake tensors.

    A model managed by FSDP2 from outside (the ``block`` of ``fully_shard(MONeTWrapper(block,
    ...))``, called inside FSDP2's forward with its parameters all-gathered) is traced as a plain
    module (`_fsdp_managed_as_plain`).

    Raises:
        ShardedModelError: the model is or contains a ``fully_shard``-ed module, or holds DTensor
            parameters (`fsdp_refusal`).
        CaptureError: a graph break, a data-dependent branch, an output Dynamo cannot return (a
            transformers cache: the message says ``use_cache=False``), or a model compiled already.
    """
    if compat.is_compiled_module(model):
        raise CaptureError("the model is a torch.compile result: pass the original model "
                           "(`model._orig_mod`)")
    refusal = fsdp_refusal(model)
    if refusal:
        raise ShardedModelError(refusal)
    # An export leaves a cache entry on the forward's code object, like a compilation; after eight
    # exports of one model class (eight wrappers, or tests) Dynamo's recompile limit would refuse the
    # ninth.  Nothing runs from those entries (the exported module is run, not the cache), so the
    # limit is lifted for the export and the entries are dropped after it (`_forget`).
    try:
        with _train_mode(model), _fsdp_managed_as_plain(model), masks_as_compiled():
            gm = compat.dynamo_export(model, inputs.args, inputs.kwargs, _logging_functions())
    except CaptureError:
        raise
    except Exception as e:  # noqa: BLE001 - re-raised with what failed and the fix
        where = _user_code(str(e)) or _user_frame(e)
        kind = GraphBreakError if is_graph_break(e) else CaptureError
        raise kind(f"could not capture the model with Dynamo{where}: {describe_export_failure(e)}") from e
    finally:
        _forget(model)
    _canonical_order(gm, model)
    return gm


def rebind(gm: fx.GraphModule, source: nn.Module, target: nn.Module) -> fx.GraphModule:
    """A copy of ``gm`` (an `export` of ``source``) that reads ``target``'s parameters and buffers
    instead of ``source``'s: ``target`` is a copy of ``source`` (``copy.deepcopy``, same names and
    shapes).  Exporting a 96-layer GPT-2 takes about 50 s on 2 cores; this, milliseconds.

    Raises:
        ValueError: ``target``'s parameters and buffers are not ``source``'s by name and shape."""
    import copy

    def tensors(m):
        return list(m.named_parameters(remove_duplicate=False)) + list(m.named_buffers(remove_duplicate=False))

    ours, theirs = tensors(source), tensors(target)
    if [(n, tuple(t.shape)) for n, t in ours] != [(n, tuple(t.shape)) for n, t in theirs]:
        raise ValueError("cannot rebind the export: the target's parameters and buffers are not the source's")
    with warnings.catch_warnings():  # torch 2.13's pytree warns of its own LeafSpec when copied
        warnings.filterwarnings("ignore", message=".*LeafSpec.*", category=FutureWarning)
        return copy.deepcopy(gm, {id(a): b for (_, a), (_, b) in zip(ours, theirs)})


def _forget(model: nn.Module) -> None:
    """Drop Dynamo's cache entries on the code objects of ``model``'s forward (and the functions it
    wraps: transformers decorates its forwards), which `export` left."""
    fn = type(model).forward
    seen = set()
    while fn is not None and id(fn) not in seen:
        seen.add(id(fn))
        code = getattr(fn, "__code__", None)
        if code is not None:
            compat.forget_code(code)
        fn = getattr(fn, "__wrapped__", None)


def primal_sources(gm: nn.Module, model: nn.Module, inputs: ExampleInputs) -> list[tuple[str, object]]:
    """What feeds each of AOTAutograd's ``primals_*`` placeholders of ``aot_module(gm)``, in order:
    ``("param", name)`` and ``("buffer", name)`` with the model's own name of each parameter and
    buffer Dynamo lifted (it lifts only those the forward uses), ``("constant", tensor)`` for a
    plain tensor attribute it lifted, then ``("input", k)`` for leaf k of the inputs."""
    names = {}
    for name, t in list(model.named_parameters(remove_duplicate=False)) + list(model.named_buffers(remove_duplicate=False)):
        names.setdefault(id(t), name)
    sources: list[tuple[str, object]] = []
    for _, p in gm.named_parameters(remove_duplicate=True):
        sources.append(("param", names[id(p)]) if id(p) in names else ("constant", p))
    for _, b in gm.named_buffers(remove_duplicate=True):
        sources.append(("buffer", names[id(b)]) if id(b) in names else ("constant", b))
    return sources + [("input", k) for k in range(len(inputs.leaves()))]


def primal_kinds(sources: list[tuple[str, object]]) -> list[str]:
    """The memory kind of each primal (`primal_sources`): "param", "buffer" (constants too) or "input"."""
    return ["buffer" if kind == "constant" else kind for kind, _ in sources]


def kinds_by_name(joint: fx.GraphModule, kinds: list[str]) -> dict[str, str]:
    placeholders = [n.name for n in joint.graph.nodes if n.op == "placeholder" and n.name.startswith("primals")]
    return dict(zip(placeholders, kinds))


def trace(gm: nn.Module, partition_fn, fw_compiler=None, bw_compiler=None) -> nn.Module:
    """``aot_module(gm)`` with ``partition_fn`` (it receives the joint graph on the first call,
    which is to run inside `tracing`)."""
    return compat.aot_module(gm, partition_fn, fw_compiler, bw_compiler)


@contextlib.contextmanager
def tracing():
    """The context of a `trace`'s first call, where AOTAutograd traces: the backward pass traced
    without autocast, as eager autograd runs it (`monet.compat.eager_backward_autocast`), and the
    joint graph's Python code left ungenerated until something runs or reads it
    (`monet.compat.lazy_graph_modules`: monet reads its nodes only)."""
    with compat.eager_backward_autocast(), compat.lazy_graph_modules():
        yield


def _user_frame(e: BaseException) -> str:
    """`` at file:line: `code` `` of the innermost frame outside torch and monet, where the model did
    what failed."""
    import os
    import traceback

    torch_dir = os.path.dirname(torch.__file__)
    frames = [f for f in traceback.extract_tb(e.__traceback__) if not f.filename.startswith(torch_dir)
              and "/monet/" not in f.filename.replace(os.sep, "/")]
    if not frames:
        return ""
    f = frames[-1]
    return f" at {f.filename}:{f.lineno}: `{(f.line or '').strip()}`"


__all__ = ["CaptureError", "GraphBreakError", "is_graph_break", "ShardedModelError", "fsdp_refusal", "export", "rebind", "trace", "tracing", "primal_sources", "primal_kinds", "kinds_by_name",
           "describe_export_failure", "training_inputs", "cache_owner"]
