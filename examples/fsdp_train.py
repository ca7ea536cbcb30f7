"""Train with monet schedules under FSDP2 (``fully_shard``), per block (CPU, gloo).

    python examples/fsdp_train.py --nproc 2
    python examples/fsdp_train.py --nproc 2 --blocks 6 --width 64 --budget 60% --steps 3
    python examples/fsdp_train.py --nproc 2 --show-refusal     # what happens when the whole model is sharded first

torch 2.13 keeps FSDP2's hooks out of Dynamo (``torch._dynamo.disable``), so a ``fully_shard``-ed
model cannot be captured as one graph; the way that works is per block: solve one schedule for a
block at the per-rank batch (the blocks here are alike, so one solution serves them all), wrap each
block with it, shard each wrapper, then shard the model::

    for i, block in enumerate(model.blocks):
        model.blocks[i] = fully_shard(MONeTWrapper(block, block_solution))
    fully_shard(model)

FSDP2 all-gathers a block's parameters before its scheduled forward, frees them after, gathers
them again before its scheduled backward (which recomputes what the schedule dropped) and
reduce-scatters its gradients.  Each rank prints its losses, the per-rank memory accounting of
the budget, and a checksum of the full parameters (equal on every rank).
"""
from __future__ import annotations

import argparse
import os
import socket
import sys
import tempfile
from pathlib import Path

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn as nn
import torch.nn.functional as F


class Block(nn.Module):
    """A residual MLP block (no BatchNorm, no dropout)."""

    def __init__(self, c: int):
        super().__init__()
        self.up = nn.Linear(c, 4 * c)
        self.down = nn.Linear(4 * c, c)

    def forward(self, x):
        return x + self.down(torch.tanh(F.gelu(torch.tanh(self.up(torch.tanh(x))))))


class Net(nn.Module):
    """A stem, ``blocks`` alike blocks and a classifier head: the blocks are what FSDP2 shards one
    by one, and the stem makes every block's input require a gradient (one graph for all)."""

    def __init__(self, c: int, blocks: int, classes: int = 10):
        super().__init__()
        self.stem = nn.Linear(c, c)
        self.blocks = nn.ModuleList([Block(c) for _ in range(blocks)])
        self.head = nn.Linear(c, classes)

    def forward(self, x):
        x = self.stem(x)
        for b in self.blocks:
            x = b(x)
        return self.head(x)


def solve_block(args, path: Path) -> None:
    """Solve one block's schedule at the per-rank batch, its input requiring a gradient, and save it."""
    from monet.plan import prepare

    torch.manual_seed(0)
    plan = prepare(Block(args.width), torch.randn(args.batch_size, args.width).requires_grad_(),
                   cost="analytic", progress=False)
    sol = plan.solve(args.budget, mode="normal", time_limit=args.time_limit, if_infeasible="smallest")
    sol.save(path)


def param_bytes(module: nn.Module) -> int:
    return sum(p.numel() * p.element_size() for p in module.parameters())


def train(rank: int, world: int, init_method: str, args, solution: str) -> None:
    torch.set_num_threads(max(1, (os.cpu_count() or 1) // world))
    dist.init_process_group("gloo", init_method=init_method, rank=rank, world_size=world)
    try:
        if args.show_refusal:
            show_refusal(rank, args, solution)
        else:
            train_steps(rank, world, args, solution)
    finally:
        dist.destroy_process_group()


def train_steps(rank: int, world: int, args, solution: str) -> None:
    from torch.distributed.fsdp import fully_shard

    from monet.solution import load_solution
    from monet.wrapper import MONeTWrapper

    torch.manual_seed(0)
    model = Net(args.width, args.blocks)
    total, block = param_bytes(model), param_bytes(model.blocks[0])
    sol = load_solution(solution)
    # the essential lines: wrap each block with its schedule, shard each wrapper, then the model
    for i, b in enumerate(model.blocks):
        model.blocks[i] = fully_shard(MONeTWrapper(b, sol))
    fully_shard(model)
    if rank == 0:
        print(f"per rank: sharded parameters {total / world / 2**10:.1f} KiB + reduce-scattered gradients "
              f"{total / world / 2**10:.1f} KiB; the block in flight: all-gathered parameters "
              f"{block / 2**10:.1f} KiB and their unsharded gradients, counted in the block's schedule "
              f"(predicted peak {sol.meta.predicted_peak_bytes / 2**10:.1f} KiB, budget "
              f"{sol.meta.budget_bytes / 2**10:.1f} KiB, {sol.schedule.recompute_count()} recomputations); "
              f"plus the activations the other blocks keep", flush=True)
    gen = torch.Generator().manual_seed(1 + rank)
    x = torch.randn(args.batch_size, args.width, generator=gen)
    y = torch.randint(0, 10, (args.batch_size,), generator=gen)
    opt = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9)
    for step in range(args.steps):
        opt.zero_grad(set_to_none=True)
        loss = F.cross_entropy(model(x), y)
        loss.backward()  # per block: all-gather, the schedule's recomputations, backward, reduce-scatter
        opt.step()
        print(f"rank {rank} step {step} loss {loss.item():.4f}", flush=True)
    checksum = sum(p.full_tensor().double().sum().item() for p in model.parameters())
    print(f"rank {rank} parameter checksum {checksum:.10f}", flush=True)


def show_refusal(rank: int, args, solution: str) -> None:
    """Shard the whole model first, then wrap it: refused, with the message printed."""
    from torch.distributed.fsdp import fully_shard

    from monet.frontend import ShardedModelError
    from monet.wrapper import MONeTWrapper

    model = Net(args.width, args.blocks)
    for b in model.blocks:
        fully_shard(b)
    fully_shard(model)
    try:
        MONeTWrapper(model, solution)
    except ShardedModelError as e:
        if rank == 0:
            print(f"MONeTWrapper(fully_shard(model), ...) is refused:\n{e}", flush=True)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--nproc", type=int, default=2, help="processes (ranks) to start (default 2)")
    p.add_argument("--blocks", type=int, default=4)
    p.add_argument("--width", type=int, default=32)
    p.add_argument("--batch-size", type=int, default=64, help="batch size per rank (default 64)")
    p.add_argument("--budget", default="70%", help="one block's budget: bytes, 6GB, or a percentage of its "
                   "plain PyTorch peak (default 70%%; the smallest feasible one if below it)")
    p.add_argument("--time-limit", type=float, default=20)
    p.add_argument("--steps", type=int, default=3)
    p.add_argument("--lr", type=float, default=0.05)
    p.add_argument("--show-refusal", action="store_true", help="shard the whole model, then wrap it: print the error")
    args = p.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "block.monet"
        solve_block(args, path)
        mp.spawn(train, nprocs=args.nproc, join=True,
                 args=(args.nproc, f"tcp://127.0.0.1:{free_port()}", args, str(path)))


if __name__ == "__main__":
    sys.exit(main())
