"""MONeTWrapper on a user model: training steps, nn.Module behaviour and refusals of bad input."""
from __future__ import annotations

import copy
import gc
import os
import pickle

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

from monet.capture import CaptureError, capture
from monet.solution import MAGIC, FORMAT_VERSION, SolutionFileError, SolutionMismatchError, save_solution
from monet.solver.ilp import InfeasibleBudgetError
from monet.solver.solve import solve
from monet.wrapper import MONeTWrapper
from usernet import UserNet, solved_usernet


SHAPE = (3, 16, 16)
BATCH = 8


@pytest.fixture(scope="module")
def solved():
    torch.manual_seed(0)
    x = torch.randn(BATCH, *SHAPE)
    model, graph, costs, sol = solved_usernet(x)
    return model, x, graph, costs, sol


def test_solution_recomputes(solved):
    *_, sol = solved
    assert sol.schedule.recompute_count() > 0
    assert sol.meta.predicted_peak_bytes <= sol.meta.budget_bytes < sol.meta.eager_peak_bytes


def test_three_sgd_steps_bitwise(solved):
    """Three SGD steps with the wrapper give the same losses and weights as plain PyTorch, bit for bit."""
    model, x, _, _, sol = solved
    y = torch.randint(0, 5, (BATCH,))

    def train(m):
        opt = torch.optim.SGD(m.parameters(), lr=0.1, momentum=0.9)
        torch.manual_seed(1)  # same dropout masks
        losses = []
        for _ in range(3):
            opt.zero_grad(set_to_none=True)
            loss = F.cross_entropy(m(x), y)
            loss.backward()
            opt.step()
            losses.append(loss.detach())
        return losses

    plain = copy.deepcopy(model)
    wrapped = MONeTWrapper(copy.deepcopy(model), sol, SHAPE)
    lp, lw = train(plain), train(wrapped)
    assert all(torch.equal(a, b) for a, b in zip(lp, lw)), (lp, lw)
    for (n, a), (_, b) in zip(plain.state_dict().items(), wrapped.state_dict().items()):
        assert torch.equal(a, b), n


def test_module_behaviour(solved):
    model, x, _, _, sol = solved
    wrapped = MONeTWrapper(copy.deepcopy(model), sol, SHAPE)
    assert list(wrapped.state_dict()) == list(model.state_dict())  # same keys as the original
    assert [p.shape for p in wrapped.parameters()] == [p.shape for p in model.parameters()]
    wrapped.load_state_dict(model.state_dict())
    wrapped.eval()
    with torch.no_grad():
        assert torch.equal(wrapped(x), copy.deepcopy(model).eval()(x))
    wrapped.train()
    wrapped.to(torch.float32)  # a move re-traces on the next call
    wrapped(x).sum().backward()
    assert all(p.grad is not None for p in wrapped.parameters())


def test_larger_batch_refused(solved):
    model, x, _, _, sol = solved
    wrapped = MONeTWrapper(copy.deepcopy(model), sol, SHAPE)
    before = copy.deepcopy(wrapped.state_dict())
    with pytest.raises(SolutionMismatchError, match=r"made for batch 8, called with batch 16.*solve for batch 16"):
        wrapped(torch.cat([x, x]))
    assert all(torch.equal(before[k], v) for k, v in wrapped.state_dict().items())  # nothing changed


def test_smaller_batch_runs_the_schedule(solved):
    """The last batch of an epoch (3 of 8): the same schedule runs, with PyTorch's gradients (bit for
    bit), a measured peak under the budget and under plain PyTorch's at that batch (plain PyTorch
    fits the budget at batch 3 too, so only the second tells that the schedule still saves memory)."""
    from monet.profiling.measure import measure_iteration_peak

    model, x, _, _, sol = solved
    small = x[:3].clone()
    wrapped = MONeTWrapper(copy.deepcopy(model), sol, SHAPE)
    plain = copy.deepcopy(model)
    grads = []
    for m in (plain, wrapped):
        torch.manual_seed(3)
        m(small).square().mean().backward()
        grads.append([p.grad for p in m.parameters()])
    assert all(torch.equal(a, b) for a, b in zip(*grads))
    ran = wrapped.scheduled.monet_compiled
    assert ran["schedule"] is sol.schedule and ran["graph"].input_shape[0] == 3
    assert ran["graph"].fingerprint != sol.meta.fingerprint  # another graph, the same schedule
    g = torch.randn(3, 5)
    peak = measure_iteration_peak(wrapped, small, g)
    assert peak <= sol.meta.budget_bytes
    assert peak < measure_iteration_peak(copy.deepcopy(model), small, g), "the schedule saves nothing at batch 3"
    # the next epoch: the full batch, then the small one again; each is traced once
    wrapped(x).sum().backward()
    traced = dict(wrapped.scheduled.traces)
    wrapped(small).sum().backward()
    assert len(traced) == 2 and all(wrapped.scheduled.traces[k] is v for k, v in traced.items())


def test_other_input_shape_refused(solved):
    model, *_ = solved
    sol = solved[-1]
    with pytest.raises(SolutionMismatchError, match="input shape differs"):
        MONeTWrapper(copy.deepcopy(model), sol, (3, 32, 32))


def test_other_model_refused(solved):
    *_, sol = solved
    other = UserNet(c=12)  # same input shape and batch, another graph
    wrapped = MONeTWrapper(other, sol, SHAPE)
    with pytest.raises(SolutionMismatchError, match="first difference at node"):
        wrapped(torch.randn(BATCH, *SHAPE))


def test_truncated_file_refused(solved, tmp_path):
    model, *_, sol = solved
    path = tmp_path / "s.pkl"
    save_solution(sol, path)
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])
    with pytest.raises(SolutionFileError, match="truncated"):
        MONeTWrapper(copy.deepcopy(model), path, SHAPE)


class _Evil:
    def __init__(self, target):
        self.target = target

    def __reduce__(self):
        return (os.system, (f"touch {self.target}",))


def test_code_running_pickle_refused(solved, tmp_path):
    model, *_ = solved
    target = tmp_path / "pwned"
    path = tmp_path / "evil.pkl"
    path.write_bytes(MAGIC + bytes([FORMAT_VERSION]) + pickle.dumps(_Evil(target), protocol=4))
    with pytest.raises(SolutionFileError, match="refusing to load"):
        MONeTWrapper(copy.deepcopy(model), path, SHAPE)
    assert not target.exists()


def test_budget_below_smallest_names_it(solved):
    _, _, graph, costs, _ = solved
    with pytest.raises(InfeasibleBudgetError, match=r"smallest (feasible )?budget( found feasible)? is \d+ bytes"):
        solve(graph, costs, 1000, "normal", time_limit=10)


class Branchy(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(4, 4)

    def forward(self, x):
        if x.sum() > 0:  # data-dependent control flow: cannot be traced ahead of time
            return self.lin(x)
        return self.lin(-x)


def test_untraceable_model_names_the_construct():
    with pytest.raises(CaptureError, match="data-dependent"):
        capture(Branchy(), torch.randn(2, 4))


def test_distributed_data_parallel_wrap(solved, tmp_path):
    """DDP wraps the wrapper like any module; one gloo process gives plain PyTorch's gradients."""
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP

    model, x, _, _, sol = solved
    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'rendezvous'}", rank=0, world_size=1)
    ddp = m = None
    try:
        ddp = DDP(MONeTWrapper(copy.deepcopy(model), sol, SHAPE))
        plain = copy.deepcopy(model)
        for m in (ddp, plain):
            torch.manual_seed(3)
            m(x).square().mean().backward()
        for (n, p), q in zip(plain.named_parameters(), ddp.module.parameters()):
            assert torch.equal(p.grad, q.grad), n
    finally:
        # DDP's reducer goes before the process group: a reducer that drops the last reference to
        # a gloo group after destroy_process_group joins the group's threads and can hang there
        ddp = m = None
        gc.collect()
        dist.destroy_process_group()


def test_zoo_prefix_explains(solved):
    """An unknown zoo entry is a SolutionFileError naming it (tests/test_zoo.py uses real entries)."""
    model, *_ = solved
    with pytest.raises(SolutionFileError, match="no zoo entry named 'resnet50-6GB'"):
        MONeTWrapper(copy.deepcopy(model), "zoo:resnet50-6GB", SHAPE)


def test_solution_from_another_torch_release_is_accepted_and_other_graphs_are_not(solved):
    """torch 2.15 writes aten._unsafe_view where 2.11-2.14 write aten.view (matmul's reshape of its mm
    result; both aliases in the memory model): a solution made on one release is accepted for the same
    model captured on the other, while any other difference is still refused with the node it is at."""
    import dataclasses

    from monet.graph import fingerprint
    from monet.solution import check_compatible

    model, x, graph, costs, sol = solved
    at = [i for i, line in enumerate(graph.summary) if " aten.view.default (" in line]
    assert at, "UserNet's graph has no view to rename"

    def made_with(summary):
        return dataclasses.replace(sol.meta, graph_summary=summary, fingerprint=fingerprint(summary))

    def check(meta):
        check_compatible(meta, graph.fingerprint, graph.summary, batch_size=BATCH, input_shape=SHAPE,
                         dtype="float32", nodes=(len(graph.fwd), len(graph.bwd)))

    other_release = [line.replace(" aten.view.default (", " aten._unsafe_view.default (") for line in graph.summary]
    assert fingerprint(other_release) != graph.fingerprint
    check(made_with(other_release))  # accepted

    other_graph = list(graph.summary)
    other_graph[at[0]] = other_graph[at[0]].replace(" aten.view.default (", " aten.reshape.default (")
    with pytest.raises(SolutionMismatchError, match=f"first difference at node {at[0]}"):
        check(made_with(other_graph))
