"""ReLU and hardtanh (ReLU6) with a 1-bit mask kept for the backward pass."""
import torch

from .bits import pack_bits, unpack_bits

aten = torch.ops.aten


def relu_mask_forward(x: torch.Tensor):
    """ReLU that also returns the packed mask of positive outputs.

    x: float tensor, any shape, numel n. Returns (y, packed): y = aten.relu(x) (same shape,
    dtype, bitwise equal to PyTorch), packed = pack_bits(y > 0), flat uint8 of ceil(n / 8)
    bytes, the only thing the backward needs. (The mask is computed as ~(y <= 0) so that
    NaN lets the gradient through exactly like aten.threshold_backward.)
    """
    y = aten.relu.default(x)
    return y, pack_bits(~(y <= 0))


def hardtanh_mask_forward(x: torch.Tensor, min_val: float = -1.0, max_val: float = 1.0):
    """Hardtanh (ReLU6 is min_val=0, max_val=6) that also returns a packed mask.

    x: float tensor, any shape, numel n. Returns (y, packed): y = aten.hardtanh(x, min_val,
    max_val), packed = pack_bits(min_val < x < max_val) as ceil(n / 8) uint8 bytes
    (computed as ~(x <= min_val | x >= max_val), matching aten.hardtanh_backward on NaN).
    """
    y = aten.hardtanh.default(x, min_val, max_val)
    return y, pack_bits(~((x <= min_val) | (x >= max_val)))


def mask_backward(grad: torch.Tensor, packed: torch.Tensor) -> torch.Tensor:
    """Backward of relu_mask_forward / hardtanh_mask_forward.

    grad: float tensor of the forward output's shape; packed: uint8 from the forward.
    Returns grad where the mask is set, +0 elsewhere (grad's shape and dtype), bitwise equal
    to aten.threshold_backward(grad, y, 0) / aten.hardtanh_backward(grad, x, min, max).
    """
    mask = unpack_bits(packed, grad.shape)
    return torch.where(mask, grad, torch.zeros((), dtype=grad.dtype, device=grad.device))


# ----------------------------------------------------------------------------------------------
# implementations (graph rewrites), see monet.impls.registry
# ----------------------------------------------------------------------------------------------
from monet.impls.registry import Impl, register, replace, swap, unused, users_with_op  # noqa: E402

_aten = torch.ops.aten


def _relu_backwards(anchor):
    """threshold_backward(grad, relu_output, 0) nodes (through views): a ReLU's backward, reading its output."""
    return [(u, None) for u in users_with_op(anchor, "aten.threshold_backward.default") if u.args[2] == 0]


def _hardtanh_args(anchor):
    lo, hi = (list(anchor.args[1:]) + [-1.0, 1.0][len(anchor.args) - 1:])[:2]
    return anchor.args[0], lo, hi


def _hardtanh_backwards(anchor):
    """(hardtanh_backward(grad, input, lo, hi), clone or None) pairs: a hardtanh's backward, reading its
    input directly or (after AOTAutograd functionalised ``hardtanh_``) a backward ``clone`` of it."""
    x, lo, hi = _hardtanh_args(anchor)
    if len(users_with_op(x, "aten.hardtanh.default")) != 1:
        return []
    found = [(u, None) for u in users_with_op(x, "aten.hardtanh_backward.default")]
    for c in users_with_op(x, "aten.clone.default"):
        users = [u for u in c.users if u.target is _aten.hardtanh_backward.default]
        if users and len(users) == len(c.users):
            found += [(u, c) for u in users]
    return [(u, c) for u, c in found if tuple(u.args[2:4]) == (lo, hi)]


def _rewire(graph, pairs, fn, read):
    for b, clone in pairs:
        swap(graph, b, fn, (b.args[0], read, *b.args[2:]) if fn is not mask_backward else (b.args[0], read))
        if clone is not None and not clone.users:
            swap(graph, clone, unused, ())  # keeps backward node ids; computes nothing


def _relu_store_input(graph, anchor) -> bool:
    pairs = _relu_backwards(anchor)
    # x > 0 exactly where relu(x) > 0: the same mask, read from the input
    _rewire(graph, pairs, _aten.threshold_backward.default, anchor.args[0])
    return bool(pairs)


def _hardtanh_store_output(graph, anchor) -> bool:
    pairs = _hardtanh_backwards(anchor)
    # lo < x < hi exactly where lo < hardtanh(x) < hi
    _rewire(graph, pairs, _aten.hardtanh_backward.default, anchor)
    return bool(pairs)


def _with_mask(graph, anchor, pairs, fn, args) -> bool:
    if not pairs:
        return False
    y, mask = replace(graph, anchor, fn, args, n_outputs=2)
    anchor.replace_all_uses_with(y)
    graph.erase_node(anchor)
    _rewire(graph, pairs, mask_backward, mask)
    return True


def _relu_mask(graph, anchor) -> bool:
    return _with_mask(graph, anchor, _relu_backwards(anchor), relu_mask_forward, (anchor.args[0],))


def _hardtanh_mask(graph, anchor) -> bool:
    return _with_mask(graph, anchor, _hardtanh_backwards(anchor), hardtanh_mask_forward, _hardtanh_args(anchor))


register(Impl("relu.store_input", "multiway", "fwd", ("aten.relu.default",), _relu_store_input,
              stores="the input instead of the output (same size: numel x itemsize bytes)"))
register(Impl("relu.mask", "newnode", "fwd", ("aten.relu.default",), _relu_mask,
              stores="a 1-bit mask, ceil(numel / 8) bytes"))
register(Impl("hardtanh.store_output", "multiway", "fwd", ("aten.hardtanh.default",), _hardtanh_store_output,
              stores="the output instead of the input (same size: numel x itemsize bytes)"))
register(Impl("hardtanh.mask", "newnode", "fwd", ("aten.hardtanh.default",), _hardtanh_mask,
              stores="a 1-bit mask, ceil(numel / 8) bytes"))
