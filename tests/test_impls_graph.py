"""Operator implementations applied to a traced model: gradients, memory, in-place, refusals."""
from __future__ import annotations

import copy
import math

import pytest
import torch
import torch.nn as nn

from monet.capture import capture
from monet.executor import build_modules
from monet.impls import IMPLS, apply_impls, impls_for, mode_tokens, variant
from monet.impls.batchnorm import ZeroGammaError
from monet.profiling.measure import measure_iteration_peak
from monet.profiling.costs import analytic_costs, costs_for
from monet.profiling.profiler import profile_costs
from monet.matrices import schedule_from_matrices
from monet.simulate import simulate
from monet.solver.solve import keep_all_matrices
from monet.wrapper import scheduled_module


def family_net() -> nn.Module:
    """Every operator family once: conv, BatchNorm, ReLU, 3x3 max-pool with padding, depthwise conv,
    ReLU6, dropout, linear.  Odd spatial sizes, so masks are not a multiple of 8 long."""
    return nn.Sequential(
        nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU(inplace=True),
        nn.MaxPool2d(3, 2, 1),
        nn.Conv2d(8, 8, 3, padding=1, groups=8, bias=False), nn.BatchNorm2d(8), nn.ReLU6(inplace=True),
        nn.Flatten(), nn.Dropout(0.3), nn.Linear(8 * 7 * 6, 10))


@pytest.fixture(scope="module")
def net():
    torch.manual_seed(0)
    model = family_net()
    with torch.no_grad():  # BatchNorm weights away from 1 and biases away from 0
        for m in model.modules():
            if isinstance(m, nn.BatchNorm2d):
                m.weight.uniform_(0.5, 1.5)
                m.bias.uniform_(-0.5, 0.5)
    x = torch.randn(3, 3, 13, 11)
    graph = capture(model, x)
    g = torch.randn(3, 10)
    return model, x, graph, g


def _grads(model, run, x, g, seed=7):
    model.zero_grad(set_to_none=True)
    torch.manual_seed(seed)
    run(x).backward(g)
    return [p.grad.detach().clone() for p in model.parameters()]


def _rel(a: list[torch.Tensor], b: list[torch.Tensor]) -> float:
    """Relative error over all gradients together: ||a - b|| / ||b||."""
    num = math.sqrt(sum(float((x - y).double().pow(2).sum()) for x, y in zip(a, b)))
    den = math.sqrt(sum(float(y.double().pow(2).sum()) for y in b))
    return num / den


def _run(net, impls, inplace=False):
    model, x, graph, g = net
    S, R = keep_all_matrices(graph)
    sched = schedule_from_matrices(graph, S, R)
    sched.impl, sched.inplace = impls, inplace
    m = copy.deepcopy(model)
    wrapped = scheduled_module(m, lambda _g: sched)
    return m, wrapped, sched


def test_mode_tokens():
    assert mode_tokens("normal") == frozenset()
    assert mode_tokens("inplace_conv_multiway_newnode") == {"inplace", "conv", "multiway", "newnode"}
    assert mode_tokens("full") == mode_tokens("inplace_conv_multiway_newnode_attention")
    assert mode_tokens("conv_normal") == {"conv"}
    with pytest.raises(ValueError, match="unknown mode 'fast'.*inplace_conv_multiway_newnode_attention"):
        mode_tokens("fast")


# the family net has no attention: tests/test_attention.py covers the attention implementations
CPU_IMPLS = [i.name for i in impls_for("full", "cpu") if i.token != "attention"]


@pytest.mark.parametrize("name", CPU_IMPLS)
def test_implementation_gradients_and_memory(net, name):
    """Each implementation, applied wherever it applies: gradients within 1e-5 of PyTorch's, and
    the simulated peak of the rewritten modules equals the measured one (to 2 %)."""
    model, x, graph, g = net
    vg, keys, governed = variant(graph, name)
    assert keys, f"{name} applies to no node of the family net"
    assert all(k.startswith(IMPLS[name].kind) for k in keys)
    m, wrapped, sched = _run(net, {k: name for k in keys})
    ref = _grads(model, model, x, g)
    got = _grads(m, wrapped, x, g)
    assert _rel(got, ref) <= 1e-5, f"{name}: gradients differ from PyTorch's by {_rel(got, ref):.3g}"
    table = analytic_costs(vg)
    table["workspace_bytes"] = profile_costs(model, x, vg, "cpu", 1, 0, progress=False)["workspace_bytes"].values
    c = costs_for(vg, table)
    fw, bw = build_modules(vg, sched)
    predicted = simulate(vg, fw, bw, c.fwd_workspace, c.bwd_workspace).peak_bytes
    measured = measure_iteration_peak(wrapped, x, g)
    assert abs(predicted - measured) <= 0.02 * measured, (name, predicted, measured)


@pytest.mark.parametrize("name, bytes_of", [
    ("relu.mask", lambda n: math.ceil(n / 8)),
    ("hardtanh.mask", lambda n: math.ceil(n / 8)),
    ("dropout.bitmask", lambda n: math.ceil(n / 8)),
    ("maxpool.compact", lambda n: math.ceil(n / 2)),  # 3x3 window: 4 bits per output
])
def test_compact_values_have_their_formula_size(net, name, bytes_of):
    """The new value an intermediate-activated implementation stores has the documented size."""
    _, _, graph, _ = net
    vg, keys, _ = variant(graph, name)
    for k in keys:
        i = int(k[4:])
        base_out = graph.values[graph.fwd[i].outputs[0]]
        n = base_out.nbytes // 4  # fp32 elements of the op's output
        extra = [v for v in vg.fwd[i].outputs if vg.values[v].nbytes != base_out.nbytes]
        assert [vg.values[v].nbytes for v in extra] == [bytes_of(n)], (name, k)


def test_store_input_and_output_change_what_the_backward_reads(net):
    _, _, graph, _ = net
    relu = next(n for n in graph.fwd if n.op == "aten.relu.default")
    vg, keys, governed = variant(graph, "relu.store_input")
    t = governed[f"fwd:{relu.id}"][0]
    assert relu.outputs[0] in graph.bwd[t].reads
    assert vg.bwd[t].reads == (vg.alias_root[vg.fwd[relu.fwd_inputs[0]].outputs[0]],)
    ht = next(n for n in graph.fwd if n.op == "aten.hardtanh.default")
    vg, keys, governed = variant(graph, "hardtanh.store_output")
    t = [t for t in governed[f"fwd:{ht.id}"] if vg.bwd[t].op == "aten.hardtanh_backward.default"][0]
    assert vg.bwd[t].reads == (vg.fwd[ht.id].outputs[0],)


def _allocated(gm) -> int:
    """Bytes a module's ops allocate in total (views and in-place ops allocate nothing)."""
    from monet.graph import is_alias, tensor_bytes, tensors_in
    from monet.inplace import is_inplace

    return sum(tensor_bytes(t) for n in gm.graph.nodes if n.op == "call_function" and not is_alias(n)
               and not is_inplace(n) for t in tensors_in(n.meta.get("val")))


def test_inplace_keeps_gradients_and_allocates_less(net):
    """In-place ReLU/add: bitwise the same gradients, less allocated, and the simulator (which
    treats an in-place op as an alias of its input) still equals the measured peak."""
    model, x, graph, g = net
    m0, w0, s0 = _run(net, {}, inplace=False)
    m1, w1, s1 = _run(net, {}, inplace=True)
    a, b = _grads(m0, w0, x, g), _grads(m1, w1, x, g)
    assert all(torch.equal(p, q) for p, q in zip(a, b))
    fw0, bw0 = build_modules(graph, s0)
    fw1, bw1 = build_modules(graph, s1)
    assert any(str(n.target).endswith("relu_.default") for n in fw1.graph.nodes)
    assert _allocated(fw1) < _allocated(fw0)
    table = analytic_costs(graph)
    table["workspace_bytes"] = profile_costs(model, x, graph, "cpu", 1, 0, progress=False)["workspace_bytes"].values
    c = costs_for(graph, table)
    sim0 = simulate(graph, fw0, bw0, c.fwd_workspace, c.bwd_workspace)
    sim1 = simulate(graph, fw1, bw1, c.fwd_workspace, c.bwd_workspace)
    assert sim1.peak_bytes <= sim0.peak_bytes
    measured = measure_iteration_peak(w1, x, g)
    assert abs(sim1.peak_bytes - measured) <= 0.02 * measured


def test_zero_gamma_is_refused_in_the_backward(net):
    """Output-activated BatchNorm cannot rebuild its input where gamma == 0: a clear error, never a
    silently wrong gradient."""
    model, x, graph, g = net
    _, keys, _ = variant(graph, "batchnorm.output_activated")
    m, wrapped, _ = _run(net, {k: "batchnorm.output_activated" for k in keys})
    with torch.no_grad():
        m[1].weight[3] = 0.0
    out = wrapped(x)
    with pytest.raises(ZeroGammaError, match="gamma == 0.*multiway"):
        out.backward(g)


def test_apply_impls_refuses_what_does_not_fit(net):
    _, _, graph, _ = net
    conv = next(n for n in graph.fwd if n.op == "aten.convolution.default")
    with pytest.raises(ValueError, match="unknown implementation 'relu.fast'"):
        apply_impls(graph, {f"fwd:{conv.id}": "relu.fast"})
    with pytest.raises(ValueError, match="does not apply to fwd:"):
        apply_impls(graph, {f"fwd:{conv.id}": "relu.mask"})
    with pytest.raises(ValueError, match="bad implementation key"):
        apply_impls(graph, {"fwd:99999": "relu.mask"})
    same = apply_impls(graph, {f"fwd:{conv.id}": "conv.native"})
    assert same.fingerprint == graph.fingerprint and len(same.fwd) == len(graph.fwd)
    assert same.fwd[conv.id].op == "monet.convolution_native"


def test_analytic_costs_count_the_flops_of_wrapped_convolutions(net):
    """A convolution run by another algorithm does the same FLOP: the analytic model must see them."""
    _, _, graph, _ = net
    vg, keys, _ = variant(graph, "conv.native")
    base, var = analytic_costs(graph), analytic_costs(vg)
    for k in keys:
        i = int(k[4:])
        row = lambda t: t[(t["kind"] == "fwd") & (t["node"] == i)].iloc[0]
        assert row(var)["flops"] == row(base)["flops"] > 0
