"""The zoo's model definitions: exact sizes, forward shapes, capture, and get_model's forms."""
import sys
import types

import pytest
import torch
from torch import nn

from monet.zoo.models import MODELS, example_input, get_model

# Parameter counts of the reference implementations (tied weights counted once): torchvision's
# resnet50, vgg16, mobilenet_v2 and googlenet(aux_logits=False); milesial's UNet(3, 2,
# bilinear=False) with bias-free DoubleConv convolutions; Hugging Face's GPT-2 small.
EXPECTED_PARAMS = {
    "resnet50": 25_557_032,
    "vgg16": 138_357_544,
    "mobilenet_v2": 3_504_872,
    "googlenet": 6_624_904,
    "unet": 31_037_698,
    "gpt2-small": 124_439_808,
}


def count_params(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())


def test_zoo_names():
    assert set(MODELS) == set(EXPECTED_PARAMS)


@pytest.mark.parametrize("name", sorted(EXPECTED_PARAMS))
def test_parameter_count(name):
    model = get_model(name)
    assert count_params(model) == EXPECTED_PARAMS[name] == MODELS[name].num_params


def test_gpt2_head_is_tied():
    """The LM head reuses the token embedding: one (vocab, width) parameter, no head bias."""
    model = get_model("gpt2-small", n_layer=1, n_embd=32, n_head=2, vocab_size=100, n_positions=16)
    model.eval()
    params = model.named_parameters(remove_duplicate=False)
    vocab_shaped = [n for n, p in params if p.shape[0] == 100]
    assert vocab_shaped == ["wte.weight"]
    final = {}

    def keep_output(module, args, out):
        final["x"] = out

    model.ln_f.register_forward_hook(keep_output)
    tokens = example_input("gpt2-small", 2, (8,), vocab_size=100)
    with torch.no_grad():
        logits = model(tokens)
    torch.testing.assert_close(logits, final["x"] @ model.wte.weight.T)


@pytest.mark.parametrize("name", ["resnet50", "vgg16", "mobilenet_v2", "googlenet"])
def test_classifier_forward(name):
    torch.manual_seed(0)
    model = get_model(name, num_classes=10).eval()
    x = example_input(name, batch_size=2, input_shape=(3, 64, 64))
    with torch.no_grad():
        out = model(x)
    assert out.shape == (2, 10)
    assert torch.isfinite(out).all()


@pytest.mark.parametrize("size", [(64, 96), (50, 70)])  # multiples of 16, and not (padding path)
def test_unet_forward(size):
    model = get_model("unet", base_channels=8).eval()
    x = example_input("unet", batch_size=2, input_shape=(3, *size))
    with torch.no_grad():
        out = model(x)
    assert out.shape == (2, 2, *size)


def test_gpt2_forward_tiny():
    model = get_model("gpt2-small", n_layer=2, n_embd=64, n_head=4, vocab_size=97, n_positions=32)
    tokens = example_input("gpt2-small", batch_size=3, input_shape=(16,), vocab_size=97)
    assert tokens.dtype == torch.long and 0 <= tokens.min() and tokens.max() < 97
    model.eval()
    with torch.no_grad():
        logits = model(tokens)
    assert logits.shape == (3, 16, 97)
    model.train()
    model(tokens).sum().backward()
    assert model.wte.weight.grad is not None
    with pytest.raises(ValueError, match="n_positions"):
        model(torch.zeros(1, 33, dtype=torch.long))


def test_gpt2_is_causal():
    """Changing a later token leaves the logits of earlier positions unchanged."""
    model = get_model(
        "gpt2-small", n_layer=2, n_embd=32, n_head=2, vocab_size=50, n_positions=16
    ).eval()
    tokens = example_input("gpt2-small", 1, (8,), vocab_size=50)
    changed = tokens.clone()
    changed[0, 5] = (changed[0, 5] + 1) % 50
    with torch.no_grad():
        a, b = model(tokens), model(changed)
    torch.testing.assert_close(a[:, :5], b[:, :5])
    assert not torch.allclose(a[:, 5:], b[:, 5:])


def test_example_input_defaults_and_determinism():
    for name, spec in MODELS.items():
        assert spec.input_kind in ("image", "tokens")
    assert MODELS["resnet50"].input_shape == (3, 224, 224)
    assert MODELS["unet"].input_shape == (3, 416, 608)
    assert MODELS["gpt2-small"].input_shape == (1024,)

    x = example_input("resnet50", 2)
    assert x.shape == (2, 3, 224, 224) and x.dtype == torch.float32
    torch.testing.assert_close(x, example_input("resnet50", 2), rtol=0, atol=0)
    assert not torch.equal(x, example_input("resnet50", 2, seed=1))
    assert example_input(MODELS["vgg16"], 1, dtype=torch.float64).dtype == torch.float64

    tokens = example_input("gpt2-small", 2)
    assert tokens.shape == (2, 1024) and tokens.dtype == torch.long
    assert 0 <= tokens.min() and tokens.max() < 50257
    with pytest.raises(ValueError, match="integer"):
        example_input("gpt2-small", 2, dtype=torch.float32)

    # Models outside the zoo need an explicit shape and get float inputs.
    with pytest.raises(ValueError, match="input_shape"):
        example_input("torchvision.models.resnet18()", 2)
    y = example_input("models.py:build", 4, (3, 8, 8))
    assert y.shape == (4, 3, 8, 8) and y.dtype == torch.float32


def test_unknown_name_lists_zoo():
    with pytest.raises(ValueError) as info:
        get_model("resnet51")
    for name in MODELS:
        assert name in str(info.value)


def test_file_factory(tmp_path):
    source = tmp_path / "my_model.py"
    source.write_text(
        "import torch.nn as nn\n"
        "def build(width=4):\n"
        "    return nn.Sequential(nn.Linear(3, width), nn.ReLU())\n"
        "def not_a_model():\n"
        "    return 42\n"
    )
    model = get_model(f"{source}:build")
    assert isinstance(model, nn.Sequential) and model[0].out_features == 4
    assert get_model(f"{source}:build", width=7)[0].out_features == 7
    with pytest.raises(ValueError, match="missing"):
        get_model(f"{source}:missing")
    with pytest.raises(TypeError, match="nn.Module"):
        get_model(f"{source}:not_a_model")
    with pytest.raises(FileNotFoundError):
        get_model(f"{tmp_path / 'absent.py'}:build")


def test_torchvision_form_without_torchvision(monkeypatch):
    monkeypatch.setitem(sys.modules, "torchvision", None)  # makes `import torchvision` fail
    with pytest.raises(ImportError, match=r"torchvision is not importable here .*'resnet50'"):
        get_model("torchvision.models.resnet50()")
    with pytest.raises(ImportError, match="torchvision is not importable here"):
        get_model("torchvision.models.resnet18(num_classes=10)")


def test_torchvision_form_parses_literals_only(monkeypatch):
    calls = []
    fake = types.ModuleType("torchvision")
    fake.models = types.SimpleNamespace(
        resnet50=lambda **kwargs: calls.append(kwargs) or nn.Identity()
    )
    monkeypatch.setitem(sys.modules, "torchvision", fake)

    assert isinstance(get_model("torchvision.models.resnet50()"), nn.Identity)
    get_model("torchvision.models.resnet50(num_classes=10, weights=None)")
    assert calls == [{}, {"num_classes": 10, "weights": None}]

    with pytest.raises(ValueError, match="literal"):
        get_model("torchvision.models.resnet50(num_classes=__import__('os').getpid())")
    with pytest.raises(ValueError, match="keyword"):
        get_model("torchvision.models.resnet50(10)")
    with pytest.raises(ValueError, match="no builder"):
        get_model("torchvision.models.not_a_model()")
    assert len(calls) == 2


# Small variants for CPU tests: (factory kwargs, per-sample input shape, example_input kwargs).
TINY = {
    "resnet50": (dict(base_width=8, layers=(1, 1, 1, 1)), (3, 32, 32), {}),
    "vgg16": (dict(width=8, hidden=32), (3, 32, 32), {}),
    # Two stride-1 rows: a block without expansion, then one with expansion and a residual.
    "mobilenet_v2": (dict(width_mult=0.25, inverted_residual_setting=[(1, 16, 1, 1), (6, 16, 2, 1)]),
                     (3, 32, 32), {}),
    "unet": (dict(base_channels=4), (3, 48, 64), {}),
    "gpt2-small": (dict(n_layer=2, n_embd=32, n_head=2, vocab_size=50, n_positions=16), (16,),
                   dict(vocab_size=50)),
}


@pytest.mark.parametrize("name", sorted(TINY))
def test_aot_module_capture(name):
    """Zoo models trace under AOTAutograd (the capture path) in training mode: in-place ReLU and
    ReLU6, the tied GPT-2 head, and gradients that match eager mode. GoogLeNet is left out to keep
    the suite fast: it has no width knob, its trace takes seconds, and it adds no new kind of op."""
    from monet.compat import boxed_function as make_boxed_func
    from torch._functorch.aot_autograd import aot_module  # as torch.compile's users call it

    kwargs, shape, input_kwargs = TINY[name]
    torch.manual_seed(0)
    model = get_model(name, **kwargs).train()
    graphs = {}

    def compiler(kind):
        def compile_graph(gm, example_inputs):
            graphs[kind] = gm
            return make_boxed_func(gm.forward)
        return compile_graph

    # Dropout draws random numbers, so switch it off to compare the captured and eager gradients.
    for module in model.modules():
        if isinstance(module, nn.Dropout):
            module.p = 0.0
        elif hasattr(module, "dropout") and isinstance(module.dropout, float):
            module.dropout = 0.0  # GPT-2 attention dropout
    captured = aot_module(model, fw_compiler=compiler("fw"), bw_compiler=compiler("bw"))
    x = example_input(name, 2, shape, **input_kwargs)
    state = {k: v.clone() for k, v in model.state_dict().items()}
    captured(x).sum().backward()
    assert set(graphs) == {"fw", "bw"}
    grads = {n: p.grad.clone() for n, p in model.named_parameters()}
    model.zero_grad()
    model.load_state_dict(state)  # undo the BatchNorm statistics update of the captured step
    model(x).sum().backward()
    for n, p in model.named_parameters():
        torch.testing.assert_close(grads[n], p.grad, msg=f"{name}: gradient of {n}")
    if name == "unet":  # sides are multiples of 16: no padding node
        assert not any("pad" in str(node.target) for node in graphs["fw"].graph.nodes)
