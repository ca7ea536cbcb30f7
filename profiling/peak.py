"""Peak memory of one call (typically one training iteration), measured at the allocator.

All quantities are in **bytes**.

Two devices are supported:

* **CUDA** -- the caching allocator keeps the statistics itself:
  ``torch.cuda.reset_peak_memory_stats`` before the call, ``max_memory_allocated`` after it.
  The baseline is ``memory_allocated()`` at the start, so the caller does not supply it.
  Sizes are the allocator's *block* sizes, i.e. rounded up to multiples of 512 bytes
  (more if ``PYTORCH_CUDA_ALLOC_CONF`` asks for power-of-two rounding).

* **CPU** -- there is no ``max_memory_allocated``. The call runs under
  ``torch.profiler.profile(profile_memory=True)``; every allocation and free made through
  c10's CPU allocator is then reported to the profiler as a raw "[memory]" event (pointer,
  signed size, timestamp). This module reads those raw events from the profiler's event tree
  (``prof.profiler.kineto_results.experimental_event_tree()``, nodes tagged
  ``_EventType.Allocation``), orders them by time and takes the maximum prefix sum.
  Because it works at the allocator, **kernel temporaries count**: e.g. oneDNN's reordered
  input/weight/output buffers and its scratchpad (PyTorch registers the c10 CPU allocator as
  oneDNN's allocator), ``slow_conv2d``'s im2col buffer, reduction buffers, ...
  Memory obtained outside c10 (plain ``malloc`` inside a third-party library, numpy arrays,
  Python objects) is not seen.

  ``prof.events()`` is *not* used: there, a "[memory]" event that happens inside an op is
  folded into that op's ``cpu_memory_usage`` (and the op's total includes its children), so
  the order of allocations and frees inside an op is lost -- a workspace allocated and freed
  inside one kernel would cancel out and never show in the peak.

  The profiler slows the call down, which does not matter: only byte counts are read, and
  they do not depend on timing.

  Sizes are the *requested* ``nbytes`` (the same number ``untyped_storage().nbytes()``
  reports), not the malloc footprint: c10 allocates CPU memory with ``posix_memalign`` at a
  64-byte alignment, so each live allocation really occupies up to 63 bytes more plus the
  C library's bookkeeping. Zero-byte tensors allocate nothing.

  The CPU allocator cannot tell the profiler the size of a block allocated *before*
  profiling started, so frees of memory that was live at the start of the call are dropped
  (and when it does report one, the size may come from a stale table entry of an earlier
  profiling session). This module therefore counts only frees of blocks that were allocated
  during the call: memory live at the start is assumed to stay live throughout, and if
  ``fn`` frees part of it the reported peak is an upper bound. c10 prints a warning
  ("Memory block of unknown size was allocated before the profiling started ...") in that
  case; it is harmless here.

  What was live at the start must be supplied by the caller as ``baseline_bytes``
  (parameters, buffers, gradients, optimizer state, inputs: see :func:`live_tensor_bytes`).

:func:`measure_peak_dispatch` is an independent, cheaper cross-check that sees only the
outputs of ATen ops (via a ``TorchDispatchMode``), not kernel temporaries.
"""
from __future__ import annotations

import weakref
from dataclasses import dataclass
from typing import Any, Callable, Iterable

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

__all__ = [
    "PeakMemory",
    "measure_peak",
    "measure_peak_dispatch",
    "live_tensor_bytes",
    "cpu_allocation_events",
    "cpu_scoped_allocation_events",
]


@dataclass
class PeakMemory:
    """Result of :func:`measure_peak`; all sizes in bytes."""

    #: Maximum bytes allocated by tensors during the call, *including* ``baseline_bytes``.
    peak_bytes: int
    #: Bytes live when the call started (CUDA: ``memory_allocated()``; CPU: supplied by the
    #: caller, 0 if not supplied -- then ``peak_bytes`` is relative to the start).
    baseline_bytes: int
    #: CUDA only: ``torch.cuda.max_memory_reserved()`` during the call (segments the caching
    #: allocator held, including fragmentation and cached free blocks). ``None`` on CPU.
    reserved_bytes: int | None
    #: The device measured, e.g. ``"cpu"`` or ``"cuda:0"``.
    device: str

    @property
    def delta_bytes(self) -> int:
        """Peak above the baseline: what the call itself needed at its worst moment."""
        return self.peak_bytes - self.baseline_bytes


# ----------------------------------------------------------------------------------------------
# live bytes
# ----------------------------------------------------------------------------------------------


def _iter_tensors(obj: Any, seen: set[int]) -> Iterable[torch.Tensor]:
    """Tensors reachable from obj: tensors (and their .grad), modules, optimizers, containers."""
    if id(obj) in seen:
        return
    seen.add(id(obj))
    if isinstance(obj, torch.Tensor):
        if obj.layout == torch.sparse_coo:
            yield from _iter_tensors(obj._indices(), seen)
            yield from _iter_tensors(obj._values(), seen)
        elif obj.layout in (torch.sparse_csr, torch.sparse_bsr):
            yield from _iter_tensors(obj.crow_indices(), seen)
            yield from _iter_tensors(obj.col_indices(), seen)
            yield from _iter_tensors(obj.values(), seen)
        elif obj.layout in (torch.sparse_csc, torch.sparse_bsc):
            yield from _iter_tensors(obj.ccol_indices(), seen)
            yield from _iter_tensors(obj.row_indices(), seen)
            yield from _iter_tensors(obj.values(), seen)
        else:
            yield obj
        grad = obj.grad if obj.is_leaf else None  # .grad of a non-leaf warns and is None
        if grad is not None:
            yield from _iter_tensors(grad, seen)
    elif isinstance(obj, torch.nn.Module):
        for t in obj.parameters():
            yield from _iter_tensors(t, seen)
        for t in obj.buffers():
            yield from _iter_tensors(t, seen)
    elif isinstance(obj, torch.optim.Optimizer):
        for group in obj.param_groups:
            yield from _iter_tensors(group["params"], seen)
        yield from _iter_tensors(list(obj.state.values()), seen)
    elif isinstance(obj, dict):
        for v in obj.values():
            yield from _iter_tensors(v, seen)
    elif isinstance(obj, (list, tuple, set, frozenset)):
        for v in obj:
            yield from _iter_tensors(v, seen)


def live_tensor_bytes(*objs: Any, device: torch.device | str | None = None) -> int:
    """Bytes of the distinct storages reachable from ``objs``.

    ``objs`` may be tensors (their ``.grad`` is included), ``nn.Module``s (parameters,
    buffers and the parameters' ``.grad``), optimizers (their parameters and state, e.g.
    Adam's ``exp_avg``), and lists / tuples / sets / dicts of these, nested. Each storage is
    counted once however many tensors view it (deduplicated by
    ``untyped_storage().data_ptr()``), with its full ``untyped_storage().nbytes()`` -- a small
    view keeps its whole storage alive. Storages without data (zero bytes, meta tensors) count 0.

    If ``device`` is given, only storages on that device type (and index, if given) count.
    This is the ``baseline_bytes`` to pass to :func:`measure_peak` on CPU.
    """
    want = torch.device(device) if device is not None else None
    seen_storages: set[tuple[str, int | None, int]] = set()
    total = 0
    for t in _iter_tensors(list(objs), set()):
        dev = t.device
        if want is not None and (
            dev.type != want.type or (want.index is not None and dev.index != want.index)
        ):
            continue
        storage = t.untyped_storage()
        ptr = storage.data_ptr()
        nbytes = storage.nbytes()
        if ptr == 0 or nbytes == 0:
            continue
        key = (dev.type, dev.index, ptr)
        if key in seen_storages:
            continue
        seen_storages.add(key)
        total += nbytes
    return total


# ----------------------------------------------------------------------------------------------
# allocator-level measurement
# ----------------------------------------------------------------------------------------------


def _measure_cuda(fn: Callable[[], Any], dev: torch.device) -> PeakMemory:
    index = dev.index if dev.index is not None else torch.cuda.current_device()
    torch.cuda.synchronize(index)
    torch.cuda.reset_peak_memory_stats(index)
    start = torch.cuda.memory_allocated(index)
    result = fn()
    torch.cuda.synchronize(index)
    peak = torch.cuda.max_memory_allocated(index)
    reserved = torch.cuda.max_memory_reserved(index)
    del result
    return PeakMemory(
        peak_bytes=int(peak),
        baseline_bytes=int(start),
        reserved_bytes=int(reserved),
        device=f"cuda:{index}",
    )


def cpu_allocation_events(fn: Callable[[], Any]) -> list[tuple[int, int, int]]:
    """Run ``fn()`` once under the profiler and return its raw CPU allocator events.

    Returns ``(time_ns, signed_bytes, ptr)`` in time order: positive sizes are allocations,
    negative sizes frees. Only CPU events are kept. Frees of blocks that were not allocated
    during the call are dropped (see the module docstring), so the running sum of
    ``signed_bytes`` is the memory the call added on top of what was live at its start.
    """
    return [e[:3] for e in cpu_scoped_allocation_events(fn, None)[0]]


def cpu_scoped_allocation_events(fn: Callable[[], Any], prefix: str | None):
    """`cpu_allocation_events` with the scope of each event: ``(events, scopes)``.

    ``events``: ``(time_ns, signed_bytes, ptr, scope)`` in time order, ``scope`` the name of the
    innermost ``torch.profiler.record_function`` around the allocation whose name starts with
    ``prefix`` (None outside any, or when ``prefix`` is None).  ``scopes``: ``(name, start_ns,
    end_ns)`` of those ``record_function`` ranges (`monet.compat.scoped_allocation_events`).
    """
    from torch.profiler import ProfilerActivity

    from monet.compat import quiet_profile, scoped_allocation_events

    with quiet_profile(
        activities=[ProfilerActivity.CPU],
        profile_memory=True,
        record_shapes=False,
        with_stack=False,
    ) as prof:
        result = fn()
        del result

    found, scopes = scoped_allocation_events(prof, prefix)
    raw: list[tuple] = []  # (time, traversal order, bytes, ptr, scope)
    for t, nbytes, ptr, device, scope in found:  # the tree order breaks timestamp ties
        if device == "cpu" and nbytes != 0:
            raw.append((t, len(raw), nbytes, ptr, scope))
    raw.sort(key=lambda e: e[:2])

    events: list[tuple[int, int, int, str | None]] = []
    live: dict[int, int] = {}  # ptr -> bytes, for blocks allocated during the call
    for t, _, nbytes, ptr, scope in raw:
        if nbytes > 0:
            live[ptr] = nbytes
        else:
            size = live.pop(ptr, None)
            if size is None:  # block from before the call: its free is not trusted
                continue
            nbytes = -size
        events.append((t, nbytes, ptr, scope))
    return events, scopes


def _measure_cpu(fn: Callable[[], Any], baseline_bytes: int | None) -> PeakMemory:
    events = cpu_allocation_events(fn)
    current = 0
    highest = 0
    for _, nbytes, _ in events:
        current += nbytes
        if current > highest:
            highest = current
    baseline = int(baseline_bytes) if baseline_bytes is not None else 0
    return PeakMemory(
        peak_bytes=baseline + highest,
        baseline_bytes=baseline,
        reserved_bytes=None,
        device="cpu",
    )


def measure_peak(
    fn: Callable[[], Any],
    device: torch.device | str,
    baseline_bytes: int | None = None,
) -> PeakMemory:
    """Run ``fn()`` once and report its peak memory on ``device``, in bytes.

    ``peak_bytes`` is the largest amount of tensor memory allocated at any moment during the
    call, including what was already live when it started (``baseline_bytes``). ``fn``'s
    return value is dropped when the call ends (it does not change the peak).

    CUDA: measured by the caching allocator (``max_memory_allocated`` after
    ``reset_peak_memory_stats``); the baseline is ``memory_allocated()`` at the start and the
    ``baseline_bytes`` argument is ignored. Sizes are rounded to the allocator's 512-byte
    blocks. ``reserved_bytes`` is ``max_memory_reserved`` during the call. Measuring resets
    the device's peak statistics.

    CPU: measured from the profiler's raw allocator events, so temporaries allocated inside
    kernels (oneDNN workspaces and reorders, im2col buffers, ...) count; sizes are the
    requested bytes, before the allocator's 64-byte alignment. The allocator does not know
    what was live before the call: pass it as ``baseline_bytes`` (e.g.
    ``live_tensor_bytes(model, optimizer, inputs, device="cpu")``). If it is ``None``, 0 is
    used and ``peak_bytes`` is relative to the start of the call. Memory live at the start is
    assumed to stay live: if ``fn`` frees some of it, the result is an upper bound.
    ``reserved_bytes`` is ``None``. See the module docstring for details.

    The profiler's time overhead is irrelevant: only byte counts are read.
    """
    dev = torch.device(device)
    if dev.type == "cuda":
        return _measure_cuda(fn, dev)
    if dev.type == "cpu":
        return _measure_cpu(fn, baseline_bytes)
    raise ValueError(f"measure_peak supports 'cpu' and 'cuda' devices, not {dev.type!r}")


# ----------------------------------------------------------------------------------------------
# cross-check: op outputs only
# ----------------------------------------------------------------------------------------------


class _StorageTracker(TorchDispatchMode):
    """Counts the bytes of storages created by ATen ops while the mode is active.

    A storage is new when an op returns it and it is neither one of the op's inputs' storages
    (views, in-place ops, ``out=``) nor already tracked. It stops counting when the storage
    object dies (``weakref.finalize`` on the ``UntypedStorage``, whose Python object lives as
    long as the C++ storage does).
    """

    def __init__(self) -> None:
        super().__init__()
        self.current = 0
        self.peak = 0
        self._live: dict[int, int] = {}  # data_ptr -> bytes
        self._finalizers: list[weakref.finalize] = []

    def _free(self, ptr: int) -> None:
        nbytes = self._live.pop(ptr, None)
        if nbytes is not None:
            self.current -= nbytes

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        inputs = {
            t.untyped_storage().data_ptr()
            for t in tree_leaves((args, kwargs))
            if isinstance(t, torch.Tensor) and t.layout == torch.strided
        }
        for t in tree_leaves(out):
            if not isinstance(t, torch.Tensor) or t.layout != torch.strided or t.is_meta:
                continue
            storage = t.untyped_storage()
            ptr = storage.data_ptr()
            nbytes = storage.nbytes()
            if ptr == 0 or nbytes == 0 or ptr in inputs or ptr in self._live:
                continue
            self._live[ptr] = nbytes
            self.current += nbytes
            self._finalizers.append(weakref.finalize(storage, self._free, ptr))
        if self.current > self.peak:
            self.peak = self.current
        return out

    def detach(self) -> None:
        for f in self._finalizers:
            f.detach()
        self._finalizers.clear()
        self._live.clear()


def measure_peak_dispatch(fn: Callable[[], Any]) -> int:
    """Peak bytes of op *outputs* during ``fn()``, relative to the start of the call.

    An independent cross-check of :func:`measure_peak` that does not use the profiler: a
    ``TorchDispatchMode`` sees every ATen op (forward and backward) below autograd and records
    the new storages the op returns; a ``weakref.finalize`` on each storage removes it when it
    is freed. The peak is sampled after each op.

    It cannot see temporaries allocated and freed *inside* a kernel (oneDNN workspaces,
    reorders and scratchpads, im2col buffers, ...), nor tensors made without going through
    the dispatcher (e.g. Python scalars wrapped into 0-dim tensors by the argument parser),
    nor storages resized in place. So it is a lower bound of the CPU profiler measurement
    and matches it on chains of plain elementwise ops. Memory live at the start is not
    counted and frees of it are not seen. Device-agnostic (all devices are summed). Bytes.
    """
    tracker = _StorageTracker()
    try:
        with tracker:
            result = fn()
            del result
        return tracker.peak
    finally:
        tracker.detach()
