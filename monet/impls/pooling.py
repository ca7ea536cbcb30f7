"""2-D max pooling that keeps each maximum's offset inside its window (4 or 8 bits) instead of
int64 flat indices."""
import torch

from .bits import pack_nibbles, unpack_nibbles

aten = torch.ops.aten


def _params(kernel_size, stride, padding, dilation):
    two = lambda v: [v, v] if isinstance(v, int) else ([v[0], v[0]] if len(v) == 1 else list(v))
    k = two(kernel_size)
    return k, (two(stride) if stride else k), two(padding), two(dilation)  # stride [] = kernel


def _window_origin(out_shape, s, p, device):
    """Top-left (h, w) of every output's window, broadcastable to (..., OH, OW)."""
    oh = torch.arange(out_shape[-2], device=device).view(-1, 1) * s[0] - p[0]
    ow = torch.arange(out_shape[-1], device=device) * s[1] - p[1]
    return oh, ow


def compact_offset_bytes(out_numel: int, kernel_size) -> int:
    """Bytes the offsets of a pooling output with out_numel elements take:
    ceil(out_numel / 2) if the window has <= 16 elements, else out_numel."""
    k = _params(kernel_size, None, 0, 1)[0]
    return (out_numel + 1) // 2 if k[0] * k[1] <= 16 else out_numel


def maxpool2d_compact_forward(x, kernel_size, stride, padding=0, dilation=1, ceil_mode=False):
    """aten.max_pool2d_with_indices with compact indices.

    x: float (N, C, H, W) or (C, H, W); the other arguments as aten.max_pool2d_with_indices
    takes them (int lists of length 1 or 2, stride [] = kernel_size). Returns (out, offsets):
    out exactly as PyTorch's; offsets the position o = dh * kw + dw of each maximum inside its
    window (the one PyTorch's index points to, so ties match). For kh * kw <= 16 offsets is a
    flat uint8 tensor of ceil(out.numel() / 2) bytes (4 bits each, pack_nibbles), otherwise a
    uint8 tensor of out's shape (out.numel() bytes). Errors are aten's (bad shapes/params).
    """
    k, s, p, d = _params(kernel_size, stride, padding, dilation)
    out, idx = aten.max_pool2d_with_indices.default(x, kernel_size, stride, padding, dilation, ceil_mode)
    width = x.shape[-1]
    oh, ow = _window_origin(out.shape, s, p, x.device)
    dh = torch.div(idx // width - oh, d[0], rounding_mode="floor")
    dw = torch.div(idx % width - ow, d[1], rounding_mode="floor")
    offsets = (dh * k[1] + dw).to(torch.uint8)
    return out, (pack_nibbles(offsets) if k[0] * k[1] <= 16 else offsets)


def maxpool2d_compact_backward(grad, offsets, input_shape, kernel_size, stride, padding=0,
                               dilation=1, ceil_mode=False):
    """Backward of maxpool2d_compact_forward.

    grad: float, out's shape; offsets: from the forward; input_shape: list of ints (x's shape);
    pooling parameters as in the forward. Returns grad_input, contiguous, of input_shape and
    grad's dtype: grad scattered-added to the recorded maxima. Equal to
    aten.max_pool2d_with_indices_backward up to summation order where windows overlap.
    """
    k, s, p, d = _params(kernel_size, stride, padding, dilation)
    if k[0] * k[1] <= 16:
        offsets = unpack_nibbles(offsets, grad.shape)
    off = offsets.to(torch.int64)
    oh, ow = _window_origin(grad.shape, s, p, grad.device)
    h = oh + torch.div(off, k[1], rounding_mode="floor") * d[0]
    w = ow + off % k[1] * d[1]
    planes = grad.shape[:-2].numel()
    idx = (h * input_shape[-1] + w).reshape(planes, -1)
    grad_input = grad.new_zeros((planes, input_shape[-2] * input_shape[-1]))
    grad_input = grad_input.scatter_add(1, idx, grad.reshape(planes, -1))
    return grad_input.view(input_shape)


# ----------------------------------------------------------------------------------------------
# implementation (graph rewrite), see monet.impls.registry
# ----------------------------------------------------------------------------------------------
from monet.impls.registry import Impl, getitem_users, register, replace_stashing  # noqa: E402

_aten = torch.ops.aten


def _compact(graph, anchor) -> bool:
    """max_pool2d_with_indices -> (out, in-window offsets); its backward reads the offsets only
    (PyTorch's reads the int64 indices and the input, for its shape)."""
    outs = getitem_users(anchor)
    if 1 not in outs:
        return False
    bwds = [u for u in outs[1].users if u.target is _aten.max_pool2d_with_indices_backward.default]
    if not bwds:
        return False
    x = anchor.args[0]
    args = list(anchor.args) + [[], 0, 1, False][len(anchor.args) - 2:]
    shape = [int(d) for d in x.meta["val"].shape]
    replace_stashing(graph, anchor, maxpool2d_compact_forward, args, bwds, maxpool2d_compact_backward,
                     lambda b, offsets: (b.args[0], offsets, shape, *args[1:]))
    return True


register(Impl("maxpool.compact", "newnode", "fwd", ("aten.max_pool2d_with_indices.default",), _compact,
              stores="in-window offsets: 4 bits each for windows of <= 16 elements, else 1 byte "
                     "(PyTorch's: 8-byte indices and the input)"))
