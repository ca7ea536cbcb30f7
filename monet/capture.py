"""Graph capture: trace a model's forward and backward with AOTAutograd into an `OpGraph`.

AOTAutograd traces with fake tensors, so capturing ResNet-50 at batch 184 allocates nothing of that
size: the example input only gives shapes and dtypes.  The ``partition_fn`` hook of ``aot_module``
receives the joint forward+backward graph; `capture` records it and stops the trace there.
"""
from __future__ import annotations

import contextlib

import torch
import torch.nn as nn
from torch._functorch.aot_autograd import aot_module

from monet import mixed_precision
from monet.graph import OpGraph, build_opgraph


class CaptureError(RuntimeError):
    """The model could not be traced; the message names the operator or construct."""


class _Captured(Exception):
    def __init__(self, joint, num_fwd_outputs):
        super().__init__("captured")
        self.joint = joint
        self.num_fwd_outputs = num_fwd_outputs


def primal_kinds(model: nn.Module, n_inputs: int) -> list[str]:
    """Kinds of AOTAutograd's ``primals_*`` placeholders in order: parameters, buffers, inputs."""
    n_params = len(dict(model.named_parameters(remove_duplicate=True)))
    n_buffers = len(dict(model.named_buffers(remove_duplicate=True)))
    return ["param"] * n_params + ["buffer"] * n_buffers + ["input"] * n_inputs


def kinds_by_name(joint, kinds: list[str]) -> dict[str, str]:
    placeholders = [n.name for n in joint.graph.nodes if n.op == "placeholder" and n.name.startswith("primals")]
    return dict(zip(placeholders, kinds))


def trace_joint(model: nn.Module, inputs: tuple, partition_fn, fw_compiler=None, bw_compiler=None) -> nn.Module:
    """``aot_module`` with our partitioner; the trace happens on the first call."""
    from functorch.compile import make_boxed_compiler, nop

    return aot_module(model, fw_compiler=fw_compiler or make_boxed_compiler(nop),
                      bw_compiler=bw_compiler or make_boxed_compiler(nop), partition_fn=partition_fn)


@contextlib.contextmanager
def _train_mode(model: nn.Module):
    was = model.training
    model.train()
    try:
        yield
    finally:
        model.train(was)


def capture(model: nn.Module, example_input: torch.Tensor, autocast_dtype: torch.dtype | None = None) -> OpGraph:
    """Trace ``model(example_input)`` forward and backward and return its `OpGraph`.

    Args:
        model: any ``nn.Module`` whose forward takes one tensor; traced in training mode
            (dropout, batch statistics), its mode restored afterwards.  Not modified.
        example_input: a tensor of the real shape, dtype and device, e.g. (B, 3, 224, 224)
            float32.  Its values are not read (the trace uses fake tensors).
        autocast_dtype: trace inside ``torch.autocast(example_input.device.type, autocast_dtype)``
            (``torch.bfloat16``; ``torch.float16`` on CUDA): mixed-precision training.  The graph
            then holds autocast's casts and 16-bit activations (2 bytes per element), and records
            the setting (``graph.autocast``, part of the fingerprint).  None: the autocast state in
            force at the call, as a training loop would run it (usually none).

    Returns:
        The `OpGraph`, with ``joint`` set to the traced joint graph.

    Raises:
        CaptureError: when AOTAutograd cannot trace the model (data-dependent control flow, an
            operator without a fake-tensor implementation ...); the message says which.
        ValueError: if no output of the model requires a gradient, or autocast does not run
            ``autocast_dtype`` on the input's device.
    """
    kinds = primal_kinds(model, 1)
    device_type = example_input.device.type

    def partition(joint, joint_inputs, *, num_fwd_outputs, **_):
        raise _Captured(joint, num_fwd_outputs)

    traced = trace_joint(model, (example_input,), partition)
    with contextlib.ExitStack() as stack:
        if autocast_dtype is not None:
            stack.enter_context(mixed_precision.context((device_type, autocast_dtype)))
        autocast = mixed_precision.current(device_type)  # what the trace runs under
        if autocast_dtype is not None and autocast != mixed_precision.normalize((device_type, autocast_dtype)):
            raise ValueError(f"torch.autocast does not run {autocast_dtype} on {device_type} "
                             f"(it runs {mixed_precision.describe(autocast)})")
        try:
            with _train_mode(model):
                traced(example_input)
        except _Captured as c:
            graph = build_opgraph(c.joint, c.num_fwd_outputs, kinds_by_name(c.joint, kinds), autocast=autocast)
            if not graph.bwd:
                raise ValueError("the model's output does not require a gradient: nothing to train")
            return graph
        except Exception as e:  # noqa: BLE001 - re-raised with what failed
            raise CaptureError(describe_trace_failure(e)) from e
    raise ValueError("the model's output does not require a gradient: nothing to train")


def _user_frame(e: BaseException) -> str:
    """``file:line: code`` of the innermost frame outside torch, where the model did what failed."""
    import os
    import traceback

    torch_dir = os.path.dirname(torch.__file__)
    frames = [f for f in traceback.extract_tb(e.__traceback__) if not f.filename.startswith(torch_dir)
              and "/monet/" not in f.filename.replace(os.sep, "/")]
    if not frames:
        return ""
    f = frames[-1]
    return f" at {f.filename}:{f.lineno}: `{(f.line or '').strip()}`"


def describe_trace_failure(e: BaseException) -> str:
    """One paragraph naming the operator or construct AOTAutograd could not trace, and what to do."""
    msg = str(e).strip().splitlines()
    first = msg[0] if msg else type(e).__name__
    text = f"{type(e).__name__}: {e}"
    hint = ""
    if ("DataDependent" in text or "data-dependent" in text or "_local_scalar_dense" in text
            or "GuardOnDataDependentSymNode" in text):
        hint = (" The model reads tensor values in Python (data-dependent control flow such as "
                "`if x.sum() > 0`, .item(), .tolist(), nonzero); make the control flow independent of "
                "the data or move it out of the model.")
    elif "fake" in text.lower() or "meta" in text.lower():
        hint = " An operator has no fake-tensor (meta) implementation; register one or replace the operator."
    return (f"could not trace the model with AOTAutograd{_user_frame(e)}: {type(e).__name__}: {first}.{hint} "
            f"Only models that AOTAutograd can trace are supported.")
