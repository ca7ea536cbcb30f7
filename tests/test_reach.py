"""The reach suite: real models from torchvision, timm and Hugging Face transformers, through
`monet.optimize`'s steps (`monet.plan.prepare`, then ``Plan.solve`` in normal and full mode).

For each model (tiny configurations, `tests/reach_models.py`): capture through Dynamo, cost with
measured workspace, solve at 50 % of plain PyTorch's simulated peak (the smallest feasible budget
found when that is higher), then train three SGD steps with the schedule and with plain PyTorch
from the same weights and RNG.  Asserted: the measured peak of an iteration is within the budget
and within 2 % of the prediction; gradients are bitwise PyTorch's in normal mode (recomputation
only) and within 1e-5 (relative) in full mode; the three losses are PyTorch's (bitwise in normal
mode).  A package that does not import skips its models with the reason.
"""
from __future__ import annotations

import copy

import pytest
import torch
import torch.nn.functional as F

import reach_models as rm
from monet.inputs import ExampleInputs
from monet.plan import WithLoss, prepare
from monet.profiling import check as chk

TIME_LIMIT = 3.0  # seconds per solve: tiny graphs; the budget guarantee does not depend on it
GRAD_TOLERANCE = 1e-5
PREDICTION_TOLERANCE = 0.02

_plans: dict = {}


def _plan(name: str, tmp_path_factory):
    """Capture and cost a model once for both modes: (plan, model, inputs as called, target)."""
    if name not in _plans:
        reason = rm.missing(rm.MODELS[name][0])
        if reason:
            _plans[name] = reason
        else:
            model, inputs, target = rm.build(name)
            kw = dict(loss_fn=F.cross_entropy, target=target) if target is not None else {}
            plan = prepare(copy.deepcopy(model), inputs, progress=False,
                           cache_dir=tmp_path_factory.mktemp("costs"), **kw)
            _plans[name] = (plan, model, target)
    if isinstance(_plans[name], str):
        pytest.skip(_plans[name])
    return _plans[name]


@pytest.mark.parametrize("mode", ["normal", "full"])
@pytest.mark.parametrize("name", list(rm.MODELS))
def test_reach(name, mode, tmp_path_factory):
    plan, model, target = _plan(name, tmp_path_factory)
    sol = plan.solve("50%", mode=mode, time_limit=TIME_LIMIT, if_infeasible="smallest")
    meta = sol.meta
    assert meta.predicted_peak_bytes <= meta.budget_bytes
    assert meta.budget_bytes >= min(int(0.5 * meta.eager_peak_bytes), meta.budget_bytes)

    def fresh():
        m = copy.deepcopy(model)
        return WithLoss(m, F.cross_entropy) if target is not None else m

    inputs = plan.inputs  # with target=... for a classifier, as the wrapper is called
    wrapped, plain = plan.wrap(sol, fresh()), fresh()
    losses_w, grads_w = chk.train_losses(wrapped, inputs)
    losses_p, grads_p = chk.train_losses(plain, inputs)
    assert grads_w.keys() == grads_p.keys() and grads_w
    if mode == "normal" or not sol.schedule.impl:
        assert all(torch.equal(grads_w[k], grads_p[k]) for k in grads_p), chk.grad_rel_error(grads_w, grads_p)
        assert all(torch.equal(a, b) for a, b in zip(losses_w, losses_p)), (losses_w, losses_p)
    else:
        assert chk.grad_rel_error(grads_w, grads_p) <= GRAD_TOLERANCE
        assert torch.allclose(torch.stack(losses_w), torch.stack(losses_p), rtol=1e-5, atol=0)

    measured = chk.step_peak(wrapped, inputs)
    assert measured <= meta.budget_bytes, (measured, meta.budget_bytes)
    assert abs(meta.predicted_peak_bytes - measured) <= PREDICTION_TOLERANCE * measured, \
        (meta.predicted_peak_bytes, measured)


def test_smaller_batch_of_a_language_model(tmp_path_factory):
    """The last batch of an epoch: a GPT-2 schedule solved for batch 2 runs batch 1 with PyTorch's
    gradients (bitwise) and under the budget."""
    plan, model, _ = _plan("transformers/gpt2", tmp_path_factory)
    sol = plan.solve("50%", mode="normal", time_limit=TIME_LIMIT, if_infeasible="smallest")
    one = {k: (v[:1] if isinstance(v, torch.Tensor) else v) for k, v in plan.inputs.kwargs.items()}
    wrapped, plain = plan.wrap(sol, copy.deepcopy(model)), copy.deepcopy(model)
    _, gw = chk.train_losses(wrapped, one, steps=1)
    _, gp = chk.train_losses(plain, one, steps=1)
    assert all(torch.equal(gw[k], gp[k]) for k in gp)
    assert wrapped._traced.monet_compiled["graph"].input_shape[0] == 1
    assert chk.step_peak(wrapped, one) <= sol.meta.budget_bytes


def test_cache_output_is_refused_with_the_fix():
    """GPT-2 with its default use_cache=True returns a DynamicCache: the error says use_cache=False."""
    from monet.capture import CaptureError, capture

    reason = rm.missing("transformers")
    if reason:
        pytest.skip(reason)
    model, inputs, _ = rm.build("transformers/gpt2")
    inputs = {k: v for k, v in inputs.items() if k != "use_cache"}
    with pytest.raises(CaptureError, match="use_cache=False"):
        capture(model, inputs)


def test_graph_break_names_the_construct():
    """A construct Dynamo cannot put in one graph is refused with its place in the model."""
    from monet.capture import CaptureError, capture

    class Printing(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = torch.nn.Linear(4, 4)

        def forward(self, x):
            y = self.lin(x)
            print(y.tolist())  # reads values in Python: a graph break
            return y

    with pytest.raises(CaptureError, match=r"test_reach\.py:\d+.*(graph break|data-dependent|tolist)"):
        capture(Printing(), torch.randn(2, 4))


def test_example_inputs_forms():
    x = torch.randn(2, 3)
    assert ExampleInputs.of(x).args == (x,)
    assert ExampleInputs.of((x, x)).batch_size == 2
    assert ExampleInputs.of({"input_ids": torch.zeros(5, 7, dtype=torch.long)}).batch_size == 5
    with pytest.raises(TypeError, match="no tensor"):
        ExampleInputs.of({"use_cache": False})
    with pytest.raises(TypeError, match="tensor, a tuple"):
        ExampleInputs.of("x")
