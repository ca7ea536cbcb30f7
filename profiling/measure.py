"""Checks of a schedule against plain PyTorch: gradients, measured peak memory and overhead.

One training iteration, as docs/design.md ("Measuring") defines it: parameter gradients set to None,
``y = model(x); y.backward(g)`` with ``g`` allocated beforehand, no optimizer step.  ``x`` may be
any inputs `monet.inputs.ExampleInputs.of` takes (keyword arguments of a language model ...); a
model whose output is not a tensor (a ``ModelOutput`` or dict with a ``loss``) has ``g = None``
(`output_grad`) and is trained through ``loss_of(y).backward()``.  Peak memory is
measured at the allocator (`monet.profiling.peak.measure_peak`) and includes parameters,
buffers, the input and ``g``.  Overhead is measured in one process, the schedule and plain PyTorch
interleaved after warm-up: the median over the turns of the schedule's iteration time over plain
PyTorch's of the same turn, minus 1 (`paired_overhead`), which a drift of the machine's speed
between turns leaves alone.

Mixed precision: every function takes ``autocast``, a setting of `monet.mixed_precision` (None, or
``("cpu", "bfloat16")`` ...); the forward pass then runs inside ``torch.autocast`` and the backward
pass outside it, as PyTorch's automatic mixed precision recipe has it, for the schedule and for
plain PyTorch alike.
"""
from __future__ import annotations

import contextlib
import copy
import statistics
import time
from dataclasses import dataclass

import torch
import torch.nn as nn

from monet import mixed_precision
from monet.profiling.peak import PeakMemory, live_tensor_bytes, measure_peak


@dataclass
class CheckResult:
    """Measured figures (bytes, seconds, fractions); None where not measured."""

    peak_bytes: int | None = None
    eager_measured_peak_bytes: int | None = None
    grad_rel_error: float | None = None
    grads_bitwise_equal: bool | None = None
    buffers_bitwise_equal: bool | None = None
    overhead: float | None = None
    median_time_s: float | None = None
    eager_median_time_s: float | None = None


def _sync(device):
    if torch.device(device).type == "cuda":
        torch.cuda.synchronize()


def _inputs(x):
    """`ExampleInputs` of ``x`` (a tensor, a tuple of positional arguments, a dict of keyword
    arguments or an `ExampleInputs`), and the device of its first tensor."""
    from monet.inputs import ExampleInputs

    inputs = ExampleInputs.of(x)
    return inputs, inputs.first.device


def _forward(model: nn.Module, x, autocast=None):
    with mixed_precision.context(autocast):
        return _inputs(x)[0].call(model)


def _backward(output, g: torch.Tensor | None) -> None:
    """``output.backward(g)``; with ``g`` None, ``loss_of(output).backward()``."""
    if g is None:
        loss_of(output).backward()
    else:
        output.backward(g)


def run_iteration(model: nn.Module, x, g: torch.Tensor | None, autocast=None) -> None:
    """One training iteration without the optimizer: the parameters' gradients set to None, the
    forward pass (``x`` a tensor, a tuple of positional inputs or a dict of keyword inputs; under
    ``autocast``, a `monet.mixed_precision` setting, when given) and the backward pass from the output gradient ``g`` (None:
    the output is a scalar loss)."""
    for p in model.parameters():
        p.grad = None
    _backward(_forward(model, x, autocast), g)


def output_grad(model: nn.Module, x, seed: int = 0, autocast=None) -> torch.Tensor | None:
    """A fixed random gradient for the model's output, shaped like it (a stand-in for a loss); of
    the output's dtype under ``autocast`` (bf16 for a bf16 autocast model).

    ``x``: one input tensor, or any inputs `monet.inputs.ExampleInputs.of` takes.  A model whose
    output is not a tensor (a ``ModelOutput`` or a dict) gets None: the iteration helpers here then
    train it through `loss_of` (its ``loss``, e.g. a transformers model given ``labels``).
    """
    inputs, device = _inputs(x)
    with torch.no_grad():
        shape_probe = _forward(copy.deepcopy(model).eval(), inputs, autocast)
    if not isinstance(shape_probe, torch.Tensor):
        return None
    gen = torch.Generator(device="cpu").manual_seed(seed)
    return torch.randn(shape_probe.shape, generator=gen, dtype=shape_probe.dtype).to(device)


def _iteration_memory(model: nn.Module, inputs, step, *allocated) -> PeakMemory:
    """Memory of ``step()`` after one warm-up ``step()``, parameter gradients None before each;
    the baseline (bytes live before the step) is the model, the input tensors and ``allocated``."""
    inputs, device = _inputs(inputs)
    for p in model.parameters():
        p.grad = None
    step()  # warm-up: AOTAutograd (the wrapper) exports and traces on its first call
    for p in model.parameters():
        p.grad = None
    baseline = live_tensor_bytes(model, inputs.tensors(), *allocated, device=device)
    return measure_peak(step, device, baseline_bytes=baseline)


def measure_iteration_memory(model: nn.Module, x, g: torch.Tensor | None, autocast=None) -> PeakMemory:
    """Memory of one iteration after one warm-up iteration (parameter gradients None at start):
    `PeakMemory` with the allocated peak in bytes and, on CUDA, ``max_memory_reserved`` in bytes
    (the caching allocator's segments: the allocated peak plus fragmentation and cached blocks).

    ``x`` as `output_grad` takes it; ``g`` from `output_grad` (None: train through `loss_of`).
    The baseline includes the model, the inputs and ``g``.
    """
    inputs, _ = _inputs(x)
    return _iteration_memory(model, inputs, lambda: _backward(_forward(model, inputs, autocast), g),
                             *([] if g is None else [g]))


def measure_iteration_peak(model: nn.Module, x, g: torch.Tensor | None, autocast=None) -> int:
    """Peak bytes of one iteration (`measure_iteration_memory`'s allocated peak)."""
    return measure_iteration_memory(model, x, g, autocast).peak_bytes


def grads_and_buffers(model: nn.Module, x, g: torch.Tensor | None, seed: int = 0, autocast=None):
    """Gradients and buffers after one iteration from the RNG state ``seed``, keyed by position.

    Positions (the order of ``parameters()`` / ``buffers()``), not names: a wrapper prefixes the
    names of the model it wraps.  ``x`` and ``g`` as `measure_iteration_peak` takes them.
    """
    torch.manual_seed(seed)
    run_iteration(model, x, g, autocast)
    grads = {i: p.grad.detach().clone() for i, p in enumerate(model.parameters()) if p.grad is not None}
    bufs = {i: b.detach().clone() for i, b in enumerate(model.buffers())}
    return grads, bufs


def max_rel_diff(a: dict, b: dict, floor: float = 1e-3) -> float:
    """max over tensors of ||a - b||_inf / max(||b||_inf, floor * max_k ||b_k||_inf); inf if the keys differ.

    The floor: a gradient that is zero in exact arithmetic (a convolution's bias in front of
    BatchNorm, which removes the mean) holds only rounding noise, so it is compared on the scale
    of the model's largest gradient rather than its own.
    """
    if a.keys() != b.keys():
        return float("inf")
    inf = {k: (b[k].double().abs().max().item() if b[k].numel() else 0.0) for k in b}
    top = max(inf.values(), default=0.0)
    worst = 0.0
    for k in a:
        d = (a[k].double() - b[k].double()).abs().max().item() if a[k].numel() else 0.0
        worst = max(worst, d / max(inf[k], floor * top, 1e-30))
    return worst


def grad_rel_error(a: dict, b: dict) -> float:
    """Relative error of all gradients together: ||a - b||_2 / ||b||_2 over the concatenation of
    every tensor (inf if the keys differ).

    This is the criterion of "gradients within 1e-5 of PyTorch's" (docs/design.md, "What must stay true") when a schedule runs
    other kernels: a per-tensor ratio would divide rounding noise by gradients that are zero in
    exact arithmetic (a convolution's bias in front of BatchNorm).
    """
    if a.keys() != b.keys():
        return float("inf")
    num = sum(float((a[k].double() - b[k].double()).pow(2).sum()) for k in a)
    den = sum(float(b[k].double().pow(2).sum()) for k in b)
    return (num ** 0.5) / max(den ** 0.5, 1e-300)


def comparison_numerics(device):
    """The numerics both sides of a gradient comparison run under on ``device`` (docs/design.md, "What
    must stay true"): on CUDA full fp32 (`monet.compat.strict_fp32`: TF32 off for cuDNN
    convolutions, which torch 2.11-2.15 run in TF32 by default, and for cuBLAS matmuls), so that
    a schedule running another convolution algorithm than plain PyTorch (full mode's
    implementations; cuDNN's heuristics, which weigh the free memory) differs by fp32 rounding,
    not by TF32's 10-bit mantissa, compounded over the layers; elsewhere nothing changes."""
    from monet import compat

    return compat.strict_fp32() if torch.device(device).type == "cuda" else contextlib.nullcontext()


def compare_gradients(make_plain, make_wrapped, x, g: torch.Tensor | None, seed: int = 0, autocast=None):
    """Run one iteration of each from identical weights and RNG; return (`grad_rel_error`, grads
    bitwise equal, buffers bitwise equal).

    ``make_plain()`` and ``make_wrapped()`` build the two models from the same weights; ``x`` and
    ``g`` as `measure_iteration_peak` takes them.  Both run under `comparison_numerics` of the
    inputs' device (full fp32 on CUDA).
    """
    with comparison_numerics(_inputs(x)[1]):
        ga, ba = grads_and_buffers(make_wrapped(), x, g, seed, autocast)
        gb, bb = grads_and_buffers(make_plain(), x, g, seed, autocast)
    equal = ga.keys() == gb.keys() and all(torch.equal(ga[k], gb[k]) for k in ga)
    bequal = ba.keys() == bb.keys() and all(torch.equal(ba[k], bb[k]) for k in ba)
    return grad_rel_error(ga, gb), equal, bequal


def paired_ratio(times, reference_times) -> float:
    """Median, over the turns of an interleaved timing (`interleaved_times_of`), of one callable's
    seconds over the reference's in the same turn: both lists of equal length, the i-th of each
    from turn i.  A slowdown of the machine that lasts a few turns moves both sides of those turns
    and leaves their ratio, where two medians taken apart move by the part of it each side caught.

    Raises:
        ValueError: lists of different or zero length, or a reference time that is not positive.
    """
    import numpy as np

    t, ref = np.asarray(times, dtype=float), np.asarray(reference_times, dtype=float)
    if t.shape != ref.shape or t.size == 0:
        raise ValueError(f"paired times need two lists of one length > 0, got {t.shape} and {ref.shape}")
    if (ref <= 0).any():
        raise ValueError("a reference time is not positive: nothing to divide by")
    return float(np.median(t / ref))


def interleaved_times_of(iterates, repeats: int = 5, warmup: int = 1, device="cpu",
                         clock=time.perf_counter) -> list[list[float]]:
    """Seconds of every timed call of each of ``iterates`` (callables; one list per callable, of
    ``repeats`` floats, the i-th of each from the same turn), each called ``warmup`` times and then
    ``repeats`` times in turn (a, b, c, a, b, c ...) in this process (docs/design.md, "Measuring").
    ``clock``: wall time by default; ``time.process_time`` counts this process's CPU time, which the
    other jobs of a shared machine move less (on the CPU only: a GPU's work is not in it)."""
    for _ in range(warmup):
        for it in iterates:
            it()
    times = [[] for _ in iterates]
    for _ in range(repeats):
        for it, acc in zip(iterates, times):
            _sync(device)
            t0 = clock()
            it()
            _sync(device)
            acc.append(clock() - t0)
    return times


def overhead(plain: nn.Module, wrapped: nn.Module, x, g: torch.Tensor | None, repeats: int = 5,
             warmup: int = 1, autocast=None) -> tuple[float, float, float]:
    """(overhead fraction, median schedule time s, median plain time s), interleaved in one process
    (`paired_overhead`); ``x`` and ``g`` as `measure_iteration_peak` takes them."""
    x, device = _inputs(x)
    return paired_overhead(lambda: run_iteration(wrapped, x, g, autocast),
                           lambda: run_iteration(plain, x, g, autocast), repeats, warmup, device)


def paired_overhead(iterate, iterate_plain, repeats: int = 5, warmup: int = 1, device="cpu") -> tuple[float, float, float]:
    """``(overhead fraction, median seconds of iterate(), median seconds of iterate_plain())``:
    both called ``warmup`` times and then ``repeats`` times alternately in this process
    (`interleaved_times_of`), the overhead the median over those turns of ``iterate``'s time over
    ``iterate_plain``'s of the same turn, minus 1 (`paired_ratio`; docs/design.md, "Measuring":
    why turns are paired)."""
    t, tp = interleaved_times_of((iterate, iterate_plain), repeats, warmup, device)
    return paired_ratio(t, tp) - 1.0, statistics.median(t), statistics.median(tp)


# ----------------------------------------------------------------------------------------------
# models called with any inputs, trained from a loss (transformers, timm, torchvision)
# ----------------------------------------------------------------------------------------------


def loss_of(output) -> torch.Tensor:
    """The scalar to call ``backward`` on from a model's output: a scalar tensor itself; a
    ``ModelOutput``'s or dict's ``loss`` (transformers computes it when given ``labels``); else the
    mean square of the first floating tensor (a stand-in loss for models without one).

    Raises:
        TypeError: no floating tensor in the output.
    """
    import torch.utils._pytree as pytree

    if isinstance(output, torch.Tensor) and output.dim() == 0:
        return output
    loss = output.get("loss") if hasattr(output, "get") else None
    if isinstance(loss, torch.Tensor):
        return loss
    for t in pytree.tree_leaves(output):
        if isinstance(t, torch.Tensor) and t.is_floating_point() and t.requires_grad:
            return t.float().square().mean()
    raise TypeError(f"no loss in the model's output ({type(output).__name__}): nothing to call backward on")


def training_step(model: nn.Module, inputs, loss_fn=loss_of, autocast=None) -> None:
    """One iteration: parameter gradients set to None, ``loss_fn(model(*inputs)).backward()``, no
    optimizer step; ``inputs`` an `monet.inputs.ExampleInputs`.

    ``autocast`` (a `monet.mixed_precision` setting, None: none): the forward pass runs under it
    and the backward pass outside it, as PyTorch's AMP recipe and ``transformers.Trainer`` run
    them.  One context per iteration matters: autocast caches the 16-bit copies of the weights
    until its outermost context exits, so iterations run inside one context held around them all
    reuse the first iteration's copies: they are neither allocated (an eager model's peak
    measured that way misses them, 19 MiB of a 12-layer Llama's 38 MiB of fp32 weights) nor cast
    again (its time misses the casts)."""
    for p in model.parameters():
        p.grad = None
    loss_fn(_forward(model, inputs, autocast)).backward()


def step_overhead(plain: nn.Module, candidate: nn.Module, inputs, repeats: int = 5, warmup: int = 1,
                  loss_fn=loss_of, autocast=None) -> tuple[float, float, float]:
    """`overhead` for a model called with any inputs (``inputs`` as `monet.inputs.ExampleInputs.of`
    takes them) and trained from ``loss_fn`` of its output: (overhead fraction, median candidate
    time s, median plain time s), `training_step` of each timed in turn (`paired_overhead`), each
    forward pass under ``autocast`` (`training_step`)."""
    from monet.inputs import ExampleInputs

    inputs = ExampleInputs.of(inputs)
    return paired_overhead(lambda: training_step(candidate, inputs, loss_fn, autocast),
                           lambda: training_step(plain, inputs, loss_fn, autocast), repeats, warmup,
                           inputs.first.device)


def step_peak(model: nn.Module, inputs, loss_fn=loss_of, autocast=None) -> int:
    """Peak bytes of one training iteration ``loss_fn(model(*inputs)).backward()`` after one
    warm-up iteration, parameter gradients None at the start (docs/design.md, "Measuring"); ``inputs``
    as `monet.inputs.ExampleInputs.of` takes them; the forward pass under ``autocast``, the
    backward outside it (`training_step`: not inside a context held around both iterations, whose
    cached 16-bit weights the measured iteration would not allocate)."""
    inputs, _ = _inputs(inputs)

    def step():
        out = _forward(model, inputs, autocast)  # held during the backward pass, as a training loop holds it
        loss_fn(out).backward()

    return _iteration_memory(model, inputs, step).peak_bytes


def train_losses(model: nn.Module, inputs, steps: int = 3, lr: float = 1e-2, seed: int = 0,
                 loss_fn=loss_of) -> tuple[list[torch.Tensor], dict]:
    """Losses of ``steps`` SGD steps (momentum 0.9) from the RNG state ``seed``, and the first
    step's gradients keyed by position (the order of ``parameters()``)."""
    inputs, _ = _inputs(inputs)
    opt = torch.optim.SGD(model.parameters(), lr=lr, momentum=0.9)
    losses, first = [], {}
    for step in range(steps):
        torch.manual_seed(seed + step)
        opt.zero_grad(set_to_none=True)
        loss = loss_fn(inputs.call(model))
        loss.backward()
        if step == 0:
            first = {i: p.grad.detach().clone() for i, p in enumerate(model.parameters()) if p.grad is not None}
        opt.step()
        losses.append(loss.detach().clone())
    return losses, first
