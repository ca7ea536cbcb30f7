"""MONeTWrapper and torch.compile.

The wrapper's scheduled training step is a graph break (``torch.compiler.disable``): Dynamo does
not trace into it, so the schedule (what is kept, what is recomputed) is the one that runs, and it
runs eagerly, as AOTAutograd graphs of our own.  Tracing into it instead fails (AOTAutograd inside
Dynamo: "Attempting to use FunctionalTensor on its own") or, with the "eager" backend, traces monet's
own Python.  So:

* ``torch.compile(wrapper)`` trains exactly like the wrapper (nothing of the model is compiled in
  training mode; in eval mode the model is compiled as usual);
* ``torch.compile`` of a module that contains the wrapper compiles the code around it;
* ``MONeTWrapper(torch.compile(model), ...)`` is refused with a message that says what to do.
"""
from __future__ import annotations

import copy

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F
from torch._dynamo.testing import AotEagerAndRecordGraphs

from monet.wrapper import MONeTWrapper
from usernet import solved_usernet

SHAPE = (3, 16, 16)
BATCH = 8


@pytest.fixture(scope="module")
def solved():
    torch.manual_seed(0)
    gen = torch.Generator().manual_seed(1)
    x = torch.randn(BATCH, *SHAPE, generator=gen)
    y = torch.randint(0, 5, (BATCH,), generator=gen)
    model, _, _, sol = solved_usernet(x)
    assert sol.schedule.recompute_count() > 0
    return model, x, y, sol


@pytest.fixture(autouse=True)
def fresh_dynamo():
    torch.compiler.reset()
    yield
    torch.compiler.reset()


def train(module, params, x, y, steps=2):
    """``steps`` SGD steps; the losses and the gradients of each step."""
    opt = torch.optim.SGD(params, lr=0.1, momentum=0.9)
    torch.manual_seed(1)  # same dropout masks
    losses, grads = [], []
    for _ in range(steps):
        opt.zero_grad(set_to_none=True)
        loss = F.cross_entropy(module(x), y)
        loss.backward()
        losses.append(loss.detach())
        grads.append([p.grad.clone() for p in params])
        opt.step()
    return losses, grads


def ran_schedule(wrapper: MONeTWrapper, sol) -> bool:
    """The wrapper traced its model and built the executor's modules from ``sol``'s schedule."""
    holder = wrapper.scheduled.monet_compiled
    recomputed = sum(1 for n in holder["bw"].graph.nodes if n.meta.get("monet", ("",))[0] == "fwd")
    return holder["schedule"] == sol.schedule and recomputed == sol.schedule.recompute_count()


def convolutions(graphs) -> int:
    return sum(1 for g in graphs for n in g.graph.nodes if n.target is torch.ops.aten.convolution.default)


def test_compile_wrapper_trains_like_the_wrapper(solved):
    """torch.compile(wrapper), default backend: bitwise the wrapper's (= PyTorch's) training."""
    model, x, y, sol = solved
    plain = copy.deepcopy(model)
    wrapper = MONeTWrapper(copy.deepcopy(model), sol, SHAPE)
    compiled = torch.compile(wrapper)
    lp, gp = train(plain, list(plain.parameters()), x, y)
    lc, gc = train(compiled, list(wrapper.parameters()), x, y)
    assert all(torch.equal(a, b) for a, b in zip(lp, lc)), (lp, lc)
    for step_p, step_c in zip(gp, gc):
        for (name, _), a, b in zip(plain.named_parameters(), step_p, step_c):
            assert torch.equal(a, b), name
    for (name, a), b in zip(plain.state_dict().items(), wrapper.state_dict().values()):
        assert torch.equal(a, b), name  # weights and BatchNorm statistics
    assert ran_schedule(wrapper, sol)


class Outer(nn.Module):
    """A larger program around the wrapped model: compiled code before and after it.

    The wrapped model's input must not require a gradient (the solution was traced with one that
    does not), so what comes before it has no parameters; what comes after it has one.
    """

    def __init__(self, inner):
        super().__init__()
        self.register_buffer("scale", torch.linspace(0.5, 1.5, 3).view(3, 1, 1))
        self.inner = inner
        self.temperature = nn.Parameter(torch.tensor(2.0))

    def forward(self, x):
        return self.inner(torch.sigmoid(x) * self.scale) / self.temperature


@pytest.mark.filterwarnings("ignore:Your compiler for AOTAutograd:UserWarning")  # the recording backend's
def test_compile_outer_module_around_the_wrapper(solved):
    """torch.compile of a module containing the wrapper: the code around it is compiled, the
    wrapper runs its schedule, the gradients are PyTorch's."""
    model, x, y, sol = solved
    plain = Outer(copy.deepcopy(model))
    wrapper = MONeTWrapper(copy.deepcopy(model), sol, SHAPE)
    outer = Outer(wrapper)
    backend = AotEagerAndRecordGraphs()
    compiled = torch.compile(outer, backend=backend)
    lp, gp = train(plain, list(plain.parameters()), x, y)
    lc, gc = train(compiled, list(outer.parameters()), x, y)
    torch.testing.assert_close(lc, lp, rtol=1e-5, atol=1e-6)
    for step_p, step_c in zip(gp, gc):
        for (name, _), a, b in zip(plain.named_parameters(), step_p, step_c):
            torch.testing.assert_close(b, a, rtol=1e-5, atol=1e-6, msg=lambda m, n=name: f"{n}: {m}")
    assert ran_schedule(wrapper, sol)
    # the code around the wrapper was compiled (forward and backward), the model's ops were not
    assert backend.fw_graphs and backend.bw_graphs
    assert convolutions(backend.fw_graphs + backend.bw_graphs) == 0


def test_compiled_wrapper_in_eval_mode_compiles_the_model(solved):
    model, x, _, sol = solved
    wrapper = MONeTWrapper(copy.deepcopy(model), sol, SHAPE).eval()
    backend = AotEagerAndRecordGraphs()
    compiled = torch.compile(wrapper, backend=backend)
    with torch.no_grad():
        out = compiled(x)
        torch.testing.assert_close(out, copy.deepcopy(model).eval()(x), rtol=1e-5, atol=1e-6)
    assert convolutions(backend.fw_graphs) > 0  # the model itself was traced and compiled


def test_wrapping_a_compiled_model_is_refused(solved):
    model, _, _, sol = solved
    with pytest.raises(TypeError, match=r"not a torch\.compile result.*_orig_mod"):
        MONeTWrapper(torch.compile(copy.deepcopy(model)), sol, SHAPE)
