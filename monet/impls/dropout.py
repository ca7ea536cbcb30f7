"""Dropout in a captured graph: its backward scale as eager PyTorch rounds it, its forward and
backward on the CPU without the mixed-dtype product (`lower_dropout`), and an implementation that keeps a
1-bit mask instead of a bool (1-byte) mask."""
import operator

import torch
from torch import fx

from monet import compat
from monet.impls.registry import Impl, getitem_users, register, replace_stashing, swap

from .bits import pack_bits, unpack_bits

aten = torch.ops.aten


def dropout_bitmask_forward(x: torch.Tensor, p: float, train):
    """aten.native_dropout with the mask bit-packed.

    x: float tensor, any shape, numel n. Returns (out, packed): out exactly as
    aten.native_dropout(x, p, train) gives it (same random numbers drawn, so bitwise equal
    under the same seed), packed = pack_bits(mask), flat uint8 of ceil(n / 8) bytes.
    Draws random numbers (attribute `_monet_random`): recomputed with the forward pass's
    generator state (`monet.rng`).
    """
    out, mask = aten.native_dropout.default(x, p, train)
    return out, pack_bits(mask)


dropout_bitmask_forward._monet_random = True


def dropout_bitmask_backward(grad: torch.Tensor, packed: torch.Tensor, scale: float) -> torch.Tensor:
    """Backward of dropout_bitmask_forward: grad (output's shape, float) and the packed mask ->
    grad_input of grad's shape and dtype, computed as grad * mask * scale like
    aten.native_dropout_backward (bitwise equal)."""
    mask = unpack_bits(packed, grad.shape)
    return grad * mask * scale


def eager_scale(p: float, dtype: torch.dtype) -> float:
    """The factor eager PyTorch's dropout multiplies kept elements and their gradients by on the CPU,
    for drop probability ``p`` and a tensor of ``dtype``: 1 / (1 - p) rounded to ``dtype``.

    On the CPU, ``F.dropout`` is not the fused ``aten.native_dropout`` (only CUDA and XPU take it,
    ``is_fused_kernel_acceptable`` in ATen's Dropout.cpp): it draws a ``noise`` tensor of the
    input's dtype, divides it by 1 - p in place and multiplies, so the backward is ``grad * noise``.
    A traced graph holds ``aten.native_dropout`` (torch._decomp's ``dropout``) and its backward
    ``grad * mask * scale``, with ``scale`` a double that the kernel keeps in fp32.  The same mask
    and forward values either way; in bf16 the gradients differ (1/0.9 is 1.109375 in bf16, not
    1.1111112), in fp32 and fp64 they agree."""
    with compat.real_tensors():  # called inside AOTAutograd's trace: a real tensor
        return torch.ones(8, dtype=dtype).div_(1 - p)[0].item()


def match_eager_dropout(joint: fx.GraphModule) -> int:
    """Give each ``aten.native_dropout_backward`` of a CPU tensor in ``joint`` (the joint graph
    AOTAutograd traced) the scale eager PyTorch's dropout uses (`eager_scale`), so that the
    captured graph's gradients are eager's bit for bit in bf16 and fp16 too.  CUDA's dropout is
    the fused kernel the graph holds, and fp32 agrees already: both left as they are.  Returns
    the number of nodes changed."""
    changed = 0
    for node in joint.graph.nodes:
        if node.target is not aten.native_dropout_backward.default:
            continue
        grad, mask, scale = node.args[:3]
        val = grad.meta.get("val") if isinstance(grad, fx.Node) else None
        fwd = mask.args[0] if isinstance(mask, fx.Node) and mask.target is operator.getitem else None
        if (val is None or val.device.type != "cpu" or val.dtype not in (torch.bfloat16, torch.float16)
                or getattr(fwd, "target", None) is not aten.native_dropout.default):
            continue  # fp32 and fp64: the kernel's fp32 scale is eager's already (graphs unchanged)
        p = float(fwd.args[1])
        if not 0 < p < 1:
            continue
        rounded = eager_scale(p, val.dtype)
        if rounded != scale:
            node.args = (grad, mask, rounded, *node.args[3:])
            changed += 1
    if changed:
        joint.recompile()
    return changed


def dropout_forward_cpu(x: torch.Tensor, p: float, train):
    """``aten.native_dropout(x, p, train)`` on the CPU, bit for bit: ``(out, mask)``, ``out`` of
    ``x``'s shape and dtype, ``mask`` bool of its shape.  The same random numbers are drawn (the
    kernel's own ``bernoulli_`` into the bool mask), then the mask is converted to ``x``'s dtype once,
    into the tensor that becomes ``out``, and multiplied by ``x`` and by 1 / (1 - p) in place
    (``aten.mul_.Scalar``, as the kernel's C++ does: Python's ``mul_(float)`` rounds the factor to
    bf16 / fp16 first and gave other bits in those dtypes).

    Why: ATen's kernel computes ``x.mul(mask).mul_(scale)``, and the CPU runs the mixed-dtype product
    by first copying the bool mask into a temporary of ``x``'s dtype: one more allocation and pass of
    ``x``'s size per dropout, in the forward pass and in every recomputation.  ``x * 1`` and ``x * 0``
    in ``x``'s dtype either way, then the same scalar product: the same values, signed zeros,
    infinities and NaN included, in fp32, bf16 and fp16.  Not in eval (``train`` False) or for an empty ``x``: the kernel.
    Draws random numbers (`_monet_random`): recomputed with the forward pass's generator state
    (`monet.rng`)."""
    if train is False or x.numel() == 0:
        return aten.native_dropout.default(x, p, train)
    p1m = 1.0 - p
    mask = torch.empty_like(x, dtype=torch.bool).bernoulli_(p1m)
    out = _as_float(mask, x.dtype)
    return aten.mul_.Scalar(out.mul_(x), 0.0 if p1m == 0 else 1.0 / p1m), mask


dropout_forward_cpu._monet_random = True


def _as_float(mask: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """The bool ``mask`` as 0 and 1 of the float ``dtype``, in a new tensor of its shape and strides.
    Converted from the mask's bytes read as uint8 (a bool tensor holds 0 or 1 in each byte): the
    same values, and 2.6 times faster on the CPU than the bool-to-float copy (0.13 against 0.34 ms
    for 2 x 4 x 256 x 256 to fp32, one thread)."""
    return mask.view(torch.uint8).to(dtype)


def dropout_backward_cpu(grad: torch.Tensor, mask: torch.Tensor, scale: float) -> torch.Tensor:
    """``aten.native_dropout_backward(grad, mask, scale)`` on the CPU, bit for bit: ``grad * mask *
    scale`` with the bool ``mask`` (grad's shape) converted to ``grad``'s dtype once, into the tensor
    that becomes the result (one allocation of grad's size, as the kernel's own output), then
    multiplied in place.  The factor is applied as the kernel's ``tensor * double`` applies it, a
    product with a wrapped number (``Tensor.mul_``); ``aten.mul_.Scalar``, right for the forward,
    gives other bf16 and fp16 bits here when ``scale`` is not a 16-bit number.

    Why: the ATen kernel multiplies a float tensor by a bool one, and the CPU runs that mixed-dtype
    product element by element: 1.7 ms for the attention probabilities of one layer of the depth
    benchmark (2 x 4 x 256 x 256 fp32, one thread), 0.43 ms this way (eager PyTorch's dropout
    keeps fp32 noise and pays 0.26 ms; the bool mask is a quarter of its memory); in bf16 0.81
    against 0.44 ms.  The same results for every value, signed zeros, infinities and NaN
    included (``grad * 1`` and ``grad * 0`` in grad's dtype, then the same scalar product)."""
    out = _as_float(mask, grad.dtype)
    torch.mul(grad, out, out=out)
    return out.mul_(scale)


def _on_cpu(node: fx.Node, dtypes, *args) -> bool:
    """Whether ``node`` and its tensor ``args`` were traced as CPU tensors, the first of them of one
    of ``dtypes``, and ``node``'s (first) result has the strides of the last of them (the ones the
    lowering's result takes)."""
    vals = [a.meta.get("val") if isinstance(a, fx.Node) else None for a in (*args, node)]
    out = vals[-1][0] if isinstance(vals[-1], (tuple, list)) else vals[-1]
    vals[-1] = out
    if any(not isinstance(v, torch.Tensor) for v in vals):
        return False
    return vals[0].device.type == "cpu" and vals[0].dtype in dtypes and out.stride() == vals[-2].stride()


_LOWERED_DTYPES = (torch.float32, torch.bfloat16, torch.float16)  # the dtypes lowered, forward and backward


def lower_dropout(graph: fx.Graph) -> int:
    """Rewrite ``graph`` (a joint FX graph, in place) to run each ``native_dropout`` of a CPU fp32,
    bf16 or fp16 tensor as `dropout_forward_cpu` and each ``native_dropout_backward`` of one as
    `dropout_backward_cpu`, where the result is laid out as the traced node's (the forward's input's,
    the backward's mask's strides).  One node stays one node, with its name, arguments, users and
    traced value (the same shapes, dtypes and strides: not traced again), as
    `monet.impls.lowering.lower_for_device` needs.  Returns how many it rewrote."""
    count = 0
    for node in list(graph.nodes):
        if node.op != "call_function":
            continue
        if node.target is aten.native_dropout.default and _on_cpu(node, _LOWERED_DTYPES, node.args[0], node.args[0]):
            swap(graph, node, dropout_forward_cpu, val=node.meta["val"])
        elif (node.target is aten.native_dropout_backward.default and _on_cpu(node, _LOWERED_DTYPES, *node.args[:2])
              and node.args[1].meta["val"].dtype == torch.bool):
            swap(graph, node, dropout_backward_cpu, val=node.meta["val"])
        else:
            continue
        count += 1
    return count


# ----------------------------------------------------------------------------------------------
# implementation (graph rewrite), see monet.impls.registry
# ----------------------------------------------------------------------------------------------


def _bitmask(graph, anchor) -> bool:
    outs = getitem_users(anchor)
    if 1 not in outs:
        return False
    bwds = [u for u in outs[1].users if u.target is aten.native_dropout_backward.default]
    if not bwds or len(bwds) != len(outs[1].users):
        return False
    replace_stashing(graph, anchor, dropout_bitmask_forward, anchor.args, bwds, dropout_bitmask_backward,
                     lambda b, packed: (b.args[0], packed, b.args[2]))
    return True


register(Impl("dropout.bitmask", "newnode", "fwd", ("aten.native_dropout.default",), _bitmask,
              stores="a 1-bit mask, ceil(numel / 8) bytes (PyTorch's: a bool mask, numel bytes)"))
