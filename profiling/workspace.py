"""An upper bound on each operator's workspace, from shapes: what the analytic cost source charges.

The analytic model cannot know a kernel's temporaries (docs/design.md, "Data flow", step 2), yet a
schedule solved with zero workspace can exceed its budget where it is run (a kernel's temporaries
sit on top of the peak the schedule was solved for).
`workspace_bound` gives, per operator family, a number of bytes that covers what the kernel
allocates and frees while it runs (the profiler's ``workspace_bytes``: peak during the call minus
what was live before, minus the new outputs).  All sizes in bytes; ``in`` is the sum of the op's
tensor inputs, ``out`` of its outputs, ``w`` the convolution weight, ``T`` the intra-op threads.

CPU (oneDNN, MKL, ATen's flash attention; measured with `monet.profiling.profiler.profile_costs`,
torch 2.13, 1 to 64 threads, single ops and six models: zoo ResNet-50 and MobileNetV2, torchvision
EfficientNet-B0, timm ConvNeXt-atto and ViT-tiny, GPT-2, batch 2, 2 threads; largest measured /
bound per family: convolution 0.64 (227 nodes), its backward 0.96 (227; ConvNeXt's depthwise),
normalisation 0.67 (418), attention 0.30 and 0.03 (12 each), other 0.67 (1421);
tests/test_budget_guarantee.py checks it on the machine that runs the tests):

=========================  ==============================================================  =====
family                     bound                                                           why
=========================  ==============================================================  =====
convolution (forward)      ``3 * (in + out) + T * 16 KiB``; float64: ``columns + out / 2``  [a][g]
convolution backward       ``3 * (in + out) + T * 16 KiB``; grouped: ``+ max(260, 6 T) w``  [b]
normalisation (fwd, bwd)   ``1.5 * out``                                                   [c]
monet's chunked LM loss    fwd ``c V (s + 8)``; bwd ``c V (2 s + 16) + 8 H V`` (``c`` rows     [f]
                           of a chunk, ``V x H`` the head's weight of ``s`` bytes per element)
CPU flash attention        fwd ``T * q_split * (kv_split + 2 + D) * 4 + out``;             [d]
                           bwd ``T * 2 * q_split * kv_split * 4 + in``
anything else              ``out / 2 + 256``                                               [e]
=========================  ==============================================================  =====

[a] oneDNN reorders the weight (and the input, for a blocked layout) into its own buffers: up to
    580x the output for a 1x1 conv on a 1x1 map of ResNet-50's last stage, about 1x the weight;
    the strided 2x2 downsampling conv of ConvNeXt (channels last) 2x; plus a per-thread
    scratchpad (about 4 KiB per thread, channels last, 64 threads).
[b] A dense backward reorders the weight and its gradient (<= 3x the weight, ConvNeXt's
    downsampling); a depthwise or grouped backward reduces per-thread weight-gradient copies:
    5 T x the weight (channels first, 5x5 and 3x3 groups of 2), 257x the weight at any thread
    count (ConvNeXt's channels-last 7x7 depthwise), 30x (3x3 depthwise).
[c] BatchNorm and LayerNorm backward hold one temporary as large as the gradient (<= 1.00x the
    outputs, ResNet-50, MobileNetV2, ConvNeXt, GPT-2); dropout's mask is 0.8x; forward <= 0.95x.
[d] PyTorch's CPU flash kernel (aten/src/ATen/native/cpu/FlashAttentionKernel.cpp) gives each
    thread a ``q_split x (kv_split + 2 + D)`` float buffer (``q_split`` 256 from 768 queries, 64
    from 192, else 32, at most the query length; ``kv_split`` min(512, keys)), exactly the measured
    forward; its backward two ``q_split x kv_split`` float buffers per thread and a float copy of
    the query gradient (measured 2.1 MB at T=1 and 17.8 MB at T=16 for 2 heads of 2048 x 64).
[e] Elementwise ops, reductions, softmax, pooling, matmuls measured at most 12 bytes or 0.27x
    their output (``_safe_softmax``); MKL's matmul packing buffers come from MKL's own allocator,
    which neither this bound nor the allocator-level peak (`monet.profiling.peak`) sees.

[f] `monet.lm_loss`: per chunk the head's logits, their float32 copy and log-softmax (forward);
    the logits, log-softmax and their gradients, and in one chunk the weight's gradient as a (H, V)
    product before its transposed copy (backward; over several chunks it is added in place); the
    same chunk temporaries in the forward pass of ``linear_cross_entropy_grads``.
    Read from the op's own code, not measured.

[g] In a dtype oneDNN does not take (float64), ATen convolves by im2col: the forward allocates a
    column buffer of batch x input channels x kernel elements x output positions elements (a 3x3
    convolution: 9x its input; measured: exactly that), which the bound counts instead of
    oneDNN's reorders.

CUDA (not measured here: no GPU was available).  The bound takes the convolution family as
``max(w, out) + in`` and every other family as on CPU without the per-thread terms (one stream, no
thread pool).  It is a guess, not a bound: PyTorch 2.11-2.15 run the top cuDNN heuristic plan
whatever its workspace, and nothing caps it outside benchmark mode (`monet.profiling.cuda_bytes`
reads the sources), and the H100 profile of ResNet-50 at batch 184 (torch 2.11, cuDNN 9; in
benchmarks/profiles) exceeds it on 20 of its 106 convolution nodes, by up to 17 % (forward node 190:
119,063,552 bytes measured, 101,761,024 bounded).  Solve with ``--cost hybrid`` or ``--cost profile`` on the GPU where the
schedule must hold to the byte.
"""
from __future__ import annotations

import torch
import torch.fx as fx

__all__ = ["workspace_bound", "workspace_family", "with_workspace_bound", "FAMILIES"]

#: Family of each ATen op with a bound of its own (``OpOverload`` names); others are ``"other"``.
FAMILIES = {
    "aten.convolution.default": "convolution",
    "aten.convolution_backward.default": "convolution_backward",
    "aten.native_batch_norm_backward.default": "normalisation",
    "aten.native_layer_norm_backward.default": "normalisation",
    "aten.native_group_norm_backward.default": "normalisation",
    "aten._native_batch_norm_legit_functional.default": "normalisation",
    "aten._native_batch_norm_legit.default": "normalisation",
    "aten._native_batch_norm_legit_no_training.default": "normalisation",
    "aten.native_batch_norm.default": "normalisation",
    "aten.native_layer_norm.default": "normalisation",
    "aten.native_group_norm.default": "normalisation",
    "aten.native_dropout.default": "normalisation",  # the mask: the same "<= out" law
    "aten.native_dropout_backward.default": "normalisation",
    "monet.linear_cross_entropy.default": "lm_loss",
    "monet.linear_cross_entropy_backward.default": "lm_loss_backward",
    "monet.linear_cross_entropy_grads.default": "lm_loss_grads",
    "aten._scaled_dot_product_flash_attention_for_cpu.default": "attention",
    "aten._scaled_dot_product_flash_attention_for_cpu_backward.default": "attention_backward",
}

_THREAD_SCRATCH = 16 * 1024  # bytes per thread for oneDNN's scratchpad ([a]: about 4 KiB measured)
_GROUPED_FLOOR, _GROUPED_PER_THREAD = 260, 6  # x the weight ([b]: 257x, 5 T x measured)


def _bytes(x) -> int:
    if isinstance(x, torch.Tensor):
        return int(x.numel()) * int(x.element_size())
    if isinstance(x, (list, tuple)):
        return sum(_bytes(v) for v in x)
    return 0


def _val(a):
    return a.meta.get("val") if isinstance(a, fx.Node) else a


def workspace_family(fx_node: fx.Node) -> str:
    """The family of the op ``fx_node`` runs (a key of `workspace_bound`'s table): an
    implementation's kernel (`monet.impls`) is in the family of the ATen op it names
    (``_monet_aten``); an op without a family of its own is ``"other"``."""
    target = getattr(fx_node.target, "_monet_aten", fx_node.target)
    return FAMILIES.get(str(target), "other")


def _flash_splits(q_len: int, kv_len: int) -> tuple[int, int]:
    """(q_split, kv_split) of PyTorch's CPU flash attention kernel (FlashAttentionKernel.cpp)."""
    q_split = 256 if q_len >= 768 else (64 if q_len >= 192 else 32)
    return min(q_split, q_len), min(512, kv_len)


#: the dtypes oneDNN convolves on the CPU; any other (float64) takes ATen's im2col convolution
_ONEDNN_DTYPES = (torch.float32, torch.bfloat16, torch.float16)


def _columns(family: str, args: list, weight, out) -> int:
    """Bytes of the column buffer of ATen's im2col convolution (``slow_conv2d``, [g]), which a CPU
    forward convolution in a dtype oneDNN does not take allocates: batch x (input channels x
    kernel elements) x output positions; 0 for the dtypes oneDNN takes and for the backward (its
    measured workspace is under the bound without it)."""
    x = args[0]
    if family != "convolution" or not isinstance(x, torch.Tensor) or x.dtype in _ONEDNN_DTYPES:
        return 0
    channels_and_kernel = int(weight.shape[1:].numel()) * int(args[8])  # (C_in / groups) k^2 x groups
    return int(x.shape[0]) * channels_and_kernel * int(out.shape[2:].numel()) * x.element_size()


def workspace_bound(fx_node: fx.Node, device: str = "cpu", threads: int | None = None) -> int:
    """An upper bound, in bytes, on the workspace of the op ``fx_node`` (a node of a traced joint
    graph, with fake tensors in ``meta['val']``) on ``device`` (``"cpu"`` or ``"cuda"``) with
    ``threads`` intra-op threads (None: ``torch.get_num_threads()`` now).  The formulas and the
    measurements behind them are in this module's docstring.

    Raises:
        ValueError: ``threads`` < 1, or a device other than cpu and cuda.
    """
    kind = device.split(":")[0]
    if kind not in ("cpu", "cuda"):
        raise ValueError(f"workspace bounds are for 'cpu' and 'cuda', not {device!r}")
    threads = torch.get_num_threads() if threads is None else threads
    if threads < 1:
        raise ValueError(f"threads must be >= 1, got {threads}")
    per_thread = threads if kind == "cpu" else 0
    family = workspace_family(fx_node)
    args = [_val(a) for a in fx_node.args]
    ins = sum(_bytes(a) for a in args)
    out = _bytes(_val(fx_node))
    if family in ("convolution", "convolution_backward"):
        weight = args[1] if family == "convolution" else args[2]
        w = _bytes(weight)
        if kind == "cuda":
            return max(w, out) + ins
        groups = int(args[8] if family == "convolution" else args[9])
        grouped = max(_GROUPED_FLOOR, _GROUPED_PER_THREAD * threads) * w \
            if family == "convolution_backward" and groups > 1 else 0
        columns = _columns(family, args, weight, _val(fx_node))
        if columns:  # ATen's im2col convolution: no oneDNN reorders or scratchpad ([g])
            return columns + out // 2 + 256
        return 3 * (ins + out) + per_thread * _THREAD_SCRATCH + grouped
    if family == "normalisation":
        return (3 * out) // 2
    if family in ("lm_loss", "lm_loss_backward", "lm_loss_grads"):  # monet.lm_loss: one chunk's logits at a time
        back = family != "lm_loss"  # the gradients' chunk temporaries, in the backward or the forward pass
        hidden, weight = args[1:3] if family == "lm_loss_backward" else args[0:2]
        rows = min(int(fx_node.args[-1]), int(hidden.shape[0]))
        vocab, width, size = int(weight.shape[0]), int(weight.shape[1]), weight.element_size()
        if back:  # logits, their float log-softmax, its gradient, the logits' gradient; in one chunk
            # the weight's gradient transposed before its copy (over chunks it is added in place)
            whole = rows >= int(hidden.shape[0]) and family == "lm_loss_backward"
            return rows * vocab * (2 * size + 16) + (width * vocab * size if whole else 0) + 256
        return rows * vocab * (size + 8) + 256  # logits, their float copy, the log-softmax
    if family in ("attention", "attention_backward"):
        q, k = args[1:3] if family == "attention_backward" else args[0:2]
        q_split, kv_split = _flash_splits(int(q.shape[-2]), int(k.shape[-2]))
        if family == "attention":
            return max(per_thread, 1) * q_split * (kv_split + 2 + int(q.shape[-1])) * 4 + out
        return max(per_thread, 1) * 2 * q_split * kv_split * 4 + ins
    return out // 2 + 256


def with_workspace_bound(table, graph, device: str = "cpu", threads: int | None = None):
    """``table`` (a cost table of ``graph``, `monet.profiling.costs`) with each node's
    ``workspace_bytes`` raised to `workspace_bound` (bytes) and ``"+workspace-bound"`` added to its
    ``source``: the analytic cost source, so that its schedules hold at the allocator.

    Raises:
        ValueError: ``graph.joint`` missing (a graph loaded from a solution file), or as
            `workspace_bound`.
    """
    from monet.profiling.costs import validate_costs

    if graph.joint is None:
        raise ValueError("workspace bounds need the traced joint graph (graph.joint is None); re-capture the model")
    by_name = {n.name: n for n in graph.joint.graph.nodes}
    name = {(n.kind, n.id): n.name for n in list(graph.fwd) + list(graph.bwd)}
    table = table.copy()
    table["workspace_bytes"] = [max(int(ws), workspace_bound(by_name[name[(k, i)]], device, threads))
                                for k, i, ws in zip(table["kind"], table["node"], table["workspace_bytes"])]
    table["source"] = table["source"] + "+workspace-bound"
    return validate_costs(table)
