"""Training a schedule and plain PyTorch side by side (``monet demo``): the same weights, data and
RNG, SGD with momentum, the loss of every step and the gradient differences.

Implementations with other arithmetic than PyTorch's (another convolution kernel) change the
gradients by themselves; a third model with the same implementations and no recomputation (keep
everything, `monet.solver.solve.same_kernels_solution`) separates their effect from the schedule's:
recomputation alone must change nothing (bitwise).
"""
from __future__ import annotations

import copy
from dataclasses import dataclass, field
from typing import Callable

import torch
import torch.nn.functional as F
from torch import nn


@dataclass
class SideBySide:
    """Losses per step (0-d tensors) and relative gradient differences (`check.grad_rel_error`)."""

    schedule_losses: list = field(default_factory=list)
    plain_losses: list = field(default_factory=list)
    same_losses: list = field(default_factory=list)  # empty without a same-implementations model
    grad_diff: float = 0.0  # schedule vs plain PyTorch, first step (later ones start from moved weights)
    same_diff: float = 0.0  # schedule vs same implementations, largest over all steps

    @property
    def identical(self) -> bool:
        """Whether the schedule's losses equal plain PyTorch's bit for bit."""
        return all(torch.equal(a, b) for a, b in zip(self.schedule_losses, self.plain_losses))

    @property
    def identical_to_same(self) -> bool:
        """Whether the schedule's losses equal the same implementations' bit for bit."""
        return all(torch.equal(a, b) for a, b in zip(self.schedule_losses, self.same_losses))


def random_target_loss(model: nn.Module, inputs, tokens: bool, seed: int = 1) -> Callable:
    """``loss_fn(output) -> scalar`` for ``model`` on ``inputs`` (`monet.inputs.ExampleInputs`).

    A model whose output is a tensor gets cross-entropy against a random target (seed ``seed``):
    classes on dim 1, or, for a language model (``tokens``, output (B, T, V)), on the last dim.  Any
    other output (a ModelOutput or dict) is trained through its own loss (`check.loss_of`).
    """
    from monet.profiling.check import loss_of

    with torch.no_grad():
        probe = inputs.call(copy.deepcopy(model).eval())
    if not isinstance(probe, torch.Tensor):
        return loss_of
    shape = probe.shape
    n_classes = shape[-1] if tokens else shape[1]
    target_shape = shape[:-1] if tokens else (shape[0], *shape[2:])
    gen = torch.Generator().manual_seed(seed)
    target = torch.randint(0, n_classes, tuple(target_shape), generator=gen).to(probe.device)

    def loss_fn(out):
        if tokens and out.dim() == 3:  # (B, T, V) -> classes on dim 1
            out = out.transpose(1, 2)
        return F.cross_entropy(out, target)

    return loss_fn


def _grads(model: nn.Module) -> dict:
    # by position: a wrapper's parameter names carry a "model." prefix
    return {i: p.grad for i, p in enumerate(model.parameters()) if p.grad is not None}


def train_side_by_side(schedule: nn.Module, plain: nn.Module, inputs, loss_fn: Callable, steps: int,
                       same: nn.Module | None = None, lr: float = 0.01, momentum: float = 0.9,
                       log: Callable[[str], None] | None = None) -> SideBySide:
    """Train ``schedule`` (a `MONeTWrapper`), ``plain`` (the same weights) and ``same`` (optional)
    for ``steps`` SGD steps on ``inputs`` (`ExampleInputs`), each step under ``torch.manual_seed(step)``
    for every model, and compare losses and gradients.  ``log(line)`` gets one line per step."""
    from monet.profiling.check import grad_rel_error

    res = SideBySide()
    runs = [(schedule, res.schedule_losses), (plain, res.plain_losses)]
    if same is not None:
        runs.append((same, res.same_losses))
    opts = [torch.optim.SGD(m.parameters(), lr=lr, momentum=momentum) for m, _ in runs]
    for step in range(steps):
        for (m, losses), opt in zip(runs, opts):
            torch.manual_seed(step)
            opt.zero_grad(set_to_none=True)
            loss = loss_fn(inputs.call(m))
            loss.backward()
            losses.append(loss.detach().clone())
        gw = _grads(schedule)
        if step == 0:
            res.grad_diff = grad_rel_error(gw, _grads(plain))
        if same is not None:
            res.same_diff = max(res.same_diff, grad_rel_error(gw, _grads(same)))
        for opt in opts:
            opt.step()
        if log is not None:
            log(f"  step {step + 1}: loss {res.schedule_losses[-1].item():.6f} (schedule), "
                f"{res.plain_losses[-1].item():.6f} (plain PyTorch)")
    return res
