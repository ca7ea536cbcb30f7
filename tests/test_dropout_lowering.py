"""Dropout's forward and backward (fp32, bf16, fp16) on the CPU without the mixed-dtype product
(`monet.impls.dropout.dropout_forward_cpu`, `dropout_backward_cpu`, applied by `monet.impls.lower_for_device`):
the same bits, random numbers, nodes and memory, run by the executor, recomputed too."""
from __future__ import annotations

import copy

import pytest
import torch
import torch.nn as nn

from monet.capture import capture
from monet.impls import dropout, lower_for_device
from monet.impls.registry import fake_value
from monet.profiling.measure import output_grad
from monet.matrices import schedule_from_matrices
from monet.wrapper import scheduled_module

aten = torch.ops.aten


def _model():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(16, 32), nn.Dropout(0.1), nn.GELU(), nn.Linear(32, 32), nn.Dropout(0.3),
                         nn.Linear(32, 4))


def _targets(graph):
    return [n.target for n in graph.joint.graph.nodes if n.op == "call_function"]


BITS = {torch.float32: torch.int32, torch.bfloat16: torch.int16, torch.float16: torch.int16}


@pytest.mark.parametrize("dtype", list(BITS), ids=str)
def test_the_cpu_backward_has_the_kernels_bits(dtype):
    torch.manual_seed(0)
    x, g = torch.randn(2, 4, 64, 64), torch.randn(2, 4, 64, 64).to(dtype)
    g.view(-1)[:4] = torch.tensor([-0.0, float("nan"), float("-inf"), float("inf")])
    _, mask = aten.native_dropout(x, 0.1, True)
    # eager's bf16 factor (match_eager_dropout), the kernel's double ones, and p = 1
    for scale in (dropout.eager_scale(0.1, dtype), 1 / 0.9, 1 / 0.7, 0.0):
        for grad, m in ((g, mask), (g.transpose(1, 3), mask.transpose(1, 3))):  # strides follow the mask's
            want = aten.native_dropout_backward(grad, m, scale)
            got = dropout.dropout_backward_cpu(grad, m, scale)
            assert got.dtype == want.dtype and got.stride() == want.stride()
            assert torch.equal(got.view(BITS[dtype]), want.view(BITS[dtype]))  # bits: signed zeros and NaN too


@pytest.mark.parametrize("dtype", list(BITS), ids=str)
def test_the_cpu_forward_has_the_kernels_bits_and_draws(dtype):
    x = torch.randn(2, 4, 64, 64).to(dtype)
    x.view(-1)[:4] = torch.tensor([-0.0, float("nan"), float("-inf"), float("inf")])
    for p in (0.1, 0.3, 0.5, 1.0, 0.0):
        torch.manual_seed(3)
        want = aten.native_dropout(x, p, True)
        after_want = torch.randn(4)
        torch.manual_seed(3)
        got = dropout.dropout_forward_cpu(x, p, True)
        after_got = torch.randn(4)
        assert torch.equal(got[1], want[1]) and got[1].dtype == torch.bool
        assert got[0].stride() == want[0].stride()
        assert torch.equal(got[0].view(BITS[dtype]), want[0].view(BITS[dtype]))  # bits: signed zeros, NaN, inf
        assert torch.equal(after_got, after_want)  # the generator advanced by the same draws
    t = x.transpose(1, 3)  # not contiguous: strides follow the input's, as the kernel's
    torch.manual_seed(1)
    want = aten.native_dropout(t, 0.2, True)
    torch.manual_seed(1)
    got = dropout.dropout_forward_cpu(t, 0.2, True)
    assert got[0].stride() == want[0].stride() and torch.equal(got[0].view(BITS[dtype]), want[0].view(BITS[dtype]))
    evaluated = dropout.dropout_forward_cpu(x, 0.1, False)
    assert torch.equal(evaluated[1], aten.native_dropout(x, 0.1, False)[1])


def test_lowering_keeps_ids_fingerprint_and_memory():
    x = torch.randn(8, 16)
    graph = capture(_model(), x)
    low = lower_for_device(graph)
    assert _targets(low).count(dropout.dropout_backward_cpu) == 2
    assert _targets(low).count(dropout.dropout_forward_cpu) == 2
    assert aten.native_dropout_backward.default not in _targets(low)
    assert aten.native_dropout.default not in _targets(low)
    assert [n.random for n in low.fwd] == [n.random for n in graph.fwd]  # still recomputed with their draws
    assert aten.native_dropout_backward.default in _targets(graph)  # the input graph is not modified
    assert (len(low.fwd), len(low.bwd)) == (len(graph.fwd), len(graph.bwd))
    assert low.fingerprint == graph.fingerprint and low.summary == graph.summary
    for a, b in zip(graph.bwd, low.bwd):
        assert (a.id, a.out_bytes) == (b.id, b.out_bytes)
    for a, b in zip(graph.fwd, low.fwd):
        assert (a.id, a.out_bytes, a.saved_bytes) == (b.id, b.out_bytes, b.saved_bytes)
    for n in low.joint.graph.nodes:  # each lowered node keeps the traced value: it is what the kernel returns
        if n.target in (dropout.dropout_forward_cpu, dropout.dropout_backward_cpu):
            traced, kept = (torch.utils._pytree.tree_leaves(v) for v in (fake_value(n.target, n.args), n.meta["val"]))
            assert [(t.shape, t.dtype, t.stride()) for t in traced] == [(t.shape, t.dtype, t.stride()) for t in kept]
    plain = capture(nn.Sequential(nn.Linear(16, 4)), x)
    assert lower_for_device(plain) is plain


def test_bf16_dropout_is_lowered_both_ways():
    graph = capture(_model(), torch.randn(8, 16), autocast_dtype=torch.bfloat16)
    bf16 = [n for n in graph.joint.graph.nodes if n.target is aten.native_dropout_backward.default
            and n.args[0].meta["val"].dtype == torch.bfloat16]
    assert bf16, "autocast keeps this dropout's gradient in bf16"
    low = lower_for_device(graph)
    for fn, kernel in ((dropout.dropout_forward_cpu, aten.native_dropout.default),
                       (dropout.dropout_backward_cpu, aten.native_dropout_backward.default)):
        assert _targets(low).count(fn) == 2 and kernel not in _targets(low)


def test_the_executor_runs_it_with_plain_gradients(monkeypatch):
    calls = []
    kernel = dropout.dropout_backward_cpu
    monkeypatch.setattr(dropout, "dropout_backward_cpu", lambda *a: calls.append(1) or kernel(*a))
    model, x = _model(), torch.randn(8, 16)
    g = output_grad(model, x)
    graph = capture(model, x)
    keep = schedule_from_matrices(graph, [[True] * len(graph.fwd)] * len(graph.bwd),
                                  [[False] * len(graph.fwd)] * len(graph.bwd))

    def step(m):
        m.train()
        torch.manual_seed(5)
        out = m(x.clone())
        out.backward(g)
        return out.detach(), [p.grad for p in m.parameters()]

    plain_out, plain_grads = step(copy.deepcopy(model))
    out, grads = step(scheduled_module(copy.deepcopy(model), lambda _g: keep))
    assert len(calls) >= 2  # both dropouts' backward ran the CPU kernel
    assert torch.equal(out, plain_out) and all(torch.equal(a, b) for a, b in zip(grads, plain_grads))


def test_the_executor_recomputes_the_lowered_forward_with_its_draws(monkeypatch):
    """A schedule that keeps nothing it can recompute runs each lowered dropout forward twice (the
    forward pass and its recomputation, replaying the generator state): plain PyTorch's outputs,
    gradients and next random numbers, bit for bit."""
    from test_rng import _keep_nothing  # the schedule that keeps nothing it can recompute

    calls = []
    kernel = dropout.dropout_forward_cpu

    def counted(*a):
        calls.append(1)
        return kernel(*a)

    counted._monet_random = True
    monkeypatch.setattr(dropout, "dropout_forward_cpu", counted)
    model, x = _model(), torch.randn(8, 16)
    g = output_grad(model, x)
    graph, _, sched = _keep_nothing(model, x)
    dropouts = {n.id for n in graph.fwd if n.random}
    assert len(dropouts) == 2 and dropouts <= {i for st in sched.stages for i in st.recompute}

    def step(m):
        m.train()
        m.zero_grad(set_to_none=True)
        torch.manual_seed(5)
        out = m(x.clone())
        out.backward(g)
        return out.detach(), [p.grad for p in m.parameters()], torch.rand(3)

    plain = step(copy.deepcopy(model))
    monet = scheduled_module(copy.deepcopy(model), lambda _g: sched)
    got = step(monet)
    calls.clear()  # the first call traced the executor's modules too
    step(monet)
    recomputed = sum(i in dropouts for st in sched.stages for i in st.recompute)
    assert len(calls) == 2 + recomputed  # two dropouts in the forward pass, then each recomputation
    assert torch.equal(got[0], plain[0]) and torch.equal(got[2], plain[2])
    assert all(torch.equal(a, b) for a, b in zip(got[1], plain[1]))


def test_rewritten_joint_graphs_generate_their_code_when_read():
    """The capture's joint graph and the lowered copy are read, not run: their Python code is made
    when it is read (`monet.frontend.tracing`, `monet.compat.lazy_graph_module`), and then it is
    the rewritten graph's: eager's bf16 dropout scale, the lowered kernels."""
    graph = capture(_model(), torch.randn(8, 16), autocast_dtype=torch.bfloat16)
    scales = {n.args[2] for n in graph.joint.graph.nodes if n.target is aten.native_dropout_backward.default
              and n.args[0].meta["val"].dtype == torch.bfloat16}
    assert scales == {dropout.eager_scale(0.1, torch.bfloat16), dropout.eager_scale(0.3, torch.bfloat16)}
    low = lower_for_device(graph)
    # no code made yet (a GraphModule keeps its generated code as ``_code``)
    assert "_code" not in vars(graph.joint) and "_code" not in vars(low.joint)
    assert all(repr(s) in graph.joint.code for s in scales)  # the code says what the graph holds
    assert "dropout_backward_cpu" in low.joint.code and "native_dropout_backward" not in low.joint.code
    assert "native_dropout_backward" in graph.joint.code  # the capture's graph is not modified
