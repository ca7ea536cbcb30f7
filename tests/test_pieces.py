"""Models Dynamo captures only in pieces (graph breaks), trained through `monet.optimize`
(`monet.pieces`): gradients bitwise those of plain PyTorch, the measured peak of an iteration
within the one budget, the graph breaks named, errors that say what fits."""
from __future__ import annotations

import copy
import warnings

import pytest
import torch
import torch.nn as nn

import monet
import reach_models as rm
from ci import skip_unless_long
from monet.inputs import ExampleInputs
from monet.pieces import PiecewiseModule, describe_breaks, find
from monet.profiling import measure as chk
from monet.terms import MonetWarning

SOLVE = dict(time_limit=4, cost="analytic", progress=False)


class Chatty(nn.Module):
    """A forward that prints a value (``.item()``) and branches on one: three graph breaks."""

    def __init__(self, width: int = 128, depth: int = 10):
        super().__init__()
        self.a = nn.Sequential(nn.Linear(32, width), *[nn.Sequential(nn.Linear(width, width), nn.Tanh())
                                                       for _ in range(depth)])
        self.bn = nn.BatchNorm1d(width)
        self.b = nn.Sequential(*[nn.Sequential(nn.Linear(width, width), nn.Tanh()) for _ in range(depth)])
        self.head = nn.Linear(width, 4)

    def forward(self, x):
        h = self.bn(self.a(x))
        print(f"mean activation {h.mean().item():.3f}")
        if x.mean() > 0:  # the batch's sign: the test of the other branch flips it
            h = self.b(h)
        else:
            h = self.b(-h)
        return self.head(h).square().mean()


def _trains_as_pytorch(model: nn.Module, x, budget="50%", **kw) -> PiecewiseModule:
    """Optimize a copy of ``model`` in pieces; assert bitwise gradients and losses over three steps,
    and the measured peak within the budget."""
    wrapped = monet.optimize(copy.deepcopy(model), x, budget, **{**SOLVE, **kw})
    assert isinstance(wrapped, PiecewiseModule) and len(wrapped.solutions) >= 2
    inputs = ExampleInputs.of(x)
    losses_w, grads_w = chk.train_losses(wrapped, inputs)
    losses_p, grads_p = chk.train_losses(copy.deepcopy(model), inputs)
    assert grads_w.keys() == grads_p.keys() and grads_w
    assert all(torch.equal(grads_w[k], grads_p[k]) for k in grads_p), chk.grad_rel_error(grads_w, grads_p)
    assert all(torch.equal(a, b) for a, b in zip(losses_w, losses_p)), (losses_w, losses_p)
    measured = chk.step_peak(wrapped, inputs)
    assert measured <= wrapped.budget_bytes, (measured, wrapped.budget_bytes)
    assert wrapped.budget_bytes <= 0.5 * wrapped.eager_peak_bytes + 1 or budget != "50%"
    return wrapped


def test_a_model_that_prints_reads_a_value_and_branches_trains_in_pieces(capsys):
    torch.manual_seed(0)
    wrapped = _trains_as_pytorch(Chatty(), torch.randn(1024, 32).abs())
    assert "mean activation" in capsys.readouterr().out  # the eager code between the pieces ran
    assert sum(p.trainable for p in wrapped.pieces) == len(wrapped.solutions) == 2
    assert [s.meta.budget_bytes < wrapped.budget_bytes for s in wrapped.solutions] == [True, True]
    assert wrapped.state_dict().keys() == Chatty().state_dict().keys()


def test_the_log_names_each_graph_break_and_piece():
    torch.manual_seed(0)
    model = Chatty(width=16, depth=1)
    _, backend, reasons = find(model, ExampleInputs.of(torch.randn(8, 32)))
    lines = describe_breaks(backend, reasons)
    assert any("item()" in line for line in lines) and any("print" in line for line in lines), lines
    assert len(backend.pieces) == 3
    assert "run plainly" in lines[-2] and "test_pieces.py:" in lines[-1], lines  # `x.mean() > 0` trains nothing
    assert all(b.grad is None for b in model.parameters())  # find left the model as it was
    assert int(model.bn.num_batches_tracked) == 0


def test_the_branch_the_example_did_not_take_runs_plainly_with_a_warning():
    torch.manual_seed(0)
    model = Chatty(width=64, depth=6)
    x = torch.randn(1024, 32).abs()
    wrapped = monet.optimize(copy.deepcopy(model), x, "80%", **SOLVE)
    plain = copy.deepcopy(model)
    with pytest.warns(MonetWarning, match="branch the example batch did not take"):
        wrapped(-x).backward()
    plain(-x).backward()
    for (n, p), q in zip(plain.named_parameters(), wrapped.module.parameters()):
        assert torch.equal(p.grad, q.grad), n


def test_a_budget_no_piece_fits_names_the_piece_and_what_it_needs():
    torch.manual_seed(0)
    with pytest.raises(monet.InfeasibleBudgetError, match=r"piece \d of the model \(test_pieces\.py:\d+.*give budget=\d+"):
        monet.optimize(Chatty(width=64, depth=2), torch.randn(256, 32), 4096, **SOLVE)
    with pytest.raises(ValueError, match="min"):
        monet.optimize(Chatty(width=16, depth=1), torch.randn(8, 32), "min", **SOLVE)


def test_capture_alone_still_refuses_a_graph_break():
    from monet.capture import capture
    from monet.frontend import GraphBreakError

    with pytest.raises(GraphBreakError, match="monet.optimize trains such a model in pieces"):
        capture(Chatty(width=16, depth=1), torch.randn(8, 32))


def test_wav2vec2_for_ctc_trains_in_pieces():
    skip_unless_long("Wav2Vec2ForCTC in 7 pieces", 30, covered="test_a_model_that_prints_reads_a_value_and_branches_"
               "trains_in_pieces trains a model with graph breaks")
    reason = rm.missing("transformers")
    if reason:
        pytest.skip(reason)
    model, inputs, _ = rm.build("transformers/wav2vec2-ctc", batch=4)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", MonetWarning)
        wrapped = _trains_as_pytorch(model, inputs)
    assert len(wrapped.pieces) > len(wrapped.solutions) >= 3
