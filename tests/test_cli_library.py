"""The library pieces the command line is built on: `monet.models.build`, `monet.profiling.training`
(the demo's loss), `monet.profiling.comparison` and `.frontier` (the demo's rows and plot),
and `monet.profiling.sources.gpu_spec_for_hybrid`."""
import copy

import pytest
import torch
from torch import nn

from monet.inputs import ExampleInputs
from monet.models import build, input_info
from monet.profiling.sources import gpu_spec_for_hybrid
from monet.profiling.comparison import MethodResult, Training
from monet.profiling.frontier import frontier_plot
from monet.profiling.training import random_target


def test_build_is_seeded_and_reports_what_is_wrong(tmp_path):
    (tmp_path / "lm.py").write_text("import torch.nn as nn\n\ndef build():\n    return nn.Embedding(7, 4)\n")
    name = f"{tmp_path / 'lm.py'}:build"
    (m1, x1), (m2, x2) = build(name, 2, inputs_spec="8:int64:7"), build(name, 2, inputs_spec="8:int64:7")
    assert torch.equal(m1.weight, m2.weight) and torch.equal(x1.first, x2.first)
    assert input_info(x1, "8:int64:7") == dict(batch_size=2, input_shape=(8,), dtype="int64",
                                               inputs_spec="8:int64:7")
    with pytest.raises(ValueError, match="batch size .* must be positive, got 0"):
        build(name, 0, (8,))
    with pytest.raises(ValueError, match="cannot build model 'no_such_model'"):
        build("no_such_model", 2, (3, 8, 8))


class Tiny(nn.Module):
    def __init__(self):
        super().__init__()
        self.a, self.b = nn.Linear(6, 8), nn.Linear(8, 3)

    def forward(self, x):
        return self.b(torch.relu(self.a(x)))


def _training(model, x, steps=3):
    loss_fn, target = random_target(model, x, tokens=False)
    return Training.of(copy.deepcopy(model), x, steps, lambda out: loss_fn(out, target))


def test_training_of_one_model_against_itself_is_bitwise():
    torch.manual_seed(0)
    model = Tiny()
    x = ExampleInputs.of(torch.randn(4, 6))
    a, b = _training(model, x), _training(model, x)
    assert len(a.losses) == 3 and a.versus(b) == (True, 0.0)
    assert a.losses[2] < a.losses[0]  # SGD trains


def test_training_sees_a_different_model():
    torch.manual_seed(0)
    model = Tiny()
    other = copy.deepcopy(model)
    with torch.no_grad():
        other.b.weight.mul_(1.5)
    x = ExampleInputs.of(torch.randn(4, 6))
    bitwise, error = _training(other, x, steps=1).versus(_training(model, x, steps=1))
    assert not bitwise and error > 0


def test_random_target_of_a_language_model_takes_classes_from_the_last_dim():
    class LM(nn.Module):
        def __init__(self):
            super().__init__()
            self.emb = nn.Embedding(11, 11)

        def forward(self, ids):
            return self.emb(ids)  # (B, T, V)

    ids = ExampleInputs.of(torch.randint(0, 11, (2, 5)))
    loss_fn, target = random_target(LM(), ids, tokens=True)
    assert target.shape == (2, 5) and int(target.max()) < 11
    loss = loss_fn(ids.call(LM()), target)
    assert loss.dim() == 0 and torch.isfinite(loss)


def test_random_target_of_a_model_with_its_own_loss_is_none():
    class Own(nn.Module):
        def forward(self, x):
            return {"loss": x.sum()}

    assert random_target(Own(), ExampleInputs.of(torch.randn(2, 3)), tokens=False) is None


def test_frontier_plot_writes_a_png(tmp_path):
    rows = [MethodResult("plain PyTorch", peak_bytes=100 * 2**20, overhead=0.0),
            MethodResult("monet 50%", peak_bytes=50 * 2**20, overhead=0.1),
            MethodResult("monet 40%", peak_bytes=40 * 2**20, overhead=0.4),
            MethodResult("Chen sqrt(n)", note="n/a: not sequential")]  # no peak: left out
    out = frontier_plot(rows, tmp_path / "f.png", title="t")
    assert out.read_bytes().startswith(b"\x89PNG\r\n\x1a\n")
    with pytest.raises(OSError):
        frontier_plot(rows, tmp_path / "missing" / "f.png")


def test_gpu_spec_for_hybrid_on_the_cpu_is_its_own():
    assert gpu_spec_for_hybrid("cpu") is None
