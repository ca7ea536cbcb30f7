"""What the executor's forward module hands to its backward module (`monet.executor.build_modules`):
tensors only, in AOTAutograd's order; a non-tensor value a backward node reads is never among them.

CUDA's fused attention kernels return Python ints and undefined tensors among their outputs
(``_scaled_dot_product_flash_attention`` and ``_cudnn_attention``: ``cum_seq_q``, ``cum_seq_k``
undefined, ``max_q``, ``max_k`` ints), and their backward reads them.  AOTAutograd takes the
forward's saved values as tensors first, then SymInts; an int or None saved as a tensor broke
torch 2.11 at compile time (``'int' object has no attribute 'untyped_storage'`` in
``collect_fw_donated_buffer_idxs``) and 2.13 at run time (``save_from_forward``: "expected all
tensors_saved_with_vc_check to be Tensors").  The CPU has no such kernel, so the tests here give the
CPU flash kernel CUDA flash's output structure (`_cuda_like_forward`) as an attention
implementation and run it through the executor.
"""
from __future__ import annotations

import copy

import numpy as np
import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

from monet.capture import capture
from monet.executor import build_modules
from monet.impls import IMPLS, variant
from monet.impls.attention import Backend, _rewrite, flash_cpu_backward, flash_cpu_forward
from monet.impls.registry import Impl
from monet.profiling import measure as chk
from monet.profiling.costs import analytic_costs, costs_for
from monet.matrices import schedule_from_matrices
from monet.solver import formulation
from monet.solver.repair import repair
from monet.solver.solve import keep_all_matrices, memory_model
from monet.wrapper import scheduled_module

FLASH_CPU = "aten._scaled_dot_product_flash_attention_for_cpu.default"
NAME = "attention.cuda_like_test"


def _cuda_like_forward(q, k, v, attn_mask=None, is_causal=False, scale=None, *, layout=None):
    """The CPU flash kernel with CUDA flash's outputs: (out, logsumexp, cum_seq_q None, cum_seq_k
    None, max_q int, max_k int)."""
    out, lse = flash_cpu_forward(q, k, v, attn_mask, is_causal, scale, layout=layout)
    return out, lse, None, None, q.size(-2), k.size(-2)


def _cuda_like_backward(grad, q, k, v, attn_mask, is_causal, scale, out, lse, cum_q, cum_k, max_q, max_k, *,
                        layout=None):
    """Backward of `_cuda_like_forward`; refuses anything but the forward's None and ints."""
    got = (cum_q, cum_k, max_q, max_k)
    if got != (None, None, q.size(-2), k.size(-2)) or not all(type(m) is int for m in got[2:]):
        raise AssertionError(f"the backward read {got!r}, not the forward's (None, None, L, S)")
    return flash_cpu_backward(grad, q, k, v, attn_mask, is_causal, scale, out, lse, layout=layout)


class Attention(nn.Module):
    def __init__(self, dim=16, heads=2):
        super().__init__()
        self.qkv, self.out, self.heads = nn.Linear(dim, 3 * dim), nn.Linear(dim, dim), heads

    def forward(self, x):
        b, length, dim = x.shape
        q, k, v = self.qkv(x).view(b, length, 3, self.heads, dim // self.heads).permute(2, 0, 3, 1, 4)
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return torch.tanh(self.out(y.transpose(1, 2).reshape(b, length, dim)))


@pytest.fixture
def cuda_like(monkeypatch):
    """(model, x (2, 12, 16), graph, its variant with the CUDA-like implementation, its keys)."""
    backend = Backend("cuda_like_test", "cpu", None, None, _cuda_like_forward, _cuda_like_backward,
                      (0, 1, 2, 3, 4, 5), lambda *_: True)
    monkeypatch.setitem(IMPLS, NAME, Impl(NAME, "attention", "fwd", (FLASH_CPU,), _rewrite(backend), ("cpu",)))
    torch.manual_seed(0)
    model, x = Attention(), torch.randn(2, 12, 16)
    graph = capture(model, x)
    vg, keys, _ = variant(graph, NAME)
    assert len(keys) == 1
    return model, x, graph, vg, keys


def _keep_nothing(graph):
    """The schedule that keeps nothing it can recompute (the attention node is recomputed)."""
    costs = costs_for(graph, analytic_costs(graph))
    mem = memory_model(graph, costs)
    P = formulation.Problem(mem, np.zeros(len(graph.fwd)), "normal")
    S, R = repair(graph, mem, np.zeros((P.T, P.G), dtype=bool), P.allow_s)
    return schedule_from_matrices(graph, mem.group_to_node(S), R)


def _keep_all(graph):
    return schedule_from_matrices(graph, *keep_all_matrices(graph))


@pytest.mark.parametrize("make", [_keep_all, _keep_nothing], ids=["keep-all", "keep-nothing"])
def test_non_tensor_outputs_are_never_saved(cuda_like, make):
    """Every value the forward module saves for the backward is a tensor; the ints and Nones the
    backward node reads are constants of the backward graph."""
    _, _, graph, vg, keys = cuda_like
    sched = make(graph)
    sched.impl = {keys[0]: NAME}
    fw, bw = build_modules(vg, sched)
    for p in bw.graph.find_nodes(op="placeholder"):
        assert isinstance(p.meta.get("val"), torch.Tensor), (p.name, p.meta.get("val"))
    attn_bwd = [n for n in bw.graph.nodes if n.target is _cuda_like_backward]
    assert len(attn_bwd) == 1
    read = [a.meta["val"] if isinstance(a, torch.fx.Node) else a for a in attn_bwd[0].args[9:13]]
    assert read == [None, None, 12, 12]
    if make is _keep_all:  # nothing recomputed: the forward's values are constants of the backward
        assert attn_bwd[0].args[9:13] == (None, None, 12, 12)


@pytest.mark.parametrize("make", [_keep_all, _keep_nothing], ids=["keep-all", "keep-nothing"])
def test_non_tensor_outputs_run_with_plain_gradients(cuda_like, make):
    """The scheduled module trains with the CUDA-like implementation (kept, and recomputed in the
    backward pass) and gives plain PyTorch's gradients bit for bit: the same CPU kernel runs."""
    model, x, graph, _, keys = cuda_like
    sched = make(graph)
    sched.impl = {keys[0]: NAME}
    recomputed = {i for st in sched.stages for i in st.recompute}
    anchor = int(keys[0].split(":")[1])
    assert (anchor in recomputed) == (make is _keep_nothing)
    g = torch.randn(2, 12, 16)
    ref = chk.grads_and_buffers(model, x, g)[0]
    got = chk.grads_and_buffers(scheduled_module(copy.deepcopy(model), lambda _g: sched), x, g)[0]
    assert ref.keys() == got.keys()
    assert all(torch.equal(got[k], ref[k]) for k in ref)


def test_symbolic_values_are_saved_after_the_tensors(cuda_like):
    """A SymInt the backward reads (dynamic shapes; here ``max_q`` given a symbolic traced value) is
    saved where AOTAutograd takes SymInts: the forward module returns it after every saved tensor,
    the backward module takes it before them."""
    from torch.fx.experimental.symbolic_shapes import ShapeEnv

    _, _, graph, vg, keys = cuda_like
    sched = _keep_all(graph)
    sched.impl = {keys[0]: NAME}
    attn = next(n for n in vg.joint.graph.nodes if n.target is _cuda_like_forward)
    max_q = next(u for u in attn.users if u.args[1] == 4)
    max_q.meta["val"] = ShapeEnv().create_unbacked_symint()
    fw, bw = build_modules(vg, sched)
    outs = list(next(iter(fw.graph.find_nodes(op="output"))).args[0])
    assert outs[-1].name == max_q.name
    assert all(isinstance(o.meta.get("val"), torch.Tensor) for o in outs[vg.num_fwd_outputs:-1])
    phs = list(bw.graph.find_nodes(op="placeholder"))
    assert phs[0].name == max_q.name
    assert all(isinstance(p.meta.get("val"), torch.Tensor) for p in phs[1:])
