"""transformers' attention masks in a captured graph (`monet.frontend.masks_as_compiled`): an encoder
called without ``attention_mask`` gets no mask, as in eager PyTorch; one called with a padding mask
keeps it; the gradients are plain PyTorch's either way, bit for bit."""
from __future__ import annotations

import copy

import pytest
import torch

from monet.capture import capture
from monet.inputs import ExampleInputs
from monet.matrices import schedule_from_matrices
from monet.wrapper import scheduled_module
from reach_models import declare_torchvision_ops

pytest.importorskip("transformers")
declare_torchvision_ops()  # transformers imports torchvision where it is installed


def _bert():
    from transformers import BertConfig, BertForMaskedLM

    torch.manual_seed(0)
    return BertForMaskedLM(BertConfig(vocab_size=128, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                                      intermediate_size=64, max_position_embeddings=64, pad_token_id=0))


def _ids():
    return torch.randint(1, 128, (2, 16), generator=torch.Generator().manual_seed(1))


def _square_masks(graph, t: int) -> list:
    """The nodes of ``graph``'s joint graph that give a (B, 1, T, T) mask."""
    return [n for n in graph.joint.graph.nodes if tuple(getattr(n.meta.get("val"), "shape", ()))[1:] == (1, t, t)]


def _plain_and_monet_grads(model, kwargs):
    graph = capture(model, ExampleInputs.of(kwargs))
    keep = schedule_from_matrices(graph, [[True] * len(graph.fwd)] * len(graph.bwd),
                                  [[False] * len(graph.fwd)] * len(graph.bwd))

    def step(m):
        m.train()
        torch.manual_seed(5)
        m(**kwargs).loss.backward()
        return [p.grad for p in m.parameters() if p.grad is not None]

    return graph, step(copy.deepcopy(model)), step(scheduled_module(copy.deepcopy(model), lambda _g: keep))


def test_an_encoder_without_a_mask_is_captured_without_one():
    import transformers.masking_utils as masking

    exporting = masking.is_torchdynamo_exporting
    ids = _ids()
    graph, plain, monet = _plain_and_monet_grads(_bert(), {"input_ids": ids, "labels": ids})
    assert masking.is_torchdynamo_exporting is exporting  # restored after the capture
    assert not _square_masks(graph, 16)
    assert len(plain) == len(monet) and all(torch.equal(a, b) for a, b in zip(plain, monet))


def test_a_padding_mask_is_kept_with_plain_gradients():
    ids = _ids()
    mask = torch.ones_like(ids)
    mask[0, 11:] = 0  # the first sequence padded
    graph, plain, monet = _plain_and_monet_grads(_bert(), {"input_ids": ids, "attention_mask": mask, "labels": ids})
    assert _square_masks(graph, 16)
    assert len(plain) == len(monet) and all(torch.equal(a, b) for a, b in zip(plain, monet))
