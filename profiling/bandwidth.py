"""Host<->device copy bandwidth, for offload to host memory (`monet.solver.offload`).

`measure_host_bandwidth` times pinned-memory copies in both directions on the current CUDA device
with CUDA events (after a warm-up copy) and returns the slower direction, the figure the ILP's
copy windows assume for both.  The predicted tables use `monet.solver.offload.DEFAULT_BANDWIDTHS`
instead (PCIe 5.0 x16, GH200's NVLink-C2C).
"""
from __future__ import annotations

import torch


def measure_host_bandwidth(nbytes: int = 256 * 2 ** 20, repeats: int = 5, device: str | torch.device = "cuda") -> float:
    """Bytes per second of the slower direction of pinned host<->device copies.

    Args:
        nbytes: bytes per copy (default 256 MiB: large enough that launch latency does not count).
        repeats: timed copies per direction; the median is taken.
        device: the CUDA device.

    Raises:
        RuntimeError: CUDA is not available (offload is off on CPU: there is no device memory to save).
    """
    if not torch.cuda.is_available():
        raise RuntimeError("measuring host<->device bandwidth needs a CUDA GPU; on CPU offload is off "
                           "(offload_bandwidth=None)")
    dev = torch.device(device)
    host = torch.empty(nbytes, dtype=torch.uint8, pin_memory=True)
    gpu = torch.empty(nbytes, dtype=torch.uint8, device=dev)
    rates = []
    for dst, src in ((gpu, host), (host, gpu)):
        dst.copy_(src, non_blocking=True)  # warm-up
        torch.cuda.synchronize(dev)
        times = []
        for _ in range(repeats):
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            dst.copy_(src, non_blocking=True)
            end.record()
            end.synchronize()
            times.append(start.elapsed_time(end) / 1e3)
        times.sort()
        rates.append(nbytes / times[len(times) // 2])
    return float(min(rates))
