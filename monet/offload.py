"""The executor's offload operations: a kept value to host memory and back (`solver.offload`).

Four functions become FX nodes of the executor's modules (`monet.executor.build_modules`):

* forward, after the value's last forward use: ``host = offload(value)`` starts the copy;
* forward, after forward node ``release`` of the schedule: ``offload_done(host, value)`` waits for
  the copy and returns ``host``, the tensor saved for the backward pass; ``value`` has no later
  use, so the device copy is freed right after (FX frees a value after its last use);
* backward, at the start of the prefetch stage: ``dev = prefetch(host, shape, dtype, device)``
  allocates the device tensor and starts the copy back;
* backward, where the value is first read: ``fetched(dev)`` waits for that copy and returns ``dev``.

**CUDA.**  The copies run on one side stream per device (``side.wait_stream(current)`` first, so
they read and write the value only after the compute stream has produced it or freed the block's
earlier use), into pinned host memory (``torch.empty(pin_memory=True)``: PyTorch's caching host
allocator, which records the copy's event before reusing the block).  ``offload_done`` and
``fetched`` make the compute stream wait on the copy's CUDA event, so the device tensor is freed
(and its block reused by the compute stream) only after the copy has read it, and is read only
after the copy has written it: no ``record_stream`` is needed for the out-copy; the prefetched
tensor gets one, in case it is freed unread.  Untested on a GPU here (no device in the session
that wrote it): the `cuda`-marked test in tests/test_offload.py runs it where one exists.

**CPU** (tests): the host copy is a numpy array, memory that c10's CPU allocator, and so the
measured peak (`monet.profiling.peak`), does not see, while the copy back is a torch tensor that
it does: the measured peak drops as the ILP predicts, and the values round-trip bit for bit.  The
copies are synchronous; there is nothing to hide them behind.

The simulator (`monet.simulate`) counts the outputs of ``offload`` and ``offload_done`` as 0
device bytes (``host_output``), ``prefetch``'s as the value's bytes, and ``fetched``'s as an alias
of its argument (``alias_of_first``).
"""
from __future__ import annotations

import torch

_events: dict[tuple[str, int], object] = {}  # (device, data_ptr) of a host or device copy -> CUDA event
_streams: dict[int, object] = {}


def _bytes(t: torch.Tensor) -> torch.Tensor:
    """The bytes of a contiguous tensor as a flat uint8 view."""
    return t.detach().reshape(-1).view(torch.uint8)


def _side_stream(device: torch.device):
    index = device.index if device.index is not None else torch.cuda.current_device()
    if index not in _streams:
        _streams[index] = torch.cuda.Stream(device=index)
    return _streams[index]


def offload(value: torch.Tensor) -> torch.Tensor:
    """Start copying a contiguous tensor to host memory; returns the host copy, (nbytes,) uint8."""
    if value.device.type == "cuda":
        host = torch.empty(value.numel() * value.element_size(), dtype=torch.uint8, pin_memory=True)
        side = _side_stream(value.device)
        side.wait_stream(torch.cuda.current_stream(value.device))
        with torch.cuda.stream(side):
            host.copy_(_bytes(value), non_blocking=True)
            event = torch.cuda.Event()
            event.record(side)
        _events[("host", host.data_ptr())] = (event, value.device)
        return host
    # numpy owns this memory: outside c10's allocator, as pinned host memory is outside the GPU's
    return torch.from_numpy(_bytes(value).numpy().copy())


offload.host_output = True


def offload_done(host: torch.Tensor, value: torch.Tensor) -> torch.Tensor:
    """The compute stream waits for ``offload``'s copy; returns ``host`` (``value`` is released by
    the caller after this call)."""
    entry = _events.pop(("host", host.data_ptr()), None)
    if entry is not None:
        event, device = entry
        torch.cuda.current_stream(device).wait_event(event)
    return host


offload_done.host_output = True


def prefetch(host: torch.Tensor, shape: tuple, dtype: torch.dtype, device: str) -> torch.Tensor:
    """Allocate the device tensor (``shape``, ``dtype``) and start copying ``host`` into it."""
    dev = torch.device(device)
    out = torch.empty(shape, dtype=dtype, device=dev)
    if dev.type == "cuda":
        side = _side_stream(dev)
        side.wait_stream(torch.cuda.current_stream(dev))
        with torch.cuda.stream(side):
            _bytes(out).copy_(host, non_blocking=True)
            event = torch.cuda.Event()
            event.record(side)
        out.record_stream(side)
        _events[("dev", out.data_ptr())] = (event, dev)
    else:
        _bytes(out).copy_(host)
    return out


def fetched(value: torch.Tensor) -> torch.Tensor:
    """The compute stream waits for ``prefetch``'s copy into ``value``; returns ``value``."""
    entry = _events.pop(("dev", value.data_ptr()), None) if value.device.type == "cuda" else None
    if entry is not None:
        event, device = entry
        torch.cuda.current_stream(device).wait_event(event)
    return value


fetched.alias_of_first = True
