"""Kernels of monet.impls against PyTorch's own operators (CPU, fp32)."""
import math

import pytest
import torch
import torch.nn.functional as F

from monet.compat import fake_mode as FakeTensorMode
from monet.graph import is_random
from monet.impls.activation import hardtanh_mask_forward, mask_backward, relu_mask_forward
from monet.impls.batchnorm import ZeroGammaError, batch_norm_backward_from_output
from monet.impls.bits import pack_bits, pack_nibbles, unpack_bits, unpack_nibbles
from monet.impls.conv import CONV_ALGORITHMS, convolution_backward_native, convolution_native
from monet.impls.dropout import dropout_bitmask_backward, dropout_bitmask_forward
from monet.impls.pooling import (compact_offset_bytes, maxpool2d_compact_backward,
                                 maxpool2d_compact_forward)

aten = torch.ops.aten


def rel(a, b):
    return float((a - b).norm() / b.norm())


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)


# ---------------------------------------------------------------- bits
@pytest.mark.parametrize("shape", [(1,), (7,), (8,), (9,), (1001,), (3, 5, 7), (2, 1, 13), ()])
def test_bits_round_trip(shape):
    mask = torch.rand(shape) > 0.5
    packed = pack_bits(mask)
    assert packed.dtype == torch.uint8 and packed.shape == (math.ceil(mask.numel() / 8),)
    out = unpack_bits(packed, shape)
    assert out.dtype == torch.bool and out.is_contiguous() and torch.equal(out, mask)


def test_bits_layout():
    mask = torch.zeros(10, dtype=torch.bool)
    mask[[0, 3, 9]] = True
    assert pack_bits(mask).tolist() == [0b1001, 0b10]


@pytest.mark.parametrize("shape", [(1,), (7,), (8,), (1001,), (3, 5, 7)])
def test_nibbles_round_trip(shape):
    values = torch.randint(0, 16, shape, dtype=torch.uint8)
    packed = pack_nibbles(values)
    assert packed.shape == (math.ceil(values.numel() / 2),)
    assert torch.equal(unpack_nibbles(packed, shape), values)
    if values.numel() > 1:
        assert int(packed[0]) == int(values.reshape(-1)[0]) | int(values.reshape(-1)[1]) << 4


# ---------------------------------------------------------------- activations
def _act_input(shape=(3, 5, 7, 11)):
    x = torch.randn(shape) * 4
    x.view(-1)[::7] = 0.0
    x.view(-1)[3::11] = 6.0
    return x


def test_relu_mask():
    x, g = _act_input(), torch.randn(3, 5, 7, 11)
    y, packed = relu_mask_forward(x)
    assert torch.equal(y, torch.relu(x))
    assert packed.nbytes == math.ceil(x.numel() / 8) and x.numel() % 8 != 0
    assert torch.equal(mask_backward(g, packed), aten.threshold_backward.default(g, y, 0))


@pytest.mark.parametrize("lo,hi", [(0.0, 6.0), (-1.0, 1.0)])
def test_hardtanh_mask(lo, hi):
    x, g = _act_input(), torch.randn(3, 5, 7, 11)
    y, packed = hardtanh_mask_forward(x, lo, hi)
    assert torch.equal(y, F.hardtanh(x, lo, hi))
    assert packed.nbytes == math.ceil(x.numel() / 8)
    assert torch.equal(mask_backward(g, packed), aten.hardtanh_backward.default(g, x, lo, hi))


# ---------------------------------------------------------------- batchnorm
def _bn_case(shape, affine=True, eps=1e-5):
    c = shape[1]
    x = torch.randn(shape) * 2 + 0.5
    w = (torch.rand(c) + 0.5) if affine else None
    b = torch.randn(c) if affine else None
    y, _, save_invstd = aten.native_batch_norm.default(x, w, b, None, None, True, 0.1, eps)
    return x, w, b, y, save_invstd, torch.randn(shape)


def _bn_reference(x, w, b, g, eps=1e-5):
    leaves = [t.clone().requires_grad_() for t in (x, w, b) if t is not None]
    xr, wr, br = leaves if len(leaves) == 3 else (leaves[0], None, None)
    F.batch_norm(xr, None, None, wr, br, training=True, eps=eps).backward(g)
    return [t.grad for t in (xr, wr, br)] if wr is not None else [xr.grad]


@pytest.mark.parametrize("shape", [(5, 3, 7, 9), (4, 6), (2, 3, 5)])
def test_batchnorm_from_output(shape):
    x, w, b, y, invstd, g = _bn_case(shape)
    got = batch_norm_backward_from_output(g, y, w, b, invstd, 1e-5, [True, True, True])
    for a, ref in zip(got, _bn_reference(x, w, b, g)):
        assert a.shape == ref.shape and rel(a, ref) <= 1e-5
    gi, gw, gb = batch_norm_backward_from_output(g, y, w, b, invstd, 1e-5, [True, False, False])
    assert gw is None and gb is None and torch.allclose(gi, got[0])
    gi, gw, gb = batch_norm_backward_from_output(g, y, w, b, invstd, 1e-5, [False, True, True])
    assert gi is None and torch.allclose(gw, got[1]) and torch.allclose(gb, got[2])


def test_batchnorm_no_affine():
    x, w, b, y, invstd, g = _bn_case((5, 3, 7, 9), affine=False)
    gi, gw, gb = batch_norm_backward_from_output(g, y, None, None, invstd, 1e-5, [True, False, False])
    assert gw is None and gb is None and rel(gi, _bn_reference(x, None, None, g)[0]) <= 1e-5


def test_batchnorm_zero_gamma():
    x, w, b, y, invstd, g = _bn_case((4, 3, 5))
    w[1] = 0.0
    with pytest.raises(ZeroGammaError, match="1 BatchNorm channel.*multiway"):
        batch_norm_backward_from_output(g, y, w, b, invstd, 1e-5, [True, True, True])


# ---------------------------------------------------------------- max pooling
POOL_CASES = [  # shape, kernel, stride, padding, dilation, ceil_mode
    ((2, 3, 13, 11), [3, 3], [2, 2], [1, 1], [1, 1], False),
    ((2, 3, 13, 11), [2, 2], [2, 2], [0, 0], [1, 1], True),
    ((2, 3, 13, 11), [5, 5], [1, 1], [2, 2], [1, 1], False),
    ((2, 3, 13, 11), [3], [], [1], [2], False),
    ((3, 12, 10), [3, 2], [1, 2], [1, 0], [1, 1], True),
]


@pytest.mark.parametrize("shape,k,s,p,d,ceil", POOL_CASES)
def test_maxpool_compact(shape, k, s, p, d, ceil):
    x = torch.randn(shape).round(decimals=1)  # many ties
    out, offsets = maxpool2d_compact_forward(x, k, s, p, d, ceil)
    xr = x.clone().requires_grad_()
    ref = F.max_pool2d(xr, k, s or None, p, d, ceil)
    assert torch.equal(out, ref)
    assert offsets.dtype == torch.uint8 and offsets.nbytes == compact_offset_bytes(out.numel(), k)
    assert offsets.numel() == (math.ceil(out.numel() / 2) if math.prod(k if len(k) == 2 else k * 2) <= 16 else out.numel())
    g = torch.randn(out.shape)
    ref.backward(g)
    gi = maxpool2d_compact_backward(g, offsets, list(shape), k, s, p, d, ceil)
    assert gi.shape == x.shape and rel(gi, xr.grad) <= 1e-5
    _, idx = aten.max_pool2d_with_indices.default(x, k, s, p, d, ceil)
    assert rel(gi, aten.max_pool2d_with_indices_backward.default(g, x, k, s, p, d, ceil, idx)) <= 1e-6


# ---------------------------------------------------------------- dropout
@pytest.mark.parametrize("p", [0.5, 0.1])
def test_dropout_bitmask(p):
    x, g = torch.randn(3, 5, 7), torch.randn(3, 5, 7)
    torch.manual_seed(1)
    out, packed = dropout_bitmask_forward(x, p, True)
    torch.manual_seed(1)
    ref, mask = aten.native_dropout.default(x, p, True)
    assert torch.equal(out, ref) and packed.nbytes == math.ceil(x.numel() / 8)
    scale = 1.0 / (1.0 - p)
    assert torch.equal(dropout_bitmask_backward(g, packed, scale),
                       aten.native_dropout_backward.default(g, mask, scale))
    # a random op: the graph marks its node so that a recomputation replays the generator state
    graph = torch.fx.Graph()
    assert is_random(graph.call_function(dropout_bitmask_forward, (graph.placeholder("x"), p, True)))
    assert not is_random(graph.call_function(dropout_bitmask_backward, (graph.placeholder("g"), packed, scale)))


# ---------------------------------------------------------------- convolution
@pytest.mark.parametrize("groups", [1, 4])
def test_convolution_native(groups):
    x, w, b = torch.randn(2, 4, 11, 9), torch.randn(8, 4 // groups, 3, 3), torch.randn(8)
    args = (x, w, b, [2, 2], [1, 1], [1, 1], False, [0, 0], groups)
    out, ref = convolution_native(*args), aten.convolution.default(*args)
    assert rel(out, ref) <= 1e-5
    g = torch.randn(out.shape)
    bargs = (g, x, w, [8], [2, 2], [1, 1], [1, 1], False, [0, 0], groups, [True, True, True])
    for a, r in zip(convolution_backward_native(*bargs), aten.convolution_backward.default(*bargs)):
        assert rel(a, r) <= 1e-5
    assert torch.backends.mkldnn.enabled  # flags restored
    assert CONV_ALGORITHMS["cpu"]["native"] == (convolution_native, convolution_backward_native)
    assert set(CONV_ALGORITHMS["cuda"]) == {"cudnn_benchmark", "cudnn_deterministic", "no_cudnn"}


# ---------------------------------------------------------------- fake-tensor tracing
def test_fake_tensor_tracing():
    mode = FakeTensorMode()
    real = {"x": torch.randn(2, 4, 13, 11), "w": torch.rand(4) + 0.5, "b": torch.randn(4),
            "invstd": torch.rand(4), "cw": torch.randn(8, 4, 3, 3)}
    with mode:
        t = {k: mode.from_tensor(v) for k, v in real.items()}
        x = t["x"]
        y, packed = relu_mask_forward(x)
        assert packed.shape == (math.ceil(x.numel() / 8),) and packed.dtype == torch.uint8
        assert mask_backward(y, packed).shape == x.shape
        y, packed = hardtanh_mask_forward(x, 0.0, 6.0)
        assert mask_backward(y, packed).dtype == torch.float32
        zero_w = torch.zeros(4)  # zero gamma is not checked on fake tensors
        gi, gw, gb = batch_norm_backward_from_output(x, x, zero_w, t["b"], t["invstd"], 1e-5, [True] * 3)
        assert gi.shape == x.shape and gw.shape == gb.shape == (4,)
        for k, s in (([3, 3], [2, 2]), ([5, 5], [1, 1])):
            out, off = maxpool2d_compact_forward(x, k, s, [1, 1], [1, 1], False)
            assert off.nbytes == compact_offset_bytes(out.numel(), k)
            gi = maxpool2d_compact_backward(out, off, list(x.shape), k, s, [1, 1], [1, 1], False)
            assert gi.shape == x.shape and gi.dtype == x.dtype
        out, packed = dropout_bitmask_forward(x, 0.5, True)
        assert dropout_bitmask_backward(out, packed, 2.0).shape == x.shape
        args = (x, t["cw"], None, [2, 2], [1, 1], [1, 1], False, [0, 0], 1)
        out = convolution_native(*args)
        assert out.shape == (2, 8, 7, 6)
        gx, gw, gb = convolution_backward_native(out, x, t["cw"], [8], *args[3:], [True, True, True])
        assert gx.shape == x.shape and gw.shape == t["cw"].shape and gb.shape == (8,)


@pytest.mark.parametrize("mask", [[True, True, True], [False, True, True], [True, False, False]])
def test_convolution_backward_chunked_matches_aten(mask):
    from monet.impls.conv import convolution_backward_chunked

    torch.manual_seed(0)
    x = torch.randn(5, 4, 11, 9)
    w = torch.randn(6, 4, 3, 3)
    args = ([6], [2, 2], [1, 1], [1, 1], False, [0, 0], 1, mask)
    y = torch.ops.aten.convolution.default(x, w, torch.randn(6), [2, 2], [1, 1], [1, 1], False, [0, 0], 1)
    g = torch.randn_like(y)
    ref = torch.ops.aten.convolution_backward.default(g, x, w, *args)
    got = convolution_backward_chunked(g, x, w, *args)
    for a, b, on in zip(got, ref, mask):
        if not on:
            assert a is None and b is None
        else:
            assert a.shape == b.shape and ((a - b).norm() / b.norm()).item() <= 1e-6
    with FakeTensorMode() as mode:
        fx, fw, fg = mode.from_tensor(x), mode.from_tensor(w), mode.from_tensor(g)
        out = convolution_backward_chunked(fg, fx, fw, *args)
        assert [None if t is None else tuple(t.shape) for t in out] == \
               [None if t is None else tuple(t.shape) for t in ref]
