"""The language-model head and its cross-entropy as one op over chunks of tokens
(`monet.lm_loss`): PyTorch's loss and gradients (bitwise in one chunk, within 1e-6 in several,
ignore_index and a bias included), the rewrite of a transformers model's graph, and a GPT-2
trained with it: its logits gone from the plain peak, its gradients PyTorch's within 1e-6, its
measured peak under the budget, and its solution loaded back on the model alone."""
from __future__ import annotations

import copy
import math

import pytest
import torch
import torch.nn.functional as F

from monet.lm_loss import (CHUNK_ROWS, MAX_CHUNKS, chunked_loss_hint, default_chunk, find_lm_losses, fuse_lm_loss,
                           fused, fused_loss, liger_chunk, linear_cross_entropy, logits_bytes)
from reach_models import missing


@pytest.mark.parametrize("op", [linear_cross_entropy, fused_loss])
@pytest.mark.parametrize("bias", [False, True])
@pytest.mark.parametrize("reduction", ["mean", "sum"])
@pytest.mark.parametrize("chunk", [1000, 16, 7])
def test_the_op_is_pytorchs_cross_entropy(op, bias, reduction, chunk):
    torch.manual_seed(0)
    h = torch.randn(64, 16, requires_grad=True)
    w = torch.randn(100, 16, requires_grad=True)
    b = torch.randn(100, requires_grad=True) if bias else None
    t = torch.randint(0, 100, (64,))
    t[::5] = -100  # ignored tokens (padding, the last position of a shifted row)
    leaves = [h, w] + ([b] if bias else [])
    ref = F.cross_entropy(F.linear(h, w, b).float(), t, ignore_index=-100, reduction=reduction)
    out = op(h, w, b, t, -100, reduction, chunk)
    g_ref, g_out = torch.autograd.grad(ref, leaves), torch.autograd.grad(out, leaves)
    if chunk >= 64:  # one chunk: PyTorch's own operators in its order
        assert torch.equal(out, ref) and all(torch.equal(a, c) for a, c in zip(g_out, g_ref))
    else:  # sums in another order
        assert torch.allclose(out, ref, rtol=1e-6, atol=0)
        assert all((a - c).norm() <= 1e-6 * c.norm() for a, c in zip(g_out, g_ref))


@pytest.mark.parametrize("scale", [1.0, 0.3])
def test_gradients_in_the_forward_pass_are_the_recomputing_ones(scale):
    """`linear_cross_entropy_grads` (several chunks): the loss bitwise the recomputing op's over the
    same chunks, the gradients bitwise its for a loss gradient of 1 and within 1e-6 for another
    (scaled after the products instead of before)."""
    torch.manual_seed(0)
    h = torch.randn(64, 16, requires_grad=True)
    w = torch.randn(100, 16, requires_grad=True)
    t = torch.randint(0, 100, (64,))
    t[::3] = -100
    old = linear_cross_entropy(h, w, None, t, -100, "mean", 16)
    new = fused_loss(h, w, None, t, -100, "mean", 16)
    assert torch.equal(old, new) and new.grad_fn is not None
    g_old = torch.autograd.grad(old * scale, [h, w])
    g_new = torch.autograd.grad(new * scale, [h, w])
    for a, c in zip(g_new, g_old):
        assert torch.equal(a, c) if scale == 1.0 else (a - c).norm() <= 1e-6 * c.norm()
    with pytest.raises(ValueError, match="reduction"):
        fused_loss(h, w, None, t, -100, "none", 16)


SIZES = [(rows, vocab, hidden) for rows in (1, 10, 256, 1000, 1024, 8 * 1024) for vocab in (100, 2048, 50257, 128256)
         for hidden in (32, 512, 768, 1000)]


def _power_of_two(n: int) -> bool:
    return n >= 1 and n & (n - 1) == 0


@pytest.mark.parametrize("rows, vocab, hidden", SIZES)
def test_liger_chunk_holds_the_hidden_states_bytes(rows, vocab, hidden):
    """The smallest power of two of rows whose logits hold at least the hidden states' elements,
    ``rows / ceil(V / H)`` (one chunk where the vocabulary is narrower than the hidden state)."""
    chunk, fit = liger_chunk(rows, vocab, hidden), math.ceil(rows / math.ceil(vocab / hidden))
    assert _power_of_two(chunk) and chunk // 2 < fit <= chunk


def test_liger_chunk_of_gpt2_small():
    assert liger_chunk(1024, 50257, 768) == 16  # GPT-2 small, 2 x 512 tokens: ceil(1024 / ceil(50257 / 768))


@pytest.mark.parametrize("rows, vocab, hidden", SIZES)
def test_default_chunk_bounds_the_number_of_chunks(rows, vocab, hidden):
    """Liger's chunk or larger, a power of two; more than MAX_CHUNKS chunks only where a chunk
    would then hold more than CHUNK_ROWS rows; and no larger than those two rules need."""
    chunk, liger = default_chunk(rows, vocab, hidden), liger_chunk(rows, vocab, hidden)
    assert _power_of_two(chunk) and chunk >= liger
    assert math.ceil(rows / chunk) <= MAX_CHUNKS or chunk >= CHUNK_ROWS
    if chunk > liger:  # the smallest power of two of rows that meets the bound
        assert chunk // 2 < min(math.ceil(rows / MAX_CHUNKS), CHUNK_ROWS)


def _gpt2(vocab: int, width: int, batch: int):
    """A 2-layer transformers GPT-2 in training and its batch (``batch`` x 64 tokens, labels = ids);
    skips the test without transformers."""
    reason = missing("transformers")
    if reason:
        pytest.skip(reason)
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(0)
    model = GPT2LMHeadModel(GPT2Config(vocab_size=vocab, n_positions=64, n_embd=width, n_layer=2, n_head=2,
                                       bos_token_id=0, eos_token_id=0)).train()
    ids = torch.randint(0, vocab, (batch, 64), generator=torch.Generator().manual_seed(1))
    return model, dict(input_ids=ids, labels=ids, use_cache=False)


@pytest.fixture(scope="module")
def gpt2():
    return _gpt2(vocab=2048, width=32, batch=4)


def test_the_rewrite_finds_the_head_and_drops_the_logits(gpt2):
    from monet.frontend import export, training_inputs
    from monet.inputs import ExampleInputs

    model, batch = gpt2
    inputs = training_inputs(model, ExampleInputs.of(batch))
    gm = export(model, inputs)
    assert len(find_lm_losses(gm)) == 1
    assert logits_bytes(gm) == 4 * 64 * 2048 * 4  # (B T, V) fp32
    assert 'lm_loss="chunked"' in chunked_loss_hint(gm)
    assert fuse_lm_loss(gm, 64) == 1 and fuse_lm_loss(gm, 64) == 0  # idempotent
    assert logits_bytes(gm) == 0 and chunked_loss_hint(gm) == ""
    torch.manual_seed(3)
    out = gm(*inputs.args, **inputs.kwargs)
    torch.manual_seed(3)
    ref = model(**batch)
    assert out.logits is None and torch.allclose(out.loss, ref.loss, rtol=1e-6, atol=0)
    with pytest.raises(ValueError, match="chunk"):
        fuse_lm_loss(export(model, inputs), 0)


def test_a_gpt2_trains_with_the_chunked_loss_in_less_memory(gpt2, tmp_path):
    import monet
    from monet.profiling.measure import step_peak

    model, batch = gpt2
    kw = dict(cost="analytic", time_limit=5, progress=False)
    plain = monet.optimize(copy.deepcopy(model), batch, budget="min", lm_loss=None, **kw)
    chunked = monet.optimize(copy.deepcopy(model), batch, budget="min", lm_loss="chunked", **kw)
    meta = chunked.solution.meta
    assert fused(meta.graph_summary) == default_chunk(4 * 64, 2048, 32) < 4 * 64
    # several chunks: the gradients come from the forward pass, the backward pass only scales them
    ops = " ".join(meta.graph_summary)
    assert "monet.linear_cross_entropy_grads" in ops and "monet.linear_cross_entropy_backward" not in ops
    # the logits (4 x 64 x 2048 floats, 2 MiB) and their gradient no longer in plain PyTorch's peak
    assert meta.eager_peak_bytes < plain.solution.meta.eager_peak_bytes - 2 * 2**20
    assert meta.budget_bytes < plain.solution.meta.budget_bytes
    reference = copy.deepcopy(model)
    for wrapped in (chunked, monet.MONeTWrapper(copy.deepcopy(model), _saved(chunked, tmp_path))):
        torch.manual_seed(5)
        out = wrapped(**batch)
        out.loss.backward()
        torch.manual_seed(5)
        ref = reference(**batch).loss
        ref.backward()
        assert out.logits is None and torch.allclose(out.loss, ref, rtol=1e-6, atol=0)
        theirs = dict(reference.named_parameters())
        for name, p in wrapped.model.named_parameters():
            assert (p.grad - theirs[name].grad).norm() <= 1e-6 * theirs[name].grad.norm() + 1e-12, name
            p.grad = None
        reference.zero_grad(set_to_none=True)
        assert step_peak(wrapped, batch) <= meta.budget_bytes


def _saved(wrapper, tmp_path):
    path = tmp_path / "chunked.monet"
    wrapper.solution.save(path)
    return path


def test_an_infeasible_budget_names_the_chunked_loss(gpt2):
    """A language model's infeasible budget, short of the smallest feasible one by less than its
    logits and their gradient, says that ``lm_loss="chunked"`` lowers the smallest feasible
    budget, and how many bytes of logits it saves; one short by more, which chunking could not
    close, does not.  (A graph whose loss is chunked already, or that has no head, gets no such
    sentence: `chunked_loss_hint` is "" for those, tested above.)"""
    import monet

    model, batch = gpt2
    plan = monet.prepare(copy.deepcopy(model), batch, cost="analytic", progress=False)
    with pytest.raises(monet.InfeasibleBudgetError) as far:
        plan.solve(budget=4096, time_limit=2)
    assert "lm_loss" not in str(far.value)
    with pytest.raises(monet.InfeasibleBudgetError, match='2.00 MiB of logits.*lm_loss="chunked"'):
        plan.solve(budget=far.value.min_budget_bytes - 2**20, time_limit=2)


def test_by_default_a_budget_short_by_the_logits_is_met_with_the_chunked_loss(gpt2, capfd):
    """``lm_loss="auto"`` (the default): plain PyTorch's peak less twice the logits' bytes is
    infeasible computing the model's own loss and met with the chunked loss, whose measured peak
    is under it and whose gradients are plain PyTorch's within 1e-5; the log says which loss was
    kept and that the logits are gone."""
    import monet
    from monet.profiling.measure import step_peak

    model, batch = gpt2
    kw = dict(cost="analytic", time_limit=10)
    plain = monet.prepare(copy.deepcopy(model), batch, cost="analytic", progress=False)
    budget = plain.eager_peak_bytes - 2 * (4 * 64 * 2048 * 4)
    with pytest.raises(monet.InfeasibleBudgetError):
        monet.optimize(copy.deepcopy(model), batch, budget=budget, lm_loss=None, progress=False, **kw)
    wrapper = monet.optimize(copy.deepcopy(model), batch, budget=budget, **kw)
    assert fused(wrapper.solution.meta.graph_summary), "the chunked loss was not kept"
    assert "the chunked loss gives the faster schedule" in capfd.readouterr().err
    reference = copy.deepcopy(model)
    torch.manual_seed(5)
    out = wrapper(**batch)
    out.loss.backward()
    torch.manual_seed(5)
    reference(**batch).loss.backward()
    theirs = dict(reference.named_parameters())
    for name, p in wrapper.model.named_parameters():
        assert (p.grad - theirs[name].grad).norm() <= 1e-5 * theirs[name].grad.norm() + 1e-12, name
    assert step_peak(wrapper, batch) <= budget


def test_by_default_an_infeasible_budget_names_the_smallest_of_both_losses(gpt2):
    import monet

    model, batch = gpt2
    with pytest.raises(monet.InfeasibleBudgetError) as e:
        monet.optimize(copy.deepcopy(model), batch, budget=4096, cost="analytic", time_limit=6, progress=False)
    message = str(e.value)
    assert "computing the model's own loss" in message and "computing the chunked loss" in message
    assert e.value.min_budget_bytes is not None and str(e.value.min_budget_bytes) in message


def test_auto_is_the_models_own_loss_where_the_logits_are_small():
    """A language model whose logits are a small part of its peak is captured once, as it computes
    its loss (`monet.lm_choice.worth_chunking` is 0)."""
    import monet
    from monet.lm_choice import worth_chunking

    model, batch = _gpt2(vocab=64, width=64, batch=2)
    plan = monet.prepare(copy.deepcopy(model), batch, cost="analytic", progress=False)
    assert worth_chunking(plan) == 0
    wrapper = monet.optimize(copy.deepcopy(model), batch, budget="70%", cost="analytic", time_limit=5, progress=False)
    assert not fused(wrapper.solution.meta.graph_summary)
