"""MONeTWrapper under FSDP2 (``fully_shard``): two gloo processes on the CPU train like one process.

What works in torch 2.13 is the per-block way: each block is wrapped with a schedule solved for one
block, then the wrapper is sharded, ``model.blocks[i] = fully_shard(MONeTWrapper(block, sol))``, then
``fully_shard(model)``.  FSDP2's hooks run around each wrapper (all-gather before the scheduled
forward, again before the scheduled backward and its recomputations, reduce-scatter after), so the
averaged gradients of the two ranks, each on half of a fixed batch, must equal plain PyTorch's
gradients of the mean loss over the whole batch in one process (to float tolerance), and so must
the parameters after two SGD steps.

What does not work: capturing a ``fully_shard``-ed model as one graph (torch 2.13 marks FSDP2's
hooks ``torch._dynamo.disable``); `MONeTWrapper` and `capture` refuse it with `ShardedModelError`,
whether the model is sharded before wrapping or after.  These refusals are checked in the same
ranks (``fully_shard`` needs a process group).

The model has no BatchNorm or dropout, as in tests/test_ddp.py, and a stem before the blocks so that
every block's input requires a gradient (each block runs the graph its solution was made for).
"""
from __future__ import annotations

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
from monet.solver.ilp import InfeasibleBudgetError
from monet.solver.solve import eager_peak, solve

C = 16
BATCH = 64  # the whole batch; each of the WORLD ranks gets BATCH // WORLD samples
WORLD = 2
STEPS = 2
LR = 0.1
TIMEOUT_S = HANG_GUARD_S  # a guard against a hung rank, not a speed test


class Block(nn.Module):
    """A residual MLP block with a chain of smooth activations (something to recompute)."""

    def __init__(self, c=C):
        super().__init__()
        self.up = nn.Linear(c, 4 * c)
        self.down = nn.Linear(4 * c, c)

    def forward(self, x):
        h = torch.tanh(self.up(torch.tanh(x)))
        h = torch.sin(F.gelu(torch.cos(h)))
        return x + self.down(torch.tanh(h))


class Net(nn.Module):
    def __init__(self, c=C, classes=5, blocks=2):
        super().__init__()
        self.stem = nn.Linear(c, c)
        self.blocks = nn.ModuleList([Block(c) for _ in range(blocks)])
        self.head = nn.Linear(c, classes)

    def forward(self, x):
        x = self.stem(x)
        for b in self.blocks:
            x = b(x)
        return self.head(x)


def block_solution(per_rank: int):
    """A schedule for one block at the per-rank batch, its input requiring a gradient (as the
    blocks receive it after the stem), at 70 % of plain PyTorch's peak or the smallest feasible."""
    blk = Block()
    graph = capture(blk, torch.randn(per_rank, C).requires_grad_())
    costs = costs_for(graph, analytic_costs(graph))
    info = dict(model="Block", batch_size=per_rank, input_shape=(C,), dtype="float32")
    try:
        return solve(graph, costs, int(0.7 * eager_peak(graph, costs)), "normal", time_limit=10, info=info)
    except InfeasibleBudgetError as e:
        return solve(graph, costs, e.min_budget_bytes, "normal", time_limit=10, info=info)


def _rank_main(rank, world, init_method, sol, state, x, y, out_dir):
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=init_method, rank=rank, world_size=world)
    try:
        result = _train_rank(rank, world, sol, state, x, y)
        result["refusals"] = _refusals(sol, state, x[: x.shape[0] // world])
        torch.save(result, out_dir / f"rank{rank}.pt")
    finally:
        dist.destroy_process_group()


def _train_rank(rank, world, sol, state, x, y):
    from torch.distributed.fsdp import fully_shard

    from monet.wrapper import MONeTWrapper

    model = Net()
    model.load_state_dict(state)
    for i, block in enumerate(model.blocks):
        model.blocks[i] = fully_shard(MONeTWrapper(block, sol))
    fully_shard(model)
    block_grad_fns = []
    for w in model.blocks:
        w.register_forward_hook(lambda _m, _i, out: block_grad_fns.append(type(out.grad_fn).__name__))
    opt = torch.optim.SGD(model.parameters(), lr=LR)
    part = slice(rank * (x.shape[0] // world), (rank + 1) * (x.shape[0] // world))
    grads, losses = [], []
    for _ in range(STEPS):
        opt.zero_grad(set_to_none=True)
        loss = F.cross_entropy(model(x[part]), y[part])
        loss.backward()
        grads.append([p.grad.full_tensor() for p in model.parameters()])  # reduce-scattered shards, gathered
        losses.append(loss.detach())
        opt.step()
    recomputed = [sum(1 for n in w.scheduled.monet_compiled["bw"].graph.nodes
                      if n.meta.get("monet", ("",))[0] == "fwd") for w in model.blocks]
    return dict(grads=grads, losses=losses, params=[p.full_tensor().detach() for p in model.parameters()],
                block_grad_fns=block_grad_fns, recomputed=recomputed,
                sharded=[type(p).__name__ for p in model.parameters()])


def _refusals(sol, state, x_rank):
    """The errors of the ways that cannot work: a fully_shard-ed model wrapped or captured whole,
    and a wrapper whose model is sharded after wrapping (on its first training call)."""
    from torch.distributed.fsdp import fully_shard

    from monet.wrapper import MONeTWrapper

    def sharded_net():
        m = Net()
        m.load_state_dict(state)
        for b in m.blocks:
            fully_shard(b)
        return fully_shard(m)

    out = {}
    m = sharded_net()
    for name, call in (("wrap", lambda: MONeTWrapper(m, sol)), ("capture", lambda: capture(m, x_rank))):
        try:
            call()
            out[name] = None
        except Exception as e:  # noqa: BLE001 - recorded for the test to check
            out[name] = (type(e).__name__, str(e))
    inner = Net()
    inner.load_state_dict(state)
    wrapper = MONeTWrapper(inner, sol)
    for b in inner.blocks:
        fully_shard(b)
    fully_shard(inner)
    try:
        wrapper(x_rank)
        out["shard_after_wrap"] = None
    except Exception as e:  # noqa: BLE001
        out["shard_after_wrap"] = (type(e).__name__, str(e))
    return out


@pytest.fixture(scope="module")
def ranks(tmp_path_factory):
    torch.manual_seed(0)
    model = Net()
    gen = torch.Generator().manual_seed(1)
    x = torch.randn(BATCH, C, generator=gen)
    y = torch.randint(0, 5, (BATCH,), generator=gen)
    sol = block_solution(BATCH // WORLD)
    tmp = tmp_path_factory.mktemp("fsdp")
    procs = mp.spawn(_rank_main, nprocs=WORLD, join=False,
                     args=(WORLD, f"file://{tmp / 'rendezvous'}", sol, model.state_dict(), x, y, tmp))
    deadline = time.monotonic() + TIMEOUT_S
    while not procs.join(timeout=1):  # raises if a rank failed
        if time.monotonic() > deadline:
            for proc in procs.processes:
                proc.kill()
            pytest.fail(f"the ranks did not finish in {TIMEOUT_S} s")
    return model, x, y, sol, [torch.load(tmp / f"rank{r}.pt") for r in range(WORLD)]


def test_per_block_wrappers_under_fully_shard_match_one_process_on_the_whole_batch(ranks):
    model, x, y, sol, results = ranks
    assert sol.meta.batch_size == BATCH // WORLD
    assert sol.schedule.recompute_count() > 0, "the budget must force recomputation"
    assert_matches_one_process(model, x, y, results, STEPS, LR)
    for r in results:
        # the parameters were sharded (DTensor), and each block ran its schedule: its output came from
        # AOTAutograd's runtime, whose backward module holds the schedule's recomputations
        assert set(r["sharded"]) == {"DTensor"}
        assert r["block_grad_fns"] == ["CompiledFunctionBackward"] * (len(model.blocks) * STEPS)
        assert r["recomputed"] == [sol.schedule.recompute_count()] * len(model.blocks)


@pytest.mark.parametrize("how", ["wrap", "capture", "shard_after_wrap"])
def test_a_fully_shard_model_is_refused_with_the_per_block_way(ranks, how):
    *_, results = ranks
    for r in results:
        assert r["refusals"][how] is not None, f"{how}: a fully_shard-ed model was not refused"
        kind, message = r["refusals"][how]
        assert kind == "ShardedModelError"
        assert "monet cannot capture this model as one graph: it is sharded with FSDP2's fully_shard" in message
        assert "torch._dynamo.disable" in message
        assert "fully_shard(MONeTWrapper(block, block_solution))" in message
        assert "DDP(MONeTWrapper(model, solution))" in message


def test_reserved_bytes_come_out_of_the_budget():
    from monet.plan import prepare

    plan = prepare(Block(), torch.randn(32, C).requires_grad_(), cost="analytic", progress=False)
    budget = plan.eager_peak_bytes * 2
    sol = plan.solve(budget, reserved_bytes=budget // 4, time_limit=10)
    assert sol.meta.budget_bytes == budget - budget // 4
    assert sol.meta.predicted_peak_bytes <= budget - budget // 4
    with pytest.raises(ValueError, match="the reserved bytes"):
        plan.solve(budget, reserved_bytes=budget)
    with pytest.raises(ValueError, match="reserved_bytes must be >= 0"):
        plan.solve(budget, reserved_bytes=-1)
