"""Convolution algorithm choices, selected through backend flags around the ATen ops.

Each variant is a module-level function (FX code generation and pickling can name it) taking the
arguments of aten.convolution / aten.convolution_backward and returning their results.
"""
from contextlib import contextmanager

import torch

aten = torch.ops.aten


@contextmanager
def _mkldnn_off():
    # None leaves a flag unchanged (avoids touching oneDNN's TF32 / precision settings).
    with torch.backends.mkldnn.flags(enabled=False, deterministic=None, allow_tf32=None,
                                     fp32_precision=None):
        yield


def _cudnn(enabled, benchmark=None, deterministic=None):
    # None leaves a flag unchanged; allow_tf32 is passed its current value so TF32 use is unchanged.
    return torch.backends.cudnn.flags(enabled=enabled, benchmark=benchmark, benchmark_limit=None,
                                      deterministic=deterministic,
                                      allow_tf32=torch.backends.cudnn.allow_tf32,
                                      fp32_precision=None, depthwise_kernel=None)


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


for _device, _algos in CONV_ALGORITHMS.items():
    for _name, (_fwd, _bwd) in _algos.items():
        _fwd._monet_aten, _bwd._monet_aten = aten.convolution.default, aten.convolution_backward.default
        register(Impl(f"conv.{_name}", "conv", "fwd", ("aten.convolution.default",), _retarget(_fwd),
                      devices=(_device,), stores="the same as PyTorch's; time and workspace differ"))
        register(Impl(f"conv_backward.{_name}", "conv", "bwd", ("aten.convolution_backward.default",),
                      _retarget(_bwd), devices=(_device,), stores="nothing (a backward node)"))
