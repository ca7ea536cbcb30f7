"""What CUDA's allocated bytes hold beyond the graph's tensors, from PyTorch's sources (torch 2.11-2.15).

``torch.cuda.max_memory_allocated`` (docs/design.md, "Measuring") is the peak of the caching allocator's
``allocated_bytes`` statistic.  Three things put it above the sum of the tensors' ``nbytes`` that
`monet.simulate` and the ILP (`monet.solver.memory_model`) counted before this module:

1. **The caching allocator's blocks** (c10/cuda/CUDACachingAllocator.cpp, 2.11-2.15).  A request of
   n > 0 bytes becomes a block of `round_size` (n) bytes: 512 at least, else n rounded up to a
   multiple of 512 (``kMinBlockSize``; ``roundup_power2_divisions`` in ``PYTORCH_CUDA_ALLOC_CONF``
   rounds coarser: `round_size` takes them).  A block comes from the small pool (requests of at most
   1 MiB, ``kSmallSize``, carved from 2 MiB segments) or the large pool.  ``allocated_bytes`` grows
   by the *block's* size (``alloc_found_block``: ``stats.allocated_bytes.increase(block->size)``;
   ``requested_bytes`` counts n).  A cached free block larger than the request is split only if the
   remainder is at least 512 bytes (small pool) or more than 1 MiB (large pool, ``should_split``):
   a large request served from a cached block up to 1 MiB larger holds, and counts, that whole
   block.  That remainder depends on which blocks are cached at that moment, so no static model
   can know it; `split_slack_bound` is its bound per block (0 small, 1 MiB large).  The memory model
   counts `round_size`; the recorded traces (`monet.profiling.trace`) show what the slack adds.

2. **cuBLAS / cuBLASLt workspaces** (aten/src/ATen/cuda/CublasHandlePool.cpp, 2.11-2.15).  The first
   cuBLAS call of a (handle, stream) pair allocates a workspace of `cublas_workspace_bytes` through the
   caching allocator and keeps it in ``cublas_handle_stream_to_workspace()`` for the process
   (``clearCublasWorkspaces`` frees it; nothing in a training step calls it).  Size:
   ``CUBLAS_WORKSPACE_CONFIG`` (``:SIZE_KiB:COUNT`` pairs, summed ``SIZE * 1024 * COUNT``), else 32 MiB
   on compute capability 9.x (Hopper; PyTorch's PR #89027) and, in the sources read for 2.12 and later,
   10.x and 12.x (Blackwell, PR #175344; a revert, #182669, was closed unmerged), else
   ``:4096:2:16:8`` = 8 MiB + 128 KiB.  cuBLASLt (``addmm`` with a bias epilogue, ``_scaled_mm`` ...)
   shares that same allocation by default from 2.12 ("unified" workspaces, PR #168175, on unless
   ``TORCH_CUBLASLT_UNIFIED_WORKSPACE=0``; PR #175879 made the allocation follow the
   setting); in 2.11 it does not: on an H100 with 2.11.0+cu130 (benchmarks/gpu_probe.py)
   the first ``a @ b`` of a thread allocated 32 MiB and the first ``addmm`` with a bias 1 MiB more.
   A cuBLASLt workspace not shared is ``CUBLASLT_WORKSPACE_SIZE`` KiB (default 1024 KiB) per (handle,
   stream), allocated by a thread's first cuBLASLt op (`LT_OPS`): `cublaslt_workspace_bytes`.
   Handles are per thread (``DeviceThreadHandlePool``): the forward pass runs in the caller's thread,
   the backward pass in autograd's device thread, so a training step that multiplies matrices in both
   holds two workspaces, 64 MiB on an H100 (`library_workspace_bytes`).  They are allocated in the
   warm-up step and are live, as part of the baseline, through every step measured after it.  (On an
   H100 they are most of what the CUDA offload test measured beyond its prediction: 68,709,632
   bytes, two 32 MiB workspaces and 1.53 MiB.)

3. **cuDNN convolution workspace** (aten/src/ATen/native/cudnn/Conv_v8.cpp, 2.11-2.15; the v8/v9
   frontend path, unless ``TORCH_CUDNN_V8_API_DISABLED`` selects Conv_v7.cpp).  Without benchmark mode
   (``torch.backends.cudnn.benchmark = False``, the default) ``run_single_conv`` first looks the
   convolution up in a thread-local plan cache (key: shapes, strides, dtype, layout, alignment of the
   data pointers, ``deterministic`` and TF32 settings); on a miss it asks cuDNN's heuristics (mode
   INSTANT, or B with ``TORCH_CUDNN_USE_HEURISTIC_MODE_B``) for its engine configs, filtered by the
   deterministic / TF32 / down-conversion notes, and *tries them in order*: each plan's
   ``getWorkspaceSize()`` bytes are allocated through the caching allocator for the duration of the
   call (``run_conv_plan``), and an ``OutOfMemoryError`` (or a cuDNN error) moves on to the next plan,
   then to the fallback list.  The first plan that runs is cached.  So the workspace is the top
   heuristic plan's, whatever memory is free; nothing caps it: ``benchmark_limit`` only bounds how
   many plans benchmark mode times, and the free-memory filter (``get_available_workspace``, the
   largest cached free block) and the halving on OOM in ``generate_and_filter_plans`` run only in
   benchmark mode; ``CUDNN_CONV_WSCAP_DBG`` is read only by the v7 path.  Only a failed allocation
   (a full GPU, after the allocator has freed its cache and retried) makes it pick a smaller plan.
   The plan, and therefore the workspace, is a function of the node's shapes and the numerics
   settings (TF32 on or off selects different engines), per cuDNN release and GPU.

   What the profile's ``workspace_bytes`` of a node means (`monet.profiling.profiler`, CUDA): the
   peak of ``max_memory_allocated`` while the node runs alone after a warm-up, minus what was
   allocated before, minus the outputs' exact bytes: the cached plan's workspace rounded to blocks,
   plus the outputs' rounding (at most 511 bytes per output; the profile's many 512-byte entries).
   ResNet-50 at batch 184 on an H100 (torch 2.11, cuDNN 9): 701,699,072 bytes for the first
   convolution, up to 894,698,496 for a convolution's backward.

   **The rule**: count the profile's ``workspace_bytes`` while the node runs (the simulator and the
   ILP do), measured on the GPU, cuDNN and torch release that will run the schedule and under the same
   numerics settings (``monet.compat.strict_fp32`` switches TF32 off and with it the engines).  The
   outputs' rounding, now counted by `round_size`, is then counted twice, at most 511 bytes per
   output.  There is no bound from the shapes alone: cuDNN's heuristics are not documented, so the
   analytic cost source cannot promise a CUDA budget: `monet.profiling.workspace`'s CUDA guess for
   convolutions, ``max(w, out) + in``, is below the H100 profile's measurement on 20 of ResNet-50's
   106 convolution nodes (by up to 17 %).  A schedule must be solved with a profile of that GPU for
   the budget to hold.  No GPU is needed to apply this rule, only the profile.

`memory_terms` returns these terms for a graph: the identity and nothing held for a CPU graph (CPU
predictions are unchanged), `round_size` and `library_workspace_bytes` for a CUDA graph
(``OpGraph.device == "cuda"``).  `sized_graph` gives the ILP the same byte sizes as the simulator.
"""
from __future__ import annotations

import dataclasses
import os
import re
from dataclasses import dataclass
from typing import Callable

__all__ = ["K_MIN_BLOCK_SIZE", "K_SMALL_SIZE", "round_size", "pool_of", "split_slack_bound",
           "cublas_workspace_bytes", "cublaslt_workspace_bytes", "BLAS_OPS", "LT_OPS", "uses_blas",
           "library_workspace_bytes", "MemoryTerms", "memory_terms", "sized_graph", "parse_roundup_divisions",
           "ROUNDUP_INTERVALS"]

#: ``kMinBlockSize``: the smallest block, and the granule of every block size (bytes).
K_MIN_BLOCK_SIZE = 512
#: ``kSmallSize``: requests of at most this many bytes come from the small pool (1 MiB).
K_SMALL_SIZE = 1 << 20
MiB = 1 << 20


#: ``kRoundUpPowerOfTwoIntervals``: the power-of-two intervals of ``roundup_power2_divisions``,
#: [1 MiB, 2 MiB) (and everything smaller) to [32 GiB, 64 GiB) (and everything larger).
ROUNDUP_INTERVALS = 16


def parse_roundup_divisions(conf: str | None = None) -> list[int]:
    """``roundup_power2_divisions`` of ``PYTORCH_CUDA_ALLOC_CONF`` (default: the environment's, or
    ``PYTORCH_ALLOC_CONF``'s) as the allocator's table: divisions per power-of-two interval,
    `ROUNDUP_INTERVALS` entries, entry i for sizes in [2^(20+i), 2^(21+i)) bytes (0: no
    power-of-two rounding); ``[]`` when the option is not set.

    ``roundup_power2_divisions:N`` sets every interval; ``roundup_power2_divisions:[256:1,512:2,>:8]``
    sets the interval starting at each key (MiB, a power of two), the first key also every interval
    below it, ``>`` every interval after the last key, and leaves the others at 0
    (``parseRoundUpPower2Divisions`` and ``roundup_power2_divisions``, c10/core/AllocatorConfig.cpp,
    2.11-2.15).

    Raises:
        ValueError: a malformed option.
    """
    text = conf if conf is not None else (os.environ.get("PYTORCH_CUDA_ALLOC_CONF")
                                          or os.environ.get("PYTORCH_ALLOC_CONF") or "")
    m = re.search(r"roundup_power2_divisions:(\[[^\]]*\]|\d+)", text)
    if not m:
        return []
    value = m.group(1)
    try:
        if not value.startswith("["):
            return [int(value)] * ROUNDUP_INTERVALS
        table, first, last = [0] * ROUNDUP_INTERVALS, True, 0
        for item in value[1:-1].split(","):
            key, div = (part.strip() for part in item.split(":"))
            if key == ">":
                table[last + 1:] = [int(div)] * (ROUNDUP_INTERVALS - last - 1)
                continue
            index = min(max(int(key).bit_length() - 1, 0), ROUNDUP_INTERVALS - 1)
            if first:
                table[:index] = [int(div)] * index
                first = False
            table[index], last = int(div), index
        return table
    except ValueError:
        raise ValueError(f"cannot read roundup_power2_divisions from {text!r}") from None


def _divisions(size: int, table: list[int]) -> int:
    log = size.bit_length() - 1
    return table[min(log - 20 if log > 20 else 0, ROUNDUP_INTERVALS - 1)]


def round_size(nbytes: int, divisions: list[int] | None = None) -> int:
    """Bytes of the block the CUDA caching allocator hands out for a request of ``nbytes`` bytes
    (``DeviceCachingAllocator::round_size``, c10/cuda/CUDACachingAllocator.cpp, 2.11-2.15): 0 for 0
    (no allocation), 512 below 512, else ``nbytes`` rounded up to a multiple of 512, or, where
    ``divisions`` (`parse_roundup_divisions`) give more than one division for the size and the size
    exceeds ``512 * divisions``, up to the next of the ``divisions`` equal steps between two powers
    of two (``roundup_power2_next_division``).

    This is what ``allocated_bytes`` counts for the block unless it was served from a larger cached
    block left unsplit (`split_slack_bound`).
    """
    n = int(nbytes)
    if n <= 0:
        return 0
    if n < K_MIN_BLOCK_SIZE:
        return K_MIN_BLOCK_SIZE
    div = _divisions(n, divisions) if divisions else 0
    if div > 1 and n > K_MIN_BLOCK_SIZE * div:
        if n & (n - 1) == 0:
            return n
        floor = 1 << (n.bit_length() - 1)
        step = floor >> (div.bit_length() - 1)
        if step == 0:
            return floor << 1
        low = n & ~(step - 1)
        return n if low == n else low + step
    return K_MIN_BLOCK_SIZE * ((n + K_MIN_BLOCK_SIZE - 1) // K_MIN_BLOCK_SIZE)


def pool_of(nbytes: int) -> str:
    """``"small"`` for requests of at most 1 MiB (``kSmallSize``), else ``"large"``
    (``get_pool``, CUDACachingAllocator.cpp 2.11-2.15)."""
    return "small" if int(nbytes) <= K_SMALL_SIZE else "large"


def split_slack_bound(nbytes: int) -> int:
    """The most bytes beyond `round_size` that ``allocated_bytes`` can count for one request: a cached
    block is split only if the remainder is >= 512 bytes (small pool: block sizes are multiples of
    512, so never any slack) or > 1 MiB (large pool: up to 1 MiB) (``should_split`` with the default
    ``max_split_size``, no expandable segments; CUDACachingAllocator.cpp 2.11-2.15)."""
    return 0 if pool_of(nbytes) == "small" or int(nbytes) <= 0 else K_SMALL_SIZE


def cublas_workspace_bytes(capability: tuple[int, int] | None, config: str | None = None) -> int:
    """Bytes of the cuBLAS workspace of one (handle, stream) pair (``parseChosenWorkspaceSize``,
    aten/src/ATen/cuda/CublasHandlePool.cpp, 2.11-2.15).

    Args:
        capability: the GPU's compute capability (major, minor); None: unknown, the largest default
            (32 MiB) is returned, an upper bound.
        config: ``CUBLAS_WORKSPACE_CONFIG`` (default: the environment's): ``:SIZE:COUNT`` pairs in
            KiB, e.g. ``:4096:8``, summed as ``SIZE * 1024 * COUNT``; unparseable: the default.

    The default is 32 MiB (``4096 * 8 * 1024``) for compute capability 9.x (Hopper) and 10.x / 12.x
    (Blackwell, in the sources read for 2.12 and later: PR #175344; for 2.11 Blackwell may be the
    8 MiB default), else ``:4096:2:16:8`` = 8,519,680 bytes.
    """
    text = config if config is not None else os.environ.get("CUBLAS_WORKSPACE_CONFIG")
    if capability is None:
        default = 32 * MiB
    else:
        default = 32 * MiB if int(capability[0]) in (9, 10, 11, 12) else 4096 * 1024 * 2 + 16 * 1024 * 8
    if text:
        pairs = re.findall(r":([0-9]+):([0-9]+)", text)
        if pairs:
            return sum(int(size) * 1024 * int(count) for size, count in pairs)
    return default


def cublaslt_workspace_bytes(unified: bool | None = None, size_kib: str | None = None,
                             release: tuple[int, int] | None = None) -> int:
    """Bytes of a separate cuBLASLt workspace per (handle, stream), 0 when it shares cuBLAS's
    (``getCUDABlasLtWorkspace``, CublasHandlePool.cpp 2.11-2.15).

    Args:
        unified: cuBLASLt uses the cuBLAS workspace; None: from ``TORCH_CUBLASLT_UNIFIED_WORKSPACE``
            ("0", "false", "off": False) when set, else the default of ``release``: shared from 2.12
            (PR #168175, its allocation fixed by PR #175879), separate in 2.11 (measured on an H100).
        size_kib: ``CUBLASLT_WORKSPACE_SIZE`` in KiB (default: the environment's, else 1024).
        release: torch's (major, minor); None: the installed torch's (`monet.compat.torch_version`).
    """
    if unified is None:
        text = os.environ.get("TORCH_CUBLASLT_UNIFIED_WORKSPACE")
        if text is not None and text.strip():
            unified = text.strip().lower() not in ("0", "false", "off")
        else:
            from monet.compat import torch_version

            unified = (release or torch_version()) >= (2, 12)
    if unified:
        return 0
    text = size_kib if size_kib is not None else os.environ.get("CUBLASLT_WORKSPACE_SIZE")
    try:
        kib = int(text) if text else 1024
    except ValueError:
        kib = 1024
    return kib * 1024


#: ATen ops that call cuBLAS or cuBLASLt on CUDA (matrix products; ``linear`` and ``matmul``
#: decompose into them).  Convolutions use cuDNN, attention kernels their own.
BLAS_OPS = frozenset({"aten.mm.default", "aten.addmm.default", "aten.bmm.default", "aten.baddbmm.default",
                      "aten.addbmm.default", "aten.mv.default", "aten.addmv.default", "aten.dot.default",
                      "aten.vdot.default", "aten._addmm_activation.default", "aten._scaled_mm.default",
                      "aten._int_mm.default", "aten.linear.default", "aten.matmul.default", "aten.addr.default"})


#: The ops of `BLAS_OPS` that PyTorch runs through cuBLASLt (a bias epilogue, scaled and integer
#: products), which allocate a thread's cuBLASLt workspace when it is not shared.
LT_OPS = frozenset({"aten.addmm.default", "aten._addmm_activation.default", "aten._scaled_mm.default",
                    "aten._int_mm.default", "aten.linear.default", "aten.baddbmm.default"})


def uses_blas(op: str) -> bool:
    """Whether the ATen op ``op`` (``OpGraph`` node ``op`` string) runs a cuBLAS / cuBLASLt kernel."""
    return op in BLAS_OPS


def library_workspace_bytes(graph, capability: tuple[int, int] | None = None) -> int:
    """Bytes the BLAS libraries hold through a training step of ``graph`` on CUDA: one
    `cublas_workspace_bytes` (+ `cublaslt_workspace_bytes`) per thread that runs a matrix product,
    the caller's thread for the forward pass if a forward node does, autograd's device thread for the
    backward pass if a backward node does or a forward node does (the schedule may recompute it
    there); the cuBLASLt workspace in a thread that may run one of `LT_OPS`.  ``capability``: default
    ``graph.cuda_capability``.  Bytes, block-rounded."""
    cap = capability if capability is not None else getattr(graph, "cuda_capability", None)
    blas, lt = round_size(cublas_workspace_bytes(cap)), round_size(cublaslt_workspace_bytes())
    fwd = any(uses_blas(n.op) for n in graph.fwd)
    bwd = fwd or any(uses_blas(n.op) for n in graph.bwd)
    fwd_lt = any(n.op in LT_OPS for n in graph.fwd)
    bwd_lt = fwd_lt or any(n.op in LT_OPS for n in graph.bwd)
    return blas * (int(fwd) + int(bwd)) + (lt * (int(fwd_lt) + int(bwd_lt)) if lt else 0)


@dataclass(frozen=True)
class MemoryTerms:
    """How the memory model counts bytes on a device.

    Attributes:
        block: bytes the allocator counts for one tensor of n bytes (identity on CPU,
            `round_size` on CUDA).
        library_bytes: bytes held outside the graph's nodes through the whole step (0 on CPU; the
            BLAS workspaces on CUDA).
        device: ``"cpu"`` (also for meta graphs) or ``"cuda"``.
    """

    block: Callable[[int], int]
    library_bytes: int
    device: str

    def tensor(self, t) -> int:
        """Counted bytes of one (fake or real) tensor: ``block(monet.graph.tensor_bytes(t))``."""
        from monet.graph import tensor_bytes

        return self.block(tensor_bytes(t))

    def of(self, val) -> int:
        """Counted bytes of a node's ``meta["val"]``: every tensor in it, each its own block."""
        from monet.graph import tensors_in

        return sum(self.tensor(t) for t in tensors_in(val))


def _identity(n: int) -> int:
    return int(n)


CPU_TERMS = MemoryTerms(block=_identity, library_bytes=0, device="cpu")


def memory_terms(graph) -> MemoryTerms:
    """The `MemoryTerms` of ``graph``: CUDA's (`round_size`, `library_workspace_bytes`) when
    ``graph.device == "cuda"``, else the CPU's (exact bytes, nothing held)."""
    if getattr(graph, "device", "cpu") != "cuda":
        return CPU_TERMS
    divisions = parse_roundup_divisions()
    block = (lambda n: round_size(n, divisions)) if divisions else round_size
    return MemoryTerms(block=block, library_bytes=library_workspace_bytes(graph), device="cuda")


def sized_graph(graph):
    """``graph`` with every byte count as the allocator counts it (`memory_terms`): the same object
    for a CPU graph; for a CUDA graph a shallow copy whose values, node outputs, saved bytes and
    primal / tangent / output totals are sums of per-tensor blocks, with ``library_bytes`` set.  The
    joint graph, fingerprint and summary are shared.  The ILP (`monet.solver.memory_model`) reads
    these, the simulator (`monet.simulate`) applies the same `MemoryTerms` to the FX modules."""
    terms = memory_terms(graph)
    if terms.device != "cuda":
        return graph
    by_name = {n.name: n for n in graph.joint.graph.nodes}
    values = {}
    for name, v in graph.values.items():
        node = by_name.get(name)
        nbytes = terms.of(node.meta.get("val")) if node is not None else terms.block(v.nbytes)
        values[name] = dataclasses.replace(v, nbytes=nbytes)

    def resized(n):
        return dataclasses.replace(n, out_bytes=sum(values[o].nbytes for o in n.outputs),
                                   saved_bytes=sum(values[o].nbytes for o in n.saved))

    kinds = graph.primal_kinds

    def total(kind):
        return sum(values[p].nbytes for p, k in kinds.items() if k == kind and p in values)

    from monet.graph import TANGENT

    tangent = sum(v.nbytes for k, v in values.items() if k.startswith(TANGENT))
    return dataclasses.replace(graph, values=values, fwd=[resized(n) for n in graph.fwd],
                               bwd=[resized(n) for n in graph.bwd], param_bytes=total("param"),
                               buffer_bytes=total("buffer"), input_bytes=total("input"), tangent_bytes=tangent,
                               output_bytes=tangent, library_bytes=terms.library_bytes)
