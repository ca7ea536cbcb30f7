"""Costs of a deep stack measured on a shallow copy of it: a 96-layer model costed about as fast as
a 4-layer one.

The CPU cost sources measure two things per graph (`monet.profiling.sources`): each operator's time
in the sequence of an iteration (the quick profile) and whole training iterations (plain PyTorch,
MONeT's executor keeping everything, Chen's schedule: `monet.profiling.dispatch.measure_iterations`),
whose differences give the time between operators, the operator scale and the recompute factor.
Both grow with depth: a 96-layer GPT-2 (hidden 256, 2 x 256 tokens) took 294 s to cost on 2 cores,
of which about 210 s were some fifty training iterations of 3 s each and 52 s two traces of the
executor, although its layers are one block 96 times.

Where the model holds a stack of at least `MIN_LAYERS` identical layers (an ``nn.ModuleList`` whose
members have one class and the same parameters and buffers by name, shape and dtype: transformers'
``model.layers`` / ``transformer.h`` / ``encoder.layer``), the same measurements are made on a copy
of the model that keeps only its first `SHALLOW_LAYERS` layers (`shallow_copy`), captured as the
model was (autocast, fused loss), and carried over:

* each node's time and workspace from the node of the shallow graph with the same op signature
  (`monet.graph.op_signature`: operator, argument shapes, strides, dtypes and values; the median
  time where several nodes share one), so that the layers the copy lacks cost what the ones it
  has cost;
* the recompute factor, which is per second of recomputation, not per model; the executor's
  time beyond its operators, about one sum per iteration; and its tax over plain PyTorch, a
  fraction of the iteration, with the operators' scale set so that the executor keeping
  everything takes the deep model's plain iteration times that fraction (`carried_record`);
* plain PyTorch's iteration, the reference of the predicted overhead, measured on the model itself
  (`plain_iteration_s`: a few iterations, no trace).

Where the copy cannot be made or captured, or a node of the model has no twin in the copy, the
model is measured whole, as before.
"""
from __future__ import annotations

import statistics
import warnings
import weakref
from dataclasses import dataclass

import pandas as pd
import torch
import torch.nn as nn

from monet import stack
from monet.graph import OpGraph, node_signatures
from monet.stack import repeated_layers, shallow_copy
from monet.terms import MonetWarning

#: stacks with fewer identical layers are measured whole (`monet.stack.MIN_LAYERS`, as they are
#: exported whole); the copy keeps this many (`monet.stack.KEEP`, the copy an export is written from)
MIN_LAYERS, SHALLOW_LAYERS = stack.MIN_LAYERS, stack.KEEP
#: plain PyTorch's iterations on the deep model itself: discarded, then timed (the median is taken)
PLAIN_WARMUP, PLAIN_REPEATS = 1, 2


@dataclass
class Shallow:
    """A shallow stand-in of a deep model: ``model`` (`shallow_copy`), its captured ``graph``, and
    the stack it shortened (``layers``: qualified name, ``kept`` of ``of`` layers)."""

    model: nn.Module
    graph: OpGraph
    layers: str
    kept: int
    of: int

    def describe(self) -> str:
        return f"{self.kept} of the {self.of} layers of {self.layers}"


_LAST: list = []  # [(weakref to the model, weakref to the graph, MIN_LAYERS, SHALLOW_LAYERS, Shallow | None)]


def _last(model: nn.Module, graph: OpGraph):
    """The entry `stand_in` made last, if it was for this very ``model`` and ``graph`` (and the
    module's settings), else None."""
    if _LAST:
        m, g, low, keep, found = _LAST[0]
        if m() is model and g() is graph and (low, keep) == (MIN_LAYERS, SHALLOW_LAYERS):
            return (found,)
    return None


def stand_in(model: nn.Module, inputs, graph: OpGraph) -> Shallow | None:
    """The `Shallow` stand-in of ``model`` (captured with ``inputs`` as ``graph`` was: its autocast
    setting and fused loss), or None where ``model`` has no stack of `MIN_LAYERS` identical layers
    or the copy cannot be captured (a warning says why).  Made once for the model and graph costed
    last (the quick profile and the iterations share it)."""
    last = _last(model, graph)
    if last is not None:
        return last[0]
    found = _make_stand_in(model, inputs, graph)
    _LAST[:] = [(weakref.ref(model), weakref.ref(graph), MIN_LAYERS, SHALLOW_LAYERS, found)]
    return found


def _make_stand_in(model: nn.Module, inputs, graph: OpGraph) -> Shallow | None:
    from monet import mixed_precision
    from monet.capture import capture
    from monet.lm_loss import fused

    found = repeated_layers(model, MIN_LAYERS)
    if found is None or graph.joint is None:
        return None
    name, count = found
    try:
        small = stack.take_copy(model, name, SHALLOW_LAYERS) or shallow_copy(model, name, SHALLOW_LAYERS)
        dtype = None if graph.autocast is None else getattr(torch, mixed_precision.normalize(graph.autocast)[1])
        chunk = fused(graph.summary)
        small_graph = capture(small, inputs, autocast_dtype=dtype, lm_loss=None if chunk is None else chunk)
    except Exception as e:  # noqa: BLE001 - any failure: the model is measured whole
        warnings.warn(f"could not capture a {SHALLOW_LAYERS}-layer copy of {type(model).__name__} ({type(e).__name__}: "
                      f"{e}); its {count} layers are measured whole", MonetWarning, stacklevel=3)
        return None
    return Shallow(small, small_graph, name, SHALLOW_LAYERS, count)


def describe_costing(model: nn.Module, graph: OpGraph) -> str:
    """How ``graph``'s costs were measured, for the log: its nodes and distinct op signatures (each
    measured once, the others reusing it), and the shallow copy where one stood in."""
    sigs = node_signatures(graph) if graph.joint is not None else {}
    text = f"{len(sigs)} nodes, {len(set(sigs.values()))} distinct ops measured ({len(sigs) - len(set(sigs.values()))} reused)"
    last = _last(model, graph)
    return text if last is None or last[0] is None else f"{text}, on a copy with {last[0].describe()}"


def carried_table(graph: OpGraph, shallow: Shallow, table: pd.DataFrame) -> pd.DataFrame | None:
    """A cost table for ``graph`` from ``table``, the quick profile of ``shallow.graph``: each node
    takes the median time and the largest workspace of the shallow graph's nodes with its op
    signature (flops and bytes moved the same).  None where a node of ``graph`` has no twin there."""
    from monet.profiling.costs import validate_costs

    theirs = node_signatures(shallow.graph)
    rows = table.set_index(["kind", "node"])
    by_sig: dict[str, list] = {}
    for key, sig in theirs.items():
        if key in rows.index:
            by_sig.setdefault(sig, []).append(rows.loc[key])
    out = []
    for (kind, node_id), sig in node_signatures(graph).items():
        twins = by_sig.get(sig)
        if not twins:
            return None
        seconds = float(statistics.median(float(r["time_s"]) for r in twins))
        first = twins[0]
        out.append(dict(kind=kind, node=node_id, op=(graph.fwd if kind == "fwd" else graph.bwd)[node_id].op,
                        impl=first["impl"], time_s=seconds, recompute_s=seconds,
                        workspace_bytes=int(max(int(r["workspace_bytes"]) for r in twins)),
                        flops=first["flops"], bytes_moved=first["bytes_moved"],
                        source=f"{first['source']}:{shallow.kept}-of-{shallow.of}-layers"))
    return validate_costs(pd.DataFrame(out, columns=list(table.columns)))


def plain_iteration_s(model: nn.Module, inputs, autocast=None, repeats: int = PLAIN_REPEATS,
                      warmup: int = PLAIN_WARMUP) -> float:
    """Median seconds of plain PyTorch's training iteration of ``model`` on the CPU
    (`monet.profiling.measure.training_step`, ``warmup`` discarded, ``repeats`` timed:
    `monet.profiling.measure.interleaved_times_of`), each forward pass under ``autocast``; ``model``
    is left as it was (`monet.profiling.dispatch.restored`)."""
    from monet.inputs import ExampleInputs
    from monet.profiling.measure import interleaved_times_of, training_step
    from monet.profiling.dispatch import restored

    inputs = ExampleInputs.of(inputs)
    with restored(model, inputs):
        (times,) = interleaved_times_of([lambda: training_step(model, inputs, autocast=autocast)], repeats,
                                        warmup, "cpu")
    return float(statistics.median(times))


def carried_record(model: nn.Module, inputs, graph: OpGraph, table: pd.DataFrame, shallow: Shallow,
                   shallow_record: dict, plain_s: float | None = None) -> dict:
    """`monet.profiling.dispatch.iteration_record`'s fields for ``graph`` (cost table ``table``)
    from ``shallow_record``, the record of ``shallow``: the recompute factor carried over; the
    executor's time beyond its operators, ``K - scale * T`` of the copy, carried as one sum per
    iteration, not per node (`monet.profiling.dispatch.between_operators_s` then spreads it over
    ``graph``'s nodes); plain PyTorch's iteration ``plain_s`` (seconds; None: measured on ``model``,
    `plain_iteration_s`); and the operators' scale set so that the executor keeping everything
    takes plain PyTorch's iteration times what the executor took over plain PyTorch on the copy
    (``K / P`` of the copy, at least 1).

    Why the time beyond the operators is a sum: it is the autograd engine's and AOTAutograd's
    work around the operators, about the same at any depth.  A 24-layer GPT-2 (hidden 256, 2 x 256
    tokens, one thread) measured 72 ms beyond its operators' 1.15 s; its 4-layer copy 74 ms beyond
    0.20 s, which spread per node would have charged the 24 layers 400 ms.  Why the executor's
    tax over plain PyTorch is a fraction: it is per layer (the generated code's Python per node,
    the captured dropout's mask conversions and the out-of-place gradient sums of each layer), and
    so is plain PyTorch's iteration.  The depth benchmark's models at 4 and 16 layers (hidden 256,
    2 x 256 tokens, one thread, 20 pairs): ``K - P`` grew from 4 to 16 layers (BERT 9 to 21 ms,
    GPT-2 2 to 20 ms) while ``K / P`` stayed within the pairs' spread (BENCHMARKS.md, "Executor
    tax (keep everything, CPU)"; `benchmarks/executor_tax.py`); carried as the copy's sum,
    the 48-layer BERT's tax in bf16 was predicted +0.4 % and measured +5.1 % and +5.7 %
    (BENCHMARKS.md, "Deep networks", has the predictions since).  Why the scale, both ways: the copy's operators, timed one by
    one, are no good guess of the deep model's iteration, over or under.  Taken as they were, the
    48-layer GPT-2, Llama and BERT of the depth benchmark were predicted 6-13 points under their
    measured overhead at 50 % (plain iteration 0-8 % over the carried executor's); raised to meet
    plain PyTorch only, the 48-layer BERT's carried operators summed to 2.33 s against its plain
    iteration's 2.09 s, every schedule was charged those 12 % and its 50 % schedule was predicted
    +37.7 % and measured +17.1 %."""
    beyond = max(0.0, shallow_record["executor_iteration_s"]
                 - shallow_record["operator_scale"] * shallow_record["operators_s"])
    small_plain = shallow_record["plain_iteration_s"]
    tax_fraction = max(0.0, shallow_record["executor_iteration_s"] / small_plain - 1) if small_plain > 0 else 0.0
    default = table[table["impl"] == "default"]
    operators = float(default["time_s"].sum())
    plain = plain_iteration_s(model, inputs, graph.autocast) if plain_s is None else float(plain_s)
    tax = tax_fraction * plain
    beyond = min(beyond, plain + tax)
    scale = (plain + tax - beyond) / operators if operators > 0 else shallow_record["operator_scale"]
    executor = scale * operators + beyond
    return dict(between_operators_s=beyond / max(1, len(default)), operator_scale=scale,
                recompute_factor=shallow_record["recompute_factor"], operators_s=operators,
                executor_iteration_s=executor, plain_iteration_s=plain)


__all__ = ["MIN_LAYERS", "SHALLOW_LAYERS", "Shallow", "carried_record", "carried_table", "describe_costing", "plain_iteration_s",
           "repeated_layers", "shallow_copy", "stand_in"]
