"""The executor's own work per training call (`benchmarks/executor_tax.py` times it): BatchNorm's
running statistics updated in place by the forward module, and the wrapper's input checks run once
per call key.  Behaviour only: gradients and buffers against plain PyTorch, refusals, what runs."""
from __future__ import annotations

import copy

import numpy as np
import pytest
import torch
import torch.nn as nn

from monet.capture import capture
from monet.executor import build_modules
from monet.profiling.measure import grads_and_buffers
from monet.profiling.costs import analytic_costs, costs_for
from monet.matrices import schedule_from_matrices
from monet.solution import AutocastMismatchError, SolutionMismatchError
from monet.solver import formulation
from monet.solver.repair import repair
from monet.solver.solve import keep_all_matrices, memory_model, solve
from monet.wrapper import MONeTWrapper, scheduled_module

FUNCTIONAL_BN = torch.ops.aten._native_batch_norm_legit_functional.default
IN_PLACE_BN = torch.ops.aten._native_batch_norm_legit.default


def _net():
    torch.manual_seed(0)
    return nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU(),
                         nn.Conv2d(8, 8, 3, padding=1), nn.BatchNorm2d(8), nn.Tanh(),
                         nn.Flatten(), nn.Linear(8 * 6 * 6, 4))


@pytest.fixture(scope="module")
def bn_case():
    model, x = _net(), torch.randn(4, 3, 6, 6)
    graph = capture(model, x)
    costs = costs_for(graph, analytic_costs(graph))
    mem = memory_model(graph, costs)
    P = formulation.Problem(mem, np.zeros(len(graph.fwd)), "normal")
    S, R = repair(graph, mem, np.zeros((P.T, P.G), dtype=bool), P.allow_s)
    schedules = {"keep-all": schedule_from_matrices(graph, *keep_all_matrices(graph)),
                 "keep-nothing": schedule_from_matrices(graph, mem.group_to_node(S), R)}
    assert schedules["keep-nothing"].recompute_count() > 0
    return model, x, graph, schedules


def _targets(gm):
    return [n.target for n in gm.graph.nodes if n.op == "call_function"]


@pytest.mark.parametrize("which", ["keep-all", "keep-nothing"])
def test_batchnorm_statistics_are_updated_in_place(bn_case, which):
    """The forward module the wrapper runs updates the running statistics in place (no functional
    copies for AOTAutograd's runtime to copy back), and three iterations give plain PyTorch's
    gradients and buffers bit for bit, with and without recomputation."""
    model, x, graph, schedules = bn_case
    sched = schedules[which]
    g = torch.randn(4, 4)
    wrapped, plain = scheduled_module(copy.deepcopy(model), lambda _g: sched), copy.deepcopy(model)
    for _ in range(3):
        ga, ba = grads_and_buffers(wrapped, x, g)
        gb, bb = grads_and_buffers(plain, x, g)
        assert ga.keys() == gb.keys() and all(torch.equal(ga[k], gb[k]) for k in gb)
        assert ba.keys() == bb.keys() and all(torch.equal(ba[k], bb[k]) for k in bb)
    targets = _targets(wrapped.monet_compiled["fw"])
    assert FUNCTIONAL_BN not in targets and targets.count(IN_PLACE_BN) == 2
    assert torch.ops.aten.add_.Tensor not in targets  # num_batches_tracked: functional (no hidden temporary)
    # the simulator's modules keep AOTAutograd's functional form (an upper bound of the memory)
    fw, _ = build_modules(graph, sched)
    assert _targets(fw).count(FUNCTIONAL_BN) == 2 and IN_PLACE_BN not in _targets(fw)


def test_a_shared_buffer_stays_functional():
    """A BatchNorm called twice: its second call reads the first one's new statistics, so neither
    is rewritten (no op may read a buffer after it changed), and the result is still plain's."""
    class Twice(nn.Module):
        def __init__(self):
            super().__init__()
            self.conv, self.bn = nn.Conv2d(3, 3, 3, padding=1), nn.BatchNorm2d(3)

        def forward(self, x):
            return self.bn(self.conv(self.bn(x))).sum(dim=(2, 3))

    torch.manual_seed(0)
    model, x = Twice(), torch.randn(4, 3, 5, 5)
    graph = capture(model, x)
    sched = schedule_from_matrices(graph, *keep_all_matrices(graph))
    wrapped = scheduled_module(copy.deepcopy(model), lambda _g: sched)
    g = torch.randn(4, 3)
    ga, ba = grads_and_buffers(wrapped, x, g)
    gb, bb = grads_and_buffers(copy.deepcopy(model), x, g)
    assert all(torch.equal(ga[k], gb[k]) for k in gb) and all(torch.equal(ba[k], bb[k]) for k in bb)
    assert _targets(wrapped.monet_compiled["fw"]).count(FUNCTIONAL_BN) == 2


@pytest.fixture
def wrapper(bn_case):
    model, x, graph, _ = bn_case
    sol = solve(graph, costs_for(graph, analytic_costs(graph)), None, "none",
                info=dict(batch_size=4, input_shape=(3, 6, 6), dtype="float32"))
    return MONeTWrapper(copy.deepcopy(model), sol), x


def test_input_checks_run_once_per_call_key(wrapper, monkeypatch):
    """Repeated calls with the same shapes check the inputs against the solution once; a new
    batch size is a new key and is checked."""
    wrapped, x = wrapper
    calls = []
    check = MONeTWrapper._check_inputs
    monkeypatch.setattr(MONeTWrapper, "_check_inputs", lambda self, inputs: calls.append(1) or check(self, inputs))
    for _ in range(3):
        wrapped(x).sum().backward()
    assert len(calls) == 1
    wrapped(x[:2]).sum().backward()  # an epoch's last, smaller batch
    wrapped(x).sum().backward()
    assert len(calls) == 2


def test_cached_checks_still_refuse_bad_calls(wrapper):
    """After good calls were checked (and their checks cached), a larger batch, another dtype and
    a call under autocast are still refused, and a good call still runs."""
    wrapped, x = wrapper
    wrapped(x).sum().backward()
    with pytest.raises(SolutionMismatchError, match="batch"):
        wrapped(torch.cat([x, x]))
    with pytest.raises(SolutionMismatchError, match="dtype"):
        wrapped(x.double())
    with pytest.raises(AutocastMismatchError):
        with torch.autocast("cpu", dtype=torch.bfloat16):
            wrapped(x)
    with pytest.raises(SolutionMismatchError, match="batch"):  # refused again: a refusal is not cached
        wrapped(torch.cat([x, x]))
    wrapped(x).sum().backward()


@pytest.mark.parametrize("which", ["keep-all", "keep-nothing"])
def test_backward_module_calls_no_detach(bn_case, which, monkeypatch):
    """The joint graph detaches ReLU's output for its backward; the backward module reads the
    output itself (no ATen call for nothing), for the wrapper and the simulator alike, and the
    simulated peak is the one with the detaches."""
    import monet.executor as executor
    from monet.simulate import simulate

    model, x, graph, schedules = bn_case
    costs = costs_for(graph, analytic_costs(graph))
    fw, bw = build_modules(graph, schedules[which])
    assert torch.ops.aten.detach.default not in _targets(bw)
    assert torch.ops.aten.threshold_backward.default in _targets(bw)
    peak = simulate(graph, fw, bw, costs.fwd_workspace, costs.bwd_workspace).peak_bytes
    monkeypatch.setattr(executor, "drop_detaches", lambda _g: 0)
    fw0, bw0 = build_modules(graph, schedules[which])
    assert torch.ops.aten.detach.default in _targets(bw0)
    assert simulate(graph, fw0, bw0, costs.fwd_workspace, costs.bwd_workspace).peak_bytes == peak
