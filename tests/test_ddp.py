"""MONeTWrapper under DistributedDataParallel: two gloo processes on the CPU train like one process.

The schedule is solved for the per-rank batch (B/2: a solution fixes the batch size); each rank
runs the wrapped model under DDP on its half of a fixed batch of B.  DDP averages the ranks'
gradients, so with the loss a mean over each half they must equal plain PyTorch's gradients of the
mean loss over the whole batch, in one process (to float tolerance: the sums are split and
reduced in another order).  Every rank must have run the same schedule, and run it: the backward
pass each rank executed is the schedule's, with its recomputations.

The model has no BatchNorm and no dropout: batch statistics of a half batch differ from those of
the whole batch (DDP does not synchronise them; SyncBatchNorm would), and each process draws its
own dropout masks, so neither could match one process on the whole batch.
"""
from __future__ import annotations

import hashlib
import time

import pytest
from ci import HANG_GUARD_S
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn as nn
import torch.nn.functional as F

from one_process import assert_matches_one_process

from monet.capture import capture
from monet.profiling.costs import analytic_costs, costs_for
from monet.solver.solve import eager_peak, solve

SHAPE = (3, 16, 16)
BATCH = 8  # the whole batch; each of the WORLD ranks gets BATCH // WORLD samples
WORLD = 2
STEPS = 2
LR = 0.1
# a guard against a hung rank (see _rank_main), not a speed test: far above what the ranks take, so a
# slow or shared machine does not decide the outcome
TIMEOUT_S = HANG_GUARD_S  # a guard against a hung rank, not a speed test


class ResidualNet(nn.Module):
    """Convolutions with a residual branch and smooth activations; no BatchNorm, no dropout."""

    def __init__(self, c=8, classes=5):
        super().__init__()
        self.c1 = nn.Conv2d(3, c, 3, padding=1)
        self.c2 = nn.Conv2d(c, c, 3, padding=1)
        self.c3 = nn.Conv2d(c, c, 3, padding=1)
        self.head = nn.Linear(c, classes)

    def forward(self, x):
        y = torch.tanh(self.c1(x))
        r = self.c3(F.gelu(self.c2(y))) + y
        return self.head(F.relu(r).mean(dim=(2, 3)))


def solution_digest(sol) -> str:
    """SHA-256 of what makes a schedule: graph fingerprint, the explicit schedule, S and R."""
    h = hashlib.sha256()
    h.update(sol.meta.fingerprint.encode())
    h.update(repr(sol.schedule).encode())
    for a in (sol.S, sol.R):
        h.update(str((a.dtype, a.shape)).encode())
        h.update(a.tobytes())
    return h.hexdigest()


def recomputed_nodes(holder) -> int:
    """Forward ops recomputed by the backward module the executor built for AOTAutograd's runtime
    (one node per recomputation)."""
    return sum(1 for n in holder["bw"].graph.nodes if n.meta.get("monet", ("",))[0] == "fwd")


def _rank_main(rank, world, init_method, sol, state, x, y, out_dir):
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=init_method, rank=rank, world_size=world)
    try:
        _train_rank(rank, world, sol, state, x, y, out_dir)
    finally:
        # after the DDP model is gone: when DDP's reducer drops the last reference to a gloo process
        # group it can deadlock on the GIL at exit (torch 2.13)
        dist.destroy_process_group()


def _train_rank(rank, world, sol, state, x, y, out_dir):
    from torch.nn.parallel import DistributedDataParallel as DDP

    from monet.wrapper import MONeTWrapper

    model = ResidualNet()
    model.load_state_dict(state)
    ddp = DDP(MONeTWrapper(model, sol, SHAPE))
    opt = torch.optim.SGD(ddp.parameters(), lr=LR)
    part = slice(rank * (x.shape[0] // world), (rank + 1) * (x.shape[0] // world))
    grads, losses, grad_fns = [], [], []
    for _ in range(STEPS):
        opt.zero_grad(set_to_none=True)
        out = ddp(x[part])
        grad_fns.append(type(out.grad_fn).__name__)
        loss = F.cross_entropy(out, y[part])
        loss.backward()
        grads.append([p.grad.clone() for p in model.parameters()])
        losses.append(loss.detach())
        opt.step()
    holder = ddp.module.scheduled.monet_compiled
    # what this rank ran: the solution it holds and the graph and schedule its executor built
    ran = (solution_digest(ddp.module.solution), holder["graph"].fingerprint, repr(holder["schedule"]))
    everyone = [None] * world
    dist.all_gather_object(everyone, ran)
    torch.save(dict(grads=grads, losses=losses, params=[p.detach() for p in model.parameters()],
                    everyone=everyone, grad_fns=grad_fns, recomputed=recomputed_nodes(holder)),
               out_dir / f"rank{rank}.pt")


@pytest.fixture(scope="module")
def setup():
    torch.manual_seed(0)
    model = ResidualNet()
    gen = torch.Generator().manual_seed(1)
    x = torch.randn(BATCH, *SHAPE, generator=gen)
    y = torch.randint(0, 5, (BATCH,), generator=gen)
    per_rank = BATCH // WORLD
    graph = capture(model, x[:per_rank])  # the solution is for the batch each rank sees
    costs = costs_for(graph, analytic_costs(graph))
    sol = solve(graph, costs, int(0.8 * eager_peak(graph, costs)), "normal", time_limit=10,
                info=dict(model="ResidualNet", batch_size=per_rank, input_shape=SHAPE, dtype="float32"))
    return model, x, y, sol


def test_two_gloo_ranks_match_one_process_on_the_whole_batch(setup, tmp_path):
    model, x, y, sol = setup
    assert sol.meta.batch_size == BATCH // WORLD
    assert sol.schedule.recompute_count() > 0, "the budget must force recomputation"

    ranks = mp.spawn(_rank_main, nprocs=WORLD, join=False,
                     args=(WORLD, f"file://{tmp_path / 'rendezvous'}", sol, model.state_dict(), x, y, tmp_path))
    deadline = time.monotonic() + TIMEOUT_S
    while not ranks.join(timeout=1):  # raises if a rank failed
        if time.monotonic() > deadline:
            for proc in ranks.processes:
                proc.kill()
            pytest.fail(f"the ranks did not finish in {TIMEOUT_S} s")
    ranks = [torch.load(tmp_path / f"rank{r}.pt") for r in range(WORLD)]

    # one process, plain PyTorch, the whole batch, the mean loss over it
    assert_matches_one_process(model, x, y, ranks, STEPS, LR)
    # DDP's allreduce hands every rank the same gradients
    for g0, g1 in zip(ranks[0]["grads"][-1], ranks[1]["grads"][-1]):
        assert torch.equal(g0, g1)

    # every rank ran the same schedule, the one solved here, and ran it with its recomputations
    expected = (solution_digest(sol), sol.meta.fingerprint, repr(sol.schedule))
    for r in ranks:
        assert r["everyone"] == [expected] * WORLD
        assert r["recomputed"] == sol.schedule.recompute_count()
        # the output came from AOTAutograd's runtime, which runs the executor's modules, not from the model
        assert r["grad_fns"] == ["CompiledFunctionBackward"] * STEPS
