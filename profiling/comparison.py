"""One training method measured against plain PyTorch (``monet demo``'s rows): measured peak,
overhead and a gradient check, each as `monet.profiling.measure` defines it (docs/design.md, "Measuring").

A method is a module that trains the same model from the same weights: plain PyTorch itself, a
`MONeTWrapper`, Chen's checkpointing or ``torch.compile`` (`monet.profiling.baselines`).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch
from torch import nn

from monet.profiling.measure import loss_of, max_rel_diff, step_overhead, step_peak, train_losses


@dataclass
class Training:
    """Losses of a few SGD steps (0-d tensors) and the first step's gradients by position."""

    losses: list
    grads: dict

    @staticmethod
    def of(model: nn.Module, inputs, steps: int, loss_fn=loss_of) -> "Training":
        """Train ``model`` (changed: its weights move) ``steps`` steps (`measure.train_losses`)."""
        return Training(*train_losses(model, inputs, steps=steps, loss_fn=loss_fn))

    def versus(self, reference: "Training") -> tuple[bool, float]:
        """(bitwise: every loss and every first-step gradient equal to ``reference``'s bit for bit,
        the largest relative gradient difference `measure.max_rel_diff`)."""
        same = (len(self.losses) == len(reference.losses)
                and all(torch.equal(a, b) for a, b in zip(self.losses, reference.losses))
                and self.grads.keys() == reference.grads.keys()
                and all(torch.equal(self.grads[k], reference.grads[k]) for k in self.grads))
        return same, (0.0 if same else max_rel_diff(self.grads, reference.grads))


@dataclass
class MethodResult:
    """One method's figures: bytes, fractions, seconds; None where not measured.

    Attributes:
        method: its name in the table.
        peak_bytes: measured peak of one training iteration (`measure.step_peak`), bytes.
        overhead: iteration time / plain PyTorch's - 1, interleaved, the median of each turn's
            ratio (`measure.step_overhead`).
        median_s: its median iteration time, seconds.
        bitwise: losses and first-step gradients equal plain PyTorch's bit for bit.
        grad_error: largest relative gradient difference from plain PyTorch (`measure.max_rel_diff`).
        budget_bytes, predicted_peak_bytes: a schedule's budget and the solver's predicted peak.
        predicted_overhead: the solver's predicted overhead of a schedule
            (`monet.solution.SolutionMeta.predicted_overhead`, 0.1 = +10 %).
        note: what the method ran, or why it did not.
    """

    method: str
    peak_bytes: int | None = None
    overhead: float | None = None
    median_s: float | None = None
    bitwise: bool | None = None
    grad_error: float | None = None
    budget_bytes: int | None = None
    predicted_peak_bytes: int | None = None
    predicted_overhead: float | None = None
    note: str = ""


def measure_method(result: MethodResult, candidate: nn.Module, plain: nn.Module, reference: Training, inputs,
                   steps: int, repeats: int, loss_fn=loss_of,
                   log: Callable[[str], None] | None = None) -> MethodResult:
    """Fill ``result`` with ``candidate``'s measured peak, its gradient check against ``reference``
    (plain PyTorch's `Training` of ``steps`` steps from the same weights: ``candidate``'s weights
    then move too) and its overhead against ``plain`` (``repeats`` interleaved iterations each);
    ``inputs`` as `monet.inputs.ExampleInputs.of` takes them, trained through ``loss_fn`` of the
    output.  ``log(line)`` gets one line.  Returns ``result``."""
    result.peak_bytes = step_peak(candidate, inputs, loss_fn)
    result.bitwise, result.grad_error = Training.of(candidate, inputs, steps, loss_fn).versus(reference)
    result.overhead, result.median_s, plain_s = step_overhead(plain, candidate, inputs, repeats=repeats,
                                                              loss_fn=loss_fn)
    if log is not None:
        log(f"  {result.method}: peak {result.peak_bytes / 2**20:.1f} MiB, median {result.median_s:.3f} s "
            f"vs plain {plain_s:.3f} s, gradients {'bitwise' if result.bitwise else f'{result.grad_error:.1e}'}")
    return result
