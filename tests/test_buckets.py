"""Batches of varying sequence length: one schedule per length bucket (`monet.buckets`).  A tiny
transformers GPT-2 is solved at two buckets for one budget in bytes, below plain PyTorch's peak at
both, so that each bucket's schedule recomputes; lengths at and under each bucket, where plain
PyTorch does not fit the budget either, train with plain PyTorch's loss and gradients, bitwise, at a
measured peak under the budget, and a longer batch is refused with what to do."""
from __future__ import annotations

import copy

import pytest
import torch

from reach_models import missing

pytestmark = pytest.mark.skipif(missing("transformers") is not None, reason=str(missing("transformers")))

BATCH, VOCAB = 4, 128


def _gpt2():
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(0)
    return GPT2LMHeadModel(GPT2Config(vocab_size=VOCAB, n_positions=128, n_embd=32, n_layer=2, n_head=2,
                                      bos_token_id=0, eos_token_id=0)).train()


def _batch(length: int, seed: int = 1):
    ids = torch.randint(0, VOCAB, (BATCH, length), generator=torch.Generator().manual_seed(seed))
    return dict(input_ids=ids, labels=ids, use_cache=False)


def _step(module, batch, model=None):
    """(loss, gradients by ``model``'s parameter names) of one step of ``module`` (``model``: the
    transformers model inside it, default ``module``)."""
    model = module if model is None else model
    for p in model.parameters():
        p.grad = None
    torch.manual_seed(7)  # the same dropout masks on both sides
    loss = module(**batch).loss
    loss.backward()
    return loss.detach(), {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}


@pytest.fixture(scope="module")
def bucketed():
    import monet

    model = _gpt2()
    plain = copy.deepcopy(model)
    wrapped = monet.optimize(model, _batch(64), budget="50%", buckets=[48, 64], cost="analytic", time_limit=5,
                             progress=False)
    return plain, model, wrapped


def test_one_budget_for_every_bucket(bucketed):
    _, _, wrapped = bucketed
    sols = wrapped.solutions
    assert sorted(sols) == [48, 64] == wrapped.buckets
    assert len({s.meta.budget_bytes for s in sols.values()}) == 1
    assert {s.meta.input_shape for s in sols.values()} == {(48,), (64,)}
    # half of the longest bucket's peak is under the shorter bucket's too: both recompute
    assert all(s.schedule.recompute_count() > 0 for s in sols.values())


@pytest.mark.parametrize("length", [44, 48, 56, 64])
def test_every_length_trains_as_pytorch_under_the_budget(bucketed, length):
    """44 and 56 tokens are lengths no schedule was traced at, each run by the bucket above it."""
    from monet.profiling.measure import step_peak

    plain, model, wrapped = bucketed
    batch = _batch(length, seed=length)
    budget = wrapped.solutions[64].meta.budget_bytes
    assert step_peak(plain, batch) > budget  # plain PyTorch does not fit: the schedule has to
    lw, gw = _step(wrapped, batch, model)
    lp, gp = _step(plain, batch)
    assert torch.equal(lw, lp)
    assert gw.keys() == gp.keys() and all(torch.equal(gw[k], gp[k]) for k in gp)
    bucket = wrapped.bucket_for(length)
    assert bucket == (48 if length <= 48 else 64)
    assert step_peak(wrapped, batch) <= budget


def test_a_longer_batch_is_refused(bucketed):
    from monet.solution import SolutionMismatchError

    _, _, wrapped = bucketed
    with pytest.raises(SolutionMismatchError, match=r"longest bucket, 64 tokens.*buckets=\[\.\.\., 80\]"):
        wrapped(**_batch(80))


def test_buckets_save_and_load(bucketed, tmp_path):
    from monet.buckets import load_buckets

    _, model, wrapped = bucketed
    paths = wrapped.save(tmp_path / "gpt2")
    again = load_buckets(model, paths)
    assert again.buckets == [48, 64]
    assert all(again.solutions[L] == wrapped.solutions[L] for L in again.buckets)
