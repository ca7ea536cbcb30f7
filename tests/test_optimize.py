"""`monet.optimize`, the one call: a loss traced with the model, the solution saved and loaded, the
optimizer's state and accumulated gradients counted in the budget, refusals of bad arguments.

The plans cost with ``hybrid`` (`monet.optimize`'s default): the workspace is measured on the
machine that runs the tests, and the budgets follow the smallest feasible one found on it."""
from __future__ import annotations

import copy
import warnings

import pytest
import torch
import torch.nn.functional as F

import monet
from monet.inputs import ExampleInputs
from monet.plan import WithLoss, optimizer_state_bytes, prepare
from monet.profiling import measure as chk
from monet.profiling.peak import live_tensor_bytes, measure_peak
from monet.wrapper import MONeTWrapper
from usernet import UserNet, labelled_batch

SHAPE = (3, 16, 16)
BATCH = 8


@pytest.fixture(scope="module")
def batch():
    return labelled_batch(BATCH, SHAPE)


@pytest.fixture(scope="module")
def plan(batch, tmp_path_factory):
    x, y = batch
    torch.manual_seed(0)
    return prepare(UserNet(), x, loss_fn=F.cross_entropy, target=y, progress=False,
                   cache_dir=tmp_path_factory.mktemp("costs"))


def _budget(plan, reserved: int) -> int:
    """90 % of the plain peak, or the smallest feasible budget found plus ``reserved`` bytes where
    that is more: the workspace is measured here, so whether 90 % leaves room for the reserved
    bytes depends on the machine."""
    from monet.solver.solve import min_budget

    return max(int(0.9 * plan.eager_peak_bytes), min_budget(plan.graph, plan.costs, "normal", time_limit=5)[0] + reserved)


def _fresh(plan):
    return WithLoss(copy.deepcopy(plan.module.model), F.cross_entropy)


def test_one_call_trains_as_pytorch_and_saves(batch, tmp_path):
    x, y = batch
    torch.manual_seed(0)
    model = UserNet()
    plain = WithLoss(copy.deepcopy(model), F.cross_entropy)
    needs_grad = x.detach().clone().requires_grad_()  # the costs and the calibration train on it
    wrapped = monet.optimize(model, needs_grad, budget="min", loss_fn=F.cross_entropy, target=y, time_limit=5,
                             progress=False, cache_dir=tmp_path / "costs")
    assert needs_grad.grad is None  # left as it was given
    meta = wrapped.solution.meta  # the workspace is measured here: the plain peak may be the smallest
    assert wrapped.solution.schedule.recompute_count() > 0 or meta.budget_bytes == meta.eager_peak_bytes
    inputs = dict(target=y)
    lw, gw = chk.train_losses(wrapped, ExampleInputs((needs_grad,), inputs))
    lp, gp = chk.train_losses(plain, ExampleInputs((needs_grad,), inputs))
    assert all(torch.equal(a, b) for a, b in zip(lw, lp)) and all(torch.equal(gw[k], gp[k]) for k in gp)
    path = tmp_path / "usernet.monet"
    wrapped.solution.save(path)
    again = MONeTWrapper(WithLoss(copy.deepcopy(model), F.cross_entropy), path)
    assert again.solution == wrapped.solution
    assert torch.isfinite(again(needs_grad, target=y))


def test_a_loss_solution_loads_back_on_the_model_alone(plan, batch, tmp_path):
    """A solution solved with ``loss_fn=`` records the loss by name; ``MONeTWrapper(model, file)``
    puts the model in ``WithLoss`` with it again (it raised a graph mismatch); a loss
    that cannot be imported by name (a lambda) is refused with what to pass instead."""
    x, y = batch
    sol = plan.solve("90%", time_limit=5)
    assert sol.meta.loss == "torch.nn.functional.cross_entropy"
    path = tmp_path / "usernet.monet"
    sol.save(path)
    net = copy.deepcopy(plan.module.model)
    again = MONeTWrapper(net, path)
    assert isinstance(again.model, WithLoss) and again.model.model is net
    assert set(again.state_dict()) == set(net.state_dict())
    torch.manual_seed(3)
    loss = again(x, target=y)
    torch.manual_seed(3)
    reference = F.cross_entropy(copy.deepcopy(net)(x), y)
    assert torch.equal(loss, reference)
    sol.meta.loss = "tests.test_optimize.<lambda>"
    sol.save(path)
    with pytest.raises(monet.SolutionMismatchError, match=r"WithLoss\(model, loss_fn\)"):
        MONeTWrapper(copy.deepcopy(net), path)
    assert isinstance(MONeTWrapper(WithLoss(net, F.cross_entropy), path).model, WithLoss)


def test_a_percentage_with_an_optimizer_is_of_plain_pytorch_with_its_state(plan):
    """"50%" with ``optimizer="adam"`` is half of what plain PyTorch holds with Adam's state (its
    simulated peak plus the state), the state then taken out; ``budget="min"`` with an optimizer
    gives the smallest schedule (it was refused, and a percentage of the peak without
    the state could leave less than the state itself)."""
    state = optimizer_state_bytes(plan.graph.param_bytes, "adam")
    sol = plan.solve("95%", optimizer="adam", time_limit=5)
    assert sol.meta.budget_bytes == int(0.95 * (plan.eager_peak_bytes + state)) - state
    least = plan.solve("min", optimizer="adam", time_limit=5)
    assert least.meta.predicted_peak_bytes <= least.meta.budget_bytes
    with pytest.raises(ValueError, match=r"do not fit the budget.*budget=\"min\" with optimizer='adam'"):
        plan.solve(state // 2, optimizer="adam")


def test_optimizer_state_is_counted(plan, batch):
    """With Adam, the budget covers the iteration and Adam's two state tensors per parameter."""
    x, y = batch
    state = optimizer_state_bytes(plan.graph.param_bytes, "adam")
    assert state == 2 * plan.graph.param_bytes > 0
    budget = _budget(plan, state)
    sol = plan.solve(budget, optimizer="adam", time_limit=5)
    assert sol.meta.budget_bytes == budget - state
    wrapped = plan.wrap(sol, _fresh(plan))
    opt = torch.optim.Adam(wrapped.parameters())
    wrapped(x, target=y).backward()
    opt.step()  # Adam's state now exists
    opt.zero_grad(set_to_none=True)
    wrapped(x, target=y).backward()  # warm
    opt.zero_grad(set_to_none=True)
    base = live_tensor_bytes(wrapped, opt, x, y, device="cpu")
    peak = measure_peak(lambda: wrapped(x, target=y).backward(), "cpu", baseline_bytes=base).peak_bytes
    assert peak <= budget
    # the state is really there: the iteration's predicted peak plus Adam's state (within 2 %)
    assert abs(peak - (sol.meta.predicted_peak_bytes + state)) <= 0.02 * peak


def test_accumulated_gradients_are_counted(plan, batch):
    """Two micro-batches accumulated: PyTorch's gradients, and the second one's peak (with the
    first one's gradients allocated) within the budget."""
    x, y = batch
    budget = _budget(plan, plan.graph.param_bytes)
    sol = plan.solve(budget, accumulate_grads=True, time_limit=5)
    assert sol.meta.budget_bytes == budget - plan.graph.param_bytes
    wrapped, plain = plan.wrap(sol, _fresh(plan)), _fresh(plan)
    halves = [(x[:4], y[:4]), (x[4:], y[4:])]
    for m in (wrapped, plain):
        torch.manual_seed(1)
        for xs, ys in halves:
            m(xs, target=ys).backward()
    for p, q in zip(wrapped.parameters(), plain.parameters()):
        assert torch.equal(p.grad, q.grad)
    # the second micro-batch at full size, with gradients already allocated
    base = live_tensor_bytes(wrapped, x, y, device="cpu")
    peak = measure_peak(lambda: wrapped(x, target=y).backward(), "cpu", baseline_bytes=base).peak_bytes
    assert peak <= budget


def test_bad_arguments_are_refused(plan, batch):
    x, _ = batch
    with pytest.raises(ValueError, match="unknown optimizer 'lion'"):
        plan.solve("90%", optimizer="lion")
    with pytest.raises(ValueError, match="if_infeasible"):
        plan.solve("90%", if_infeasible="ignore")
    with pytest.raises(ValueError, match="does not fit|do not fit"):
        plan.solve(1000, optimizer="adam")
    with pytest.raises(ValueError, match="target"):
        monet.optimize(UserNet(), x, loss_fn=F.cross_entropy, progress=False)
    with pytest.raises(ValueError, match="mode"):
        monet.optimize(UserNet(), x, mode="fastest", progress=False)


class _WideHead(torch.nn.Module):
    """A language-model-like output: a small body and a wide head, so the outputs are a large part
    of the peak (as logits over a vocabulary are)."""

    def __init__(self):
        super().__init__()
        self.body = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.GELU())
        self.head = torch.nn.Linear(64, 2048)

    def forward(self, x):
        return self.head(self.body(x))


def test_a_loss_outside_the_graph_is_named_and_traced_in_it_holds_the_budget(tmp_path):
    torch.manual_seed(0)
    x, y = torch.randn(64, 32), torch.randint(0, 2048, (64,))
    model = _WideHead()
    with pytest.warns(UserWarning, match="hold no scalar loss.*loss_fn= and target="):
        outside = prepare(copy.deepcopy(model), x, cost="analytic", progress=False, cache_dir=tmp_path)
    # what the warning says: the caller's loss on the outputs is not in the budget
    sol = outside.solve("100%", time_limit=5)
    wrapped = outside.wrap(sol, copy.deepcopy(model))
    with_ce = lambda out: F.cross_entropy(out, y)  # noqa: E731
    assert chk.step_peak(wrapped, outside.inputs, with_ce) > sol.meta.budget_bytes
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # traced with the model: no warning, and the budget holds
        inside = prepare(copy.deepcopy(model), x, loss_fn=F.cross_entropy, target=y, cost="analytic",
                         progress=False, cache_dir=tmp_path)
    sol = inside.solve("100%", time_limit=5)
    wrapped = inside.wrap(sol, WithLoss(copy.deepcopy(model), F.cross_entropy))
    assert chk.step_peak(wrapped, inside.inputs) <= sol.meta.budget_bytes


def test_the_options_object_and_the_keywords_are_one_call(batch, tmp_path):
    """``optimize(..., options=Options(...))`` and the same fields as keywords solve the same
    schedule; a keyword that is no option is refused with the list of options."""
    from monet.options import Options

    x, y = batch
    torch.manual_seed(0)
    model = UserNet()
    common = dict(budget="min", loss_fn=F.cross_entropy, target=y, time_limit=5)
    by_keywords = monet.optimize(copy.deepcopy(model), x, **common, progress=False, cost="analytic",
                                 cache_dir=tmp_path / "costs")
    by_object = monet.optimize(copy.deepcopy(model), x, **common,
                               options=Options(progress=False, cost="analytic", cache_dir=tmp_path / "costs"))
    assert by_object.solution.schedule == by_keywords.solution.schedule
    assert by_object.solution.meta.cost_source == by_keywords.solution.meta.cost_source
    with pytest.raises(TypeError, match="'costs'.*its options are mode, optimizer"):
        monet.optimize(model, x, costs="analytic")
    with pytest.raises(TypeError, match="options= takes a monet.options.Options"):
        monet.optimize(model, x, options={"mode": "full"})


def test_optimize_takes_at_most_ten_parameters():
    import inspect

    assert len(inspect.signature(monet.optimize).parameters) <= 10
