"""Example inputs of a model: one tensor, a tuple of positional arguments, or keyword arguments.

Models are called in many ways: a CNN with one image batch ``model(x)``, a language model with
keyword arguments ``model(input_ids=ids, attention_mask=mask, labels=ids)``.  `ExampleInputs` holds
either form and gives what the capture, the costs and the wrapper need from it: the flat list of
leaves (the order AOTAutograd numbers its input placeholders in), the batch size (the first dimension
of the first tensor) and a readable description.  Values are never read: only shapes and dtypes.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch
import torch.utils._pytree as pytree


@dataclass(frozen=True)
class ExampleInputs:
    """Positional and keyword arguments of one call of a model.

    Attributes:
        args: positional arguments, e.g. ``(x,)`` with x of shape (B, 3, 224, 224).
        kwargs: keyword arguments, e.g. ``{"input_ids": ids, "labels": ids}`` with ids (B, T) int64.
    """

    args: tuple = ()
    kwargs: dict = field(default_factory=dict)

    @staticmethod
    def of(example: Any) -> "ExampleInputs":
        """A tensor ``x`` -> ``model(x)``; a tuple or list -> ``model(*example)``; a dict ->
        ``model(**example)``; an `ExampleInputs` as it is.

        Raises:
            TypeError: anything else, or inputs without any tensor.
        """
        if isinstance(example, ExampleInputs):
            inputs = example
        elif isinstance(example, torch.Tensor):
            inputs = ExampleInputs((example,), {})
        elif isinstance(example, (tuple, list)):
            inputs = ExampleInputs(tuple(example), {})
        elif isinstance(example, dict):
            if not all(isinstance(k, str) for k in example):
                raise TypeError("keyword example inputs need string keys (argument names)")
            inputs = ExampleInputs((), dict(example))
        else:
            raise TypeError(f"example inputs must be a tensor, a tuple of arguments or a dict of keyword "
                            f"arguments, not {type(example).__name__}")
        if not inputs.tensors():
            raise TypeError("the example inputs hold no tensor: monet needs at least one input tensor "
                            "(its first dimension is the batch)")
        return inputs

    def leaves(self) -> list:
        """The pytree leaves of ``(args, kwargs)``, in the order AOTAutograd numbers its inputs."""
        return pytree.tree_leaves((self.args, self.kwargs))

    def tensors(self) -> list[torch.Tensor]:
        return [t for t in self.leaves() if isinstance(t, torch.Tensor)]

    @property
    def first(self) -> torch.Tensor:
        """The first tensor: its first dimension is the batch, its shape and dtype name the input."""
        return self.tensors()[0]

    @property
    def batch_size(self) -> int:
        """First dimension of the first tensor (1 for a 0-d tensor)."""
        t = self.first
        return int(t.shape[0]) if t.dim() else 1

    def to(self, device) -> "ExampleInputs":
        """The same inputs with every tensor moved to ``device`` (no copy where it already is)."""
        def move(v):
            return v.to(device) if isinstance(v, torch.Tensor) else v
        args, kwargs = pytree.tree_map(move, (self.args, self.kwargs))
        return ExampleInputs(tuple(args), dict(kwargs))

    def call(self, model):
        """``model(*args, **kwargs)``."""
        return model(*self.args, **self.kwargs)

    def describe(self) -> str:
        """``"(2, 3, 64, 64) float32"`` or ``"input_ids=(2, 16) int64, labels=(2, 16) int64"``."""
        def one(v):
            if isinstance(v, torch.Tensor):
                return f"{tuple(v.shape)} {str(v.dtype).removeprefix('torch.')}"
            return repr(v)
        parts = [one(a) for a in self.args] + [f"{k}={one(v)}" for k, v in self.kwargs.items()]
        return ", ".join(parts)


__all__ = ["ExampleInputs"]
