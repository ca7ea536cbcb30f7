"""Convolution algorithm choices, selected through backend flags around the ATen ops.

Each variant is a module-level function (FX code generation and pickling can name it) taking the
arguments of aten.convolution / aten.convolution_backward and returning their results.  The flags
are set through `monet.compat.backend_flags`, which leaves TF32 and precision settings alone and
works on every admitted torch (``torch.backends.cudnn.flags()``'s signature differs between them).
"""
import torch

from monet.compat import backend_flags

aten = torch.ops.aten


def _mkldnn_off():
    return backend_flags("mkldnn", enabled=False)


def _cudnn(enabled, benchmark=None, deterministic=None):
    # None leaves a flag unchanged
    return backend_flags("cudnn", enabled=enabled, benchmark=benchmark, deterministic=deterministic)


def convolution_native(*args):
    """aten.convolution with oneDNN disabled (PyTorch's native CPU kernels)."""
    with _mkldnn_off():
        return aten.convolution.default(*args)


def convolution_backward_native(*args):
    """aten.convolution_backward with oneDNN disabled."""
    with _mkldnn_off():
        return aten.convolution_backward.default(*args)


def convolution_cudnn_benchmark(*args):
    """aten.convolution with cuDNN autotuning (benchmark=True, non-deterministic)."""
    with _cudnn(True, benchmark=True, deterministic=False):
        return aten.convolution.default(*args)


def convolution_backward_cudnn_benchmark(*args):
    """aten.convolution_backward with cuDNN autotuning."""
    with _cudnn(True, benchmark=True, deterministic=False):
        return aten.convolution_backward.default(*args)


def convolution_cudnn_deterministic(*args):
    """aten.convolution with deterministic cuDNN algorithms (no autotuning)."""
    with _cudnn(True, benchmark=False, deterministic=True):
        return aten.convolution.default(*args)


def convolution_backward_cudnn_deterministic(*args):
    """aten.convolution_backward with deterministic cuDNN algorithms."""
    with _cudnn(True, benchmark=False, deterministic=True):
        return aten.convolution_backward.default(*args)


def convolution_no_cudnn(*args):
    """aten.convolution with cuDNN disabled (PyTorch's own CUDA kernels)."""
    with _cudnn(False):
        return aten.convolution.default(*args)


def convolution_backward_no_cudnn(*args):
    """aten.convolution_backward with cuDNN disabled."""
    with _cudnn(False):
        return aten.convolution_backward.default(*args)


def convolution_backward_chunked(grad, x, weight, bias_sizes, stride, padding, dilation, transposed,
                                 output_padding, groups, output_mask):
    """aten.convolution_backward over the two halves of the batch, one after the other.

    The kernel's temporaries (im2col columns, oneDNN reorders) scale with the batch, so each half
    needs about half the workspace; grad_input (x's shape) is written half by half into one
    tensor, grad_weight and grad_bias ((C_out, C_in / groups, *k) and (C_out,)) are the sums of
    the halves' (the same values up to summation order).  A batch of one runs unsplit.
    """
    n = x.shape[0]
    if n < 2:
        return aten.convolution_backward.default(grad, x, weight, bias_sizes, stride, padding, dilation,
                                                 transposed, output_padding, groups, output_mask)
    h = (n + 1) // 2
    grad_input = x.new_empty(x.shape, dtype=grad.dtype) if output_mask[0] else None
    grad_weight = grad_bias = None
    for a, b in ((0, h), (h, n)):
        gi, gw, gb = aten.convolution_backward.default(grad[a:b], x[a:b], weight, bias_sizes, stride, padding,
                                                       dilation, transposed, output_padding, groups, output_mask)
        if grad_input is not None:
            grad_input[a:b].copy_(gi)
        del gi
        if gw is not None:
            grad_weight = gw if grad_weight is None else grad_weight.add_(gw)
        if gb is not None:
            grad_bias = gb if grad_bias is None else grad_bias.add_(gb)
    return grad_input, grad_weight, grad_bias


# Non-default algorithms per device type: name -> (forward, backward).
CONV_ALGORITHMS = {
    "cpu": {"native": (convolution_native, convolution_backward_native)},
    "cuda": {
        "cudnn_benchmark": (convolution_cudnn_benchmark, convolution_backward_cudnn_benchmark),
        "cudnn_deterministic": (convolution_cudnn_deterministic, convolution_backward_cudnn_deterministic),
        "no_cudnn": (convolution_no_cudnn, convolution_backward_no_cudnn),
    },
}


# ----------------------------------------------------------------------------------------------
# implementations (graph rewrites), see monet.impls.registry
# ----------------------------------------------------------------------------------------------
from monet.impls.registry import Impl, register, swap  # noqa: E402


def _retarget(fn):
    def rewrite(graph, anchor) -> bool:
        swap(graph, anchor, fn)
        return True
    return rewrite


convolution_backward_chunked._monet_aten = aten.convolution_backward.default
register(Impl("conv_backward.chunked", "conv", "bwd", ("aten.convolution_backward.default",),
              _retarget(convolution_backward_chunked),
              stores="nothing (a backward node); about half the workspace, in two passes over the batch"))

for _device, _algos in CONV_ALGORITHMS.items():
    for _name, (_fwd, _bwd) in _algos.items():
        _fwd._monet_aten, _bwd._monet_aten = aten.convolution.default, aten.convolution_backward.default
        register(Impl(f"conv.{_name}", "conv", "fwd", ("aten.convolution.default",), _retarget(_fwd),
                      devices=(_device,), stores="the same as PyTorch's; time and workspace differ"))
        register(Impl(f"conv_backward.{_name}", "conv", "bwd", ("aten.convolution_backward.default",),
                      _retarget(_bwd), devices=(_device,), stores="nothing (a backward node)"))
