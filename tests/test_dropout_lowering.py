"""fp32 dropout's backward on the CPU without the mixed-dtype product (`monet.impls.dropout.dropout_backward_cpu`,
applied by `monet.impls.lower_for_device`): the same bits, nodes and memory, run by the executor."""
from __future__ import annotations

import copy

import torch
import torch.nn as nn

from monet.capture import capture
from monet.impls import dropout, lower_for_device
from monet.profiling.check import output_grad
from monet.schedule import schedule_from_matrices
from monet.wrapper import scheduled_module

aten = torch.ops.aten


def _model():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(16, 32), nn.Dropout(0.1), nn.GELU(), nn.Linear(32, 32), nn.Dropout(0.3),
                         nn.Linear(32, 4))


def _targets(graph):
    return [n.target for n in graph.joint.graph.nodes if n.op == "call_function"]


def test_the_cpu_backward_has_the_kernels_bits():
    torch.manual_seed(0)
    x, g = torch.randn(2, 4, 64, 64), torch.randn(2, 4, 64, 64)
    g.view(-1)[:3] = torch.tensor([-0.0, float("nan"), float("-inf")])
    _, mask = aten.native_dropout(x, 0.1, True)
    for scale in (1 / 0.9, 1 / 0.7, 0.0):
        want = aten.native_dropout_backward(g, mask, scale)
        got = dropout.dropout_backward_cpu(g, mask, scale)
        assert got.dtype == want.dtype and got.stride() == want.stride()
        assert torch.equal(got.view(torch.int32), want.view(torch.int32))  # bits: signed zeros and NaN too


def test_lowering_keeps_ids_fingerprint_and_memory():
    x = torch.randn(8, 16)
    graph = capture(_model(), x)
    low = lower_for_device(graph)
    assert _targets(low).count(dropout.dropout_backward_cpu) == 2
    assert aten.native_dropout_backward.default not in _targets(low)
    assert aten.native_dropout_backward.default in _targets(graph)  # the input graph is not modified
    assert (len(low.fwd), len(low.bwd)) == (len(graph.fwd), len(graph.bwd))
    assert low.fingerprint == graph.fingerprint and low.summary == graph.summary
    for a, b in zip(graph.bwd, low.bwd):
        assert (a.id, a.out_bytes) == (b.id, b.out_bytes)
    plain = capture(nn.Sequential(nn.Linear(16, 4)), x)
    assert lower_for_device(plain) is plain


def test_bf16_dropout_is_left_to_the_kernel():
    graph = capture(_model(), torch.randn(8, 16), autocast_dtype=torch.bfloat16)
    low = lower_for_device(graph)
    bf16 = [n for n in low.joint.graph.nodes if n.target is aten.native_dropout_backward.default
            and n.args[0].meta["val"].dtype == torch.bfloat16]
    assert bf16, "autocast keeps this dropout's gradient in bf16"


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
