"""A language model's head and cross-entropy alone, one training step: PyTorch against monet's
chunked op (`monet.lm_loss`), both ways it computes the gradients.

    python benchmarks/lm_loss_head.py                      # GPT-2 small's head at 2 x 512 tokens
    python benchmarks/lm_loss_head.py --rows 8192 --chunks 128,256,512

Rows: PyTorch (``F.cross_entropy(F.linear(h, w).float(), t)`` and its backward), the recomputing
op (`linear_cross_entropy`: each chunk's logits again in the backward pass) and the op with the
gradients in the forward pass (`fused_loss`, `linear_cross_entropy_grads`) at each chunk size.
Each candidate runs once to warm up, then ``--repeats`` times in turn with the others (interleaved,
so a machine's load falls on all alike); the table gives the median seconds and the ratio to
PyTorch's.  fp32 on the CPU (or ``--device cuda``).
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from monet.lm_loss import fused_loss, linear_cross_entropy  # noqa: E402


def candidates(h, w, t, chunks):
    """name -> one training step of the head and loss (the gradients land in h.grad, w.grad)."""
    out = {"PyTorch": lambda: F.cross_entropy(F.linear(h, w).float(), t).backward()}
    for c in chunks:
        out[f"recompute, chunks of {c}"] = lambda c=c: linear_cross_entropy(h, w, None, t, -100, "mean", c).backward()
        out[f"gradients in the forward, chunks of {c}"] = lambda c=c: fused_loss(h, w, None, t, -100, "mean",
                                                                                 c).backward()
    return out


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rows", type=int, default=1024, help="tokens (batch x sequence), default 1024")
    p.add_argument("--hidden", type=int, default=768, help="hidden size H, default 768")
    p.add_argument("--vocab", type=int, default=50257, help="vocabulary V, default 50257")
    p.add_argument("--chunks", default="128,256", help="rows per chunk, comma-separated (default 128,256)")
    p.add_argument("--repeats", type=int, default=5, help="timed steps per candidate (default 5)")
    p.add_argument("--device", default="cpu")
    args = p.parse_args(argv)
    torch.manual_seed(0)
    dev = torch.device(args.device)
    h = torch.randn(args.rows, args.hidden, device=dev, requires_grad=True)
    w = (torch.randn(args.vocab, args.hidden, device=dev) * 0.02).requires_grad_()
    t = torch.randint(0, args.vocab, (args.rows,), device=dev)
    steps = candidates(h, w, t, [int(c) for c in args.chunks.split(",") if c.strip()])
    times = {k: [] for k in steps}

    def run(step) -> float:
        h.grad = w.grad = None
        t0 = time.perf_counter()
        step()
        if dev.type == "cuda":
            torch.cuda.synchronize()
        return time.perf_counter() - t0

    for step in steps.values():
        run(step)
    for _ in range(args.repeats):
        for name, step in steps.items():
            times[name].append(run(step))
    base = statistics.median(times["PyTorch"])
    print(f"head and loss, {args.rows} rows, H {args.hidden}, V {args.vocab}, {args.device}, "
          f"median of {args.repeats} interleaved steps")
    print("| method | seconds | of PyTorch's |\n| --- | ---: | ---: |")
    for name, v in times.items():
        print(f"| {name} | {statistics.median(v):.2f} | {statistics.median(v) / base:.2f}x |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
