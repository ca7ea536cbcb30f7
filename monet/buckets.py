"""Batches whose sequence length changes every step: one schedule per length bucket.

A language model's data collator pads each batch to its longest sequence, so the length changes
from step to step.  A schedule is solved for one graph, whose shapes are fixed; but a graph that
is the same but for smaller sizes runs the same schedule with less memory (every activation is
smaller), which `monet.wrapper.MONeTWrapper` allows.  `BucketedWrapper` holds one solution per
*bucket*, a longest sequence length: a call of length T runs the schedule of the smallest bucket
of at least T tokens, traced at T itself (no padding: the model computes exactly what it would
plain).  Each bucket's schedule is solved at that bucket's length for one budget in bytes
(`optimize_buckets`), so every length up to the longest bucket runs under the budget.

Each new length is a new trace of the model (AOTAutograd's, seconds for a large model; the
export of Dynamo is done once per bucket): pad batches to a multiple of 8 or 64
(``DataCollatorWithPadding(pad_to_multiple_of=64)``) to keep the number of lengths small.
"""
from __future__ import annotations

import bisect

import torch
import torch.nn as nn

from monet.inputs import ExampleInputs
from monet.solution import SolutionMismatchError, load_solution, save_solution
from monet.solver.budget import parse_budget
from monet.wrapper import MONeTWrapper, model_attribute

#: the dimension of a (batch, sequence, ...) input that holds the sequence
SEQ_DIM = 1


def sequence_length(inputs: ExampleInputs, dim: int = SEQ_DIM) -> int:
    """The sequence length of a call: dimension ``dim`` of its first tensor (``input_ids``
    (B, T): T).

    Raises:
        ValueError: the first tensor has no such dimension."""
    x = inputs.first
    if x.dim() <= dim:
        raise ValueError(f"the first input has shape {tuple(x.shape)}: no sequence dimension {dim}")
    return int(x.shape[dim])


def resized(inputs: ExampleInputs, length: int, dim: int = SEQ_DIM) -> ExampleInputs:
    """``inputs`` with every tensor whose dimension ``dim`` has the first tensor's length cut or
    padded to ``length``: padded with 0 (token ids, attention masks: padding attends to nothing)
    and -100 for ``labels`` and ``target`` (ignored by the loss).  A tensor passed under two names
    (``labels=input_ids``) stays one tensor: Dynamo traces one input then, and the graph differs.  Only shapes matter to a solve; the values keep
    the padded batch's loss that of its real tokens."""
    old = sequence_length(inputs, dim)
    done: dict[int, torch.Tensor] = {}  # one tensor passed twice stays one (labels=ids): the graph differs

    def fit(name, t):
        if not isinstance(t, torch.Tensor) or t.dim() <= dim or t.shape[dim] != old:
            return t
        if id(t) not in done:
            done[id(t)] = _fit(name, t)
        return done[id(t)]

    def _fit(name, t):
        if length <= old:
            return t.narrow(dim, 0, length).contiguous()
        pad_shape = list(t.shape)
        pad_shape[dim] = length - old
        fill = -100 if name in ("labels", "target") else 0
        return torch.cat([t, torch.full(pad_shape, fill, dtype=t.dtype, device=t.device)], dim=dim)

    args = tuple(fit(None, a) for a in inputs.args)
    kwargs = {k: fit(k, v) for k, v in inputs.kwargs.items()}
    return ExampleInputs(args, kwargs)


class BucketedWrapper(nn.Module):
    """Train ``model`` on batches of any sequence length up to its longest bucket, each length
    under the schedule of the smallest bucket that holds it.

    Args:
        model: the ``nn.Module`` the solutions were made for.
        solutions: ``{bucket length: solution}``, each a `Solution` or a path (as
            `MONeTWrapper` takes), solved at that sequence length.
        dim: the sequence dimension of the first input (default 1: ``(batch, tokens)``).

    Called as the model is; returns what the model returns.  ``state_dict`` has the model's own
    keys.  ``wrappers`` maps each bucket to its `MONeTWrapper`.

    Raises:
        ValueError: no solutions, or a bucket length that is not a positive int.
        SolutionMismatchError: (on a call) a sequence longer than the longest bucket; the message
            names it and what to solve for.
    """

    def __init__(self, model: nn.Module, solutions: dict, dim: int = SEQ_DIM):
        super().__init__()
        if not solutions:
            raise ValueError("a BucketedWrapper needs at least one bucket's solution")
        if any(not isinstance(L, int) or L < 1 for L in solutions):
            raise ValueError(f"bucket lengths must be positive ints, got {sorted(solutions, key=str)}")
        self.model = model
        self.dim = dim
        self.buckets = sorted(solutions)
        # not submodules: their parameters are the model's
        self.__dict__["wrappers"] = {L: MONeTWrapper(model, solutions[L]) for L in self.buckets}

    @property
    def solutions(self) -> dict:
        """``{bucket length: Solution}``."""
        return {L: w.solution for L, w in self.wrappers.items()}

    def bucket_for(self, length: int) -> int:
        """The smallest bucket of at least ``length`` tokens.

        Raises:
            SolutionMismatchError: ``length`` exceeds the longest bucket."""
        i = bisect.bisect_left(self.buckets, length)
        if i == len(self.buckets):
            raise SolutionMismatchError(
                f"a batch of sequence length {length} is longer than the longest bucket, {self.buckets[-1]} tokens: "
                f"solve a bucket for it (monet.optimize(..., buckets=[..., {length}])) or truncate the batches")
        return self.buckets[i]

    def forward(self, *args, **kwargs):
        """The model's forward; in training, through the schedule of the call's bucket."""
        if not (self.training and torch.is_grad_enabled()):
            return self.model(*args, **kwargs)
        length = sequence_length(ExampleInputs(args, kwargs), self.dim)
        return self.wrappers[self.bucket_for(length)](*args, **kwargs)

    def __getattr__(self, name):
        try:
            return super().__getattr__(name)
        except AttributeError:
            return model_attribute(self, name)  # the model's own attributes (Trainer reads them)

    def state_dict(self, *args, **kwargs):
        return self.model.state_dict(*args, **kwargs)

    def load_state_dict(self, state_dict, strict: bool = True, assign: bool = False):
        return self.model.load_state_dict(state_dict, strict=strict, assign=assign)

    def save(self, prefix) -> list[str]:
        """Write each bucket's solution as ``<prefix>-<length>.monet``; returns the paths.  Load
        them with ``BucketedWrapper(model, {L: path, ...})``."""
        paths = []
        for L, w in self.wrappers.items():
            path = f"{prefix}-{L}.monet"
            save_solution(w.solution, path)
            paths.append(path)
        return paths

    def extra_repr(self) -> str:
        return f"buckets {self.buckets} (sequence dimension {self.dim})"


def optimize_buckets(model: nn.Module, example_inputs, buckets, budget="50%", *, optimize, prepare, loss_fn=None,
                     target=None, time_limit: float = 60.0, options=None, dim: int = SEQ_DIM):
    """`monet.optimize` for every bucket length: the example inputs cut or padded to each length
    (`resized`), one budget in bytes for all (a percentage is of the longest bucket's plain peak,
    which ``prepare`` measures first), each bucket solved in ``time_limit`` of its own with the
    `monet.options.Options` ``options``.  ``optimize`` and ``prepare`` are `monet.plan`'s (passed
    in by `monet.optimize`, which calls this).  Returns a `BucketedWrapper`.

    Raises:
        ValueError: no buckets, or one that is not a positive int; as `monet.optimize`.
        monet.solver.ilp.InfeasibleBudgetError: the budget does not fit the longest bucket.
    """
    from monet.options import Options

    options = options or Options()
    lengths = sorted({int(b) for b in buckets})
    if not lengths or lengths[0] < 1:
        raise ValueError(f"buckets must be positive sequence lengths, got {buckets!r}")
    inputs = ExampleInputs.of(example_inputs)

    def at(L):
        if target is None:
            return resized(inputs, L, dim), {}
        both = resized(ExampleInputs(inputs.args, {**inputs.kwargs, "target": target}), L, dim)
        return ExampleInputs(both.args, {k: v for k, v in both.kwargs.items() if k != "target"}), \
            {"target": both.kwargs["target"]}
    if isinstance(budget, str) and budget.strip().endswith("%"):
        x, t = at(lengths[-1])
        # plain PyTorch's peak of the model as it computes its loss (lm_loss does not change it)
        longest = prepare(model, x, loss_fn=loss_fn, progress=options.progress, **t,
                          **{**options.capture_and_costs(), "lm_loss": None})
        budget = parse_budget(budget, longest.eager_peak_bytes)
    solutions = {}
    for L in reversed(lengths):  # the longest first: it decides whether the budget fits at all
        x, t = at(L)
        solutions[L] = optimize(model, x, budget, loss_fn=loss_fn, time_limit=time_limit, options=options,
                                **t).solution
    return BucketedWrapper(model, solutions, dim)


def load_buckets(model: nn.Module, paths, dim: int = SEQ_DIM) -> BucketedWrapper:
    """A `BucketedWrapper` from solution files written by `BucketedWrapper.save`: each file's
    bucket is its solution's sequence length (its ``input_shape``'s first entry)."""
    solutions = {}
    for path in paths:
        sol = load_solution(path)
        solutions[int(sol.meta.input_shape[dim - 1])] = sol
    return BucketedWrapper(model, solutions, dim)


__all__ = ["BucketedWrapper", "SEQ_DIM", "load_buckets", "optimize_buckets", "resized", "sequence_length"]
