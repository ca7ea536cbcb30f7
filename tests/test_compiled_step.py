"""The compiled step (``monet.optimize(..., compile=True)``, `monet.compiled`): the schedule's forward
and backward modules compiled by Inductor.

On a small stack of transformer MLP blocks (LayerNorm, two linear layers, GELU, dropout where
asked), costed analytically so that the schedules do not depend on this machine's speed:

* the gradients are those of ``torch.compile`` with no budget, within 1e-5 relative, and the
  measured peak is at or under the budget;
* the schedule's recomputations are in Inductor's backward code: it calls one library kernel
  (matrix product) per matrix product of the backward module, recomputations included;
* a recomputed dropout reads the draws its forward saved: the same gradients as the compiled step
  that keeps everything, from the same seed;
* a solution for the eager step is refused compiled, and a mode other than normal is refused.
"""
from __future__ import annotations

import copy
import re

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils._python_dispatch import TorchDispatchMode

from monet import compat
from monet.inputs import ExampleInputs
from monet.plan import WithLoss, prepare
from monet.profiling import measure as chk
from monet.profiling.compiled_costs import is_library_node
from monet.compiled import channels_last
from monet.executor import check_steps
from monet.solution import Schedule, SolutionMismatchError, Stage
from monet.wrapper import MONeTWrapper

WIDTH, TOKENS, BATCH, CLASSES = 32, 64, 8, 5


class Block(nn.Module):
    def __init__(self, p: float):
        super().__init__()
        self.norm = nn.LayerNorm(WIDTH)
        self.up = nn.Linear(WIDTH, 4 * WIDTH)
        self.down = nn.Linear(4 * WIDTH, WIDTH)
        self.drop = nn.Dropout(p)

    def forward(self, x):
        return x + self.drop(self.down(F.gelu(self.up(self.norm(x)))))


class Stack(nn.Module):
    def __init__(self, layers: int = 3, p: float = 0.0):
        super().__init__()
        self.blocks = nn.Sequential(*[Block(p) for _ in range(layers)])
        self.head = nn.Linear(WIDTH, CLASSES)

    def forward(self, x):
        return self.head(self.blocks(x).mean(dim=1))


def _batch():
    gen = torch.Generator().manual_seed(1)
    return torch.randn(BATCH, TOKENS, WIDTH, generator=gen), torch.randint(0, CLASSES, (BATCH,), generator=gen)


def _plan(p: float = 0.0):
    torch.manual_seed(0)
    x, y = _batch()
    return prepare(Stack(p=p), x, loss_fn=F.cross_entropy, target=y, cost="analytic", progress=False,
                   compile=True), x, y


@pytest.fixture(scope="module")
def plan():
    return _plan()


@pytest.fixture(autouse=True)
def fresh_dynamo():
    torch.compiler.reset()
    yield
    torch.compiler.reset()


def _step(module, x, y, seed: int = 0):
    """One training step's loss and gradients (by parameter position)."""
    torch.manual_seed(seed)
    for p in module.parameters():
        p.grad = None
    loss = module(x, target=y)
    loss.backward()
    return loss.detach(), [p.grad.clone() for p in module.parameters()]


def _library_nodes(gm) -> int:
    """Matrix products and other library kernels of an executor module (after dead-code elimination:
    what any compiler of it computes)."""
    g = copy.deepcopy(gm.graph)
    g.eliminate_dead_code()
    return sum(1 for n in g.nodes if n.op == "call_function" and is_library_node(n))


def _library_calls(code: str) -> int:
    return len(re.findall(r"extern_kernels\.\w+\(|torch\.ops\.aten\.\w+\.\w+\(", code))


def test_compiled_step_matches_torch_compile_under_the_budget(plan):
    plan, x, y = plan
    sol = plan.solve("50%", time_limit=20)
    assert sol.meta.compiled and sol.schedule.recompute_count() > 0
    wrapper = plan.wrap(sol, WithLoss(copy.deepcopy(plan.module.model), F.cross_entropy))
    assert wrapper.compiled
    reference = torch.compile(WithLoss(copy.deepcopy(plan.module.model), F.cross_entropy))
    loss_ref, grads_ref = _step(reference, x, y)
    loss, grads = _step(wrapper, x, y)
    assert torch.allclose(loss, loss_ref, rtol=1e-5, atol=0)
    worst = chk.max_rel_diff(dict(enumerate(grads)), dict(enumerate(grads_ref)))
    assert len(grads) == len(grads_ref) and worst <= 1e-5, f"gradients {worst:.2e} from torch.compile's"
    inputs = ExampleInputs((x,), {"target": y})
    peak = chk.step_peak(wrapper, inputs)
    assert peak <= sol.meta.budget_bytes, f"measured {peak} bytes over the budget {sol.meta.budget_bytes}"
    plain = chk.step_peak(reference, inputs)
    assert plain > sol.meta.budget_bytes, "torch.compile fits the budget: the test would not tell"


def test_recomputations_are_in_the_compiled_backward(plan):
    plan, x, y = plan
    least = plan.solve("min", time_limit=20)
    by_name = {n.name: n for n in plan.graph.joint.graph.nodes}
    recomputed = [i for s in least.schedule.stages for i in s.recompute
                  if is_library_node(by_name[plan.graph.fwd[i].name])]
    assert recomputed, "the smallest schedule recomputes no matrix product: the test would not tell"
    counts = {}
    for name, sol in (("keep", plan.solve("100%", time_limit=10)), ("least", least)):
        wrapper = plan.wrap(sol, WithLoss(copy.deepcopy(plan.module.model), F.cross_entropy))
        _step(wrapper, x, y)
        held = wrapper.scheduled.monet_compiled
        counts[name] = (_library_nodes(held["bw"]), _library_calls(compat.inductor_source(held["bw_code"])))
    assert counts["keep"][0] == counts["keep"][1] > 0
    assert counts["least"][0] == counts["least"][1] == counts["keep"][1] + len(recomputed), counts


def _unread_inputs(code: str) -> list[str]:
    """The inputs of an Inductor wrapper's ``call`` that its code never reads after unpacking them:
    each stays allocated until the call returns."""
    body = code[code.index("def call(self, args):"):]
    unpack, rest = body.split("args.clear()", 1)
    names = re.findall(r"\b(arg\d+_1|primals_\d+|tangents_\d+)\b", unpack.split("=")[0])
    return [n for n in names if not re.search(rf"\b{n}\b", rest)]


def test_the_compiled_backward_reads_every_value_it_is_given(plan):
    """The loss's backward reads the log-probabilities for their shape only: the graph gives it a
    stand-in (`monet.shape_reads`), so no schedule keeps them for it, and the compiled backward
    holds no value it never reads (Inductor would keep one allocated through the whole backward)."""
    plan, x, y = plan
    losses = [n for n in plan.graph.bwd if n.op == "aten.nll_loss_backward.default"]
    read = [plan.graph.fwd[i].op for n in losses for i in n.fwd_inputs]
    assert losses and "aten._log_softmax.default" not in read, read
    for budget in ("100%", "min"):
        wrapper = plan.wrap(plan.solve(budget, time_limit=10), WithLoss(copy.deepcopy(plan.module.model),
                                                                       F.cross_entropy))
        _step(wrapper, x, y)
        assert _unread_inputs(compat.inductor_source(wrapper.scheduled.monet_compiled["bw_code"])) == [], budget


def test_recomputed_dropout_reads_its_saved_draws():
    """The keep-all schedule with every dropout recomputed in the first stage instead of kept: the
    same loss and gradients from the same seed (a dropout drawn again would draw other masks)."""
    plan, x, y = _plan(p=0.3)
    keep = plan.solve("100%", time_limit=10)
    drops = tuple(n.id for n in plan.graph.fwd if n.random)
    assert drops and set(drops) <= set(keep.schedule.saved)
    first, *rest = keep.schedule.stages
    recomputed = copy.deepcopy(keep)
    recomputed.schedule = Schedule(tuple(i for i in keep.schedule.saved if i not in drops),
                                   [Stage(first.backward, drops + first.recompute, first.release), *rest],
                                   keep.schedule.impl, keep.schedule.inplace)
    check_steps(plan.graph, recomputed.schedule)
    results = []
    for sol in (keep, recomputed):
        wrapper = plan.wrap(sol, WithLoss(copy.deepcopy(plan.module.model), F.cross_entropy))
        results.append(_step(wrapper, x, y, seed=3))
    (loss_keep, grads_keep), (loss, grads) = results
    assert torch.equal(loss, loss_keep)
    assert chk.max_rel_diff(dict(enumerate(grads)), dict(enumerate(grads_keep))) <= 1e-5


def test_an_eager_solution_is_refused_compiled(plan):
    plan, x, y = plan
    sol = copy.deepcopy(plan.solve("100%", time_limit=5))
    sol.meta.compiled = False
    with pytest.raises(SolutionMismatchError, match="compile=False"):
        MONeTWrapper(WithLoss(copy.deepcopy(plan.module.model), F.cross_entropy), sol, compile=True)


def test_full_mode_is_refused_compiled(plan):
    plan, _, _ = plan
    with pytest.raises(ValueError, match="mode 'normal'"):
        plan.solve("50%", mode="full", time_limit=5)


class ConvNet(nn.Module):
    """Two residual convolution blocks with BatchNorm, then a linear head: the operators of a ResNet."""

    def __init__(self, width: int = 8):
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, width, 3, padding=1, bias=False), nn.BatchNorm2d(width), nn.ReLU())
        self.blocks = nn.ModuleList(nn.Sequential(nn.Conv2d(width, width, 3, padding=1, bias=False),
                                                  nn.BatchNorm2d(width), nn.ReLU(),
                                                  nn.Conv2d(width, width, 3, padding=1, bias=False),
                                                  nn.BatchNorm2d(width)) for _ in range(2))
        self.head = nn.Linear(width, CLASSES)

    def forward(self, x):
        x = self.stem(x)
        for block in self.blocks:
            x = F.relu(x + block(x))
        return self.head(F.adaptive_avg_pool2d(F.max_pool2d(x, 2), 1).flatten(1))


def test_a_compiled_convolution_network_has_torch_compiles_gradients_in_float64():
    """BatchNorm and convolutions compiled inside the schedule compute what ``torch.compile``
    computes: in float64, where rounding cannot hide a different formula, the gradients agree to
    1e-10 relative (in float32 a deep BatchNorm network amplifies rounding past any such bound:
    docs/design.md, "Known limitations").  The schedule's measured peak is under its budget."""
    torch.manual_seed(0)
    model = ConvNet().double()
    gen = torch.Generator().manual_seed(1)
    x = torch.randn(8, 3, 16, 16, generator=gen, dtype=torch.float64)
    y = torch.randint(0, CLASSES, (8,), generator=gen)
    plan = prepare(copy.deepcopy(model), x, loss_fn=F.cross_entropy, target=y, cost="analytic", progress=False,
                   compile=True)
    sol = plan.solve("min", time_limit=20)
    assert sol.meta.compiled and sol.schedule.recompute_count() > 0
    wrapper = plan.wrap(sol, WithLoss(copy.deepcopy(model), F.cross_entropy))
    reference = torch.compile(WithLoss(copy.deepcopy(model), F.cross_entropy))
    loss_ref, grads_ref = _step(reference, x, y)
    loss, grads = _step(wrapper, x, y)
    assert torch.allclose(loss, loss_ref, rtol=1e-12, atol=0)
    worst = chk.max_rel_diff(dict(enumerate(grads)), dict(enumerate(grads_ref)))
    assert len(grads) == len(grads_ref) and worst <= 1e-10, f"gradients {worst:.2e} from torch.compile's"
    peak = chk.step_peak(wrapper, ExampleInputs((x,), {"target": y}))
    assert peak <= sol.meta.budget_bytes


class _ConvolutionLayouts(TorchDispatchMode):
    """Whether each convolution (forward and backward) the step runs reads a channels-last activation."""

    def __init__(self):
        super().__init__()
        self.channels_last = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func in (torch.ops.aten.convolution.default, torch.ops.aten.convolution_backward.default):
            x = args[1] if func is torch.ops.aten.convolution_backward.default else args[0]
            self.channels_last.append(x.is_contiguous(memory_format=torch.channels_last))
        return func(*args, **(kwargs or {}))


def test_a_float32_convolution_network_runs_channels_last_under_its_budget():
    """In float32 the compiled step runs its convolutions channels-last, as ``torch.compile``
    does (Inductor's layout optimization): every convolution of the step, forward and backward,
    reads a channels-last activation, the saved values included; the measured peak is under the
    budget and the gradients are ``torch.compile``'s within 1e-4 relative (two BatchNorm blocks
    in float32).  A float64 network runs eager's layout (`monet.compiled.channels_last`)."""
    torch.manual_seed(0)
    model = ConvNet()
    gen = torch.Generator().manual_seed(1)
    x = torch.randn(8, 3, 16, 16, generator=gen)
    y = torch.randint(0, CLASSES, (8,), generator=gen)
    plan = prepare(copy.deepcopy(model), x, loss_fn=F.cross_entropy, target=y, cost="analytic", progress=False,
                   compile=True)
    assert channels_last(plan.graph) and not channels_last(_plan_of_float64_graph(model, x, y))
    sol = plan.solve("min", time_limit=20)
    assert sol.schedule.recompute_count() > 0
    wrapper = plan.wrap(sol, WithLoss(copy.deepcopy(model), F.cross_entropy))
    reference = torch.compile(WithLoss(copy.deepcopy(model), F.cross_entropy))
    loss_ref, grads_ref = _step(reference, x, y)
    _step(wrapper, x, y)
    layouts = _ConvolutionLayouts()
    with layouts:
        loss, grads = _step(wrapper, x, y)
    assert len(layouts.channels_last) >= 2 * 5 and all(layouts.channels_last[1:]), layouts.channels_last
    assert torch.allclose(loss, loss_ref, rtol=1e-5, atol=0)
    worst = chk.max_rel_diff(dict(enumerate(grads)), dict(enumerate(grads_ref)))
    assert len(grads) == len(grads_ref) and worst <= 1e-4, f"gradients {worst:.2e} from torch.compile's"
    peak = chk.step_peak(wrapper, ExampleInputs((x,), {"target": y}))
    assert peak <= sol.meta.budget_bytes, f"measured {peak} bytes over the budget {sol.meta.budget_bytes}"


def _plan_of_float64_graph(model, x, y):
    return prepare(copy.deepcopy(model).double(), x.double(), loss_fn=F.cross_entropy, target=y, cost="analytic",
                   progress=False, compile=True).graph
