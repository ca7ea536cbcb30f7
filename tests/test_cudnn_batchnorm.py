"""Eager PyTorch's BatchNorm kernel on CUDA: the captured graph lowered to cuDNN's BatchNorm
(`monet.impls.lower_for_device`).

On an H100 (torch 2.11) ResNet-50's gradients through AOTAutograd's graph, monet's
executor or torch.compile's aot_eager alike, came out 2 % off eager PyTorch's under full fp32 and
were bitwise equal to them with cuDNN off in both (benchmarks/results/gpu/visit-2026-11-27b):
eager runs cuDNN's BatchNorm, the graph ATen's native one.  On the CPU the lowering's structure
and memory are checked on a meta capture counted as CUDA; on a GPU, the gradients.
"""
from __future__ import annotations

import copy

import numpy as np
import pytest
import torch
import torch.nn as nn

from monet.capture import capture
from monet.executor import build_modules
from monet.impls import lower_for_device
from monet.impls.batchnorm import (cudnn_batch_norm_functional, cudnn_batch_norm_grad, cudnn_batch_norm_inplace,
                                   eager_runs_cudnn)
from monet.matrices import schedule_from_matrices
from monet.simulate import simulate


def _net():
    return nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU(),
                         nn.Conv2d(8, 8, 3, padding=1), nn.BatchNorm2d(8, eps=1e-6), nn.ReLU(),
                         nn.Flatten(), nn.Linear(8 * 8 * 8, 5))


def _meta_graph():
    with torch.device("meta"):
        net = _net().train()
    return capture(net, torch.empty(4, 3, 8, 8, device="meta"))


def _keep_all(graph):
    shape = (len(graph.bwd), len(graph.fwd))
    return schedule_from_matrices(graph, np.ones(shape, bool), np.zeros(shape, bool))


def _targets(graph):
    return [n.target for n in graph.joint.graph.nodes if n.op == "call_function"]


def test_lowering_keeps_ids_fingerprint_and_memory():
    graph = _meta_graph()
    assert lower_for_device(graph) is graph  # counted as the CPU: nothing to lower
    cuda = graph.counted_on("cuda", (9, 0))
    low = lower_for_device(cuda)
    # the first BatchNorm (eps 1e-5) runs cuDNN's kernels; the second (eps 1e-6 < cuDNN's smallest)
    # stays ATen's, as in eager PyTorch
    assert _targets(low).count(cudnn_batch_norm_functional) == 1
    assert _targets(low).count(cudnn_batch_norm_grad) == 1
    assert _targets(low).count(torch.ops.aten._native_batch_norm_legit_functional.default) == 1
    assert cudnn_batch_norm_functional not in _targets(cuda)  # the input graph is not modified
    assert (len(low.fwd), len(low.bwd)) == (len(cuda.fwd), len(cuda.bwd))
    assert low.fingerprint == cuda.fingerprint and low.summary == cuda.summary
    assert low.device == "cuda" and low.cuda_capability == (9, 0)
    # what is stored is what the native kernel stores, less the running statistics its backward
    # reads (and ignores in training): the schedule solved for the native graph holds, within two
    # 512-byte blocks per lowered BatchNorm
    sched = _keep_all(cuda)
    peaks = [simulate(g, *build_modules(g, sched), np.zeros(len(g.fwd)), np.zeros(len(g.bwd))).peak_bytes
             for g in (cuda, low)]
    assert peaks[0] - 2 * 512 <= peaks[1] <= peaks[0]


def test_forward_module_updates_running_statistics_in_place():
    graph = lower_for_device(_meta_graph().counted_on("cuda"))
    fw, _ = build_modules(graph, _keep_all(graph), buffers_in_place=True)
    targets = [n.target for n in fw.graph.nodes if n.op == "call_function"]
    assert cudnn_batch_norm_inplace in targets and cudnn_batch_norm_functional not in targets


def test_cudnn_off_keeps_the_native_kernel(monkeypatch):
    monkeypatch.setattr(torch.backends.cudnn, "enabled", False)
    cuda = _meta_graph().counted_on("cuda")
    assert lower_for_device(cuda) is cuda


def test_eager_condition():
    x, w = torch.empty(2, 3, 4, 4, device="meta"), torch.empty(3, device="meta")
    assert eager_runs_cudnn(x, w, w, w, w, 1e-5)
    assert not eager_runs_cudnn(x, w, w, w, w, 1e-6)  # below CUDNN_BN_MIN_EPSILON
    assert not eager_runs_cudnn(x.to(torch.bfloat16), w, w, w, w, 1e-5)
    assert eager_runs_cudnn(x.half(), w, w, w, w, 1e-5) and not eager_runs_cudnn(x.half(), w.half(), w, w, w, 1e-5)
    assert not eager_runs_cudnn(torch.empty(2, 3, device="meta"), w, w, w, w, 1e-5)  # 2-d: ATen's kernel
    assert not eager_runs_cudnn(x, w, None, w, w, 1e-5)


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_cuda_gradients_and_statistics_match_eager():
    """Keeping everything, under full fp32 and deterministic cuDNN: gradients, running statistics
    and output within 1e-5 (relative) of eager PyTorch's."""
    from monet.compat import strict_fp32
    from monet.profiling.costs import analytic_costs, costs_for
    from monet.solver.solve import solve
    from monet.wrapper import MONeTWrapper

    torch.manual_seed(0)
    model = _net().cuda().train()
    x = torch.randn(16, 3, 8, 8, device="cuda")
    graph = capture(copy.deepcopy(model), x)
    sol = solve(graph, costs_for(graph, analytic_costs(graph)), None, "none", info=dict(device="cuda"))
    before = torch.backends.cudnn.deterministic
    with strict_fp32():
        torch.backends.cudnn.deterministic = True
        try:
            results = []
            for m in (copy.deepcopy(model), MONeTWrapper(copy.deepcopy(model), sol, (3, 8, 8))):
                out = m(x)
                out.square().sum().backward()
                results.append((out.detach(), [p.grad for p in m.parameters()], [b.clone() for b in m.buffers()]))
        finally:
            torch.backends.cudnn.deterministic = before
    (o1, g1, b1), (o2, g2, b2) = results
    assert torch.allclose(o1, o2, rtol=1e-5, atol=1e-6)
    for a, b in zip(g1 + b1, g2 + b2):
        assert float((a.double() - b.double()).norm()) <= 1e-5 * max(float(a.double().norm()), 1e-12)
