"""A deep stack of identical layers exported from a copy with a few of them (monet.stack):
the graph written from the copy is the graph Dynamo exports from the deep model (same joint graph,
fingerprint and primals), it computes what the model computes, and whatever does not repeat is
refused and exported whole."""
from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch
import torch.nn as nn

import monet.stack as stack
from monet.capture import capture
from monet.frontend import export
from monet.inputs import ExampleInputs
from monet.stack import KEEP, NotRepeatable, export_stack, repeat_layers, shallow_copy

sys.path.insert(0, str(Path(__file__).resolve().parent))

HIDDEN, BATCH, LAYERS = 16, 8, 9


class Layer(nn.Module):
    def __init__(self, index: int = 0, alternate: bool = False, shared: nn.Module | None = None):
        super().__init__()
        self.index, self.alternate, self.shared = index, alternate, shared
        self.norm = nn.LayerNorm(HIDDEN)
        self.up = nn.Linear(HIDDEN, 2 * HIDDEN)
        self.down = nn.Linear(2 * HIDDEN, HIDDEN)

    def forward(self, x, scale):
        h = torch.relu(self.up(self.norm(x if self.shared is None else self.shared(x))))
        if self.alternate and self.index % 2:  # what transformers' alternating attention types do
            h = h * 0.5
        return x + self.down(h) * scale


class Deep(nn.Module):
    def __init__(self, layers: int = LAYERS, alternate: bool = False, every: bool = False, shared: bool = False):
        super().__init__()
        self.embed = nn.Linear(4, HIDDEN)
        one = nn.Linear(HIDDEN, HIDDEN) if shared else None  # one module in every layer: tied weights
        self.register_buffer("scale", torch.full((HIDDEN,), 0.5))  # shared by the layers
        self.blocks = nn.ModuleList(Layer(k, alternate, one) for k in range(layers))
        self.head = nn.Linear(HIDDEN, 3)
        self.every = every

    def forward(self, x):
        x = self.embed(x)
        outs = []
        for block in self.blocks:
            x = block(x, self.scale)
            outs.append(x)
        if self.every:  # a suffix that reads every layer's output
            x = torch.stack(outs).sum(0)
        return self.head(x).square().mean()


def _deep(**kw):
    torch.manual_seed(0)
    return Deep(**kw), torch.randn(BATCH, 4)


def _written(model, x):
    small = shallow_copy(model, "blocks", KEEP)
    return repeat_layers(export(small, ExampleInputs.of(x)), small, model, "blocks", len(model.blocks))


def test_the_written_graph_computes_what_the_model_computes():
    model, x = _deep()
    gm = _written(model, x)
    assert sum(n.op == "call_module" or n.op == "call_function" for n in gm.graph.nodes) > LAYERS * 4
    with torch.no_grad():
        assert torch.equal(gm(x), model(x))
    # the deep model's own parameters, in its order: an optimizer step on the model moves the graph
    assert [id(p) for p in gm.parameters()] == [id(p) for p in model.parameters()]
    with torch.no_grad():
        model.blocks[LAYERS - 2].down.weight.add_(1.0)
        assert torch.equal(gm(x), model(x))


@pytest.mark.parametrize("shared", [False, True], ids=["own", "tied"])
def test_the_written_graph_is_the_one_dynamo_exports(monkeypatch, shared):
    """Also where every layer holds one module (tied weights)."""
    model, x = _deep(shared=shared)
    whole = capture(model, x)
    monkeypatch.setattr(stack, "MIN_LAYERS", 6)
    logged = []
    written = capture(model, x, log=logged.append)
    # one module read by every layer: Dynamo reads its weights in layer 0's nodes, which every later
    # layer reads, so the stack does not repeat and is exported whole (said in the log)
    assert logged and ("exporting all 9 layers" if shared else "exported 4 of the 9 layers of blocks") in logged[0]
    assert written.fingerprint == whole.fingerprint
    assert written.primal_sources == whole.primal_sources
    assert len(written.fwd) == len(whole.fwd) and len(written.bwd) == len(whole.bwd)


@pytest.mark.parametrize("kw, why", [(dict(alternate=True), "is not layer 1's nodes again"),
                                     (dict(every=True), "of a layer before the last")])
def test_what_does_not_repeat_is_refused_and_exported_whole(kw, why, monkeypatch):
    model, x = _deep(**kw)
    with pytest.raises(NotRepeatable, match=why):
        _written(model, x)
    monkeypatch.setattr(stack, "MIN_LAYERS", 6)
    logged = []
    gm = export_stack(model, ExampleInputs.of(x), logged.append)
    assert "exporting all 9 layers" in logged[0]
    with torch.no_grad():
        assert torch.equal(gm(x), model(x))


def test_a_copy_too_short_to_compare_is_refused():
    model, x = _deep()
    small = shallow_copy(model, "blocks", 2)
    with pytest.raises(NotRepeatable, match="need at least 3"):
        repeat_layers(export(small, ExampleInputs.of(x)), small, model, "blocks", LAYERS)


def test_a_transformers_gpt2_is_written_as_dynamo_exports_it(monkeypatch):
    pytest.importorskip("transformers")
    from reach_models import declare_torchvision_ops

    declare_torchvision_ops()
    import transformers as tr

    torch.manual_seed(0)
    model = tr.GPT2LMHeadModel(tr.GPT2Config(n_layer=6, n_embd=32, n_head=2, vocab_size=64, n_positions=16,
                                             bos_token_id=0, eos_token_id=0)).train()
    ids = torch.randint(1, 64, (2, 16), generator=torch.Generator().manual_seed(1))
    inputs = {"input_ids": ids, "labels": ids, "use_cache": False}
    whole = capture(model, inputs)
    monkeypatch.setattr(stack, "MIN_LAYERS", 6)
    logged = []
    written = capture(model, inputs, log=logged.append)
    assert "exported 4 of the 6 layers of transformer.h" in logged[0]
    assert written.fingerprint == whole.fingerprint and written.primal_sources == whole.primal_sources


def test_the_copy_is_kept_for_the_costs_and_its_export_taken_once(monkeypatch):
    import monet.frontend as frontend

    model, x = _deep()
    monkeypatch.setattr(stack, "MIN_LAYERS", 6)
    capture(model, x)
    assert stack.take_copy(model, "blocks", KEEP) is None  # not asked to keep it
    capture(model, x, keep_copy=True)
    small = stack.take_copy(model, "blocks", KEEP)
    assert small is not None and len(small.blocks) == KEEP and stack.take_copy(model, "blocks", 3) is None
    exports, real = [], frontend.export
    monkeypatch.setattr(frontend, "export", lambda *a: exports.append(a) or real(*a))
    first = capture(small, x)  # the costs' capture of the copy: its export is the one already made
    assert exports == []
    again = capture(small, x)  # taken once: a capture may rewrite an export in place
    assert len(exports) == 1 and again.fingerprint == first.fingerprint
    stack.forget_copy()
    assert stack.take_copy(model, "blocks", KEEP) is None
