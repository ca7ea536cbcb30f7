"""The time between operators: what a training iteration costs beyond its operators' own times.

A profile times each operator (`monet.profiling.profiler.profile_costs`); an iteration of MONeT's
executor also spends time between them: the generated forward and backward code, saving tensors
for the backward pass, AOTAutograd's runtime wrappers.  On the CPU this is about 1 ms per
iteration, a tenth of a small transformer's (Llama with 2 layers, batch 16x16 tokens: operators in
sequence 9.0 ms, plain PyTorch 9.0 ms, the executor keeping everything 10.0 ms), and a prediction
that left it out was 10-14 points under the measured overhead (+15 % against +26-30 %).

`measure_iterations` times, once per graph and device, the executor with the schedule that keeps
everything (``K``, seconds) interleaved with plain PyTorch (``P``).  The CPU cost sources
(`monet.profiling.sources`) then spread ``K - T`` (``T``: the operators' summed times) evenly over
the ``n`` forward and backward nodes, ``max(0, (K - T) / n)`` seconds each, so that a schedule's
predicted time includes the executor's own and each recomputed node pays its share again, and
take ``P`` as the reference of the predicted overhead (`monet.profiling.costs.CostArrays.plain_time_s`).
On a GPU the CPU's work overlaps the kernels, and the roofline's ``launch_s`` stands for it.
"""
from __future__ import annotations

import contextlib
import json
import time
import warnings
from pathlib import Path

import pandas as pd
import torch
import torch.nn as nn

from monet import mixed_precision
from monet.graph import OpGraph

#: iterations of each side: discarded (the executor's first traces the model), then timed
#: alternately, at least `REPEATS` and about `TARGET_S` seconds per side, at most `MAX_REPEATS`
#: (the medians are taken): the executor's own time is a tenth of a small model's iteration, and a
#: median of 7 such iterations drifted by half of it
WARMUP, REPEATS, MAX_REPEATS, TARGET_S = 2, 5, 201, 1.0


@contextlib.contextmanager
def restored(model: nn.Module):
    """Run a block that trains ``model`` and leave it as it was: its buffers (batch-norm
    statistics), its parameters' gradients and the global random state are restored."""
    buffers = {name: b.detach().clone() for name, b in model.named_buffers()}
    grads = [(p, p.grad) for p in model.parameters()]
    try:
        with torch.random.fork_rng(devices=[]):
            yield
    finally:
        with torch.no_grad():
            for name, b in model.named_buffers():
                if name in buffers:
                    b.copy_(buffers[name])
        for p, g in grads:
            p.grad = g


def measure_iterations(model: nn.Module, inputs, graph: OpGraph, table: pd.DataFrame,
                       repeats: int | None = None, warmup: int = WARMUP) -> tuple[float, float]:
    """Median seconds of one training iteration of MONeT's executor keeping everything (``K``)
    and of plain PyTorch (``P``), interleaved (`monet.profiling.check.interleaved_medians`), on
    the CPU: forward, `monet.profiling.check.loss_of` of the output, backward (`check.training_step`),
    under the autocast setting ``graph`` was captured with.  ``model`` is left as it was (`restored`).

    Args:
        model: the module ``graph`` was captured from (a ``WithLoss`` when a loss function was given).
        inputs: an `monet.inputs.ExampleInputs` (or what `ExampleInputs.of` takes).
        graph, table: the captured graph and its cost table (for the keep-everything schedule).
        repeats: timed iterations per side (>= 1; None: from `REPEATS` to `MAX_REPEATS`, about
            `TARGET_S` seconds per side); warmup: discarded ones before them (>= 0).

    Returns:
        ``(K, P)`` in seconds.

    Raises:
        ValueError: bad ``repeats`` / ``warmup``.
    """
    from monet.inputs import ExampleInputs
    from monet.models import input_info
    from monet.profiling.check import interleaved_medians, training_step
    from monet.profiling.costs import costs_for
    from monet.solver.checkpoint_all import solve_checkpoint_all
    from monet.solver.deadline import Deadline
    from monet.wrapper import MONeTWrapper

    if (repeats is not None and repeats < 1) or warmup < 0:
        raise ValueError(f"repeats must be >= 1 and warmup >= 0, got {repeats} and {warmup}")
    inputs = ExampleInputs.of(inputs)
    keep = solve_checkpoint_all(graph, costs_for(graph, table), 2**62, deadline=Deadline(0),
                                info=input_info(inputs, None))
    executor = MONeTWrapper(model, keep)
    with restored(model), mixed_precision.context(graph.autocast):  # as the graph was captured
        for _ in range(warmup):
            training_step(executor, inputs)
        if repeats is None:
            t0 = time.perf_counter()
            training_step(model, inputs)
            repeats = max(REPEATS, min(MAX_REPEATS, int(TARGET_S / max(time.perf_counter() - t0, 1e-6))))
        return interleaved_medians(lambda: training_step(executor, inputs), lambda: training_step(model, inputs),
                                   repeats, 1, "cpu")


def between_operators_s(executor_s: float, table: pd.DataFrame) -> float:
    """Seconds per node between operators: ``max(0, (executor_s - T) / n)``, ``T`` the summed
    ``time_s`` of ``table``'s PyTorch kernels (``impl == "default"``), ``n`` their number of rows."""
    default = table[table["impl"] == "default"]
    if len(default) == 0:
        return 0.0
    return max(0.0, (float(executor_s) - float(default["time_s"].sum())) / len(default))


def iteration_record(model: nn.Module, inputs, graph: OpGraph, table: pd.DataFrame, device: str,
                     cache_path: Path | None = None) -> dict | None:
    """The time between operators of ``graph`` on the CPU, cached as JSON at ``cache_path`` when
    given, so that one graph gets the same costs in every solve: ``between_operators_s``
    (`between_operators_s` of the measured executor iteration), ``executor_iteration_s`` (K),
    ``plain_iteration_s`` (P) and ``operators_s`` (T), all seconds.

    Returns None on a GPU (see the module docstring), or when an iteration runs out of host memory
    (then a warning says so, and only the operators' times count).

    Raises:
        ValueError: a cache file that is not this function's JSON (delete it to measure again).
    """
    if torch.device(device).type != "cpu":
        return None
    if cache_path is not None and Path(cache_path).exists():
        try:
            record = json.loads(Path(cache_path).read_text())
            return {k: float(record[k]) for k in FIELDS}
        except (ValueError, KeyError, TypeError) as e:
            raise ValueError(f"{cache_path}: not a time-between-operators cache ({type(e).__name__}: {e}); "
                             "delete it to measure again") from None
    try:
        executor, plain = measure_iterations(model, inputs, graph, table)
    except (torch.OutOfMemoryError, MemoryError, RuntimeError) as e:
        if isinstance(e, RuntimeError) and "allocate" not in str(e):
            raise
        warnings.warn(f"a training iteration ran out of memory ({e}); the costs count the operators' own "
                      "times only, and the predicted overhead may be low", stacklevel=2)
        return None
    record = dict(between_operators_s=between_operators_s(executor, table), executor_iteration_s=executor,
                  plain_iteration_s=plain,
                  operators_s=float(table.loc[table["impl"] == "default", "time_s"].sum()))
    if cache_path is not None:
        Path(cache_path).parent.mkdir(parents=True, exist_ok=True)
        Path(cache_path).write_text(json.dumps(record))
    return record


#: the keys of `iteration_record`
FIELDS = ("between_operators_s", "executor_iteration_s", "plain_iteration_s", "operators_s")

__all__ = ["FIELDS", "MAX_REPEATS", "REPEATS", "TARGET_S", "WARMUP", "between_operators_s", "iteration_record", "measure_iterations",
           "restored"]
