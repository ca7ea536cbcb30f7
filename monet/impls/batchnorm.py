"""BatchNorm: the output-activated backward (In-Place ABN, Rota Bulo et al., CVPR 2018), and eager
PyTorch's cuDNN kernels on CUDA.

The output-activated backward is computed from the BatchNorm output y instead of its input x, so x
need not be kept: x_hat = (y - bias) / weight (an implementation the solver may choose).

On CUDA, eager PyTorch runs BatchNorm with cuDNN where AOTAutograd's graph runs ATen's native
kernel; `use_cudnn_batch_norm` lowers a CUDA graph to cuDNN's kernels, so that a schedule computes
what eager PyTorch computes (`monet.impls.lowering.lower_for_device`).
"""
import operator

import torch

from monet import compat
from monet.impls.registry import Impl, getitem_users, register, swap
from monet.terms import arg

def _zero_gamma_hint() -> str:
    mode = arg('mode="inplace_conv_newnode"', "--mode inplace_conv_newnode")
    return ("the output-activated BatchNorm backward cannot recover its input when gamma == 0; "
            f"re-solve without the 'multiway' mode token (e.g. {mode}) "
            "or initialise BatchNorm weights to non-zero values")


class ZeroGammaError(RuntimeError):
    """Raised when a BatchNorm weight (gamma) is zero, so x_hat cannot be recovered from y."""


def _check_weight(weight: torch.Tensor) -> None:
    if compat.is_fake(weight) or weight.device.type == "meta":
        return
    if weight.device.type == "cpu":
        zero = int((weight == 0).sum())
        if zero:
            raise ZeroGammaError(f"{zero} BatchNorm channel(s) have gamma == 0: {_zero_gamma_hint()}")
    else:  # no host sync: fails asynchronously on the device
        torch._assert_async(torch.all(weight != 0), f"BatchNorm gamma == 0: {_zero_gamma_hint()}")


def batch_norm_backward_from_output(grad, y, weight, bias, save_invstd, eps, output_mask):
    """Training-mode BatchNorm backward from the output y = x_hat * weight + bias.

    grad, y: float (N, C, *) tensors (any number >= 0 of spatial dims; channel dim 1);
    weight, bias: (C,) or None (affine off: weight 1, bias 0); save_invstd: (C,) float, the
    1/sqrt(var + eps) saved by aten.native_batch_norm; eps: unused (signature compatibility
    with native_batch_norm_backward); output_mask: 3 bools. With M = numel / C:
      grad_bias = sum(grad), grad_weight = sum(grad * x_hat) (over all dims but 1),
      grad_input = weight * save_invstd / M * (M * grad - grad_bias - x_hat * grad_weight).
    Returns (grad_input (y's shape), grad_weight (C,), grad_bias (C,)), None where output_mask
    is False. Stores nothing beyond y and the (C,) vectors, so x can be freed after forward.

    Raises ZeroGammaError if a real CPU weight has a zero entry (x_hat unrecoverable there).
    On CUDA (and other devices) the check is torch._assert_async (no host sync; a device-side
    assert instead); it is skipped for FakeTensor / meta weights so the function traces.
    """
    c = y.shape[1]
    dims = [0] + list(range(2, y.dim()))
    shape = [1, c] + [1] * (y.dim() - 2)
    m = y.numel() // c
    if weight is not None:
        _check_weight(weight)
    need_in, need_w, need_b = output_mask
    grad_input = grad_weight = grad_bias = None
    out_dtype = grad.dtype
    if grad.dtype in (torch.bfloat16, torch.float16):
        # mixed precision (autocast runs BatchNorm in 16 bits on the CPU): accumulate in float32,
        # as ATen's kernel does, and return float32 weight and bias gradients, as it does; for
        # float32 tensors nothing changes (bitwise as before)
        grad, y = grad.float(), y.float()
    if need_in or need_w:
        x_hat = y if bias is None else y - bias.view(shape)
        x_hat = x_hat if weight is None else x_hat / weight.view(shape)
        grad_weight = (grad * x_hat).sum(dims)
    if need_in or need_b:
        grad_bias = grad.sum(dims)
    if need_in:
        scale = save_invstd / m if weight is None else weight * save_invstd / m
        grad_input = scale.view(shape) * (m * grad - grad_bias.view(shape) - x_hat * grad_weight.view(shape))
        grad_input = grad_input.to(out_dtype)
    if out_dtype != grad.dtype:  # 16-bit inputs: the parameter gradients in the parameters' dtype
        pdtype = weight.dtype if weight is not None else save_invstd.dtype
        grad_weight = None if grad_weight is None else grad_weight.to(pdtype)
        grad_bias = None if grad_bias is None else grad_bias.to(pdtype)
    return (grad_input, grad_weight if need_w else None, grad_bias if need_b else None)


# ----------------------------------------------------------------------------------------------
# implementation (graph rewrite), see monet.impls.registry
# ----------------------------------------------------------------------------------------------

_aten = torch.ops.aten


def _output_activated(graph, anchor) -> bool:
    """native_batch_norm_backward(grad, x, w, rm, rv, mean, invstd, True, eps, mask) reading the input
    -> batch_norm_backward_from_output(grad, y, w, b, invstd, eps, mask) reading the output."""
    outs = getitem_users(anchor)
    if 0 not in outs or 1 not in outs or anchor.args[5] is not True:
        return False
    bwds = [u for u in outs[1].users if u.target is _aten.native_batch_norm_backward.default and u.args[5] is outs[1]]
    for b in bwds:
        swap(graph, b, batch_norm_backward_from_output,
             (b.args[0], outs[0], anchor.args[1], anchor.args[2], b.args[6], b.args[8], b.args[9]))
    return bool(bwds)


register(Impl("batchnorm.output_activated", "multiway", "fwd",
              ("aten._native_batch_norm_legit_functional.default", "aten.native_batch_norm.default"),
              _output_activated, stores="the output instead of the input (same size); raises ZeroGammaError "
                                        "in the backward if a weight (gamma) is 0"))


# ----------------------------------------------------------------------------------------------
# eager PyTorch's kernel on CUDA: cuDNN's BatchNorm (a lowering of the captured graph, not a choice)
# ----------------------------------------------------------------------------------------------
#: cuDNN's smallest epsilon (``CUDNN_BN_MIN_EPSILON``, cudnn.h); ATen uses its own kernel below it.
CUDNN_MIN_EPS = 1e-5


def _memory_format(x):
    """ATen's ``suggest_memory_format``: channels-last for a channels-last 4-d tensor, else
    contiguous (the format eager PyTorch makes BatchNorm's input and gradient contiguous in)."""
    from torch._prims_common import suggest_memory_format

    return suggest_memory_format(x)


def cudnn_batch_norm_functional(x, weight, bias, running_mean, running_var, momentum, eps):
    """Training-mode BatchNorm by cuDNN, as eager PyTorch runs it on CUDA, in the functional form of
    ``_native_batch_norm_legit_functional``: the running statistics are updated on copies.

    x: (N, C, *) float32/float16 on CUDA; weight, bias, running_mean, running_var: (C,) float32.
    Returns (out (x's shape), save_mean (C,), save_invstd (C,), new_running_mean (C,),
    new_running_var (C,), reserve (uint8, cuDNN's reserve space, 0 bytes for spatial BatchNorm
    without an activation)): the native op's five outputs in its order, then what cuDNN's backward
    reads.  The arithmetic is ``aten.cudnn_batch_norm``'s, which ATen's ``_batch_norm_impl_index``
    calls for eager ``F.batch_norm`` (aten/src/ATen/native/Normalization.cpp, 2.11-2.15).
    """
    rm, rv = running_mean.clone(), running_var.clone()
    out, mean, invstd, reserve = _aten.cudnn_batch_norm.default(
        x.contiguous(memory_format=_memory_format(x)), weight, bias, rm, rv, True, momentum, eps)
    return out, mean, invstd, rm, rv, reserve


def cudnn_batch_norm_inplace(x, weight, bias, running_mean, running_var, momentum, eps):
    """`cudnn_batch_norm_functional` updating ``running_mean`` and ``running_var`` themselves, as
    eager PyTorch does, and returning them as outputs 3 and 4 (the executor's forward module:
    `monet.executor.update_buffers_in_place`)."""
    out, mean, invstd, reserve = _aten.cudnn_batch_norm.default(
        x.contiguous(memory_format=_memory_format(x)), weight, bias, running_mean, running_var, True,
        momentum, eps)
    return out, mean, invstd, running_mean, running_var, reserve


def cudnn_batch_norm_grad(grad, x, weight, save_mean, save_invstd, eps, reserve):
    """cuDNN's BatchNorm backward (``aten.cudnn_batch_norm_backward``, what autograd runs after
    `cudnn_batch_norm_functional`'s kernel in eager PyTorch): (grad_input (x's shape), grad_weight
    (C,), grad_bias (C,)).  ``grad`` is made contiguous in ``x``'s memory format, as autograd's
    formula does (derivatives.yaml, ``cudnn_batch_norm``)."""
    return tuple(_aten.cudnn_batch_norm_backward.default(
        x, grad.contiguous(memory_format=_memory_format(x)), weight, None, None, save_mean, save_invstd,
        eps, reserve))


def eager_runs_cudnn(x, weight, bias, running_mean, running_var, eps) -> bool:
    """Whether eager PyTorch would run training-mode ``F.batch_norm`` on these (fake) tensors with
    cuDNN: ATen's ``_batch_norm_impl_index`` condition (Normalization.cpp, 2.11-2.15) for a CUDA
    input with cuDNN enabled: neither input nor weight bfloat16; a float16 input only with float32
    weights; weight, bias and both running statistics present; 3 or more dimensions; a batch of at
    most 880,801; ``eps >= CUDNN_MIN_EPS``."""
    tensors = (x, weight, bias, running_mean, running_var)
    if not all(isinstance(t, torch.Tensor) for t in tensors):
        return False
    return (x.dtype != torch.bfloat16 and weight.dtype != torch.bfloat16
            and (x.dtype != torch.float16 or weight.dtype == torch.float32)
            and x.dim() >= 3 and x.shape[0] <= 880801 and float(eps) >= CUDNN_MIN_EPS)


def use_cudnn_batch_norm(graph) -> int:
    """Rewrite ``graph`` (a joint FX graph, in place) to run BatchNorm with cuDNN wherever eager
    PyTorch would (`eager_runs_cudnn`): each training-mode ``_native_batch_norm_legit_functional``
    whose backward is ``native_batch_norm_backward`` becomes `cudnn_batch_norm_functional` and that
    backward `cudnn_batch_norm_grad` reading cuDNN's reserve space.  Returns how many it rewrote.

    Why: AOTAutograd decomposes eager's ``cudnn_batch_norm`` into ATen's native kernel, whose
    rounding differs (on an H100, ResNet-50's gradients came out 2 % off eager's under full fp32, and
    bitwise equal with cuDNN off for both) and whose kernels are slower (43 % of ResNet-50's profiled
    step at batch 184).  One node stays one node: node ids, the fingerprint and schedules solved for
    the graph do not change (`monet.impls.lowering.lower_for_device`).
    """
    count = 0
    for node in list(graph.nodes):
        if node.op != "call_function" or node.target is not _aten._native_batch_norm_legit_functional.default:
            continue
        x, w, b, rm, rv, training, momentum, eps = node.args[:8]
        vals = [a.meta.get("val") if isinstance(a, torch.fx.Node) else a for a in (x, w, b, rm, rv)]
        if training is not True or not eager_runs_cudnn(*vals, eps):
            continue
        outs = getitem_users(node)
        bwds = [u for u in outs[1].users if u.target is _aten.native_batch_norm_backward.default
                and u.args[5] is outs[1]] if 1 in outs else []
        if 1 in outs and len(bwds) != len(outs[1].users):
            continue  # another reader of the saved mean (an implementation rewrote this one): leave it
        if any(list(b.args[9]) != [True, True, True] for b in bwds):
            continue  # cuDNN's backward computes all three gradients: a partial mask keeps ATen's
        new = swap(graph, node, cudnn_batch_norm_functional, (x, w, b, rm, rv, momentum, eps))
        with graph.inserting_after(new):
            reserve = graph.call_function(operator.getitem, (new, 5))
        reserve.meta["val"] = new.meta["val"][5]
        for bwd in bwds:
            grad, mean, invstd, beps = bwd.args[0], bwd.args[5], bwd.args[6], bwd.args[8]
            swap(graph, bwd, cudnn_batch_norm_grad, (grad, x, w, mean, invstd, beps, reserve))
        count += 1
    return count
