"""SDPA's backends as monet runs them (`monet.impls.attention`): time and memory of one attention
forward + backward, per backend, on this machine.

    python benchmarks/attention_backends.py [--shapes 4x8x512x64,2x8x1024x64] [--repeats 5] [--device cpu]

For each shape BxHxLxE (self-attention, S = L, Ev = E, causal, float32) and each backend the device
offers (CPU: ``flash_cpu``, PyTorch's default, and ``math``; CUDA: ``flash``, ``efficient``,
``cudnn`` where ``torch.backends.cuda`` accepts the inputs, and ``math``), with q, k, v already
allocated:

- **stored**: bytes the backend keeps between its forward and its backward besides q, k, v
  (`monet.impls.attention.stored_bytes`: math keeps P, B*H*L*L*4; the fused kernels keep out and
  the logsumexp), and **kept**: the same measured, the bytes of the forward's outputs that the
  backward reads;
- **peak**: peak bytes of forward + backward above what was live before (CPU: allocator events,
  `monet.profiling.peak.measure_peak`, so the kernels' temporaries count; CUDA:
  ``max_memory_allocated``);
- **fwd+bwd ms**: median milliseconds of forward + backward, the backends of a shape interleaved
  (a, b, a, b ...) in one process after a warm-up, by `monet.profiling.measure.interleaved_times_of`
  does for two (docs/design.md, "Measuring"); CPU times on shared machines drift by 20 % between runs.

Prints a markdown table.  Memory in MiB (2^20 bytes).
"""
from __future__ import annotations

import argparse
import statistics

import torch

from monet.impls.attention import BACKENDS, stored_bytes
from monet.profiling.measure import interleaved_times_of
from monet.profiling.peak import measure_peak

MIB = 2 ** 20


def _backends(q, k, v) -> list[str]:
    names = [b.name for b in BACKENDS.values()
             if b.name != "math" and b.device == q.device.type and b.supported(q, k, v, None, True)]
    return names + ["math"]


def _step(backend, q, k, v, grad):
    b = BACKENDS[backend]
    outs = b.forward(q, k, v, None, True, None)
    saved = [outs[i] for i in b.saved]
    del outs
    return b.backward(grad, q, k, v, None, True, None, *saved)


def _kept(backend, q, k, v) -> int:
    b = BACKENDS[backend]
    outs = b.forward(q, k, v, None, True, None)
    return sum(outs[i].numel() * outs[i].element_size() for i in b.saved if isinstance(outs[i], torch.Tensor)
               and outs[i].numel() > 1)


def _medians(fns: dict, repeats: int, device) -> dict:
    """Median seconds of each of ``fns`` (name -> callable), interleaved after one warm-up call
    (`monet.profiling.measure.interleaved_times_of`)."""
    times = interleaved_times_of(list(fns.values()), repeats, 1, device)
    return {name: statistics.median(t) for name, t in zip(fns, times)}


def run(shape: tuple[int, int, int, int], repeats: int, device: str) -> list[str]:
    dev = torch.device(device)
    torch.manual_seed(0)
    q, k, v = (torch.randn(*shape, device=dev) for _ in range(3))
    grad = torch.randn(*shape, device=dev)
    names = _backends(q, k, v)
    with torch.no_grad():
        ms = _medians({n: (lambda n=n: _step(n, q, k, v, grad)) for n in names}, repeats, dev)
        rows = []
        for n in names:
            peak = measure_peak(lambda n=n: _step(n, q, k, v, grad), dev).peak_bytes
            rows.append(f"| {'x'.join(map(str, shape))} | {n} | {stored_bytes(n, q, k, v) / MIB:.2f} "
                        f"| {_kept(n, q, k, v) / MIB:.2f} | {peak / MIB:.2f} | {ms[n] * 1e3:.2f} |")
    return rows


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--shapes", default="4x8x512x64,2x8x1024x64", help="comma-separated BxHxLxE")
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--device", default="cpu")
    args = p.parse_args(argv)
    print(f"torch {torch.__version__}, {args.device}, float32, causal self-attention, {args.repeats} repeats\n")
    print("| BxHxLxE | backend | stored MiB (formula) | kept MiB (measured) | peak MiB | fwd+bwd ms |")
    print("|---|---|---|---|---|---|")
    for s in args.shapes.split(","):
        for row in run(tuple(int(d) for d in s.split("x")), args.repeats, args.device):
            print(row, flush=True)


if __name__ == "__main__":
    main()
