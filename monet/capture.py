"""Graph capture: a model's forward and backward as an `OpGraph` (Dynamo, then AOTAutograd).

`monet.frontend` exports the call with Dynamo (the front end of ``torch.compile`` and
``torch.export``: keyword inputs, ``ModelOutput``, tied weights, transformers' masks) and traces the
exported graph with AOTAutograd; the ``partition_fn`` hook receives the joint forward+backward graph,
`capture` records it and stops the trace there.  A deep stack of identical layers is exported from
a copy with a few of them (`monet.stack.export_stack`).  Both steps use fake tensors, so capturing
ResNet-50 at batch 184 allocates nothing of that size: the example inputs only give shapes and dtypes.
"""
from __future__ import annotations

import contextlib

import torch
import torch.nn as nn

from monet import mixed_precision
from monet.frontend import (CaptureError, describe_export_failure, kinds_by_name, primal_kinds,
                            primal_sources, trace, tracing, training_inputs)
from monet.graph import OpGraph, build_opgraph
from monet.impls.dropout import match_eager_dropout
from monet.inputs import ExampleInputs, call_key
from monet.shape_reads import standin_shape_reads
from monet.stack import export_stack


def opgraph_of(joint: torch.fx.GraphModule, num_fwd_outputs: int, sources: dict, autocast) -> OpGraph:
    """The `OpGraph` of the joint graph AOTAutograd traced (at a capture, and again at the wrapper's
    first training call): its dropout's backward scale made eager's first
    (`monet.impls.dropout.match_eager_dropout`), the arguments its backward reads for their shape
    only given a stand-in (`monet.shape_reads.standin_shape_reads`), its inputs' kinds and sources
    from ``sources`` (`monet.frontend.primal_sources`), under the autocast setting ``autocast``
    (`monet.mixed_precision`)."""
    match_eager_dropout(joint)
    standin_shape_reads(joint)
    graph = build_opgraph(joint, num_fwd_outputs, kinds_by_name(joint, primal_kinds(sources)), autocast=autocast)
    graph.primal_sources = sources
    return graph


class _Captured(Exception):
    def __init__(self, joint, num_fwd_outputs):
        super().__init__("captured")
        self.joint = joint
        self.num_fwd_outputs = num_fwd_outputs


def capture(model: nn.Module, example_inputs, autocast_dtype: torch.dtype | None = None, lm_loss=None,
            log=None, keep_copy: bool = False) -> OpGraph:
    """Trace ``model(*example_inputs)`` forward and backward and return its `OpGraph`.

    Args:
        model: any ``nn.Module`` Dynamo can export in one graph (``torch.compile(fullgraph=True)``
            would compile it); traced in training mode (dropout, batch statistics), its mode
            restored afterwards.  Not modified.
        example_inputs: one tensor (``model(x)``, e.g. (B, 3, 224, 224) float32), a tuple of
            positional arguments, a dict of keyword arguments (``{"input_ids": ids, "labels": ids}``,
            ids (B, T) int64) or an `ExampleInputs`.  The first tensor's first dimension is the
            batch.  Values are not read (the trace uses fake tensors); non-tensor arguments
            (``use_cache=False``) are constants of the graph.
        autocast_dtype: trace inside ``torch.autocast(device_type, autocast_dtype)`` (the first
            tensor's device; ``torch.bfloat16``; ``torch.float16`` on CUDA): mixed-precision
            training.  The graph then holds autocast's casts and 16-bit activations (2 bytes per
            element), and records the setting (``graph.autocast``, part of the fingerprint).  None:
            the autocast state in force at the call, as a training loop would run it (usually none).
        lm_loss: None (default): the graph as the model computes it; ``"chunked"`` or a number of
            rows: a language model's head and cross-entropy replaced by one op computed over
            chunks of tokens (`monet.lm_loss.fuse_lm_loss`: Liger Kernel's chunk size, or that
            many rows), so that the logits never exist whole; the model then returns no logits
            in training.  A model without such a loss is captured as it is.
        log: a callable taking one line for the log (``Progress.log``), told how a deep stack of
            identical layers was exported (`monet.stack.export_stack`); None: nothing said.
        keep_copy: keep the few-layer copy such a stack was exported from, for the costs to measure
            on (`monet.stack.take_copy`), until `monet.stack.forget_copy`.

    Returns:
        The `OpGraph`, with ``joint`` set to the traced joint graph.

    Raises:
        CaptureError: when the model cannot be traced (a graph break, data-dependent control flow,
            an operator without a fake-tensor implementation, a returned cache object ...); the
            message names the construct, where it is, and the fix.
        ValueError: if no output of the model requires a gradient, or autocast does not run
            ``autocast_dtype`` on the input's device.
        TypeError: example inputs of another kind (see `ExampleInputs.of`).
    """
    inputs = training_inputs(model, ExampleInputs.of(example_inputs))
    device_type = inputs.first.device.type

    def partition(joint, joint_inputs, *, num_fwd_outputs, **_):
        raise _Captured(joint, num_fwd_outputs)

    with contextlib.ExitStack() as stack:
        if autocast_dtype is not None:
            stack.enter_context(mixed_precision.context((device_type, autocast_dtype)))
        autocast = mixed_precision.current(device_type)  # what the trace runs under
        if autocast_dtype is not None and autocast != mixed_precision.normalize((device_type, autocast_dtype)):
            raise ValueError(f"torch.autocast does not run {autocast_dtype} on {device_type} "
                             f"(it runs {mixed_precision.describe(autocast)})")
        gm = export_stack(model, inputs, log, keep_copy)
        if lm_loss is not None:
            from monet.lm_loss import fuse_lm_loss

            fuse_lm_loss(gm, None if lm_loss == "chunked" else int(lm_loss))
        sources = primal_sources(gm, model, inputs)
        try:
            with tracing():
                trace(gm, partition)(*inputs.args, **inputs.kwargs)
        except _Captured as c:
            graph = opgraph_of(c.joint, c.num_fwd_outputs, sources, autocast)
            graph.exported = (call_key(inputs, autocast), gm)
            if not graph.bwd:
                raise ValueError("the model's output does not require a gradient: nothing to train")
            return graph
        except Exception as e:  # noqa: BLE001 - re-raised with what failed
            raise CaptureError(f"could not trace the model with AOTAutograd: {describe_export_failure(e)}. "
                               "Only models that AOTAutograd can trace are supported.") from e
    raise ValueError("the model's output does not require a gradient: nothing to train")


__all__ = ["capture", "CaptureError"]
