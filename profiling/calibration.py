"""Two measured iterations that turn a schedule's predicted seconds into a predicted overhead.

The cost table's seconds are per operator, measured one at a time (or a roofline's).  Their sum is
not an iteration: plain PyTorch spends time between the operators (the autograd engine, the
model's Python, allocation), and the executor spends its own (its generated forward and backward
modules, the autograd Function around them).  On tiny transformers that time is most of an
iteration (GPT-2 with 2 layers at 16 tokens: operators 3.2 ms, plain PyTorch 10.2 ms, the executor
with nothing recomputed 10.9 ms), so recomputation seconds over the operators' sum mispredict.

Where a cost source measures times (`monet.profiling.sources.measures_times`: ``hybrid`` on the
CPU, ``profile``), `measure_iterations` times, interleaved in one process, one training iteration
of plain PyTorch (P) and of the executor running the keep-everything schedule (K), and the
predicted overhead of a schedule whose objective exceeds plain PyTorch's predicted time by R
seconds (recomputations and implementations) is

    (K + R) / P - 1        (`monet.solution.SolutionMeta.predicted_overhead`)

On 2 CPU cores, at 50 % of the plain peak, this was within 2.5 points of the measured overhead on
ShuffleNetV2, EfficientNet-B0 and Llama, where R / (operators' sum) missed Llama's by 10 (GPT-2
was 13 points under); BENCHMARKS.md "Predicted against measured overhead" holds it on every model
of the real-model table.
"""
from __future__ import annotations

import copy
from dataclasses import dataclass

import torch
from torch import nn


@dataclass(frozen=True)
class IterationTimes:
    """Median seconds of one training iteration (``loss.backward()``, no optimizer step).

    Attributes:
        plain_s: plain PyTorch.
        executor_s: the executor (`monet.wrapper.MONeTWrapper`) with the keep-everything schedule:
            nothing recomputed, PyTorch's implementations.
    """

    plain_s: float
    executor_s: float


def keep_all_solution(graph, costs, info: dict | None = None):
    """The `monet.solution.Solution` that keeps every forward output and recomputes nothing
    (plain PyTorch's schedule), simulated; its budget is its own simulated peak (bytes)."""
    from monet.solver.simulated import eager_peak, finish_solution, keep_all_matrices

    S, R = keep_all_matrices(graph)
    peak = eager_peak(graph, costs)
    return finish_solution(graph, costs, S, R, budget=peak, mode="normal", status="heuristic", solver="keep-all",
                           objective_s=float(costs.total_time), bound_s=None, gap=None, solve_time_s=0.0,
                           info=dict(info or {}), check=False)


def measure_iterations(module: nn.Module, inputs, graph, costs, *, repeats: int = 5, warmup: int = 1,
                       device: str = "cpu", info: dict | None = None) -> IterationTimes:
    """`IterationTimes` of ``module`` (the captured model, or its `monet.plan.WithLoss`) on
    ``inputs`` (`monet.inputs.ExampleInputs`): interleaved medians of ``repeats`` iterations each
    after ``warmup`` (`monet.profiling.check.interleaved_medians`), on a copy of the module (its
    buffers, BatchNorm's running statistics, are left as they were) with the RNG state restored.

    Raises:
        ValueError: ``repeats`` < 1 or ``warmup`` < 0.
    """
    from monet.profiling.check import interleaved_medians, training_step
    from monet.wrapper import MONeTWrapper

    if repeats < 1 or warmup < 0:
        raise ValueError(f"repeats must be >= 1 and warmup >= 0, got {repeats} and {warmup}")
    plain = copy.deepcopy(module)
    executor = MONeTWrapper(copy.deepcopy(module), keep_all_solution(graph, costs, info))
    dev = torch.device(device)
    with torch.random.fork_rng(devices=[dev] if dev.type == "cuda" else []):
        k, p = interleaved_medians(lambda: training_step(executor, inputs), lambda: training_step(plain, inputs),
                                   repeats, warmup, dev)
    return IterationTimes(plain_s=p, executor_s=k)


def calibrate(solution, times: IterationTimes | None):
    """Record ``times`` in ``solution.meta`` (``plain_iteration_s``, ``executor_iteration_s``), so
    that its ``predicted_overhead()`` uses them; None leaves it as it is.  Returns ``solution``."""
    if times is not None:
        solution.meta.plain_iteration_s = times.plain_s
        solution.meta.executor_iteration_s = times.executor_s
    return solution


__all__ = ["IterationTimes", "calibrate", "keep_all_solution", "measure_iterations"]
