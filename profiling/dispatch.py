"""The time between operators: what a training iteration costs beyond its operators' own times.

A profile times each operator (`monet.profiling.profiler.profile_costs`); an iteration of MONeT's
executor also spends time between them: the generated forward and backward code, saving tensors
for the backward pass, AOTAutograd's runtime wrappers.  On the CPU this is about 1 ms per
iteration, a tenth of a small transformer's (Llama with 2 layers, batch 16x16 tokens: operators in
sequence 9.0 ms, plain PyTorch 9.0 ms, the executor keeping everything 10.0 ms), and a prediction
that left it out was 10-14 points under the measured overhead (+15 % against +26-30 %).

`measure_iterations` times, once per graph and device, the executor with the schedule that keeps
everything (``K``, seconds) interleaved with plain PyTorch (``P``), ``K`` as ``P`` times the median of
their ratio within a turn (`paired_medians`).  The CPU cost sources
(`monet.profiling.sources`) then spread ``K - T`` (``T``: the operators' summed times) evenly over
the ``n`` forward and backward nodes, ``max(0, (K - T) / n)`` seconds each, so that a schedule's
predicted time includes the executor's own and each recomputed node pays its share again (where
``T`` exceeds ``K``, operators timed one by one, every time is scaled by ``K / T`` instead,
`operator_scale`), and
take ``P`` as the reference of the predicted overhead (`monet.profiling.costs.CostArrays.plain_time_s`).
On a GPU the CPU's work overlaps the kernels, and the roofline's ``launch_s`` stands for it.
"""
from __future__ import annotations

import contextlib
import copy
import json
import warnings
from pathlib import Path

import numpy as np
import pandas as pd
import torch
import torch.nn as nn

from monet.graph import OpGraph
from monet.terms import MonetWarning

#: iterations of each side: discarded (the executor's first traces the model), then timed
#: alternately, at least `REPEATS` and about `TARGET_S` seconds per side, at most `MAX_REPEATS`
#: (the medians are taken): the executor's own time is a tenth of a small model's iteration, and a
#: median of 7 such iterations drifted by half of it
WARMUP, REPEATS, MAX_REPEATS, TARGET_S = 2, 5, 201, 1.0


def own_copy(model: nn.Module) -> nn.Module:
    """A deep copy of ``model`` (its own parameters and buffers) to wrap in MONeT's executor for
    timing, so that no two timed modules share parameters: modules timed on shared parameters
    measure a wider spread of overheads than copies do (`benchmarks/timing_spread.py` times both,
    ``--shared``).  Costs one more copy of the parameters per timed module (CPU memory).  Where ``model`` cannot be deep-copied, ``model`` itself, with a
    warning."""
    try:
        return copy.deepcopy(model)
    except Exception as e:  # noqa: BLE001 - any failure to copy: time on the shared parameters
        warnings.warn(f"cannot copy {type(model).__name__} for timing ({type(e).__name__}: {e}); "
                      "timing the schedules on its own parameters, which is noisier", MonetWarning, stacklevel=2)
        return model


def timed_executor(model: nn.Module, solution, graph: OpGraph | None = None) -> nn.Module:
    """MONeT's executor running ``solution`` on a copy of ``model`` (`own_copy`): the module every
    CPU timing here sets against plain PyTorch's ``model``.  With ``graph`` (captured from
    ``model``), its first call traces the capture's export rebound to the copy
    (`monet.wrapper.MONeTWrapper.offer_export`) instead of exporting again."""
    from monet.wrapper import MONeTWrapper

    copy_ = own_copy(model)
    wrapper = MONeTWrapper(copy_, solution)
    if graph is not None and copy_ is not model:
        wrapper.offer_export(graph, source=model)
    return wrapper


@contextlib.contextmanager
def restored(model: nn.Module, inputs=None):
    """Run a block that trains ``model`` and leave it as it was: its buffers (batch-norm
    statistics), its parameters' gradients, the gradients of ``inputs``' tensors (an
    `monet.inputs.ExampleInputs`; an input that requires a gradient gets one from each step) and
    the global random state are restored."""
    buffers = {name: b.detach().clone() for name, b in model.named_buffers()}
    leaves = [] if inputs is None else [t for t in inputs.leaves() if isinstance(t, torch.Tensor) and t.is_leaf]
    grads = [(p, p.grad) for p in [*model.parameters(), *leaves]]
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
                       repeats: int | None = None, warmup: int = WARMUP) -> dict:
    """Median seconds of training iterations on the CPU: Chen's sqrt(n) schedule (``M``,
    `monet.solver.chen`), MONeT's executor keeping everything and plain PyTorch, interleaved in
    `FACTOR_ROUNDS` rounds (`timed_rounds`), or fewer turns and rounds where those would take more
    than `MEASURE_S` seconds (`turn_plan`, from the last warm-up turn's seconds: a model of
    iterations of seconds is timed in about a minute).  ``K`` (keeping everything) and ``P`` (plain) are
    paired estimates over the turns of every round (`paired_estimates`); ``M`` and ``K2`` (keeping
    everything) are the medians of the round with the median ``M - K2`` (`median_of_rounds`).  An
    iteration is forward, `monet.profiling.measure.loss_of` of the output, backward
    (`measure.training_step`), under the autocast setting ``graph`` was captured with.  ``model`` is
    left as it was (`restored`).

    Args:
        model: the module ``graph`` was captured from (a ``WithLoss`` when a loss function was given).
        inputs: an `monet.inputs.ExampleInputs` (or what `ExampleInputs.of` takes).
        graph, table: the captured graph and its cost table (the schedules' recomputation is
            costed from it).
        repeats: timed iterations per side and round (>= 1; None: from `REPEATS` to `MAX_REPEATS`,
            about `TARGET_S` seconds per side; either cut by `turn_plan`); warmup: discarded ones
            before them (>= 0; the last of them is timed, for `turn_plan`).

    Returns:
        ``executor_iteration_s`` (K), ``plain_iteration_s`` (P), ``chen_iteration_s`` (M),
        ``chen_executor_s`` (K2), seconds; ``chen_recompute_s``: the table's seconds of Chen's
        recomputations; ``chen_recomputations``: their number.

    Raises:
        ValueError: bad ``repeats`` / ``warmup``.
    """
    from monet.inputs import ExampleInputs
    from monet.models import input_info
    from monet.profiling.costs import costs_for
    from monet.solver.chen import solve_chen
    from monet.solver.deadline import Deadline

    if (repeats is not None and repeats < 1) or warmup < 0:
        raise ValueError(f"repeats must be >= 1 and warmup >= 0, got {repeats} and {warmup}")
    inputs = ExampleInputs.of(inputs)
    costs = costs_for(graph, table)
    info = input_info(inputs, None)
    keep = keep_all(model, inputs, graph, table)
    chen_solution = solve_chen(graph, costs, 2**62, deadline=Deadline(0), info=info)
    chen = timed_executor(model, chen_solution, graph)
    amp = graph.autocast  # each forward pass under it, as the graph was captured (`measure.training_step`)
    with restored(model, inputs):
        # plain PyTorch warmed up too: a round without a discarded turn starts at its third iteration,
        # as the executors' (a 12-layer GPT-2 small's second plain iteration took 1.2x its later ones)
        warm_up((keep, chen, model), model, inputs, 1, max(warmup - 1, 0), amp)
        # the last warm-up turn, timed: the turn's seconds set how many turns are timed (`turn_plan`)
        (turn,) = timed_rounds((chen, keep, model), inputs, 1, 1, autocast=amp, discard=0)
        count, repeats, discard = turn_plan(float(turn.sum()), repeats or repeats_for(float(turn[2, 0])))
        # one set of rounds for both: Chen's schedule, the executor keeping everything, plain PyTorch
        rounds = timed_rounds((chen, keep, model), inputs, repeats, count, autocast=amp, discard=discard)
        # K paired with P, as the calibration sets a schedule against plain PyTorch (`paired_medians`):
        # P times the median of K / P over the turns of every round.  From one round of its own (5
        # pairs where an iteration takes a second) one 24-layer GPT-2 costing read K / P 1.205 where
        # +1 % to +7 % is usual, and every prediction of that costing was 12 to 25 points over;
        # the rounds of Chen's schedule give three times the pairs
        # for one plain iteration more per turn
        k, p = paired_estimates(np.concatenate(rounds, axis=1)[1:], reference=1)
        m, k2 = median_of_rounds([r[:2] for r in rounds])
    return dict(executor_iteration_s=k, plain_iteration_s=p, chen_iteration_s=m, chen_executor_s=k2,
                chen_recompute_s=chen_solution.meta.objective_s - costs.total_time,
                chen_recomputations=chen_solution.schedule.recompute_count())


def timed_rounds(modules, inputs, repeats: int, rounds: int | None = None, autocast=None,
                 discard: int = 1) -> list[np.ndarray]:
    """Seconds of training iterations of each of ``modules``, interleaved on the CPU in ``rounds``
    rounds (None: `FACTOR_ROUNDS`) of ``repeats`` turns each, ``discard`` turns untimed first: one
    ``(len(modules), repeats)`` array per round, column i from turn i.  Each forward pass under
    ``autocast`` (`measure.training_step`).  The caller warms them up and holds `restored`."""
    from monet.profiling.measure import interleaved_times_of, training_step

    steps = [lambda m=m: training_step(m, inputs, autocast=autocast) for m in modules]
    return [np.asarray(interleaved_times_of(steps, repeats, discard, "cpu"), dtype=float)
            for _ in range(max(1, int(rounds or FACTOR_ROUNDS)))]


def turn_plan(turn_s: float, repeats: int) -> tuple[int, int, int]:
    """``(rounds, repeats, discard)`` for `timed_rounds` in `measure_iterations`, from one turn's
    seconds ``turn_s`` (an iteration of each side) and the turns a round would time (``repeats``):
    `FACTOR_ROUNDS` rounds of ``repeats`` turns after one discarded, where they fit in
    `MEASURE_S`; else `FACTOR_ROUNDS` rounds of the turns that fit, where that is at least
    `MIN_TURNS` a round (never two rounds: `median_of_rounds` has no middle one); else one round
    of the turns that fit, at least `MIN_TURNS`, none discarded (the warm-up just ran)."""
    if FACTOR_ROUNDS * (repeats + 1) * turn_s <= MEASURE_S:
        return FACTOR_ROUNDS, repeats, 1
    fit = int(MEASURE_S // max(turn_s, 1e-9))
    if fit >= FACTOR_ROUNDS * (MIN_TURNS + 1):
        return FACTOR_ROUNDS, fit // FACTOR_ROUNDS - 1, 1
    return 1, max(MIN_TURNS, fit), 0


def repeats_for(reference_s: float) -> int:
    """Timed iterations per side for an iteration of ``reference_s`` seconds: about `TARGET_S`
    seconds, from `REPEATS` to `MAX_REPEATS`."""
    return max(REPEATS, min(MAX_REPEATS, int(TARGET_S / max(reference_s, 1e-6))))


def median_of_rounds(rounds: list[np.ndarray]) -> tuple[float, float]:
    """``(M, K)``: the median seconds of the two rows (a schedule, the executor keeping
    everything) of the round (`timed_rounds`) with the median ``M - K``."""
    medians = [(float(np.median(r[0])), float(np.median(r[1]))) for r in rounds]
    return sorted(medians, key=lambda t: t[0] - t[1])[len(medians) // 2]


def paired_estimates(times: np.ndarray, reference: int = 0) -> tuple[float, ...]:
    """Paired estimates from ``times`` (modules, turns), seconds: row ``reference``'s median ``R``
    and, for each other row, ``R`` times the median over the turns of its time over the
    reference's in the same turn (`measure.paired_ratio`)."""
    from monet.profiling.measure import paired_ratio

    ref = times[reference]
    median_ref = float(np.median(ref))
    return tuple(median_ref if i == reference else median_ref * paired_ratio(t, ref) for i, t in enumerate(times))


def paired_medians(modules, inputs, repeats: int, rounds: int | None = None, reference: int = 0,
                   autocast=None) -> tuple[float, ...]:
    """Seconds of a training iteration of each of ``modules``, interleaved on the CPU in ``rounds``
    rounds of ``repeats`` turns each (`timed_rounds`), as paired estimates
    (`paired_estimates`): ``modules[reference]``'s median iteration ``R`` over every turn, and for
    each other module ``R`` times the median, over every turn, of its iteration over the
    reference's in that turn.  A ratio within one turn does not see the machine's speed drifting
    between turns: for timm's ViT-Tiny (150 ms iterations, about 7 turns a round) the median round
    of `median_of_rounds` put one schedule at +9 % to +17 % over plain PyTorch in six measurements in a
    row, these paired ratios at +10 % to +13 %.  The caller warms them up and holds `restored`."""
    turns = timed_rounds(modules, inputs, repeats, rounds, autocast)
    return paired_estimates(np.concatenate(turns, axis=1), reference)


def warm_up(modules, reference: nn.Module, inputs, repeats: int | None, warmup: int, autocast=None) -> int:
    """Run ``warmup`` training iterations of each of ``modules`` (the executor's first traces the
    model), each forward pass under ``autocast`` (`measure.training_step`); return ``repeats``, or
    where None the timed iterations per side that take about `TARGET_S` seconds of
    ``reference``'s iteration (from `REPEATS` to `MAX_REPEATS`)."""
    from monet.profiling.measure import training_step

    for _ in range(warmup):
        for m in modules:
            training_step(m, inputs, autocast=autocast)
    if repeats is not None:
        return repeats
    (once,) = timed_rounds((reference,), inputs, 1, 1, autocast=autocast, discard=0)
    return repeats_for(float(once[0, 0]))


def keep_all(model: nn.Module, inputs, graph: OpGraph, table) -> nn.Module:
    """A copy of ``model`` (`own_copy`) wrapped by MONeT's executor with the schedule that keeps
    everything on ``graph`` (`monet.solver.checkpoint_all`), with ``graph``'s operator implementations (``graph.impls``:
    a variant graph of `monet.impls.variant` runs its implementations).  ``table``: ``graph``'s
    cost table, or its `CostArrays`."""
    from monet.inputs import ExampleInputs
    from monet.models import input_info
    from monet.profiling.costs import costs_for
    from monet.solver.checkpoint_all import solve_checkpoint_all
    from monet.solver.deadline import Deadline

    info = input_info(ExampleInputs.of(inputs), None)
    costs = costs_for(graph, table) if isinstance(table, pd.DataFrame) else table
    return timed_executor(model, solve_checkpoint_all(graph, costs, 2**62, deadline=Deadline(0), info=info), graph)


def measure_variant(model: nn.Module, inputs, graph: OpGraph, table: pd.DataFrame, variant_graph: OpGraph,
                    variant_table: pd.DataFrame, repeats: int | None = None, warmup: int = WARMUP,
                    base: nn.Module | None = None) -> tuple[float, float]:
    """Median seconds of a training iteration of MONeT's executor keeping everything, with the
    implementations of ``variant_graph`` and with ``graph``'s (PyTorch's), interleaved on the CPU:
    ``(variant, base)``.  ``table`` / ``variant_table``: their cost tables; ``repeats`` and
    ``warmup`` as in `measure_iterations`; ``base``: ``keep_all(model, inputs, graph, table)``
    made before (one for every variant of a graph: each trace of the model takes seconds).
    ``model`` is left as it was (`restored`).

    Raises:
        ValueError: bad ``repeats`` / ``warmup``.
    """
    from monet.inputs import ExampleInputs
    from monet.profiling.measure import interleaved_times_of, training_step

    if (repeats is not None and repeats < 1) or warmup < 0:
        raise ValueError(f"repeats must be >= 1 and warmup >= 0, got {repeats} and {warmup}")
    inputs = ExampleInputs.of(inputs)
    variant = keep_all(model, inputs, variant_graph, variant_table)
    base = keep_all(model, inputs, graph, table) if base is None else base
    amp = graph.autocast
    with restored(model, inputs):
        repeats = warm_up((variant, base), base, inputs, repeats, warmup, amp)
        times = interleaved_times_of((lambda: training_step(variant, inputs, autocast=amp),
                                      lambda: training_step(base, inputs, autocast=amp)), repeats, 0, "cpu")
        return float(np.median(times[0])), float(np.median(times[1]))


def recompute_factor(measured: dict, between_s: float, scale: float = 1.0) -> float:
    """Measured over predicted recomputation on Chen's schedule: ``(M - K2) / (scale * R + r *
    between_s)`` (`measure_iterations`' fields; ``r`` its recomputations; ``scale`` the
    `operator_scale` the operators' times are taken at), clipped to [`FACTOR_MIN`, `FACTOR_MAX`];
    1.0 where the predicted recomputation is under `FACTOR_FLOOR` of ``K2``, too little to measure.

    On the CPU a recomputed value is still in cache when the backward pass reads it, so the
    backward pass runs faster than with stored values (MobileNetV2, batch 8, 96x96: 70-78 ms at a
    50 % schedule against 93.5 ms keeping everything), which per-operator costs do not see; the
    factor charges recomputation what it measurably adds (docs/design.md, Note [CPU node seconds]).
    """
    predicted = scale * measured["chen_recompute_s"] + measured["chen_recomputations"] * between_s
    if predicted < FACTOR_FLOOR * measured["chen_executor_s"]:
        return 1.0
    factor = (measured["chen_iteration_s"] - measured["chen_executor_s"]) / predicted
    return float(min(FACTOR_MAX, max(FACTOR_MIN, factor)))


#: the recompute factor's clip and the smallest predicted recomputation it is measured from
FACTOR_MIN, FACTOR_MAX, FACTOR_FLOOR = 0.5, 1.5, 0.05
#: rounds of Chen's schedule against the executor keeping everything; the median round's times are
#: the factor's: one round measured ShuffleNetV2's factor 0.68 and, another day, 0.93, and the 0.68
#: put its 50 % schedule 25 points under the measured overhead (BENCHMARKS.md, "Cost model checks")
FACTOR_ROUNDS = 3
#: seconds of timed turns (every side, every round) `measure_iterations` aims at, and the fewest
#: turns it times: `FACTOR_ROUNDS` rounds of `REPEATS` turns of a 12-layer GPT-2 small (hidden 768,
#: 2 x 512 tokens, a plain iteration 4.5 s on 2 cores) took 310 s of its 392 s of costs; where
#: they do not fit, fewer turns and rounds (`turn_plan`)
MEASURE_S, MIN_TURNS = 60.0, 4


def between_operators_s(executor_s: float, table: pd.DataFrame) -> float:
    """Seconds per node between operators: ``max(0, (executor_s - T) / n)``, ``T`` the summed
    ``time_s`` of ``table``'s PyTorch kernels (``impl == "default"``), ``n`` their number of rows."""
    default = table[table["impl"] == "default"]
    if len(default) == 0:
        return 0.0
    return max(0.0, (float(executor_s) - float(default["time_s"].sum())) / len(default))


def operator_scale(executor_s: float, table: pd.DataFrame) -> float:
    """The factor on ``table``'s measured operator times: ``min(1, executor_s / T)``, ``T`` the
    summed ``time_s`` of its PyTorch kernels (``impl == "default"``); 1.0 for an empty table.

    Operators timed one by one in an iteration's sequence can sum to more than the whole
    iteration: each timing stops the sequence, and a model of many small operators pays that on
    each (torchvision's EfficientNet-B0, batch 16: the operators' sum 1.20x the executor's
    iteration, ShuffleNetV2 1.17x).  Scaled, the keep-everything schedule is predicted at the
    measured iteration, as `between_operators_s` does where the sum is short of it; unscaled, every
    schedule of those models was predicted 17-18 points over its measured overhead."""
    default = table[table["impl"] == "default"]
    total = float(default["time_s"].sum())
    return 1.0 if total <= 0 else min(1.0, float(executor_s) / total)


def iteration_record(model: nn.Module, inputs, graph: OpGraph, table: pd.DataFrame, device: str,
                     cache_path: Path | None = None) -> dict | None:
    """The time between operators of ``graph`` on the CPU, cached as JSON at ``cache_path`` when
    given, so that one graph gets the same costs in every solve: ``between_operators_s``
    (`between_operators_s` of the measured executor iteration), ``executor_iteration_s`` (K),
    ``plain_iteration_s`` (P) and ``operators_s`` (T), all seconds, ``operator_scale``
    (`operator_scale`) and ``recompute_factor`` (`recompute_factor`), dimensionless.

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
        measured = measure_iterations(model, inputs, graph, table)
    except (torch.OutOfMemoryError, MemoryError, RuntimeError) as e:
        if isinstance(e, RuntimeError) and "allocate" not in str(e):
            raise
        warnings.warn(f"a training iteration ran out of memory ({e}); the costs count the operators' own "
                      "times only, and the predicted overhead may be low", MonetWarning, stacklevel=2)
        return None
    between = between_operators_s(measured["executor_iteration_s"], table)
    scale = operator_scale(measured["executor_iteration_s"], table)
    record = dict(between_operators_s=between, executor_iteration_s=measured["executor_iteration_s"],
                  plain_iteration_s=measured["plain_iteration_s"],
                  operators_s=float(table.loc[table["impl"] == "default", "time_s"].sum()),
                  operator_scale=scale, recompute_factor=recompute_factor(measured, between, scale))
    return record if cache_path is None else write_record(record, cache_path)


def write_record(record: dict, cache_path: Path) -> dict:
    """Write ``record`` (`iteration_record`'s fields) as the JSON cache at ``cache_path``; return it."""
    Path(cache_path).parent.mkdir(parents=True, exist_ok=True)
    Path(cache_path).write_text(json.dumps({k: float(record[k]) for k in FIELDS}))
    return record


#: the keys of `iteration_record`
FIELDS = ("between_operators_s", "executor_iteration_s", "plain_iteration_s", "operators_s", "operator_scale",
          "recompute_factor")

__all__ = ["FACTOR_FLOOR", "FACTOR_MAX", "FACTOR_MIN", "FACTOR_ROUNDS", "FIELDS", "MAX_REPEATS", "MEASURE_S", "MIN_TURNS",
           "REPEATS", "TARGET_S", "WARMUP", "repeats_for", "turn_plan",
           "recompute_factor", "between_operators_s", "iteration_record", "operator_scale", "keep_all", "measure_iterations", "median_of_rounds", "paired_estimates", "paired_medians", "timed_rounds", "warm_up",
           "measure_variant", "restored", "write_record"]
