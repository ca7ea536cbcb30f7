"""Output-activated BatchNorm backward (In-Place ABN, Rota Bulo et al., CVPR 2018).

The backward is computed from the BatchNorm output y instead of its input x, so x need not be
kept: x_hat = (y - bias) / weight.
"""
import torch

from monet import compat
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
from monet.impls.registry import Impl, getitem_users, register, swap  # noqa: E402

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
