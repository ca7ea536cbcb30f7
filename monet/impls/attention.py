"""Attention (``scaled_dot_product_attention``, SDPA) with each backend as an implementation.

What the graph holds.  ``F.scaled_dot_product_attention`` (transformers' default attention) is a
composite op: the dispatcher picks a backend for the call's device, dtypes, shapes and arguments
(``torch._fused_sdp_choice``) and runs that backend's forward op, whose backward is one op too.
AOTAutograd's joint graph therefore already holds SDPA as one forward node and one backward node
whenever the dispatcher picks a fused backend: ``_scaled_dot_product_flash_attention_for_cpu`` on
the CPU; ``_scaled_dot_product_flash_attention``, ``_efficient_attention`` or ``_cudnn_attention``
on CUDA.  That node pair is PyTorch's own choice, so it is the *default* implementation, and
normal mode runs exactly what plain PyTorch runs (bitwise gradients) with an unchanged graph
fingerprint (the zoo's schedules stay valid).

Decision (docs/capture.md, "Attention"): monet does not substitute the torch-level call with an
op of its own before tracing; the implementations anchor on the fused ATen forward nodes.  A call
for which the dispatcher picks the math backend (on the CPU: dropout in training, as GPT-2, BERT
and ViT have; grouped-query attention without the fused path) is written out by PyTorch itself
(matmul, ``_safe_softmax``, ``native_dropout``, matmul) and stays so: its ops are recomputed or
kept one by one like any other, and on the CPU no other backend takes dropout (the flash kernel
refuses dropout_p > 0), so there is nothing to choose.  On CUDA, a fused kernel with dropout draws
its mask from a Philox offset that no other backend reproduces: only calls with dropout_p == 0 get
alternatives, so every implementation computes the same function (gradients within 1e-5).

The implementations (mode token ``attention``), each a forward/backward pair of functions that
replaces the anchor and its backward node (`Backend`):

========================  =====================================  ===============================
implementation            stores for backward (besides q, k, v)  backward
========================  =====================================  ===============================
``attention.math``        probabilities P, (B, H, L, S) in q's   4 matmuls, no recomputation
                          dtype
PyTorch's fused kernel    out (B, H, L, Ev) and logsumexp        recomputes P blockwise
(default; flash-CPU,      (B, H, L) float32 (efficient: L
flash, efficient, cuDNN)  rounded up to 32)
``attention.flash`` /     as the fused kernel                    as the fused kernel
``.efficient`` /
``.cudnn`` (CUDA only)
========================  =====================================  ===============================

(Dao et al., "FlashAttention", NeurIPS 2022, Sec. 3.1: the backward recomputes P from q, k and
the logsumexp instead of storing it; Vaswani et al. 2017, Sec. 3.2.1 for the math form.)  The
workspaces (the flash kernels' per-thread blocks) are measured by the profiler on the CPU like
every other implementation's; on CUDA they are unmeasured (no GPU in this session).
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable

import torch
import torch.fx as fx

aten = torch.ops.aten

# ----------------------------------------------------------------------------------------------
# kernels
# ----------------------------------------------------------------------------------------------


def dim_order(t: torch.Tensor) -> tuple[int, ...]:
    """t's dimensions from the largest stride to the smallest: its memory layout."""
    return tuple(sorted(range(t.dim()), key=lambda d: -t.stride(d)))


def in_layout(t: torch.Tensor, order: tuple[int, ...] | None) -> torch.Tensor:
    """``t`` with the memory layout ``order`` (`dim_order`): itself when it has it, else a copy.
    The kernels return their outputs in the layout of the kernel they replace, so that the views
    the graph takes of them (``transpose(1, 2).view(B, L, H * E)``) stay valid."""
    if order is None or dim_order(t) == tuple(order):
        return t
    inverse = sorted(range(len(order)), key=lambda d: order[d])
    return t.permute(*order).contiguous().permute(*inverse)


def _layouts(tensors, layout):
    return tuple(in_layout(t, o) for t, o in zip(tensors, layout)) if layout else tuple(tensors)


def _scale_factor(q: torch.Tensor, scale: float | None) -> float:
    """sqrt of the softmax scale (default 1 / sqrt(E)): applied to q and to k, as PyTorch's math
    backend does (``_scaled_dot_product_attention_math``)."""
    return math.sqrt(scale if scale is not None else 1.0 / math.sqrt(q.size(-1)))


def math_forward(q, k, v, attn_mask=None, is_causal=False, scale=None, *, layout=None):
    """SDPA's math backend, keeping the probabilities for the backward pass.

    q: (B, H, L, E), k: (B, H, S, E), v: (B, H, S, Ev), float; attn_mask: None, bool (True =
    attend) or float (added to the scores), broadcastable to (B, H, L, S); is_causal: mask the
    upper triangle (L, S); scale: softmax scale (default 1 / sqrt(E)); layout: out's memory
    layout (`dim_order`; the fused kernels return (B, L, H, Ev) memory viewed as (B, H, L, Ev)).
    Returns (out (B, H, L, Ev), P (B, H, L, S) in q's dtype): P = softmax(q k^T * scale + mask),
    with fully masked rows 0 (``_safe_softmax``, as PyTorch's math backend).  Errors are aten's
    (shapes that do not broadcast).
    """
    sf = _scale_factor(q, scale)
    scores = torch.matmul(q * sf, k.transpose(-2, -1) * sf)
    if is_causal:
        keep = torch.ones(q.size(-2), k.size(-2), dtype=torch.bool, device=q.device).tril()
        scores = scores.masked_fill(~keep, float("-inf"))
    if attn_mask is not None:
        scores = scores.masked_fill(~attn_mask, float("-inf")) if attn_mask.dtype == torch.bool \
            else scores + attn_mask
    probs = aten._safe_softmax.default(scores, -1)
    return in_layout(torch.matmul(probs, v), layout), probs


def math_backward(grad, q, k, v, attn_mask, is_causal, scale, probs, *, layout=None):
    """Backward of `math_forward` from the stored P (no recomputation).

    grad: (B, H, L, Ev), gradient of out; q, k, v, scale as in the forward (attn_mask and
    is_causal are in P already); probs: P; layout: the three gradients' memory layouts (those of
    the backward kernel it replaces). Returns (grad_q, grad_k, grad_v) of q's, k's, v's
    shapes: dV = P^T dO, dP = dO V^T, dS = P * (dP - rowsum(dP * P)) (softmax's backward),
    dQ = dS K * scale, dK = dS^T Q * scale.
    """
    sf = _scale_factor(q, scale)
    grad_v = torch.matmul(probs.transpose(-2, -1), grad)
    grad_p = torch.matmul(grad, v.transpose(-2, -1))
    grad_s = aten._softmax_backward_data.default(grad_p, probs, -1, probs.dtype)
    grad_q = torch.matmul(grad_s, k * sf) * sf
    grad_k = torch.matmul(grad_s.transpose(-2, -1), q * sf) * sf
    return _layouts((grad_q, grad_k, grad_v), layout)


def flash_cpu_forward(q, k, v, attn_mask=None, is_causal=False, scale=None, *, layout=None):
    """The CPU flash kernel (``_scaled_dot_product_flash_attention_for_cpu``, dropout 0).
    Shapes as `math_forward`; returns (out (B, H, L, Ev), logsumexp (B, H, L) float32)."""
    out, lse = aten._scaled_dot_product_flash_attention_for_cpu.default(q, k, v, 0.0, is_causal, attn_mask=attn_mask,
                                                                        scale=scale)
    return in_layout(out, layout), lse


def flash_cpu_backward(grad, q, k, v, attn_mask, is_causal, scale, out, logsumexp, *, layout=None):
    """Backward of `flash_cpu_forward`: recomputes P blockwise from q, k and logsumexp.
    Returns (grad_q, grad_k, grad_v)."""
    return _layouts(aten._scaled_dot_product_flash_attention_for_cpu_backward.default(
        grad, q, k, v, out, logsumexp, 0.0, is_causal, attn_mask=attn_mask, scale=scale), layout)


def flash_cuda_forward(q, k, v, attn_mask=None, is_causal=False, scale=None, *, layout=None):
    """CUDA's flash kernel (dropout 0; no attn_mask): returns aten's 9 outputs (out, logsumexp,
    cum_seq_q, cum_seq_k, max_q, max_k, rng_state, unused, debug_mask).  Unmeasured here."""
    out, *rest = aten._scaled_dot_product_flash_attention.default(q, k, v, 0.0, is_causal, False, scale=scale)
    return (in_layout(out, layout), *rest)


def flash_cuda_backward(grad, q, k, v, attn_mask, is_causal, scale, out, logsumexp, cum_q, cum_k, max_q, max_k,
                        rng_state, unused, *, layout=None):
    """Backward of `flash_cuda_forward`. Returns (grad_q, grad_k, grad_v)."""
    return _layouts(aten._scaled_dot_product_flash_attention_backward.default(
        grad, q, k, v, out, logsumexp, cum_q, cum_k, max_q, max_k, 0.0, is_causal, rng_state, unused, scale=scale),
        layout)


def efficient_forward(q, k, v, attn_mask=None, is_causal=False, scale=None, *, layout=None):
    """CUDA's memory-efficient kernel (dropout 0): (out, logsumexp, philox_seed, philox_offset)."""
    out, *rest = aten._scaled_dot_product_efficient_attention.default(q, k, v, attn_mask, True, 0.0, is_causal,
                                                                      scale=scale)
    return (in_layout(out, layout), *rest)


def efficient_backward(grad, q, k, v, attn_mask, is_causal, scale, out, logsumexp, seed, offset, *, layout=None):
    """Backward of `efficient_forward`. Returns (grad_q, grad_k, grad_v)."""
    dq, dk, dv, _ = aten._scaled_dot_product_efficient_attention_backward.default(
        grad, q, k, v, attn_mask, out, logsumexp, seed, offset, 0.0, [True, True, True, False], is_causal,
        scale=scale)
    return _layouts((dq, dk, dv), layout)


def cudnn_forward(q, k, v, attn_mask=None, is_causal=False, scale=None, *, layout=None):
    """CUDA's cuDNN kernel (dropout 0): aten's 9 outputs (out, logsumexp, cum_seq_q, cum_seq_k,
    max_q, max_k, philox_seed, philox_offset, debug_mask)."""
    out, *rest = aten._scaled_dot_product_cudnn_attention.default(q, k, v, attn_mask, True, 0.0, is_causal, False,
                                                                  scale=scale)
    return (in_layout(out, layout), *rest)


def cudnn_backward(grad, q, k, v, attn_mask, is_causal, scale, out, logsumexp, cum_q, cum_k, max_q, max_k,
                   seed, offset, *, layout=None):
    """Backward of `cudnn_forward`. Returns (grad_q, grad_k, grad_v)."""
    return _layouts(aten._scaled_dot_product_cudnn_attention_backward.default(
        grad, q, k, v, out, logsumexp, seed, offset, attn_mask, cum_q, cum_k, max_q, max_k, 0.0, is_causal,
        scale=scale), layout)


# flop formulas (`monet.profiling.costs.node_flops`): the forward has SDPA's two matmuls; the math
# backward four (Vaswani et al.), the fused backwards five (they recompute q k^T, Dao et al. 3.1)
def _forward_flops(q, k, v, *args, out_val=None, **kwargs) -> int:
    from torch.utils.flop_counter import sdpa_flop_count
    return sdpa_flop_count(q.shape, k.shape, v.shape)


def _math_backward_flops(grad, q, k, v, *args, out_val=None, **kwargs) -> int:
    b, h, lq, e = q.shape
    s, ev = k.shape[-2], v.shape[-1]
    return 2 * b * h * (2 * lq * s * ev + 2 * lq * s * e)


math_forward._monet_flops = _forward_flops
math_backward._monet_flops = _math_backward_flops
for _f in (flash_cpu_forward, flash_cuda_forward, efficient_forward, cudnn_forward):
    _f._monet_flops = _forward_flops
for _f, _op in ((flash_cpu_backward, aten._scaled_dot_product_flash_attention_backward),
                (flash_cuda_backward, aten._scaled_dot_product_flash_attention_backward),
                (efficient_backward, aten._scaled_dot_product_efficient_attention_backward),
                (cudnn_backward, aten._scaled_dot_product_cudnn_attention_backward)):
    _f._monet_aten = _op


# ----------------------------------------------------------------------------------------------
# backends
# ----------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Backend:
    """One SDPA backend as an implementation.

    Attributes:
        name: "math", "flash_cpu", "flash", "efficient" or "cudnn".
        device: the device type it runs on ("cpu", "cuda"; "any" for math).
        fwd_op, bwd_op: PyTorch's forward and backward ops of this backend (None for math, which
            PyTorch writes out): the nodes it is the default of.
        forward: ``forward(q, k, v, attn_mask, is_causal, scale) -> tuple`` of outputs, the first
            the attention output (B, H, L, Ev).
        backward: ``backward(grad, q, k, v, attn_mask, is_causal, scale, *saved) -> (dq, dk, dv)``.
        saved: indices of the forward's outputs the backward reads (what it stores).
        supported: ``supported(q, k, v, attn_mask, is_causal) -> bool`` on traced (fake) values.
    """

    name: str
    device: str
    fwd_op: object
    bwd_op: object
    forward: Callable
    backward: Callable
    saved: tuple[int, ...]
    supported: Callable


def _dense(q, k, v, attn_mask, is_causal) -> bool:
    """4-D inputs with as many key/value heads as query heads (no grouped-query broadcast)."""
    return q.dim() == k.dim() == v.dim() == 4 and q.size(-3) == k.size(-3) == v.size(-3)


def _cuda_check(name: str):
    """``torch.backends.cuda.can_use_<name>`` for the call (dropout 0), on CUDA tensors only."""
    def check(q, k, v, attn_mask, is_causal) -> bool:
        if q.device.type != "cuda" or not _dense(q, k, v, attn_mask, is_causal):
            return False
        params = torch.backends.cuda.SDPAParams(q, k, v, attn_mask, 0.0, is_causal, False)
        return bool(getattr(torch.backends.cuda, f"can_use_{name}")(params, False))
    return check


BACKENDS: dict[str, Backend] = {b.name: b for b in (
    Backend("math", "any", None, None, math_forward, math_backward, (1,), _dense),
    Backend("flash_cpu", "cpu", aten._scaled_dot_product_flash_attention_for_cpu.default,
            aten._scaled_dot_product_flash_attention_for_cpu_backward.default, flash_cpu_forward, flash_cpu_backward,
            (0, 1), lambda q, k, v, m, c: q.device.type == "cpu" and _dense(q, k, v, m, c)),
    Backend("flash", "cuda", aten._scaled_dot_product_flash_attention.default,
            aten._scaled_dot_product_flash_attention_backward.default, flash_cuda_forward, flash_cuda_backward,
            (0, 1, 2, 3, 4, 5, 6, 7), _cuda_check("flash_attention")),
    Backend("efficient", "cuda", aten._scaled_dot_product_efficient_attention.default,
            aten._scaled_dot_product_efficient_attention_backward.default, efficient_forward, efficient_backward,
            (0, 1, 2, 3), _cuda_check("efficient_attention")),
    Backend("cudnn", "cuda", aten._scaled_dot_product_cudnn_attention.default,
            aten._scaled_dot_product_cudnn_attention_backward.default, cudnn_forward, cudnn_backward,
            (0, 1, 2, 3, 4, 5, 6, 7), _cuda_check("cudnn_attention")),
)}
FUSED = {b.fwd_op: b for b in BACKENDS.values() if b.fwd_op is not None}


def stored_bytes(backend: str, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> int:
    """Bytes a backend keeps for the backward pass besides q, k and v, for q (B, H, L, E),
    k (B, H, S, E), v (B, H, S, Ev): math keeps P, B*H*L*S * itemsize(q); the flash kernels keep
    out, B*H*L*Ev * itemsize(q), and the float32 logsumexp, B*H*L * 4 (efficient: L rounded up to
    a multiple of 32; its 8-byte Philox seed and offset and cuDNN's are not counted).

    Raises:
        KeyError: an unknown backend (the names are `BACKENDS`' keys).
    """
    if backend not in BACKENDS:
        raise KeyError(f"unknown attention backend {backend!r}: use one of {', '.join(BACKENDS)}")
    b, h, lq = q.shape[0], q.shape[1], q.shape[2]
    if backend == "math":
        return b * h * lq * k.shape[-2] * q.element_size()
    rows = -(-lq // 32) * 32 if backend == "efficient" else lq
    return b * h * lq * v.shape[-1] * q.element_size() + b * h * rows * 4


# ----------------------------------------------------------------------------------------------
# implementations (graph rewrites), see monet.impls.registry
# ----------------------------------------------------------------------------------------------
from monet.impls.registry import Impl, fake_value, getitem_users, register, replace  # noqa: E402


@dataclass(frozen=True)
class _Call:
    q: fx.Node
    k: fx.Node
    v: fx.Node
    attn_mask: fx.Node | None
    dropout_p: float
    is_causal: bool
    scale: float | None


def _bind(node: fx.Node) -> dict:
    """The anchor's arguments by schema name, defaults filled in."""
    schema = node.target._schema
    out = {}
    for i, arg in enumerate(schema.arguments):
        if i < len(node.args) and not arg.kwarg_only:
            out[arg.name] = node.args[i]
        elif arg.name in node.kwargs:
            out[arg.name] = node.kwargs[arg.name]
        elif arg.has_default_value():
            out[arg.name] = arg.default_value
    return out


def _call(node: fx.Node) -> _Call:
    a = _bind(node)
    return _Call(a["query"], a["key"], a["value"], a.get("attn_mask", a.get("attn_bias")), float(a["dropout_p"]),
                 bool(a["is_causal"]), a.get("scale"))


def _backward_node(anchor: fx.Node, bwd_op) -> fx.Node | None:
    """The one backward node of the anchor's backend reading its outputs (None if not exactly one)."""
    found = {u for g in getitem_users(anchor).values() for u in g.users if u.target is bwd_op}
    return found.pop() if len(found) == 1 else None


def _rewrite(target: Backend):
    """The rewrite of `Impl` for ``target``: a fused SDPA forward node of another backend (and its
    one backward node) -> ``target``'s forward and backward; False, nothing changed, when the call
    has dropout, ``target`` does not support it, or the backward is not one node."""
    def rewrite(graph: fx.Graph, anchor: fx.Node) -> bool:
        default = FUSED.get(anchor.target)
        if default is None or default is target:
            return False
        call = _call(anchor)
        val = lambda n: n.meta["val"] if isinstance(n, fx.Node) else n  # noqa: E731
        if call.dropout_p != 0.0 or not target.supported(val(call.q), val(call.k), val(call.v),
                                                          val(call.attn_mask), call.is_causal):
            return False
        bwd = _backward_node(anchor, default.bwd_op)
        if bwd is None or any(i >= 3 and g.users for i, g in getitem_users(bwd).items()):
            return False  # a gradient of the mask (efficient, cuDNN) is not computed by the others
        head = (call.q, call.k, call.v, call.attn_mask, call.is_causal, call.scale)
        old = getitem_users(anchor)
        fwd_kw = dict(layout=dim_order(anchor.meta["val"][0]))
        bwd_kw = dict(layout=tuple(dim_order(t) for t in bwd.meta["val"][:3]))
        outs = replace(graph, anchor, target.forward, head, fwd_kw,
                       n_outputs=len(fake_value(target.forward, head, fwd_kw)))
        new_bwd = replace(graph, bwd, target.backward, (bwd.args[0], *head, *[outs[i] for i in target.saved]),
                          bwd_kw)[0]
        for i, g in getitem_users(bwd).items():
            if i >= 3:
                graph.erase_node(g)
        bwd.replace_all_uses_with(new_bwd)
        graph.erase_node(bwd)
        if 0 in old:
            old[0].replace_all_uses_with(outs[0])
        for g in old.values():
            graph.erase_node(g)
        graph.erase_node(anchor)
        return True
    return rewrite


_STORES = {"math": "the probabilities P, B*H*L*S elements in q's dtype; the backward does not recompute "
                   "(PyTorch's fused kernels: out and a float32 logsumexp of B*H*L)",
           "flash": "out and a float32 logsumexp (B*H*L); the backward recomputes P blockwise",
           "efficient": "out and a float32 logsumexp (B*H*ceil(L/32)*32); the backward recomputes P",
           "cudnn": "out and a float32 logsumexp (B*H*L); the backward recomputes P"}

for _b in ("math", "flash", "efficient", "cudnn"):
    _backend = BACKENDS[_b]
    _anchors = tuple(str(op) for op, b in FUSED.items() if b is not _backend and
                     (_b == "math" or b.device == "cuda"))
    register(Impl(f"attention.{_b}", "attention", "fwd", tuple(_anchors), _rewrite(_backend),
                  devices=("cpu", "cuda") if _b == "math" else ("cuda",), stores=_STORES[_b],
                  lean=_b != "math"))
