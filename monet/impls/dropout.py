"""Dropout that keeps a 1-bit mask instead of a bool (1-byte) mask."""
import torch

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


# ----------------------------------------------------------------------------------------------
# implementation (graph rewrite), see monet.impls.registry
# ----------------------------------------------------------------------------------------------
from monet.impls.registry import Impl, getitem_users, register, replace_stashing  # noqa: E402


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
