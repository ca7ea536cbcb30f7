"""The library pieces the command line is built on: `monet.models.build`, `monet.profiling.training`
(the demo's loss), `monet.profiling.comparison` and `.frontier` (the demo's rows and plot),
`monet.profiling.sources.gpu_spec_for_hybrid` and `monet.profiling.markdown.write_section`."""
import copy

import pytest
import torch
from torch import nn

from monet.inputs import ExampleInputs
from monet.models import build, input_info
from monet.profiling.markdown import write_section
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


def test_write_section_replaces_in_place_and_appends(tmp_path):
    md = tmp_path / "B.md"
    md.write_text("# B\n\n## One\n\nold\n\n## Two\n\nkept\n")
    write_section(md, "## One\n\nnew", "## One")
    assert md.read_text() == "# B\n\n## One\n\nnew\n\n## Two\n\nkept\n"
    write_section(md, "## Three\n\nthird", "## Three")
    assert md.read_text().endswith("## Two\n\nkept\n\n## Three\n\nthird\n")
    write_section(tmp_path / "new.md", "## Only\n\ntext", "## Only")
    assert (tmp_path / "new.md").read_text() == "## Only\n\ntext\n"


def test_write_section_of_a_subsection_keeps_its_siblings(tmp_path):
    """A ``###`` section ends at the next ``###`` or ``##`` heading (not inside a code block): its
    sibling subsections stay (the depth benchmark's ``--section '### 12 layers, bf16 autocast'``
    once replaced the 24-, 48- and 96-layer sections after it)."""
    md = tmp_path / "B.md"
    md.write_text("## Deep\n\nintro\n\n### 12\n\nold\n\n```\n# a comment\n```\n\n#### 12 detail\n\nx\n\n"
                  "### 24\n\nkept\n\n## Next\n\nkept too\n")
    write_section(md, "### 12\n\nnew", "### 12")
    assert md.read_text() == "## Deep\n\nintro\n\n### 12\n\nnew\n\n### 24\n\nkept\n\n## Next\n\nkept too\n"
