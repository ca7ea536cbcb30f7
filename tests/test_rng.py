"""Recomputed dropout replays the forward pass's random numbers (`monet.rng`)."""
from __future__ import annotations

import copy

import numpy as np
import pytest
import torch
import torch.nn as nn

from monet.capture import capture
from monet.executor import build_modules
from monet.profiling.measure import output_grad
from monet.profiling.costs import analytic_costs, costs_for
from monet.matrices import schedule_from_matrices
from monet.simulate import simulate
from monet.solver import formulation
from monet.solver.repair import repair
from monet.solver.solve import memory_model
from monet.wrapper import scheduled_module


def _model():
    torch.manual_seed(0)
    return nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.ReLU(), nn.Dropout(0.5),
                         nn.Conv2d(8, 8, 3, padding=1), nn.Tanh(), nn.Dropout2d(0.3),
                         nn.Flatten(), nn.Linear(8 * 8 * 8, 4))


def _keep_nothing(model, x):
    """(graph, costs, the schedule that keeps nothing it can recompute) of ``model`` at ``x``."""
    graph = capture(model, x)
    costs = costs_for(graph, analytic_costs(graph))
    mem = memory_model(graph, costs)
    P = formulation.Problem(mem, np.zeros(len(graph.fwd)), "normal")
    S, R = repair(graph, mem, np.zeros((P.T, P.G), dtype=bool), P.allow_s)
    return graph, costs, schedule_from_matrices(graph, mem.group_to_node(S), R)


@pytest.fixture(scope="module")
def recompute_all():
    """The model, its input, graph, costs, and the schedule that keeps nothing it can recompute."""
    model = _model()
    x = torch.randn(4, 3, 8, 8)
    return (model, x) + _keep_nothing(model, x)


def test_dropout_is_recomputable(recompute_all):
    _, _, graph, _, sched = recompute_all
    random = {n.id for n in graph.fwd if n.random}
    assert random, "the model's dropout should be a random node"
    recomputed = {i for st in sched.stages for i in st.recompute}
    assert random <= recomputed


def test_recomputed_dropout_gives_plain_gradients_and_rng_stream(recompute_all):
    """Gradients bit for bit equal to plain PyTorch's under the same seed, and the generator ends
    where plain PyTorch leaves it (the replay restores it)."""
    model, x, _, _, sched = recompute_all
    g = output_grad(model, x)

    def step(m):
        m.train()
        torch.manual_seed(5)
        out = m(x.clone().requires_grad_())
        out.backward(g)
        return out.detach(), [p.grad for p in m.parameters()], torch.rand(3)

    plain_out, plain_grads, plain_next = step(copy.deepcopy(model))
    out, grads, nxt = step(scheduled_module(copy.deepcopy(model), lambda _g: sched))
    assert torch.equal(out, plain_out)
    assert all(torch.equal(a, b) for a, b in zip(grads, plain_grads))
    assert torch.equal(nxt, plain_next)
    # a different seed draws other masks: the comparison above can fail
    torch.manual_seed(6)
    assert not torch.equal(copy.deepcopy(model).train()(x), plain_out)


def test_generator_state_is_saved_only_for_recomputed_random_ops(recompute_all):
    _, _, graph, costs, sched = recompute_all
    fw, bw = build_modules(graph, sched)
    states = [n for n in bw.graph.nodes if n.op == "placeholder" and n.name.startswith("monet_rng_state_")]
    assert len(states) == sum(n.random for n in graph.fwd)
    # counted by the simulator: 5,056 bytes of CPU generator state each
    assert all(s.meta["val"].numel() == torch.get_rng_state().numel() for s in states)
    keep_all = schedule_from_matrices(graph, np.ones((len(graph.bwd), len(graph.fwd)), dtype=bool),
                                      np.zeros((len(graph.bwd), len(graph.fwd)), dtype=bool))
    fw2, bw2 = build_modules(graph, keep_all)
    assert not [n for n in bw2.graph.nodes if n.name.startswith("monet_rng_state_")]
    assert simulate(graph, fw, bw).saved_bytes < simulate(graph, fw2, bw2).saved_bytes


def test_meta_graph_counts_the_cpu_generator_state():
    """Graphs traced on the meta device (the zoo's and benchmarks/bench_solver.py's, solved for a GPU) count the
    larger, CPU-sized state; executing a replay there is refused with a message."""
    from monet.rng import rng_state, state_meta

    assert state_meta("meta").nbytes == torch.get_rng_state().nbytes
    with pytest.raises(NotImplementedError, match="meta"):
        rng_state("meta")


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_recomputed_dropout_on_cuda_replays_the_cuda_generator():
    """On CUDA the replay sets and restores the device's generator (16-byte state): gradients
    equal plain PyTorch's (up to cuDNN's summation order) and the CUDA random numbers drawn after
    the step are the same."""
    model = _model().cuda()
    x = torch.randn(4, 3, 8, 8, device="cuda")
    graph, _, sched = _keep_nothing(model, x)
    assert any(graph.fwd[i].random for st in sched.stages for i in st.recompute)
    g = torch.randn_like(model(x))

    def step(m):
        m.train()
        torch.manual_seed(5)
        out = m(x.clone().requires_grad_())
        out.backward(g)
        return [p.grad for p in m.parameters()], torch.rand(3, device="cuda")

    plain_grads, plain_next = step(copy.deepcopy(model))
    grads, nxt = step(scheduled_module(copy.deepcopy(model), lambda _g: sched))
    # cuDNN's weight gradients may sum in another order; another mask would differ by far more
    assert all(torch.allclose(a, b, rtol=1e-5, atol=1e-6) for a, b in zip(grads, plain_grads))
    assert torch.equal(nxt, plain_next)
