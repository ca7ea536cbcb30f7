"""A loss to train a model with when it has none: cross-entropy against a fixed random target
(``monet demo``'s, so that every method it compares trains the same loss from the same data)."""
from __future__ import annotations

import copy
from typing import Callable

import torch
import torch.nn.functional as F
from torch import nn


def _cross_entropy_last_dim(out: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """Cross-entropy with classes on the last dim of ``out`` (B, T, V) and ``target`` (B, T)."""
    return F.cross_entropy(out.transpose(1, 2), target)


def random_target(model: nn.Module, inputs, tokens: bool, seed: int = 1) -> tuple[Callable, torch.Tensor] | None:
    """``(loss_fn(output, target) -> scalar, target)`` for ``model`` on ``inputs``
    (`monet.inputs.ExampleInputs`), or None when the output is not a tensor (a ``ModelOutput`` or a
    dict: the model is then trained through its own loss, `monet.profiling.measure.loss_of`).

    The loss is cross-entropy against a random target drawn from the generator seeded ``seed``:
    classes on dim 1 (target (B, *spatial), int64), or, for a language model (``tokens``, output
    (B, T, V)), on the last dim (target (B, T)).  The target is on the output's device.
    """
    with torch.no_grad():
        probe = inputs.call(copy.deepcopy(model).eval())
    if not isinstance(probe, torch.Tensor):
        return None
    shape = probe.shape
    last = tokens and probe.dim() == 3
    n_classes = shape[-1] if last else shape[1]
    target_shape = shape[:-1] if last else (shape[0], *shape[2:])
    gen = torch.Generator().manual_seed(seed)
    target = torch.randint(0, n_classes, tuple(target_shape), generator=gen).to(probe.device)
    return (_cross_entropy_last_dim if last else F.cross_entropy), target

