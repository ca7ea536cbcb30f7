"""A language model's head and cross-entropy as one op over chunks of tokens: the logits never exist whole.

In a language model the largest activation is neither a convolution's nor an activation's: it is
the logits, (B, T, V) floats, and as much again in their gradient (GPT-2's 50,257 tokens at 8 x
1024 tokens a batch: 1.6 GB each in fp32).  `linear_cross_entropy` computes the head
``hidden @ weight.T + bias`` and the cross-entropy together, ``chunk`` rows of tokens at a time,
and keeps nothing but its inputs for the backward pass, which computes each chunk's logits again;
`linear_cross_entropy_grads` computes the gradients in the forward pass instead, chunk by chunk,
and keeps them (Liger Kernel's fused linear cross-entropy, Hsu et al. 2024, does that; it and
Apple's Cut Cross-Entropy, Wijmans et al., ICLR 2025, run GPU kernels of their own; here it is
PyTorch's own operators per chunk, on any device).  Memory: at most one chunk's logits and their
gradient at a time, (chunk, V) floats each, instead of (B T, V) kept from the forward pass to the
backward pass.  Time: with `linear_cross_entropy_grads` (what `fused_loss` and `fuse_lm_loss` use
for several chunks) the head's three products once, as PyTorch runs them; with
`linear_cross_entropy` the first once more in the backward pass.

Arithmetic: where one chunk holds every token (``chunk >= B T``) the op runs exactly the
operators PyTorch's ``F.cross_entropy(F.linear(h, w, b).float().view(-1, V), target)`` runs, in
its order, and its loss and gradients are bitwise PyTorch's; with smaller chunks the loss is a
sum of chunk sums and the weight's gradient a sum of chunk products, another order of the same
sums (within 1e-6 relative in fp32).

`fuse_lm_loss` puts the op into a Dynamo-exported graph in place of the head and the loss
(``linear -> [float] -> view(-1, V) -> cross_entropy``, as transformers' ``ForCausalLMLoss`` and
``BertForMaskedLM`` write them): the graph then returns no logits (``output.logits`` is None in
training, as with Liger's fused loss); `monet.optimize(..., lm_loss="chunked")` does it
(docs/guide.md, "Language models").
"""
from __future__ import annotations

import math

import torch
import torch.fx as fx
import torch.nn.functional as F

from monet.terms import fmt_size

_REDUCTIONS = {"none": 0, "mean": 1, "sum": 2}


def liger_chunk(rows: int, vocab: int, hidden: int) -> int:
    """Liger Kernel's chunk size: the tokens whose logits are the size of the hidden states, ``B T /
    ceil(V / H)`` rounded up to a power of two (so one chunk's logits take about as many bytes as
    the op's input)."""
    per = max(1, math.ceil(vocab / max(hidden, 1)))
    n = max(1, math.ceil(rows / per))
    return 1 << (n - 1).bit_length()


#: `default_chunk`'s limits: at most this many chunks, unless a chunk would then hold more rows than
#: CHUNK_ROWS (and never fewer rows than Liger's chunk)
MAX_CHUNKS, CHUNK_ROWS = 8, 256


def default_chunk(rows: int, vocab: int, hidden: int) -> int:
    """Rows per chunk of ``lm_loss="chunked"``: Liger's chunk (`liger_chunk`) or more, so that there
    are at most MAX_CHUNKS chunks where that keeps a chunk within CHUNK_ROWS rows, as a power of two.

    Every chunk reads the (V, H) weight twice and adds its product into the weight's gradient, so
    each chunk moves about 4 V H elements whatever its rows, so the number of chunks, not their
    products, sets the head's time where chunks are small (GPT-2 small at 2 x 512 tokens, V 50,257,
    H 768: 64 chunks of Liger's 16 rows).  Eight chunks of 128 rows hold one chunk's logits to
    25 MiB there (the whole logits: 196 MiB)."""
    fewer = max(1, min(math.ceil(rows / MAX_CHUNKS), CHUNK_ROWS))
    return max(liger_chunk(rows, vocab, hidden), 1 << (fewer - 1).bit_length())


def _chunks(rows: int, chunk: int):
    step = max(1, int(chunk))
    return [(a, min(rows, a + step)) for a in range(0, rows, step)] or [(0, 0)]


@torch.library.custom_op("monet::linear_cross_entropy", mutates_args=())
def linear_cross_entropy(hidden: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, target: torch.Tensor,
                         ignore_index: int, reduction: str, chunk: int) -> torch.Tensor:
    """``F.cross_entropy(F.linear(hidden, weight, bias).float(), target, ignore_index=ignore_index,
    reduction=reduction)``, ``chunk`` rows at a time.

    Args:
        hidden: (N, H) the head's input, one row per token.
        weight: (V, H) the head's weight; bias: (V,) or None.
        target: (N,) int64 classes in [0, V), or ``ignore_index`` (not counted).
        reduction: ``"mean"`` (over the counted tokens) or ``"sum"``.
        chunk: rows per chunk (>= 1); ``chunk >= N``: one chunk, PyTorch's own arithmetic.

    Returns:
        The loss, a float32 scalar.
    """
    rows = hidden.shape[0]
    if chunk >= rows:
        return F.cross_entropy(F.linear(hidden, weight, bias).float(), target, ignore_index=ignore_index,
                               reduction=reduction)
    total = hidden.new_zeros((), dtype=torch.float32)
    for a, b in _chunks(rows, chunk):
        logits = F.linear(hidden[a:b], weight, bias).float()
        total = total + F.cross_entropy(logits, target[a:b], ignore_index=ignore_index, reduction="sum")
    if reduction == "mean":
        return total / (target != ignore_index).sum().to(torch.float32)
    return total


@linear_cross_entropy.register_fake
def _(hidden, weight, bias, target, ignore_index, reduction, chunk):
    return hidden.new_empty((), dtype=torch.float32)


@torch.library.custom_op("monet::linear_cross_entropy_backward", mutates_args=())
def linear_cross_entropy_backward(grad: torch.Tensor, hidden: torch.Tensor, weight: torch.Tensor,
                                  bias: torch.Tensor | None, target: torch.Tensor, ignore_index: int,
                                  reduction: str, chunk: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The gradients of `linear_cross_entropy` for the loss's gradient ``grad`` (a scalar): each
    chunk's logits computed again, then the softmax's backward and the head's two products, as
    PyTorch's backward of ``linear -> float -> cross_entropy`` runs them.  Returns (grad_hidden (N,
    H), grad_weight (V, H), grad_bias (V,), empty where there is no bias)."""
    loss, grad_hidden, grad_weight, grad_bias = _chunked_grads(grad, hidden, weight, bias, target, ignore_index,
                                                               reduction, chunk)
    return grad_hidden, grad_weight, grad_bias


def _chunked_grads(grad, hidden, weight, bias, target, ignore_index: int, reduction: str, chunk: int,
                   whole_as_pytorch: bool = True):
    """(loss, grad_hidden (N, H), grad_weight (V, H), grad_bias (V,) or empty) of the head and its
    cross-entropy for the loss's gradient ``grad`` (a float32 scalar), ``chunk`` rows at a time:
    each chunk's logits, their log-softmax, the chunk's loss (a sum), the softmax's backward and
    the head's two products, as PyTorch runs ``linear -> float -> cross_entropy`` and its backward.
    The loss is the forward's arithmetic where there are several chunks (a sum of chunk sums); in
    one chunk, with ``whole_as_pytorch``, the gradients are PyTorch's backward bitwise and the loss
    is not computed (None), else one chunk is computed as one of several."""
    rows = hidden.shape[0]
    red = _REDUCTIONS[reduction]
    counted = (target != ignore_index).sum().to(torch.float32)
    grad_hidden = torch.empty_like(hidden)
    grad_weight = grad_bias = None
    whole = chunk >= rows and whole_as_pytorch
    total = None if whole else hidden.new_zeros((), dtype=torch.float32)
    for a, b in _chunks(rows, chunk):
        h, t = hidden[a:b], target[a:b]
        logits = F.linear(h, weight, bias)
        lsm = torch.ops.aten._log_softmax.default(logits.float(), 1, False)
        if whole:  # PyTorch's own backward, its reduction and all
            g_lsm = torch.ops.aten.nll_loss_backward.default(grad, lsm, t, None, red, ignore_index, counted)
        else:  # the chunk's sum, scaled as the mean over every chunk's tokens
            total = total + torch.ops.aten.nll_loss_forward.default(lsm, t, None, _REDUCTIONS["sum"], ignore_index)[0]
            g = grad / counted if reduction == "mean" else grad
            g_lsm = torch.ops.aten.nll_loss_backward.default(g, lsm, t, None, _REDUCTIONS["sum"], ignore_index,
                                                             counted)
        g_logits = torch.ops.aten._log_softmax_backward_data.default(g_lsm, lsm, 1, torch.float32).to(logits.dtype)
        grad_hidden[a:b] = torch.mm(g_logits, weight)
        if whole:  # autograd's product, the (H, V) gradient of the transposed weight, and its copy
            grad_weight = torch.mm(h.t(), g_logits).t().contiguous()
        elif grad_weight is None:  # (V, H), then every chunk's product added in place: no (V, H) temporary
            grad_weight = torch.mm(g_logits.t(), h)
        else:
            grad_weight.addmm_(g_logits.t(), h)
        if bias is not None:
            s = g_logits.sum(0)
            grad_bias = s if grad_bias is None else grad_bias.add_(s)
    if total is not None and reduction == "mean":
        total = total / counted
    return total, grad_hidden, grad_weight, (grad_bias if grad_bias is not None else weight.new_empty(0))


@linear_cross_entropy_backward.register_fake
def _(grad, hidden, weight, bias, target, ignore_index, reduction, chunk):
    return (torch.empty_like(hidden), torch.empty_like(weight),
            weight.new_empty(bias.shape if bias is not None else (0,)))


def _setup(ctx, inputs, output):
    hidden, weight, bias, target, ignore_index, reduction, chunk = inputs
    ctx.save_for_backward(hidden, weight, bias, target)
    ctx.args = (ignore_index, reduction, chunk)


def _backward(ctx, grad):
    hidden, weight, bias, target = ctx.saved_tensors
    gh, gw, gb = torch.ops.monet.linear_cross_entropy_backward(grad, hidden, weight, bias, target, *ctx.args)
    return gh, gw, (gb if bias is not None else None), None, None, None, None


linear_cross_entropy.register_autograd(_backward, setup_context=_setup)


@torch.library.custom_op("monet::linear_cross_entropy_grads", mutates_args=())
def linear_cross_entropy_grads(hidden: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None,
                               target: torch.Tensor, ignore_index: int, reduction: str,
                               chunk: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """`linear_cross_entropy` over several chunks with its gradients computed in the forward pass,
    for a loss gradient of 1 (Liger Kernel's fused linear cross-entropy does the same): (loss,
    grad_hidden (N, H), grad_weight (V, H), grad_bias (V,) or empty).  Its backward pass only scales
    them by the loss's gradient (`fused_loss`), so the head's product is not computed a second time
    (`benchmarks/lm_loss_head.py` times both against PyTorch's unchunked head).  What it keeps
    from the forward pass to the backward
    pass is the gradients, (N, H) + (V, H) + (V,), instead of the hidden states: the weight's
    gradient, which the backward pass would allocate anyway, exists from the end of the forward
    pass.  The loss is `linear_cross_entropy`'s over the same chunks, bitwise; the gradients, for a
    loss gradient of 1, bitwise `linear_cross_entropy_backward`'s."""
    one = hidden.new_ones((), dtype=torch.float32)
    return _chunked_grads(one, hidden, weight, bias, target, ignore_index, reduction, chunk, whole_as_pytorch=False)


@linear_cross_entropy_grads.register_fake
def _(hidden, weight, bias, target, ignore_index, reduction, chunk):
    return (hidden.new_empty((), dtype=torch.float32), torch.empty_like(hidden), torch.empty_like(weight),
            weight.new_empty(bias.shape if bias is not None else (0,)))


def _setup_grads(ctx, inputs, output):
    ctx.save_for_backward(*output[1:])
    ctx.has_bias = inputs[2] is not None
    ctx.mark_non_differentiable(*output[1:])


def _backward_grads(ctx, grad, *_unused):
    gh, gw, gb = ctx.saved_tensors
    return gh * grad, gw * grad, (gb * grad if ctx.has_bias else None), None, None, None, None


linear_cross_entropy_grads.register_autograd(_backward_grads, setup_context=_setup_grads)


def fused_loss(hidden, weight, bias, target, ignore_index: int = -100, reduction: str = "mean", chunk: int = 0):
    """The loss of the head ``hidden @ weight.T + bias`` and its cross-entropy, ``chunk`` rows at a
    time (hidden (N, H), weight (V, H), bias (V,) or None, target (N,) int64; a float32 scalar),
    what `fuse_lm_loss` puts in a graph: `linear_cross_entropy` (the backward pass computes the one
    chunk's logits again, PyTorch's arithmetic bitwise) where one chunk holds every row, else
    `linear_cross_entropy_grads` (the gradients computed in the forward pass, no second product).
    ``chunk`` 0: `default_chunk`.

    Raises:
        ValueError: ``reduction`` other than "mean" or "sum"."""
    if reduction not in ("mean", "sum"):
        raise ValueError(f"reduction must be 'mean' or 'sum', got {reduction!r}")
    rows = int(hidden.shape[0])
    size = int(chunk) or default_chunk(rows, int(weight.shape[0]), int(weight.shape[1]))
    if size >= rows:
        return torch.ops.monet.linear_cross_entropy(hidden, weight, bias, target, ignore_index, reduction, size)
    return torch.ops.monet.linear_cross_entropy_grads(hidden, weight, bias, target, ignore_index, reduction, size)[0]


# ----------------------------------------------------------------------------------------------
# the rewrite of a Dynamo-exported graph
# ----------------------------------------------------------------------------------------------

_PASS = {"float", "contiguous"}  # call_method nodes between the head and the loss that change nothing
_RESHAPE = {"view", "reshape"}


def _value(node):
    v = node.meta.get("example_value", node.meta.get("val"))
    return v if isinstance(v, torch.Tensor) else None


def _is_linear(node) -> bool:
    return node.op == "call_function" and node.target in (F.linear, torch._C._nn.linear)


def _head_of(x: fx.Node):
    """The ``linear`` node a cross-entropy's input comes from (through ``view(-1, V)``, ``float``,
    ``contiguous``), and whether a ``float`` was on the way; None when it is not that chain."""
    seen_float = False
    node = x
    for _ in range(4):
        if _is_linear(node):
            return node, seen_float
        if node.op == "call_method" and node.target in _PASS | _RESHAPE:
            seen_float |= node.target == "float"
            node = node.args[0]
            continue
        if node.op == "call_function" and node.target in (torch.reshape,):
            node = node.args[0]
            continue
        return None
    return None


def find_lm_losses(gm: fx.GraphModule) -> list[tuple[fx.Node, fx.Node]]:
    """``(cross_entropy node, linear node)`` pairs of a Dynamo-exported graph that compute a
    language model's loss from its head: ``cross_entropy(view(float(linear(h, W, b)), -1, V),
    target)`` with no class weights and no label smoothing, reduction mean or sum, over every
    class of the head (V = W's rows)."""
    found = []
    for node in gm.graph.nodes:
        if node.op != "call_function" or node.target is not F.cross_entropy:
            continue
        kw = dict(zip(("input", "target", "weight", "size_average", "ignore_index", "reduce", "reduction",
                       "label_smoothing"), node.args))
        kw.update(node.kwargs)
        if kw.get("weight") is not None or kw.get("size_average") is not None or kw.get("reduce") is not None:
            continue
        if float(kw.get("label_smoothing", 0.0) or 0.0) != 0.0 or kw.get("reduction", "mean") not in ("mean", "sum"):
            continue
        head = _head_of(kw["input"])
        if head is None:
            continue
        logits = _value(kw["input"])
        if logits is None or logits.dim() != 2:
            continue
        found.append((node, head[0]))
    return found


def logits_bytes(gm: fx.GraphModule) -> int:
    """Bytes of the logits (B T, V) that the language-model losses of a Dynamo-exported graph
    (`find_lm_losses`) compute their cross-entropy from; 0 when it has none.  `fuse_lm_loss`
    removes them (and their gradient, as many bytes again)."""
    total = 0
    for ce, _ in find_lm_losses(gm):
        v = _value(ce.args[0] if ce.args else ce.kwargs["input"])
        n = v.numel()  # a SymInt where the export made the sizes dynamic: its value at the example
        total += int(n if isinstance(n, int) else n.node.hint) * v.element_size()
    return total


def chunked_loss_hint(gm: fx.GraphModule, shortfall: int = 0) -> str:
    """The sentence `monet.plan.Plan.solve`'s infeasible budget adds for a model whose loss
    `fuse_lm_loss` can chunk (``gm``: its Dynamo-exported graph, captured without ``lm_loss``), when
    the logits and their gradient (twice `logits_bytes`) are at least ``shortfall`` bytes (the
    smallest feasible budget less the budget asked), so that chunking them could close the gap; ""
    otherwise (a classifier's few logits) and for any other model.  (The command line has no
    ``lm_loss`` option and does not add it.)"""
    size = logits_bytes(gm)
    if not size or 2 * size < shortfall:
        return ""
    return (f"; the model computes its loss from {fmt_size(size)} of logits, kept for the backward pass with as "
            'much again for their gradient: lm_loss="chunked" computes the head and the loss in chunks of tokens '
            "without them, which lowers the smallest feasible budget")


def fuse_lm_loss(gm: fx.GraphModule, chunk: int | None = None) -> int:
    """Replace each language-model loss of ``gm`` (`find_lm_losses`) by `linear_cross_entropy`
    with ``chunk`` rows per chunk (None: `default_chunk`), in place; the logits leave the graph's
    outputs (None there).  Returns how many were replaced (0: none, or fused already).

    Raises:
        ValueError: ``chunk`` below 1."""
    if chunk is not None and int(chunk) < 1:
        raise ValueError(f"chunk must be >= 1 rows, got {chunk}")
    pairs = find_lm_losses(gm)
    graph = gm.graph
    for ce, linear in pairs:
        kw = dict(zip(("input", "target", "weight", "size_average", "ignore_index", "reduce", "reduction"), ce.args))
        kw.update(ce.kwargs)
        h, weight = linear.args[0], linear.args[1]
        bias = linear.args[2] if len(linear.args) > 2 else linear.kwargs.get("bias")
        hv, wv = _value(h), _value(weight)
        if hv is None or wv is None:
            continue
        rows = int(math.prod(hv.shape[:-1]))
        size = int(chunk) if chunk is not None else default_chunk(rows, int(wv.shape[0]), int(wv.shape[1]))
        with graph.inserting_before(ce):
            flat = graph.call_method("reshape", (h, (-1, int(hv.shape[-1]))))
            # traced into the op `fused_loss` picks for this chunk (AOTAutograd traces through it)
            loss = graph.call_function(fused_loss, (flat, weight, bias, kw["target"], int(kw.get("ignore_index", -100)),
                                                    str(kw.get("reduction", "mean")), size))
        loss.meta.update(ce.meta)
        ce.replace_all_uses_with(loss)
        graph.erase_node(ce)
        # the logits: out of the outputs, then the chain from the head to the loss, where unused
        out = next(n for n in graph.nodes if n.op == "output")
        chain = [n for n in _chain(kw["input"], linear)]
        for n in chain:
            out.args = fx.node.map_arg(out.args, lambda a, n=n: None if a is n else a)
        for n in chain:  # from the loss's input back to the head
            if not n.users:
                graph.erase_node(n)
    graph.lint()
    gm.recompile()
    return len(pairs)


def _chain(x: fx.Node, linear: fx.Node) -> list[fx.Node]:
    """The nodes from the cross-entropy's input ``x`` back to ``linear``, in that order."""
    out = [x]
    while out[-1] is not linear:
        out.append(out[-1].args[0])
    return out


def fused(summary: list[str]) -> int | None:
    """The chunk of the fused loss a graph summary (`monet.graph.OpGraph.summary`) holds, else None."""
    for line in summary:
        if " monet.linear_cross_entropy.default (" in line or " monet.linear_cross_entropy_grads.default (" in line:
            args = line.split("(", 1)[1].split(";", 1)[0].split(",")
            return int(args[-1])
    return None


__all__ = ["default_chunk", "find_lm_losses", "fuse_lm_loss", "fused", "fused_loss", "liger_chunk",
           "linear_cross_entropy", "linear_cross_entropy_backward", "linear_cross_entropy_grads"]
