"""Example inputs of a model: one tensor, a tuple of positional arguments, or keyword arguments.

Models are called in many ways: a CNN with one image batch ``model(x)``, a language model with
keyword arguments ``model(input_ids=ids, attention_mask=mask, labels=ids)``.  `ExampleInputs` holds
either form and gives what the capture, the costs and the wrapper need from it: the flat list of
leaves (the order AOTAutograd numbers its input placeholders in), the batch size (the first dimension
of the first tensor) and a readable description.  Values are never read: only shapes and dtypes.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.utils._pytree as pytree


#: argument types that are pytree leaves, not containers (`ExampleInputs.first`, `monet.wrapper.call_key`)
_SCALARS = (bool, int, float, complex, str, torch.dtype, torch.device)


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
        """The first tensor: its first dimension is the batch, its shape and dtype name the input.
        Raises IndexError without one."""
        for v in (*self.args, *self.kwargs.values()):  # the leaves' order while no argument is a container
            if isinstance(v, torch.Tensor):
                return v
            if not (v is None or isinstance(v, _SCALARS)):
                break
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


# ----------------------------------------------------------------------------------------------
# input specs: "input_ids=16:int64:50257,labels=16:int64:50257" or "3x64x64:float32"
# ----------------------------------------------------------------------------------------------

SPEC_FORMAT = ("[NAME=]SHAPE[:DTYPE[:HIGH]] entries separated by commas; SHAPE is one sample's sizes "
               "without the batch, joined by 'x' (3x224x224; empty for one scalar per sample), DTYPE a torch "
               "dtype (default float32), HIGH the exclusive upper bound of integer values (default 2); "
               "e.g. 'input_ids=16:int64:50257,labels=16:int64:50257' or '3x64x64:float32'")

_DTYPES = {
    "float32": torch.float32, "float": torch.float32, "float64": torch.float64, "double": torch.float64,
    "float16": torch.float16, "half": torch.float16, "bfloat16": torch.bfloat16,
    "int64": torch.int64, "long": torch.int64, "int32": torch.int32, "int": torch.int32,
    "int16": torch.int16, "short": torch.int16, "int8": torch.int8, "uint8": torch.uint8, "bool": torch.bool,
}
_NAME = re.compile(r"^[A-Za-z_]\w*$")


@dataclass(frozen=True)
class InputEntry:
    """One entry of an input spec: ``name`` (None for a positional argument), the shape of one
    sample without the batch dimension, the dtype and, for integer dtypes, the exclusive upper
    bound ``high`` of the values (drawn uniformly from ``[0, high)``)."""

    name: str | None
    shape: tuple[int, ...]
    dtype: torch.dtype
    high: int | None = None


def parse_inputs_spec(text: str) -> tuple[InputEntry, ...]:
    """Read an input spec (`SPEC_FORMAT`): comma-separated ``[NAME=]SHAPE[:DTYPE[:HIGH]]``.

    Entries without ``NAME=`` are positional arguments, in order, and come before the keyword
    ones, as in a Python call.  Floats are drawn from a standard normal, integers uniformly from
    ``[0, HIGH)`` (HIGH defaults to 2), bools are 0 or 1 (see `inputs_from_spec`).

    Raises:
        ValueError: an empty spec, or an entry that is malformed: a bad name, a size that is not a
            positive integer, an unknown dtype, HIGH on a float or bool dtype, HIGH not a positive
            integer or beyond the dtype's range, a repeated name, a positional entry after a keyword
            one.  The message quotes the entry and shows the format.
    """
    if not isinstance(text, str) or not text.strip():
        raise ValueError(f"empty input spec: expected {SPEC_FORMAT}")
    entries: list[InputEntry] = []
    for raw in text.split(","):
        entry = raw.strip()

        def bad(why: str):
            raise ValueError(f"bad input spec entry {entry!r}: {why}; expected {SPEC_FORMAT}")

        if not entry:
            bad("empty entry (two commas, or a trailing comma)")
        name, sep, rest = entry.partition("=")
        if sep:
            name = name.strip()
            if not _NAME.match(name):
                bad(f"{name!r} is not an argument name")
        else:
            name, rest = None, entry
        parts = [p.strip() for p in rest.split(":")]
        if len(parts) > 3:
            bad("too many ':' fields")
        shape_text, dtype_text, high_text = (parts + [None, None])[:3]
        sizes = [p for p in shape_text.lower().split("x")] if shape_text else []
        if any(not p.isdigit() or int(p) < 1 for p in sizes):
            bad(f"shape {shape_text!r} must be positive sizes joined by 'x', e.g. 3x224x224")
        if dtype_text is None or dtype_text == "":
            dtype = torch.float32
        elif dtype_text.removeprefix("torch.") in _DTYPES:
            dtype = _DTYPES[dtype_text.removeprefix("torch.")]
        else:
            bad(f"unknown dtype {dtype_text!r} (use one of {', '.join(_DTYPES)})")
        high = None
        if high_text is not None:
            if dtype.is_floating_point or dtype == torch.bool:
                bad(f"HIGH applies to integer dtypes only, not {str(dtype).removeprefix('torch.')}")
            if not high_text.isdigit() or int(high_text) < 1:
                bad(f"HIGH {high_text!r} must be a positive integer")
            high = int(high_text)
            limit = torch.iinfo(dtype).max + 1
            if high > limit:
                bad(f"HIGH {high} exceeds the range of {str(dtype).removeprefix('torch.')} (at most {limit})")
        elif not (dtype.is_floating_point or dtype == torch.bool):
            high = 2
        if name is None and any(e.name is not None for e in entries):
            bad("a positional entry (no NAME=) after a keyword entry; put positional entries first")
        if name is not None and any(e.name == name for e in entries):
            bad(f"the name {name!r} is given twice")
        entries.append(InputEntry(name, tuple(int(p) for p in sizes), dtype, high))
    return tuple(entries)


def inputs_from_spec(spec: "str | tuple[InputEntry, ...]", batch_size: int, *, seed: int = 0,
                     device=None) -> ExampleInputs:
    """Deterministic example inputs for an input spec (a string as `parse_inputs_spec` reads it, or
    its entries), each tensor of shape ``(batch_size, *entry.shape)``.

    Values come from one private generator seeded with ``seed``, entry by entry (the global RNG is
    untouched): floats from a standard normal (drawn in float32 for 16-bit dtypes, then cast),
    integers uniformly from ``[0, HIGH)``, bools 0 or 1.  A single float32 positional entry gives
    the same tensor as `monet.zoo.models.example_input` with that input shape and seed.

    Raises:
        ValueError: a malformed spec (see `parse_inputs_spec`) or a batch size below 1.
    """
    entries = parse_inputs_spec(spec) if isinstance(spec, str) else tuple(spec)
    if int(batch_size) < 1:
        raise ValueError(f"batch_size must be positive, got {batch_size}")
    gen = torch.Generator().manual_seed(seed)
    args, kwargs = [], {}
    for e in entries:
        shape = (int(batch_size), *e.shape)
        if e.dtype.is_floating_point:
            draw = e.dtype if e.dtype in (torch.float32, torch.float64) else torch.float32
            t = torch.randn(shape, generator=gen, dtype=draw).to(e.dtype)
        elif e.dtype == torch.bool:
            t = torch.randint(0, 2, shape, generator=gen).bool()
        else:
            t = torch.randint(0, e.high, shape, generator=gen, dtype=e.dtype)
        if device is not None:
            t = t.to(device)
        if e.name is None:
            args.append(t)
        else:
            kwargs[e.name] = t
    return ExampleInputs(tuple(args), kwargs)




_LEAVES = (torch.Tensor, *_SCALARS)


def _leaf_key(v) -> tuple:
    return (tuple(v.shape), v.dtype, v.device) if isinstance(v, torch.Tensor) else ("const", repr(v))


def call_key(inputs: ExampleInputs, autocast) -> tuple:
    """What a traced graph is specific to: the inputs' structure, each tensor's shape, dtype and
    device, the non-tensor arguments' values, and the autocast setting (a hashable tuple).

    Computed on every training call: where every argument is a tensor or a scalar (the usual
    call), the structure is the number of positional arguments and the keyword names, without
    flattening a pytree (3 us instead of 16 us on this project's CPU); otherwise the pytree's
    spec.  The two forms have different lengths, so they never collide."""
    import torch.utils._pytree as pytree

    args, kwargs = inputs.args, inputs.kwargs
    values = (*args, *kwargs.values())
    if all(v is None or isinstance(v, _LEAVES) for v in values):
        return (len(args), tuple(kwargs), tuple(map(_leaf_key, values)), autocast)
    leaves, spec = pytree.tree_flatten((args, kwargs))
    return (str(spec), tuple(map(_leaf_key, leaves)), autocast)


__all__ = ["ExampleInputs", "call_key", "InputEntry", "SPEC_FORMAT", "parse_inputs_spec", "inputs_from_spec"]
