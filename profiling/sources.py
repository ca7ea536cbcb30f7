"""Cost sources: the cost table and the implementation-variant costs for
``--cost analytic|workspace|hybrid|profile``.

* ``analytic``: the roofline model (`monet.profiling.costs.analytic_costs`) of a `DeviceSpec`, each
  operator's workspace charged at an upper bound from its shapes
  (`monet.profiling.workspace.workspace_bound`, per op family, for the device the schedule is for
  and this process's thread count): needs no device, and its schedules hold their budget at the
  allocator, at the price of a higher smallest budget (ResNet-50, batch 2, 64x64, full mode: +8 %, the
  weight reorders of its last stage's convolutions) and a predicted peak that is a bound rather
  than within 2 % of the measured one.
* ``workspace``: the roofline's times with each operator's workspace measured as ``hybrid``
  measures it: the budget holds at the allocator and the predicted peak is the measured one, with
  nothing timed (what ``hybrid`` is on a GPU, on any device).
* ``hybrid``: each operator's workspace (bytes) from a quick profile on the device (`QUICK`: the
  median of 3 runs after 1 warm-up; on the CPU each run is an iteration's sequence of operators,
  and the nodes of one op signature share the median of all their calls, `profiler.pooled_medians`,
  `monet.profiling.profiler.ContextTimer`; cached apart from full profiles, `quick_dir`), so
  the budget holds at the allocator.  Times: on a GPU the roofline's (analytic); on the CPU the
  quick profile's, since the roofline does not rank CPU kernels.
* ``profile``: times and workspace measured on the device (`monet.profiling.profiler`).

Where times are measured on the CPU (``profile``, and ``hybrid`` there), each node's time also
carries its share of the executor's time between operators (`between_operators`,
`monet.profiling.dispatch`), so that recomputations pay it too, recompute seconds are scaled by a
factor measured on Chen's schedule (`recompute_factor`), and the predicted overhead is taken against
plain PyTorch's measured iteration (`plain_iteration`).  On the CPU the variants of full mode are
calibrated on a whole measured iteration each (`variant_cost_fn`,
`monet.profiling.variant_costs.calibrated_rows`).

`monet solve`, `monet demo` and `monet.optimize` all cost a graph through these functions.
"""
from __future__ import annotations

from pathlib import Path

import pandas as pd
import torch

from monet.profiling.shallow import carried_record, carried_table, stand_in
from monet.profiling.workspace import with_workspace_bound
from monet.terms import arg

COST_SOURCES = ("analytic", "workspace", "hybrid", "profile")
# the quick profile of ``hybrid``: warm medians (a first, cold run of a CPU kernel was 1.3-3x its
# warm time, so ratios and times from one unwarmed run mis-ranked implementations)
QUICK = dict(repeats=3, warmup=1)
#: the suffix of a graph's cached iteration record.  ".v6": the records before the operator scale
#: (v2) and the recompute factor lack them, those of one round of Chen's schedule (v3) are measured
#: again, and so are deep stacks' records that carried the executor's tax as a sum (v4,
#: `carried_record`) and those timed with the executor out of place and ATen's dropout forward (v5)
RECORD_SUFFIX = ".iterations.v6.json"


def measures_times(cost: str, device: str) -> bool:
    """Whether the cost source ``cost`` takes operator times from measurements on ``device``:
    ``profile`` everywhere, ``hybrid`` on the CPU."""
    return cost == "profile" or (cost == "hybrid" and not device.startswith("cuda"))


def device_spec(gpu_spec: str | None, device: str):
    """The roofline model for analytic times: ``gpu_spec`` (a preset name), else the visible GPU's
    preset, else the CPU's.

    Raises:
        ValueError: an unknown preset, or a GPU without one (the message lists the presets).
    """
    from monet.profiling.costs import PRESETS, DeviceSpec

    if gpu_spec:
        return DeviceSpec.named(gpu_spec)
    if device.startswith("cuda"):
        name = torch.cuda.get_device_name(torch.device(device)).lower() if torch.cuda.is_available() else ""
        for key in sorted(PRESETS, key=len, reverse=True):  # "h100-pcie" before "h100"
            if key.replace("-", " ") in name.replace("-", " "):
                return PRESETS[key]
        presets = ", ".join(sorted(PRESETS))
        raise ValueError(f"no analytic model for GPU {name or '(none visible)'!r}: pass "
                         + arg(f"gpu_spec= ({presets}) or use cost=\"profile\"", f"--gpu-spec ({presets}) or use --cost profile"))
    return DeviceSpec.cpu_default()


def gpu_spec_for_hybrid(device: str, fallback: str = "h100") -> str | None:
    """The roofline preset for hybrid costs on ``device``: None where `device_spec` has a model of
    it (the CPU, a GPU with a preset), else ``fallback``.  Hybrid costs measure the workspace on the
    device itself; the roofline only ranks the recomputations, so any GPU's preset will do for one
    without its own."""
    try:
        device_spec(None, device)
    except ValueError:
        return fallback
    return None


def in_context(device: str) -> bool:
    """Whether the quick profile times operators in the sequence of an iteration
    (`monet.profiling.profiler.ContextTimer`): on the CPU, whose times it supplies."""
    return torch.device(device).type == "cpu"


def quick_dir(device: str, cache_dir=None) -> Path:
    """Where quick profiles are cached, apart from full profiles so that one never stands in for a
    ``--cost profile`` measurement: ``<cache>/quick-context`` on the CPU (times in an iteration's
    sequence), ``<cache>/quick-warm`` elsewhere."""
    from monet.profiling.profiler import default_cache_dir

    root = Path(cache_dir) if cache_dir is not None else default_cache_dir()
    return root / ("quick-context" if in_context(device) else "quick-warm")


def quick_profile(model, inputs, graph, device: str, cache_dir=None) -> pd.DataFrame:
    """The quick profile of ``graph`` on ``device`` (seconds and workspace bytes per operator:
    `QUICK` runs, each operator's timed in an iteration's sequence where `in_context`), cached
    under `quick_dir`."""
    from monet.profiling.profiler import cache_path, load_or_profile, save_costs

    directory = quick_dir(device, cache_dir)
    path = cache_path(graph, device, directory)
    shallow = None if path.exists() or not in_context(device) else stand_in(model, inputs, graph)
    if shallow is not None:  # a deep stack: its operators measured on a shallow copy
        small = load_or_profile(shallow.model, inputs, shallow.graph, device, cache_dir=directory, progress=False,
                                in_context=True, **QUICK)
        table = carried_table(graph, shallow, small)
        if table is not None:
            save_costs(table, path)
    return load_or_profile(model, inputs, graph, device, cache_dir=directory, progress=False,
                           in_context=in_context(device), **QUICK)


def measured_table(cost: str, model, inputs, graph, device: str, cache_dir=None) -> pd.DataFrame:
    """The measured cost table ``cost`` starts from: the full profile (``profile``, cached under
    ``cache_dir``, each operator timed in a loop of its own) or the quick profile (``hybrid``,
    `quick_profile`: on the CPU each operator timed in an iteration's sequence)."""
    from monet.profiling.profiler import load_or_profile

    if cost == "profile":
        return load_or_profile(model, inputs, graph, device, cache_dir=cache_dir)
    return quick_profile(model, inputs, graph, device, cache_dir)


def iterations(cost: str, model, inputs, graph, device: str, cache_dir=None) -> dict | None:
    """The measured iterations of ``graph`` that ``cost``'s CPU times are completed with
    (`monet.profiling.dispatch.iteration_record`: the time between operators, the executor's and
    plain PyTorch's iteration, seconds), measured once per graph and cached beside
    `measured_table`'s table; None where ``cost`` does not measure times, or on a GPU."""
    from monet.profiling.dispatch import iteration_record, write_record
    from monet.profiling.profiler import cache_path, default_cache_dir

    if not measures_times(cost, device) or torch.device(device).type != "cpu":
        return None
    directory = quick_dir(device, cache_dir) if cost == "hybrid" else (cache_dir or default_cache_dir())
    path = cache_path(graph, device, directory)
    table = measured_table(cost, model, inputs, graph, device, cache_dir)
    record_path = path.with_suffix(RECORD_SUFFIX)
    shallow = None if record_path.exists() or cost != "hybrid" else stand_in(model, inputs, graph)
    if shallow is not None:  # a deep stack: its iterations measured on a shallow copy
        small = measured_table(cost, shallow.model, inputs, shallow.graph, device, cache_dir)
        small_path = cache_path(shallow.graph, device, directory).with_suffix(RECORD_SUFFIX)
        record = iteration_record(shallow.model, inputs, shallow.graph, small, device, small_path)
        if record is not None:
            return write_record(carried_record(model, inputs, graph, table, shallow, record), record_path)
    return iteration_record(model, inputs, graph, table, device, record_path)


def between_operators(cost: str, model, inputs, graph, device: str, cache_dir=None) -> float:
    """Seconds per node between operators that ``cost`` adds to each node's measured time
    (`iterations`; 0.0 where there is none)."""
    record = iterations(cost, model, inputs, graph, device, cache_dir)
    return 0.0 if record is None else record["between_operators_s"]


def operator_scale(cost: str, model, inputs, graph, device: str, cache_dir=None) -> float:
    """The factor on ``cost``'s CPU operator times (`iterations`,
    `monet.profiling.dispatch.operator_scale`; 1.0 where there is none)."""
    record = iterations(cost, model, inputs, graph, device, cache_dir)
    return 1.0 if record is None else record["operator_scale"]


def recompute_factor(cost: str, model, inputs, graph, device: str, cache_dir=None) -> float:
    """The factor on ``cost``'s CPU recompute seconds (`iterations`,
    `monet.profiling.dispatch.recompute_factor`; 1.0 where there is none)."""
    record = iterations(cost, model, inputs, graph, device, cache_dir)
    return 1.0 if record is None else record["recompute_factor"]


def plain_iteration(cost: str, model, inputs, graph, device: str, cache_dir=None) -> float | None:
    """Plain PyTorch's measured iteration (seconds, `iterations`), the reference of the predicted
    overhead (`monet.profiling.costs.CostArrays.plain_time_s`); None where there is none."""
    record = iterations(cost, model, inputs, graph, device, cache_dir)
    return None if record is None else record["plain_iteration_s"]


def with_measured_workspace(table: pd.DataFrame, model, inputs, graph, device: str,
                            cache_dir=None) -> pd.DataFrame:
    """``table`` with each operator's ``workspace_bytes`` from the quick profile (`quick_profile`)."""
    from monet.profiling.costs import validate_costs

    ws = quick_profile(model, inputs, graph, device, cache_dir).set_index(["kind", "node"])["workspace_bytes"]
    table = table.copy()
    table["workspace_bytes"] = [int(ws.get((k, n), 0)) for k, n in zip(table["kind"], table["node"])]
    table["source"] = table["source"] + "+measured-workspace"
    return validate_costs(table)


def cost_table(cost: str, model, inputs, graph, device: str, gpu_spec: str | None = None,
               cache_dir=None) -> pd.DataFrame:
    """The cost table of ``graph`` (one row per forward/backward node: seconds, workspace bytes)
    for the cost source ``cost`` (`COST_SOURCES`).

    Raises:
        ValueError: an unknown cost source or preset, or a model that does not match the graph.
    """
    from monet.profiling.costs import analytic_costs

    if cost not in COST_SOURCES:
        raise ValueError(f"cost source must be one of {', '.join(COST_SOURCES)}, got {cost!r}")
    if measures_times(cost, device):  # profile; hybrid on the CPU: the quick profile's times and workspace
        table = measured_table(cost, model, inputs, graph, device, cache_dir).copy()
        record = iterations(cost, model, inputs, graph, device, cache_dir) or {}
        between, factor = record.get("between_operators_s", 0.0), record.get("recompute_factor", 1.0)
        scale = record.get("operator_scale", 1.0)
        if cost == "hybrid":
            table["source"] = "hybrid:quick-" + table["source"].astype(str)
        if between > 0 or factor != 1.0 or scale != 1.0:
            table["time_s"] = scale * table["time_s"] + between
            table["recompute_s"] = factor * (scale * table["recompute_s"] + between)
            table["source"] = (table["source"].astype(str) +
                               f"+x{scale:.2f}+{1e6 * between:.1f}us-between-x{factor:.2f}")
        return table
    table = analytic_costs(graph, device_spec(gpu_spec, device))
    if cost in ("hybrid", "workspace"):
        return with_measured_workspace(table, model, inputs, graph, device, cache_dir)
    return with_workspace_bound(table, graph, device)


def solver_costs(cost: str, model, inputs, graph, device: str, gpu_spec: str | None = None,
                 cache_dir=None) -> tuple[pd.DataFrame, "CostArrays"]:
    """``(cost table, the solver's CostArrays)`` of ``graph`` for ``cost``: `cost_table`, and its
    arrays with plain PyTorch's measured iteration as the overhead's reference where there is
    one (`plain_iteration`).  For a graph whose step runs compiled (``graph.compiled``), the
    compiled step's costs (`monet.profiling.compiled_costs`) from the kernels' own seconds (the
    quick or full profile where ``cost`` measures times, else the roofline), with the
    keep-everything schedule's sum as the reference.

    Raises:
        ValueError: as `cost_table`.
    """
    from monet.profiling.costs import costs_for

    if graph.compiled:
        from monet.profiling.compiled_costs import compiled_costs

        if cost not in COST_SOURCES:
            raise ValueError(f"cost source must be one of {', '.join(COST_SOURCES)}, got {cost!r}")
        kernels = (measured_table(cost, model, inputs, graph, device, cache_dir) if measures_times(cost, device)
                   else cost_table(cost, model, inputs, graph, device, gpu_spec, cache_dir))
        table = compiled_costs(graph, kernels, device_spec(gpu_spec, device))
        return table, costs_for(graph, table)
    table = cost_table(cost, model, inputs, graph, device, gpu_spec, cache_dir)
    return table, costs_for(graph, table, plain_time_s=plain_iteration(cost, model, inputs, graph, device, cache_dir))


def variant_cost_fn(cost: str, model, inputs, graph, table: pd.DataFrame, device: str,
                    gpu_spec: str | None = None, cache_dir=None):
    """Costs of the variant graphs of operator implementations (full mode), made the way ``cost``
    made ``table`` (`monet.profiling.variant_costs.hybrid_cost_fn`): measured times where ``cost``
    measures them (`measures_times`), plus the same time between operators as ``table``'s nodes
    (`between_operators`, ``cache_dir`` as for `cost_table`), else analytic times scaled by the
    measured ratio to PyTorch's kernel."""
    from monet.profiling.variant_costs import hybrid_cost_fn
    from monet.solver.choices import analytic_cost_fn

    spec = device_spec(gpu_spec, device)
    if cost == "analytic":
        return analytic_cost_fn(spec, workspace_device=device)
    between = between_operators(cost, model, inputs, graph, device, cache_dir)
    factor = recompute_factor(cost, model, inputs, graph, device, cache_dir)
    scale = operator_scale(cost, model, inputs, graph, device, cache_dir)
    # on the CPU, where times are measured, each variant's whole iteration is measured too
    calibrate = measures_times(cost, device) and torch.device(device).type == "cpu"
    if cost == "profile":
        return hybrid_cost_fn(model, inputs, graph, table, device, spec, measure="profile", between_s=between,
                              recompute_factor=factor, time_scale=scale, calibrate=calibrate)
    measured = measures_times(cost, device)
    return hybrid_cost_fn(model, inputs, graph, table, device, spec, measure="measured" if measured else "hybrid",
                          between_s=between, recompute_factor=factor, in_context=measured and in_context(device),
                          time_scale=scale, calibrate=calibrate, **QUICK)


__all__ = ["COST_SOURCES", "QUICK", "between_operators", "cost_table", "device_spec", "in_context", "iterations",
           "measured_table", "measures_times", "operator_scale", "plain_iteration", "quick_dir", "quick_profile", "recompute_factor",
           "solver_costs", "variant_cost_fn", "with_measured_workspace"]
