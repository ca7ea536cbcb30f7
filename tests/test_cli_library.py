"""The library pieces the command line is built on: `monet.models.build`, `monet.profiling.training`
(the demo's side-by-side training), `monet.profiling.sources.gpu_spec_for_hybrid` and
`monet.profiling.markdown.write_section`."""
import copy

import pytest
import torch
from torch import nn

from monet.inputs import ExampleInputs
from monet.models import build, input_info
from monet.profiling.markdown import write_section
from monet.profiling.sources import gpu_spec_for_hybrid
from monet.profiling.training import random_target_loss, train_side_by_side


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


def test_side_by_side_of_one_model_with_itself_is_identical():
    torch.manual_seed(0)
    model = Tiny()
    x = ExampleInputs.of(torch.randn(4, 6))
    loss_fn = random_target_loss(model, x, tokens=False)
    res = train_side_by_side(copy.deepcopy(model), copy.deepcopy(model), x, loss_fn, steps=3,
                             same=copy.deepcopy(model))
    assert len(res.schedule_losses) == len(res.plain_losses) == len(res.same_losses) == 3
    assert res.identical and res.identical_to_same and res.grad_diff == 0.0 and res.same_diff == 0.0
    assert res.plain_losses[2] < res.plain_losses[0]  # SGD trains


def test_side_by_side_sees_a_different_model():
    torch.manual_seed(0)
    model = Tiny()
    other = copy.deepcopy(model)
    with torch.no_grad():
        other.b.weight.mul_(1.5)
    x = ExampleInputs.of(torch.randn(4, 6))
    res = train_side_by_side(other, copy.deepcopy(model), x, random_target_loss(model, x, False), steps=1)
    assert not res.identical and res.grad_diff > 0 and res.same_losses == []


def test_random_target_loss_of_a_language_model_takes_classes_from_the_last_dim():
    class LM(nn.Module):
        def __init__(self):
            super().__init__()
            self.emb = nn.Embedding(11, 11)

        def forward(self, ids):
            return self.emb(ids)  # (B, T, V)

    ids = ExampleInputs.of(torch.randint(0, 11, (2, 5)))
    loss = random_target_loss(LM(), ids, tokens=True)(ids.call(LM()))
    assert loss.dim() == 0 and torch.isfinite(loss)


def test_gpu_spec_for_hybrid_on_the_cpu_is_its_own():
    assert gpu_spec_for_hybrid("cpu") is None


def test_write_section_replaces_in_place_and_appends(tmp_path):
    md = tmp_path / "B.md"
    md.write_text("# B\n\n## One\n\nold\n\n## Two\n\nkept\n")
    write_section(md, "## One\n\nnew", "## One")
    assert md.read_text() == "# B\n\n## One\n\nnew\n\n## Two\n\nkept\n"
    write_section(md, "## Three\n\nthird", "## Three")
    assert md.read_text().endswith("## Two\n\nkept\n\n## Three\n\nthird\n")
    write_section(tmp_path / "new.md", "## Only\n\ntext", "## Only")
    assert (tmp_path / "new.md").read_text() == "## Only\n\ntext\n"
