"""The comparison methods (monet.profiling.baselines): same gradients as plain PyTorch, documented BN behaviour."""
import copy

import pytest
import torch
from torch import nn

from monet.profiling.measure import output_grad, max_rel_diff, measure_iteration_peak
from monet.profiling.baselines import (checkpoint_blocks, chen_sqrt_checkpoint, compile_with_activation_budget,
                                       sequential_units)
from monet.zoo.models import example_input, get_model


def deep_mlp(width=64, depth=9):
    """No BatchNorm, no dropout: gradients must match plain PyTorch."""
    torch.manual_seed(0)
    layers = [nn.Linear(16, width), nn.Tanh()]
    for _ in range(depth - 1):
        layers += [nn.Linear(width, width), nn.Tanh()]
    return nn.Sequential(*layers, nn.Linear(width, 4))


def conv_bn_net():
    torch.manual_seed(0)
    layers = []
    c = 3
    for _ in range(4):
        layers += [nn.Conv2d(c, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU()]
        c = 8
    return nn.Sequential(*layers, nn.Flatten(), nn.Linear(8 * 8 * 8, 5))


def run(module, params_of, x, g, seed=1):
    """One iteration; gradients and buffers of ``params_of`` (the model inside the peer)."""
    torch.manual_seed(seed)
    for p in params_of.parameters():
        p.grad = None
    module(x).backward(g)
    grads = {n: p.grad.detach().clone() for n, p in params_of.named_parameters()}
    bufs = {n: b.detach().clone() for n, b in params_of.named_buffers()}
    return grads, bufs


@pytest.fixture(scope="module")
def mlp_case():
    m = deep_mlp()
    x = torch.randn(32, 16, generator=torch.Generator().manual_seed(2))
    g = output_grad(m, x)
    ref, _ = run(m, m, x, g)
    return m, x, g, ref


def test_chen_gradients_equal_plain_bitwise(mlp_case):
    m, x, g, ref = mlp_case
    inner = copy.deepcopy(m)
    peer = chen_sqrt_checkpoint(inner)
    assert peer.n_units == 19 and peer.segments == 4  # round(sqrt(19))
    grads, _ = run(peer, inner, x, g)
    assert max_rel_diff(grads, ref) <= 1e-5
    assert all(torch.equal(grads[k], ref[k]) for k in ref)  # recomputation only: bitwise


def test_compile_gradients_within_1e5(mlp_case):
    m, x, g, ref = mlp_case
    for budget in (1.0, 0.0):
        inner = copy.deepcopy(m)
        peer = compile_with_activation_budget(inner, budget)
        grads, _ = run(peer, inner, x, g)
        assert max_rel_diff(grads, ref) <= 1e-5, budget
        # a second call reuses the compiled graph and still agrees
        grads, _ = run(peer, inner, x, g)
        assert max_rel_diff(grads, ref) <= 1e-5, budget


def test_compile_budget_rejects_out_of_range():
    with pytest.raises(ValueError, match=r"\[0, 1\]"):
        compile_with_activation_budget(deep_mlp(), 1.5)


def test_chen_reduces_measured_peak():
    """Deep and narrow in parameters, wide in activations: checkpointing must lower the peak."""
    torch.manual_seed(0)
    m = nn.Sequential(*[nn.Sequential(nn.Linear(64, 64), nn.Tanh()) for _ in range(16)])
    x = torch.randn(2048, 64)
    g = output_grad(m, x)
    plain = measure_iteration_peak(m, x, g)
    chen = measure_iteration_peak(chen_sqrt_checkpoint(m), x, g)
    assert chen < 0.6 * plain, (chen, plain)


def test_chen_batchnorm_running_stats():
    """torch.utils.checkpoint recomputes BN in training mode: its running statistics are updated twice.

    With restore_bn_stats (default) they equal plain PyTorch's bitwise; without it every BN in a
    checkpointed segment shows a second momentum update with the same batch statistics, and the
    BN of the last (not checkpointed) segment is updated once.
    """
    m = conv_bn_net()
    x = torch.randn(4, 3, 8, 8, generator=torch.Generator().manual_seed(3))
    g = output_grad(m, x)
    ref_model = copy.deepcopy(m)
    ref_g, ref_b = run(ref_model, ref_model, x, g)

    fixed = copy.deepcopy(m)
    grads, bufs = run(chen_sqrt_checkpoint(fixed), fixed, x, g)
    assert all(torch.equal(grads[k], ref_g[k]) for k in ref_g)
    assert all(torch.equal(bufs[k], ref_b[k]) for k in ref_b)

    plain_ckpt = copy.deepcopy(m)
    peer = chen_sqrt_checkpoint(plain_ckpt, restore_bn_stats=False)
    assert peer.segments == 4 and peer.n_units == 14  # units of 3: BN 1, 4, 7 checkpointed, 10 not
    grads, bufs = run(peer, plain_ckpt, x, g)
    assert all(torch.equal(grads[k], ref_g[k]) for k in ref_g)  # gradients use batch statistics
    mom = 0.1
    for idx in (1, 4, 7, 10):
        twice = idx != 10
        assert int(bufs[f"{idx}.num_batches_tracked"]) == (2 if twice else 1)
        r_mean, r_var = ref_b[f"{idx}.running_mean"], ref_b[f"{idx}.running_var"]
        if twice:  # from (0, 1): one update gives r1; a second with the same batch stats gives
            # r1 (2 - m) for the mean and r1 (2 - m) - (1 - m) for the variance
            torch.testing.assert_close(bufs[f"{idx}.running_mean"], r_mean * (2 - mom), rtol=1e-5, atol=1e-7)
            torch.testing.assert_close(bufs[f"{idx}.running_var"], r_var * (2 - mom) - (1 - mom),
                                       rtol=1e-5, atol=1e-7)
        else:
            assert torch.equal(bufs[f"{idx}.running_mean"], r_mean)


@pytest.mark.parametrize("name, kwargs, shape", [
    ("resnet50", dict(base_width=4, layers=(1, 1, 1, 1), num_classes=10), (3, 32, 32)),
    ("vgg16", dict(width=4, hidden=16, num_classes=10, dropout=0.0), (3, 32, 32)),
    ("mobilenet_v2", dict(width_mult=0.1, num_classes=10,
                          inverted_residual_setting=[(1, 16, 1, 1), (6, 24, 2, 2)]), (3, 32, 32)),
    ("unet", dict(base_channels=2), (3, 16, 16)),
    ("gpt2-small", dict(n_layer=3, n_embd=16, n_head=2, vocab_size=50, n_positions=16), (8,)),
])
def test_chen_zoo_segmentations_match_plain(name, kwargs, shape):
    """Each zoo segmentation reproduces the model's forward: bitwise equal gradients and buffers."""
    torch.manual_seed(0)
    m = get_model(name, **kwargs)
    x = example_input(name, 2, shape, vocab_size=50) if name == "gpt2-small" else example_input(name, 2, shape)
    g = output_grad(m, x)
    ref_model = copy.deepcopy(m)
    ref_g, ref_b = run(ref_model, ref_model, x, g)  # same seed: dropout draws the same masks
    inner = copy.deepcopy(m)
    grads, bufs = run(chen_sqrt_checkpoint(inner), inner, x, g)
    assert all(torch.equal(grads[k], ref_g[k]) for k in ref_g)
    assert all(torch.equal(bufs[k], ref_b[k]) for k in ref_b)


def test_googlenet_units_cover_forward():
    """Run one after another, the units compute the model's forward (eval mode: no auxiliary
    heads, no dropout), bitwise."""
    torch.manual_seed(0)
    m = get_model("googlenet", num_classes=10).eval()
    x = torch.randn(1, 3, 64, 64)
    y = x
    with torch.no_grad():
        for unit in sequential_units(m):
            y = unit(y)
        assert torch.equal(y, m(x))


def test_unknown_model_has_no_segmentation():
    class Two(nn.Module):
        def forward(self, x):
            return x

    with pytest.raises(ValueError, match="no sequential segmentation"):
        chen_sqrt_checkpoint(Two())


class _Stack(nn.Module):
    """A library-shaped model: a ``features`` sequence (or a ``layers`` block list called with a
    keyword argument, as transformers' decoder layers are), then a head."""

    def __init__(self, block_list: bool):
        super().__init__()
        torch.manual_seed(0)
        blocks = [nn.Sequential(nn.Linear(16, 16), nn.Tanh()) for _ in range(9)]
        self.block_list = block_list
        if block_list:
            self.layers = nn.ModuleList(_Scaled(b) for b in blocks)
        else:
            self.features = nn.Sequential(*blocks)
        self.head = nn.Linear(16, 3)

    def forward(self, x):
        if self.block_list:
            for layer in self.layers:
                x = layer(x, scale=0.5)
        else:
            x = self.features(x)
        return self.head(x)


class _Scaled(nn.Module):
    def __init__(self, inner):
        super().__init__()
        self.inner = inner

    def forward(self, x, *, scale):
        return scale * self.inner(x)


@pytest.mark.parametrize("block_list, says", [(False, "9 units of `features` in 3 segments"),
                                              (True, "each of the 9 blocks of `layers`")])
def test_checkpoint_blocks_gradients_equal_plain(block_list, says):
    plain = _Stack(block_list)
    ckpt = copy.deepcopy(plain)
    assert checkpoint_blocks(ckpt).startswith(says)
    x = torch.randn(4, 16)
    saved = []
    for m in (plain, ckpt):
        count = [0]

        def pack(t, count=count):
            count[0] += 1
            return t

        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            y = m(x)
        saved.append(count[0])
        y.square().sum().backward()
    assert saved[1] < saved[0]  # the checkpointed forward keeps fewer tensors
    assert all(torch.equal(a.grad, b.grad) for a, b in zip(plain.parameters(), ckpt.parameters()))


def test_checkpoint_blocks_names_where_it_looked():
    with pytest.raises(ValueError, match="no sequence of units"):
        checkpoint_blocks(nn.Linear(2, 2))
