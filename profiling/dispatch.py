"""The time between operators: what one training iteration costs beyond its operators' own times.

A profile times each operator alone, in a loop (`monet.profiling.profiler.profile_costs`).  An
iteration also spends time between operators: the model's Python code, the dispatcher, autograd's
bookkeeping in plain PyTorch and the executor's in a schedule.  On the CPU this is a large share of
a small model's iteration (GPT-2 with 2 layers, batch 16x16 tokens: its 188 operators sum to
3.2 ms, one iteration takes 10.8 ms), and every recomputed operator pays it again, so a cost table
without it predicted +40 % where +30 % was measured (BENCHMARKS.md, "Predicted against measured
overhead").

`time_between_operators` measures it once per graph and device: the median plain-PyTorch iteration
``P`` (seconds) minus the operators' summed times ``T``, spread evenly over the ``n`` forward and
backward nodes, ``max(0, (P - T) / n)`` seconds per node.  `monet.profiling.sources` adds it to
every node's time where it measures times on the CPU, so that the predicted plain iteration is the
measured one and a recomputation is charged its operator's time plus this share.  On a GPU the CPU's
work overlaps the kernels, and the roofline's ``launch_s`` stands for it instead.
"""
from __future__ import annotations

import json
import statistics
import time
import warnings
from pathlib import Path

import pandas as pd
import torch
import torch.nn as nn

from monet.graph import OpGraph

#: plain iterations: discarded, then timed (the median is taken)
WARMUP, REPEATS = 1, 5


def plain_iteration_s(model: nn.Module, inputs, repeats: int = REPEATS, warmup: int = WARMUP) -> float:
    """Median seconds of one plain-PyTorch training iteration of ``model`` on ``inputs`` (forward,
    `monet.profiling.check.loss_of` of its output, backward; `check.training_step`), on the CPU.

    The model is left as it was: its buffers (batch-norm statistics), its parameters' gradients and
    the global random state are restored afterwards.

    Args:
        model: the module the graph was captured from (a ``WithLoss`` when a loss function was given).
        inputs: an `monet.inputs.ExampleInputs` (or what `ExampleInputs.of` takes).
        repeats: timed iterations (>= 1); warmup: discarded iterations before them (>= 0).

    Raises:
        ValueError: bad ``repeats`` / ``warmup``.
    """
    from monet.inputs import ExampleInputs
    from monet.profiling.check import training_step

    if repeats < 1 or warmup < 0:
        raise ValueError(f"repeats must be >= 1 and warmup >= 0, got {repeats} and {warmup}")
    inputs = ExampleInputs.of(inputs)
    buffers = {name: b.detach().clone() for name, b in model.named_buffers()}
    grads = [(p, p.grad) for p in model.parameters()]
    times = []
    try:
        with torch.random.fork_rng(devices=[]):
            for i in range(warmup + repeats):
                t0 = time.perf_counter()
                training_step(model, inputs)
                if i >= warmup:
                    times.append(time.perf_counter() - t0)
    finally:
        with torch.no_grad():
            for name, b in model.named_buffers():
                if name in buffers:
                    b.copy_(buffers[name])
        for p, g in grads:
            p.grad = g
    return float(statistics.median(times))


def between_operators_s(plain_s: float, table: pd.DataFrame) -> float:
    """Seconds per node between operators: ``max(0, (plain_s - T) / n)``, ``T`` the summed
    ``time_s`` of ``table``'s PyTorch kernels (``impl == "default"``), ``n`` their number of rows."""
    default = table[table["impl"] == "default"]
    if len(default) == 0:
        return 0.0
    return max(0.0, (float(plain_s) - float(default["time_s"].sum())) / len(default))


def time_between_operators(model: nn.Module, inputs, graph: OpGraph, table: pd.DataFrame, device: str,
                           cache_path: Path | None = None) -> float:
    """Seconds per node between operators of ``graph`` on the CPU (`between_operators_s` of a
    measured `plain_iteration_s`), cached as JSON at ``cache_path`` when given (the value, the
    plain iteration in seconds and the operators' sum), so that one graph gets the same costs in
    every solve.

    Returns 0.0 on a GPU (see the module docstring), or when the plain iteration runs out of host
    memory: then a warning says so, and only the operators' times count.

    Raises:
        ValueError: a cache file that is not this function's JSON (delete it to measure again).
    """
    if torch.device(device).type != "cpu":
        return 0.0
    if cache_path is not None and Path(cache_path).exists():
        try:
            return float(json.loads(Path(cache_path).read_text())["between_operators_s"])
        except (ValueError, KeyError, TypeError) as e:
            raise ValueError(f"{cache_path}: not a time-between-operators cache ({e}); delete it to "
                             "measure again") from None
    try:
        plain = plain_iteration_s(model, inputs)
    except (torch.OutOfMemoryError, MemoryError, RuntimeError) as e:
        if isinstance(e, RuntimeError) and "allocate" not in str(e):
            raise
        warnings.warn(f"plain PyTorch's iteration ran out of memory ({e}); the costs count the "
                      "operators' own times only, and the predicted overhead may be low", stacklevel=2)
        return 0.0
    value = between_operators_s(plain, table)
    if cache_path is not None:
        Path(cache_path).parent.mkdir(parents=True, exist_ok=True)
        Path(cache_path).write_text(json.dumps(dict(
            between_operators_s=value, plain_iteration_s=plain,
            operators_s=float(table.loc[table["impl"] == "default", "time_s"].sum()))))
    return value


__all__ = ["REPEATS", "WARMUP", "between_operators_s", "plain_iteration_s", "time_between_operators"]
