"""PyTorch's private APIs for numerics and measurement: backend flags, the profiler's raw
allocator events, CUDA's memory history (`monet.compat`)."""
from __future__ import annotations

import contextlib
import os
import re
import sys
import tempfile
import warnings

import torch


@contextlib.contextmanager
def backend_flags(backend: str, **flags):
    """Set ``torch.backends.<backend>.<flag> = value`` for each ``flags`` entry that is not None
    (``cudnn``: ``enabled``, ``benchmark``, ``deterministic``; ``mkldnn``: ``enabled``) and restore
    the previous values afterwards; TF32 and precision settings are never touched.

    Not ``torch.backends.cudnn.flags()``: its signature differs between releases (2.11 has no
    ``depthwise_kernel``, 2.12 and later require it to be passed to leave it unchanged), and in
    2.11-2.15 it reads the legacy ``allow_tf32`` flag, which raises ("a mix of the legacy and new
    APIs") as soon as a user sets the per-operator ``torch.backends.cudnn.conv.fp32_precision``.
    The properties set here are public and the same in 2.11-2.15.

    Raises:
        ValueError: an unknown backend or flag.
    """
    module = {"cudnn": torch.backends.cudnn, "mkldnn": torch.backends.mkldnn}.get(backend)
    allowed = {"cudnn": ("enabled", "benchmark", "deterministic"), "mkldnn": ("enabled",)}.get(backend, ())
    if module is None or set(flags) - set(allowed):
        raise ValueError(f"backend_flags: {backend!r} with {sorted(flags)}; expected cudnn with {allowed} "
                         f"or mkldnn with ('enabled',)")
    before = {k: getattr(module, k) for k, v in flags.items() if v is not None}
    try:
        for k in before:
            setattr(module, k, bool(flags[k]))
        yield
    finally:
        for k, v in before.items():
            setattr(module, k, v)


@contextlib.contextmanager
def strict_fp32():
    """Full fp32 arithmetic on CUDA inside: TF32 off for cuDNN convolutions and cuBLAS matmuls,
    restored afterwards; a check compares gradients under the same numerics on both sides
    (docs/design.md, "What must stay true").

    2.9 and later (2.11-2.15 here) have the per-operator precision settings
    (``torch.backends.cudnn.conv.fp32_precision``, ``torch.backends.cuda.matmul.fp32_precision``:
    "ieee" is full fp32, "tf32" allows TF32, "none" defers to the parent setting); mixing them with
    the legacy ``allow_tf32`` flags raises on read, so only the new ones are set here.  cuDNN's
    default on 2.11-2.15 is "tf32" for convolutions (TF32 on Ampere and later), cuBLAS's "none"
    (full fp32 unless ``torch.set_float32_matmul_precision`` says otherwise).
    """
    settings = [(torch.backends.cudnn.conv, "fp32_precision"), (torch.backends.cuda.matmul, "fp32_precision")]
    before = [(obj, name, getattr(obj, name)) for obj, name in settings]
    try:
        for obj, name, _ in before:
            setattr(obj, name, "ieee")
        yield
    finally:
        for obj, name, value in before:
            setattr(obj, name, value)


def numerics() -> dict:
    """The settings that decide CUDA fp32 arithmetic, for reports: TF32 for cuDNN convolutions and
    cuBLAS matmuls (``fp32_precision``), ``torch.get_float32_matmul_precision()``, cuDNN's
    ``deterministic`` and ``benchmark``."""
    return {"cudnn_conv_fp32_precision": torch.backends.cudnn.conv.fp32_precision,
            "cuda_matmul_fp32_precision": torch.backends.cuda.matmul.fp32_precision,
            "float32_matmul_precision": torch.get_float32_matmul_precision(),
            "cudnn_deterministic": bool(torch.backends.cudnn.deterministic),
            "cudnn_benchmark": bool(torch.backends.cudnn.benchmark)}


_KINETO_CHATTER = re.compile(r"^(USDT|STAGE):\S+ \S+ \d+:\d+ \S+\.cpp:\d+\] ")


@contextlib.contextmanager
def _stderr_without_kineto_chatter():
    """File descriptor 2 into a temporary file inside; afterwards the lines written there are
    written to stderr again, except kineto's ``USDT:``/``STAGE:`` lines."""
    sys.stderr.flush()
    saved = os.dup(2)
    with tempfile.TemporaryFile() as tmp:
        os.dup2(tmp.fileno(), 2)
        try:
            yield
        finally:
            sys.stderr.flush()
            os.dup2(saved, 2)
            os.close(saved)
            tmp.seek(0)
            kept = [line for line in tmp.read().decode(errors="replace").splitlines(keepends=True)
                    if not _KINETO_CHATTER.match(line)]
            if kept:
                sys.stderr.write("".join(kept))
                sys.stderr.flush()


@contextlib.contextmanager
def quiet_profile(**kwargs):
    """``torch.profiler.profile(**kwargs)`` without kineto's lines on stderr.

    torch 2.13-2.15 (kineto) print ``USDT: ... SyncActivityProfilerHandler.cpp:52] profiler_start``
    and ``profiler_stop`` each time a profiler starts and stops (2.11 prints them too on CPU builds;
    ``STAGE:`` lines at some log levels), whatever ``KINETO_LOG_LEVEL`` says below 6.  Kineto reads
    ``KINETO_LOG_LEVEL`` once, at the first profiler of the process: it is set to 6 (silent) here
    unless the user set it, and where a profiler ran before, the start and stop are run with
    stderr filtered (`_stderr_without_kineto_chatter`).  What the profiled code itself writes to
    stderr passes unchanged.
    """
    from torch.profiler import profile

    os.environ.setdefault("KINETO_LOG_LEVEL", "6")
    with warnings.catch_warnings():
        # torch 2.11 warns that the "Profiler clears events at the end of each cycle" once a
        # profiler has run in the process: monet reads each profiler's events before the next
        warnings.filterwarnings("ignore", message=".*[Pp]rofiler clears events.*")
        prof = profile(**kwargs)
        with _stderr_without_kineto_chatter():
            prof.__enter__()
        try:
            yield prof
        finally:
            with _stderr_without_kineto_chatter():
                prof.__exit__(None, None, None)


def allocation_events(prof) -> list:
    """(start_time_ns, bytes, ptr, device type) of every raw allocator event a finished
    ``torch.profiler.profile(profile_memory=True)`` recorded, in tree order (parents before their
    children, children in order), bytes negative for a free.

    The events come from ``prof.profiler.kineto_results.experimental_event_tree()``, nodes tagged
    ``torch._C._profiler._EventType.Allocation`` with ``extra_fields`` (``alloc_size``, ``ptr``,
    ``device``): unchanged in 2.11-2.15.  ``prof.events()`` folds them into their op's totals.

    Raises:
        RuntimeError: the event tree is no longer there (a torch outside `SUPPORTED`).
    """
    return [e[:4] for e in scoped_allocation_events(prof, None)[0]]


def scoped_allocation_events(prof, prefix: str | None) -> tuple[list, list]:
    """`allocation_events` with the scope of each: ``(events, scopes)``.

    ``events``: (start_time_ns, bytes, ptr, device type, scope) in tree order, ``scope`` the name of
    the innermost enclosing event whose name starts with ``prefix`` (a
    ``torch.profiler.record_function(name)`` around the code that allocated), None outside any (or
    when ``prefix`` is None).  ``scopes``: (name, start_time_ns, end_time_ns) of every event whose
    name starts with ``prefix``, in tree order.  Same event tree as `allocation_events` (2.11-2.15:
    a ``record_function`` is a node of the tree, the allocations made inside it its descendants).

    Raises:
        RuntimeError: the event tree is no longer there (a torch outside `SUPPORTED`).
    """
    from torch._C._profiler import _EventType

    try:
        roots = prof.profiler.kineto_results.experimental_event_tree()
    except AttributeError as exc:
        raise RuntimeError(f"torch {torch.__version__}'s profiler no longer exposes "
                           "kineto_results.experimental_event_tree(): monet/compat/runtime.py needs updating") from exc
    events, scopes = [], []
    stack = [(node, None) for node in reversed(roots)]
    while stack:  # depth-first, children in order
        node, scope = stack.pop()
        if node.tag == _EventType.Allocation:
            ef = node.extra_fields
            events.append((int(node.start_time_ns), int(ef.alloc_size), int(ef.ptr), ef.device.type, scope))
        elif prefix is not None and node.name.startswith(prefix):
            scope = node.name
            scopes.append((node.name, int(node.start_time_ns), int(node.end_time_ns)))
        stack.extend((child, scope) for child in reversed(node.children))
    return events, scopes


def cuda_memory_history(enabled: bool, max_entries: int = 2_000_000) -> None:
    """Start (``enabled``) or stop recording the CUDA caching allocator's alloc / free events:
    ``torch.cuda.memory._record_memory_history("all" | None, context=None, stacks="python",
    max_entries=max_entries)``, without stack traces (the events are attributed by
    `cuda_memory_metadata` instead).  The keyword signature is that of 2.11-2.15 (read in 2.14.1's
    torch/cuda/memory.py; the string form of ``enabled`` replaced the boolean one in 2.1)."""
    torch.cuda.memory._record_memory_history("all" if enabled else None, context=None, stacks="python",
                                             max_entries=max_entries)


def cuda_memory_snapshot() -> dict:
    """``torch.cuda.memory._snapshot()``: ``{"segments": [...], "device_traces": [[entry, ...] per
    device]}``, each trace entry a dict with ``action`` ("alloc", "free_requested",
    "free_completed", "segment_alloc", "segment_free", "oom", "snapshot"), ``addr``, ``size``
    (bytes: the allocator's block), ``stream``, ``time_us`` and, where set, ``user_metadata``
    (`cuda_memory_metadata`).  The format of 2.11-2.15 (``TraceEntry`` in torch/cuda/memory.py)."""
    return torch.cuda.memory._snapshot()


def cuda_memory_metadata(label: str) -> bool:
    """Stamp ``label`` on the CUDA allocator's trace events the calling thread generates from now on
    (``torch.cuda.memory._set_memory_metadata``; "" clears it); False where this torch has no such
    function (it came with PR #165490, October 2025: 2.10 and later, so present in 2.11-2.15 as
    read in 2.14.1's sources; not run on 2.11 here, without a GPU).  Thread-local: set it in the
    thread that allocates (autograd runs a CUDA backward pass in its own device thread)."""
    setter = getattr(torch.cuda.memory, "_set_memory_metadata", None)
    if setter is None:
        return False
    setter(label)
    return True


def boxed_list_function(fn):
    """``fn`` (one argument: the list of inputs, which it may clear to free them early) marked for
    AOTAutograd's boxed calling convention: the ``_boxed_call`` attribute its runtime checks
    (``call_func_at_runtime_with_args``; what ``make_boxed_func`` sets) in 2.11-2.15."""
    fn._boxed_call = True
    return fn


__all__ = ["backend_flags", "strict_fp32", "numerics", "quiet_profile", "allocation_events", "scoped_allocation_events", "cuda_memory_history", "cuda_memory_snapshot", "cuda_memory_metadata", "boxed_list_function"]
