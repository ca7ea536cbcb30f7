"""Train a model with a monet schedule under DistributedDataParallel (CPU, gloo).

    python examples/ddp_train.py --nproc 2
    python examples/ddp_train.py --nproc 2 --model mobilenet_v2 --input-shape 3,64,64 --budget 80% --solution mnv2.pkl
    torchrun --nproc-per-node 2 examples/ddp_train.py --solution sol.pkl

A solution fixes the batch size, so it is solved for the batch each rank sees (``--batch-size``),
not for the global batch.  Without ``--solution`` it is solved here (analytic costs, normal mode)
and written to a temporary file; with ``--solution PATH`` an existing file is used (for example one
made by ``monet solve MODEL --batch-size 8 --input-shape ... -o PATH``) or a new one is written
there.  Every rank loads the same file, wraps the model, then wraps the wrapper in DDP, and trains
``--steps`` steps on a fixed synthetic batch of its own, printing its losses; at the end each rank
prints a checksum of its parameters (equal on every rank: DDP keeps them in sync).

``--model`` is a MODEL string as the ``monet`` command takes it: a zoo name, MONeT's
``"torchvision.models.resnet50()"``, or ``path/to/file.py:factory``; the default is `small_net`
below (``examples/ddp_train.py:small_net``).  The model is built after ``torch.manual_seed(0)``,
as ``monet solve`` builds it.
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

DEFAULT_MODEL = f"{Path(__file__).resolve()}:small_net"


def small_net() -> nn.Module:
    """A small residual CNN for 3x32x32 inputs and 10 classes (no BatchNorm, no dropout)."""

    class SmallNet(nn.Module):
        def __init__(self, c=16, classes=10):
            super().__init__()
            self.stem = nn.Conv2d(3, c, 3, padding=1)
            self.block = nn.Sequential(nn.Conv2d(c, c, 3, padding=1), nn.GELU(), nn.Conv2d(c, c, 3, padding=1))
            self.down = nn.Conv2d(c, 2 * c, 3, stride=2, padding=1)
            self.head = nn.Linear(2 * c, classes)

        def forward(self, x):
            y = torch.tanh(self.stem(x))
            y = F.gelu(self.block(y) + y)
            return self.head(F.gelu(self.down(y)).mean(dim=(2, 3)))

    return SmallNet()


def build(model_name: str) -> nn.Module:
    from monet.zoo.models import get_model

    torch.manual_seed(0)  # as `monet solve` builds it
    return get_model(model_name)


def input_shape_of(args) -> tuple[int, ...]:
    from monet.zoo.models import MODELS

    if args.input_shape:
        return tuple(int(s) for s in args.input_shape.replace("x", ",").split(","))
    if args.model == DEFAULT_MODEL:
        return (3, 32, 32)
    if args.model in MODELS:
        return tuple(MODELS[args.model].input_shape)
    sys.exit(f"--model {args.model!r} is not a zoo model: pass --input-shape")


def solve_for_one_rank(args, shape, path: Path) -> None:
    """Solve a schedule for the per-rank batch and save it to ``path``."""
    from monet.capture import capture
    from monet.profiling.costs import analytic_costs, costs_for
    from monet.solution import describe, save_solution
    from monet.solver.ilp import InfeasibleBudgetError
    from monet.solver.solve import eager_peak, parse_budget, solve
    from monet.zoo.models import example_input

    model = build(args.model)
    x = example_input(args.model, args.batch_size, shape)
    graph = capture(model, x)
    costs = costs_for(graph, analytic_costs(graph))
    budget = parse_budget(args.budget, eager_peak(graph, costs))
    try:
        sol = solve(graph, costs, budget, "normal", time_limit=args.time_limit,
                    info=dict(model=args.model, batch_size=args.batch_size, input_shape=shape, dtype="float32"))
    except InfeasibleBudgetError as e:
        sys.exit(f"ddp_train: {e}")
    save_solution(sol, path)
    print(describe(sol), file=sys.stderr)


def batch_for(args, shape, rank: int):
    """A fixed synthetic batch for ``rank`` and random class targets for the model's output."""
    from monet.zoo.models import MODELS, example_input

    x = example_input(args.model, args.batch_size, shape, seed=1 + rank)
    with torch.no_grad():
        out = build(args.model).eval()(x)
    tokens = args.model in MODELS and MODELS[args.model].input_kind == "tokens"
    classes = out.shape[-1] if tokens else out.shape[1]
    target_shape = out.shape[:-1] if tokens else (out.shape[0], *out.shape[2:])
    y = torch.randint(0, classes, target_shape, generator=torch.Generator().manual_seed(100 + rank))
    return x, y, tokens


def train(rank: int, world: int, init_method: str, args, shape, solution: str) -> None:
    torch.set_num_threads(max(1, (os.cpu_count() or 1) // world))
    if not dist.is_initialized():
        dist.init_process_group("gloo", init_method=init_method, rank=rank, world_size=world)
    try:
        train_steps(rank, args, shape, solution)
    finally:
        # after the DDP model is gone: when DDP's reducer drops the last reference to a gloo process
        # group it can deadlock on the GIL at exit (torch 2.13)
        dist.destroy_process_group()


def train_steps(rank: int, args, shape, solution: str) -> None:
    from torch.nn.parallel import DistributedDataParallel as DDP

    from monet.wrapper import MONeTWrapper

    x, y, tokens = batch_for(args, shape, rank)
    # the essential lines: wrap with the schedule (solved for the per-rank batch), then DDP
    model = MONeTWrapper(build(args.model), solution, input_shape=shape)
    model = DDP(model)
    opt = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9)
    for step in range(args.steps):
        opt.zero_grad(set_to_none=True)
        out = model(x)
        loss = F.cross_entropy(out.transpose(1, -1) if tokens else out, y)
        loss.backward()  # the schedule's recomputations, then DDP's gradient allreduce
        opt.step()
        print(f"rank {rank} step {step} loss {loss.item():.4f}", flush=True)
    checksum = sum(p.detach().double().sum().item() for p in model.parameters())
    dist.barrier()
    meta, schedule = model.module.solution.meta, model.module.solution.schedule
    print(f"rank {rank} parameter checksum {checksum:.10f} (schedule {meta.fingerprint[:12]}, "
          f"{schedule.recompute_count()} recomputations)", flush=True)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--nproc", type=int, default=2, help="processes (ranks) to start (default 2); "
                   "ignored under torchrun")
    p.add_argument("--model", default=DEFAULT_MODEL, help="MODEL string (default: small_net of this file)")
    p.add_argument("--input-shape", help="one sample without the batch dimension, e.g. 3,64,64")
    p.add_argument("--batch-size", type=int, default=8, help="batch size per rank (default 8)")
    p.add_argument("--budget", default="80%", help="memory budget: 6GB, 123456 bytes or a percentage "
                   "of plain PyTorch's peak (default 80%%)")
    p.add_argument("--solution", help="solution file: used if it exists, else solved and written here")
    p.add_argument("--time-limit", type=float, default=30, help="solver time limit in seconds (default 30)")
    p.add_argument("--steps", type=int, default=5)
    p.add_argument("--lr", type=float, default=0.05)
    args = p.parse_args(argv)
    shape = input_shape_of(args)

    if "RANK" in os.environ:  # started by torchrun: one process per rank, env:// rendezvous
        rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
        if not args.solution:
            sys.exit("ddp_train: under torchrun pass --solution PATH (rank 0 solves it if it does not exist)")
        dist.init_process_group("gloo", init_method="env://", rank=rank, world_size=world)
        if rank == 0 and not Path(args.solution).exists():
            solve_for_one_rank(args, shape, Path(args.solution))
        dist.barrier()
        train(rank, world, "env://", args, shape, args.solution)
        return

    with tempfile.TemporaryDirectory() as tmp:
        path = Path(args.solution or Path(tmp) / "solution.pkl")
        if not path.exists():
            solve_for_one_rank(args, shape, path)
        mp.spawn(train, nprocs=args.nproc, join=True,
                 args=(args.nproc, f"tcp://127.0.0.1:{free_port()}", args, shape, str(path)))


if __name__ == "__main__":
    main()
