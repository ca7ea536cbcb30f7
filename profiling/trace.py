"""Per-node memory traces: what the memory model predicts for each FX node of a schedule, against what
the allocator measured while that node ran, and a file that keeps the measurement.

**Recording** (`record_trace`).  One training iteration of a schedule is run through
`monet.wrapper.ScheduledModule` (the executor's forward and backward modules,
`monet.executor.build_modules`, under AOTAutograd) after one warm-up iteration, with every
``call_function`` node of both modules run by `monet.profiling.probes.ProbedInterpreter`: it runs the node, frees the values
whose last use it is (and its output when nothing reads it, as FX's generated code does), and wraps
all of that in a probe, so the frees a node causes belong to it.  Attribution:

* **CPU**: the probe is a ``torch.profiler.record_function("monet::<row>")``; the iteration runs under
  ``torch.profiler.profile(profile_memory=True)`` and each raw allocator event is attributed to the
  ``record_function`` that encloses it in the profiler's event tree
  (`monet.profiling.peak.cpu_scoped_allocation_events`).  Events outside every node (autograd's
  engine, AOTAutograd's runtime between the passes) are placed, by their time stamps, in the gap
  before the next node (``gap_peak_bytes``) or after the last one.  Bytes are the requested bytes,
  on top of the live tensors at the start (parameters, buffers, inputs, output gradient:
  `monet.profiling.peak.live_tensor_bytes`).
* **CUDA**: the probe reads the caching allocator's counters: ``max_memory_allocated`` since the last
  probe (the gap's peak), ``memory_allocated`` before, ``reset_peak_memory_stats``, then after the
  node ``max_memory_allocated`` (the node's peak) and ``memory_allocated`` (after).  These are host
  side counters, exact without synchronising.  In addition ``torch.cuda.memory._record_memory_history``
  records every allocator event of the iteration (block sizes), and the probe stamps the node's row
  on the events its thread generates (``_set_memory_metadata``, `monet.compat.cuda_memory_metadata`;
  the backward runs in autograd's device thread, where the probe runs too).  Where this torch lacks
  the metadata call, the events are kept unattributed (row -1) and the counters still hold.
  **Unverified without a GPU**: the CUDA probe and the event attribution were written from the
  2.14.1 sources and run here only through their CPU twin (`benchmarks/gpu_traces.py` runs them).

**Simulating** the same iteration: `monet.simulate.simulate` with ``timeline=True`` replays the
modules AOTAutograd ran (the one peak function), with the graph's device's `memory_terms`
(`monet.profiling.cuda_bytes`) and the per-node workspace the trace names.

**The file** (`Trace.save` / `Trace.load`): gzip-compressed JSON (``.json.gz``), a few kB for a small
model, about 100 kB for ResNet-50::

    {"format": "monet-trace", "version": 1,
     "meta": {"model": {"name", "kwargs", "batch_size", "input_shape", "dtype", "inputs_spec"},
              "device": {"type", "name", "capability", "torch", "cuda", "cudnn", "cublas", "numerics", "env"},
              "graph": {"fingerprint", "n_fwd", "n_bwd", "joint": {"nodes", "num_fwd_outputs", "primal_kinds",
                                                                    "autocast"}},
              "schedule": {"saved", "stages": [[backward, [recompute], [release]]], "impl", "inplace", "offload"},
              "executor": {"buffers_in_place"},   # `monet.executor.RUNTIME` when recorded (absent: False)
              "lowered": bool,   # the executor ran `monet.impls.lower_for_device` of the graph (absent: False)
              "solution": {"label", "mode", "budget_bytes", "predicted_peak_bytes"},
              "workspace": {"source", "fwd": [bytes per forward node], "bwd": [bytes per backward node],
                            "trace_fwd", "trace_bwd"},
              "measured": {"baseline_bytes", "peak_bytes", "peak_at", "tail_peak_bytes", "reserved_bytes",
                           "events_attributed"},
              "simulated": {"peak_bytes", "peak_at"}},
     "nodes": {column: [values]},      # one row per FX node run, in execution order
     "events": {column: [values]}}     # allocator events: row (-1: between nodes), action, size, addr

Node columns: ``row``, ``pass`` ("forward"/"backward"), ``stage`` (backward stage, -1 in the
forward pass), ``name`` (the FX node), ``op``, ``role`` ("forward", "recompute", "backward",
"view", "offload", "other"), ``node_id`` (forward or backward node id, -1), ``gap_peak_bytes``,
``before_bytes``, ``peak_bytes``, ``after_bytes`` (measured, bytes allocated in all, absolute), and
``sim_peak_bytes``, ``sim_after_bytes``, ``sim_outputs_bytes``, ``sim_workspace_bytes`` (the
simulator's, as of the recording; `replay_trace` recomputes them).  The solution is kept as its
schedule, and the captured joint graph as data (`monet.profiling.graph_json.graph_to_json`: per FX node its operator, arguments
and traced shapes, dtypes, storage bytes and device), so the simulation replays on any machine,
without the model's code, the solver or a GPU: `monet.profiling.graph_json.graph_from_json` rebuilds the joint graph with fake
tensors that report the recorded device (nothing is allocated) and checks its fingerprint.  (A
capture on the meta device, as `monet.zoo.build.capture_config` does, gives ResNet-50's CUDA graph,
fingerprint for fingerprint, but not GPT-2's: there ``scaled_dot_product_attention`` becomes matrix
products where CUDA runs its efficient-attention kernel.)  The model's name and arguments are kept
to record it again.

**Workspace**: a trace names the per-node workspace its simulation counts: ``"trace"`` (derived from
the recording itself: the largest ``peak - before - outputs`` over a node's runs, so the comparison
tests what is live, not the workspace estimate), or the profile or costs the schedule was solved
with (``"profile <file>"``, ``"analytic"``), whose numbers are copied into the file.

**Comparing** (`monet.profiling.trace_compare.compare`): per row, measured minus simulated bytes after the node and while it runs;
the first row where either differs by more than the tolerance is where the memory model and the
allocator part; the peaks of the iteration are compared as docs/design.md ("What must stay true") promises (within 2 %).
"""
from __future__ import annotations

import copy
import datetime
import gzip
import json
import os
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd
import torch

from monet import compat

from monet.profiling.graph_json import graph_from_json, graph_to_json
from monet.profiling.probes import CpuProbe, CudaProbe, ProbedInterpreter, device_info
from monet.profiling.trace_format import (ENV_KEYS, FORMAT, MEASURED, PEAK_TOLERANCE, SCOPE, SIMULATED, VERSION,
                                          TraceFormatError, TraceMismatchError)

__all__ = ["FORMAT", "VERSION", "SCOPE", "PEAK_TOLERANCE", "Trace", "TraceFormatError", "TraceMismatchError",
           "record_trace", "trace_workspace", "replay_trace", "is_trace_file", "schedule_to_json",
           "schedule_from_json"]


# ----------------------------------------------------------------------------------------------
# the file
# ----------------------------------------------------------------------------------------------


@dataclass
class Trace:
    """A recorded iteration (see the module docstring for every field).

    Attributes:
        meta: the nested dict of the file's ``meta``.
        nodes: one row per FX node run, in execution order (columns in the module docstring).
        events: the allocator events (``row``, ``action``, ``size`` bytes, ``addr``), time order.
    """

    meta: dict
    nodes: pd.DataFrame
    events: pd.DataFrame

    def save(self, path: str | Path) -> Path:
        """Write the trace as gzip-compressed JSON; returns the path.  Raises OSError."""
        path = Path(path)
        doc = {"format": FORMAT, "version": VERSION, "meta": self.meta,
               "nodes": _columns(self.nodes), "events": _columns(self.events)}
        path.parent.mkdir(parents=True, exist_ok=True)
        with gzip.open(path, "wt", encoding="utf-8", compresslevel=9) as f:
            json.dump(doc, f, separators=(",", ":"))
        return path

    @classmethod
    def load(cls, path: str | Path) -> "Trace":
        """Read a file `save` wrote.

        Raises:
            FileNotFoundError: no such file.
            TraceFormatError: not gzip JSON, not a monet trace, or a newer format version.
        """
        path = Path(path)
        try:
            with gzip.open(path, "rt", encoding="utf-8") as f:
                doc = json.load(f)
        except FileNotFoundError:
            raise
        except (OSError, EOFError, json.JSONDecodeError, UnicodeDecodeError) as e:
            raise TraceFormatError(f"{path}: not a monet trace (gzip JSON): {e}") from None
        if not isinstance(doc, dict) or doc.get("format") != FORMAT:
            raise TraceFormatError(f"{path}: not a monet trace (no format {FORMAT!r})")
        if int(doc.get("version", 0)) > VERSION:
            raise TraceFormatError(f"{path}: trace format version {doc['version']}, this monet reads up to {VERSION}")
        return cls(meta=doc["meta"], nodes=pd.DataFrame(doc["nodes"]), events=pd.DataFrame(doc["events"]))


def _columns(df: pd.DataFrame) -> dict:
    out = {}
    for c in df.columns:
        col = df[c]
        if pd.api.types.is_integer_dtype(col) or pd.api.types.is_bool_dtype(col):
            out[c] = [int(v) for v in col]
        elif pd.api.types.is_float_dtype(col):
            out[c] = [None if pd.isna(v) else (int(v) if float(v).is_integer() else float(v)) for v in col]
        else:
            out[c] = [None if v is None else str(v) for v in col]
    return out


def schedule_to_json(schedule) -> dict:
    """A `monet.solution.Schedule` as JSON-able lists (the ``meta.schedule`` of a trace)."""
    return {"saved": list(schedule.saved),
            "stages": [[s.backward, list(s.recompute), list(s.release)] for s in schedule.stages],
            "impl": dict(schedule.impl), "inplace": bool(schedule.inplace),
            "offload": [list(o) for o in schedule.offload]}


def schedule_from_json(doc: dict):
    """The `monet.solution.Schedule` `schedule_to_json` wrote."""
    from monet.solution import Schedule, Stage

    return Schedule(saved=doc["saved"], stages=[Stage(b, r, f) for b, r, f in doc["stages"]],
                    impl=doc.get("impl", {}), inplace=doc.get("inplace", False),
                    offload=[tuple(o) for o in doc.get("offload", [])])


def _stage_column(rows: list[dict]) -> list[int]:
    """Backward stage of each row: a recomputation belongs to the stage of the next backward node."""
    stages, current = [-1] * len(rows), -1
    for k in range(len(rows) - 1, -1, -1):
        r = rows[k]
        if r["pass_"] == "backward":
            if r["role"] == "backward":
                current = r["node_id"]
            stages[k] = current
    return stages


def _cpu_measure(probe: CpuProbe, events, scopes, baseline: int) -> tuple[dict, pd.DataFrame]:
    """Per-row measured bytes from the scoped CPU events (see the module docstring)."""
    import bisect

    starts = {int(name[len(SCOPE):]): start for name, start, _ in scopes}
    order = sorted(starts, key=lambda r: starts[r])
    start_times = [starts[r] for r in order]
    inside: dict[int, list] = {}
    gap: dict[int, list] = {}
    tail: list = []
    ev_rows = []
    for t, nbytes, ptr, scope in events:
        if scope is not None:
            r = int(scope[len(SCOPE):])
            inside.setdefault(r, []).append(nbytes)
        else:
            k = bisect.bisect_left(start_times, t)
            r = order[k] if k < len(order) else None
            (gap.setdefault(r, []) if r is not None else tail).append(nbytes)
            r = -1
        ev_rows.append((r, "alloc" if nbytes > 0 else "free", abs(nbytes), ptr))
    running = baseline
    for row in probe.rows:
        r = row["row"]
        row["gap_peak_bytes"] = running
        for b in gap.get(r, ()):
            running += b
            row["gap_peak_bytes"] = max(row["gap_peak_bytes"], running)
        row["before_bytes"] = row["peak_bytes"] = running
        for b in inside.get(r, ()):
            running += b
            row["peak_bytes"] = max(row["peak_bytes"], running)
        row["after_bytes"] = running
    tail_peak = running
    for b in tail:
        running += b
        tail_peak = max(tail_peak, running)
    events_df = pd.DataFrame(ev_rows, columns=["row", "action", "size", "addr"])
    return {"tail_peak_bytes": tail_peak, "reserved_bytes": None, "events_attributed": True}, events_df


def _cuda_events(snapshot: dict, device_index: int) -> tuple[pd.DataFrame, bool]:
    traces = snapshot.get("device_traces", [])
    entries = traces[device_index] if device_index < len(traces) else []
    rows, labelled = [], False
    for e in entries:
        action = e.get("action")
        if action not in ("alloc", "free_requested", "free_completed", "segment_alloc", "segment_free", "oom"):
            continue
        meta = e.get("user_metadata") or ""
        r = int(meta[len(SCOPE):]) if meta.startswith(SCOPE) else -1
        labelled |= r >= 0
        rows.append((r, action, int(e.get("size", 0)), int(e.get("addr", 0))))
    return pd.DataFrame(rows, columns=["row", "action", "size", "addr"]), labelled


def trace_workspace(nodes: pd.DataFrame, n_fwd: int, n_bwd: int) -> tuple[np.ndarray, np.ndarray]:
    """Per-node workspace derived from a recording (bytes, (N,) and (T,) int64): for each forward
    (also recomputed) and backward node, the largest ``peak_bytes - before_bytes - sim_outputs_bytes
    - sim_workspace_bytes`` over its runs, at least 0, where the ``sim_*`` columns come from a
    simulation without workspace (its ``sim_workspace_bytes`` is then what the simulator adds on its
    own: a replayed random op's generator state, `monet.rng`)."""
    fwd, bwd = np.zeros(n_fwd, dtype=np.int64), np.zeros(n_bwd, dtype=np.int64)
    extra = (nodes["peak_bytes"] - nodes["before_bytes"] - nodes["sim_outputs_bytes"]
             - nodes["sim_workspace_bytes"]).clip(lower=0)
    for role, i, ws in zip(nodes["role"], nodes["node_id"], extra):
        if role in ("forward", "recompute") and 0 <= i < n_fwd:
            fwd[i] = max(fwd[i], int(ws))
        elif role == "backward" and 0 <= i < n_bwd:
            bwd[i] = max(bwd[i], int(ws))
    return fwd, bwd


def _timeline_frame(sim) -> pd.DataFrame:
    return pd.DataFrame([(r.pass_, r.name, r.peak_bytes, r.after_bytes, r.outputs_bytes, r.workspace_bytes)
                         for r in sim.timeline], columns=["pass", "name"] + SIMULATED)


def _with_simulation(nodes: pd.DataFrame, sim) -> pd.DataFrame:
    base = nodes.drop(columns=[c for c in SIMULATED if c in nodes.columns])
    return base.merge(_timeline_frame(sim), on=["pass", "name"], how="left", validate="one_to_one")


def _simulate(graph, fw, bw, workspace: tuple | None):
    from monet.simulate import simulate

    ws_f, ws_b = workspace if workspace is not None else (None, None)
    return simulate(graph, fw, bw, ws_f, ws_b, timeline=True)


def record_trace(model: torch.nn.Module, inputs, schedule, *, model_name: str, model_kwargs: dict | None = None,
                 inputs_spec: str | None = None, g: torch.Tensor | None = None, workspace=None, workspace_source: str | None = None,
                 label: str = "", autocast=None) -> Trace:
    """Record one training iteration of a schedule, node by node (see the module docstring).

    Args:
        model: the model (on the device to measure; CPU or CUDA); not modified (a copy runs).
        inputs: its inputs, as `monet.profiling.measure.output_grad` takes them.
        schedule: a `monet.solution.Solution` (checked against the traced graph), a `Schedule`, or
            ``schedule(graph) -> Schedule`` (solved on the graph the wrapper traces).
        model_name, model_kwargs, inputs_spec: what rebuilds the model and its inputs (a MODEL
            string, its factory's arguments and an input spec, `monet.models.build`), to record it
            again (the replay needs only the recorded graph).
        g: the output gradient (default `monet.profiling.measure.output_grad`'s).
        workspace: (forward (N,), backward (T,)) bytes per node the simulation counts, or
            ``workspace(graph)`` returning them (or them and their source, or None) for the traced
            graph; None: derived from this recording (`trace_workspace`, source ``"trace"``; the
            derived arrays are kept in ``meta.workspace.trace_fwd`` / ``trace_bwd`` in every case).
        workspace_source: what ``workspace`` is ("profile <file>", "analytic" ...).
        label: a name for the schedule ("5GiB normal", "keep all").

    Returns:
        The `Trace`, with the simulation of the recorded modules in its ``sim_*`` columns.

    Raises:
        ValueError: a device other than cpu or cuda; monet.solution.SolutionMismatchError: a
            `Solution` made for another graph.
    """
    from monet.inputs import ExampleInputs
    from monet.profiling.measure import _backward, _forward, output_grad
    from monet.solution import Solution
    from monet.wrapper import ScheduledModule

    x = ExampleInputs.of(inputs)
    device = x.first.device
    if device.type not in ("cpu", "cuda"):
        raise ValueError(f"record_trace measures cpu and cuda devices, not {device.type!r}")
    model = copy.deepcopy(model)
    if g is None:
        g = output_grad(model, x, autocast=autocast)
    probe = CpuProbe() if device.type == "cpu" else CudaProbe(device)
    sol = schedule if isinstance(schedule, Solution) else None
    make_schedule = _schedule_maker(schedule, x)
    base: dict = {}

    def schedule_of(graph):  # the captured graph, before the schedule's implementations are applied
        base["graph"] = graph
        return make_schedule(graph)

    def run(gm, pass_):
        return ProbedInterpreter(gm, pass_, probe).boxed()

    scheduled = ScheduledModule(model, schedule_of, runner=run, autocast=autocast)

    def step():
        for p in scheduled.parameters():
            p.grad = None
        _backward(_forward(scheduled, x, autocast), g)

    step()  # warm-up: traces, solves where asked, allocates library workspaces, caches conv plans
    compiled = scheduled.monet_compiled
    graph, fw, bw = compiled["graph"], compiled["fw"], compiled["bw"]
    probe.fwd_of = graph.fwd_node_of()
    probe.rows = []
    for p in scheduled.parameters():
        p.grad = None
    measured, events_df, baseline = _measure_step(step, probe, scheduled, x, g, device)
    rows = probe.rows
    for r, stage in zip(rows, _stage_column(rows)):
        r["stage"] = stage
    nodes = pd.DataFrame(rows).rename(columns={"pass_": "pass"})
    nodes = nodes[["row", "pass", "stage", "name", "op", "role", "node_id"] + MEASURED]
    if callable(workspace):
        workspace = workspace(graph)
        if workspace is not None and len(workspace) == 3:
            *workspace, workspace_source = workspace
    nodes = _with_simulation(nodes, _simulate(graph, fw, bw, None))  # outputs, for the derived workspace
    derived = trace_workspace(nodes, len(graph.fwd), len(graph.bwd))
    if workspace is None:
        workspace, workspace_source = derived, "trace"
    sim = _simulate(graph, fw, bw, workspace)
    nodes = _with_simulation(nodes, sim)
    peaks = pd.concat([nodes["gap_peak_bytes"], nodes["peak_bytes"]])
    peak_row = int(nodes["peak_bytes"].idxmax())
    measured.update(baseline_bytes=int(baseline),
                    peak_bytes=int(max(peaks.max(), measured["tail_peak_bytes"])),
                    peak_at=str(nodes.loc[peak_row, "name"]))
    sched = sol.schedule if sol is not None else compiled["schedule"]
    meta = _trace_meta(model_name, model_kwargs, inputs_spec, x, device, graph, base["graph"], sched, sol, label,
                       (workspace, workspace_source, derived), measured, sim)
    return Trace(meta=meta, nodes=nodes, events=events_df)


def _schedule_maker(schedule, x):
    """``schedule`` (a `Solution`, checked against the traced graph; a `Schedule`; or a function of
    the graph) as a function ``graph -> Schedule``.

    Raises (when called):
        monet.solution.SolutionMismatchError: a `Solution` made for another graph."""
    from monet.solution import Schedule, Solution, check_compatible

    if isinstance(schedule, Solution):
        def make_schedule(graph):
            check_compatible(schedule.meta, graph.fingerprint, graph.summary, batch_size=x.batch_size,
                             input_shape=tuple(x.first.shape[1:]), dtype=x.first.dtype,
                             nodes=(len(graph.fwd), len(graph.bwd)))
            return schedule.schedule
        return make_schedule
    if isinstance(schedule, Schedule):
        return lambda graph: schedule
    return schedule


def _measure_step(step, probe, scheduled, x, g, device) -> tuple[dict, pd.DataFrame, int]:
    """(measured, allocator events, baseline bytes) of one ``step()`` of ``scheduled``, the probe
    recording each node: allocator events with their scopes on the CPU, the caching allocator's
    history on CUDA (its peak after the last node as ``tail_peak_bytes``)."""
    from monet.profiling.peak import cpu_scoped_allocation_events, live_tensor_bytes

    if device.type == "cpu":
        baseline = live_tensor_bytes(scheduled, x.tensors(), *([] if g is None else [g]), device="cpu")
        events, scopes = cpu_scoped_allocation_events(step, SCOPE)
        measured, events_df = _cpu_measure(probe, events, scopes, baseline)
        return measured, events_df, baseline
    torch.cuda.synchronize(device)
    baseline = torch.cuda.memory_allocated(device)
    torch.cuda.reset_peak_memory_stats(device)
    compat.cuda_memory_history(True)
    try:
        step()
        torch.cuda.synchronize(device)
        tail_peak = torch.cuda.max_memory_allocated(device)
        snapshot = compat.cuda_memory_snapshot()
    finally:
        compat.cuda_memory_history(False)
    events_df, labelled = _cuda_events(snapshot, device.index if device.index is not None
                                       else torch.cuda.current_device())
    measured = {"tail_peak_bytes": int(tail_peak), "reserved_bytes": int(torch.cuda.memory_reserved(device)),
                "events_attributed": bool(labelled and probe.labels)}
    return measured, events_df, baseline


def _trace_meta(model_name, model_kwargs, inputs_spec, x, device, graph, joint, sched, sol, label, workspaces,
                measured: dict, sim) -> dict:
    """The trace's ``meta``: what rebuilds the model, the device, the graph (``joint``: the captured
    joint graph), the schedule, the executor, the workspaces (given, source, derived from the
    trace), what was measured and simulated."""
    from monet.executor import RUNTIME

    workspace, workspace_source, derived = workspaces
    return {
        "created": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "monet_version": __import__("monet").__version__,
        "model": {"name": model_name, "kwargs": dict(model_kwargs or {}), "batch_size": int(x.batch_size),
                  "input_shape": list(x.first.shape[1:]), "dtype": str(x.first.dtype).removeprefix("torch."),
                  "inputs_spec": inputs_spec or (getattr(sol.meta, "inputs_spec", None) if sol is not None else None)},
        "device": device_info(device),
        "graph": {"fingerprint": graph.fingerprint, "n_fwd": len(graph.fwd), "n_bwd": len(graph.bwd),
                  "joint": graph_to_json(joint)},
        "schedule": schedule_to_json(sched),
        "executor": dict(RUNTIME),  # how the modules that ran were built
        "lowered": True,  # from the graph `monet.impls.lower_for_device` makes (`monet.wrapper`)
        "solution": {"label": label, "mode": sol.meta.mode if sol is not None else None,
                     "budget_bytes": int(sol.meta.budget_bytes) if sol is not None else None,
                     "predicted_peak_bytes": int(sol.meta.predicted_peak_bytes) if sol is not None else None},
        "workspace": {"source": workspace_source or "given", "fwd": [int(v) for v in workspace[0]],
                      "bwd": [int(v) for v in workspace[1]], "trace_fwd": [int(v) for v in derived[0]],
                      "trace_bwd": [int(v) for v in derived[1]]},
        "measured": measured,
        "simulated": {"peak_bytes": int(sim.peak_bytes), "peak_at": sim.peak_at},
    }


# ----------------------------------------------------------------------------------------------
# replaying on any machine
# ----------------------------------------------------------------------------------------------


@contextmanager
def _recorded_env(env: dict):
    """The recording's allocator / BLAS environment variables in force (others of `ENV_KEYS` unset)."""
    before = {k: os.environ.get(k) for k in ENV_KEYS}
    try:
        for k in ENV_KEYS:
            os.environ.pop(k, None)
        os.environ.update({k: str(v) for k, v in env.items() if k in ENV_KEYS})
        yield
    finally:
        for k, v in before.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def replay_trace(trace: Trace, graph=None):
    """Recompute a trace's simulation here (any machine, no GPU): rebuild its joint graph with fake
    tensors of the recorded device (`graph_from_json`), build the executor's modules of the recorded
    schedule (`monet.executor.build_modules`), simulate them (`monet.simulate.simulate`) with the
    recorded workspace and the recorded device's byte counting (`monet.profiling.cuda_bytes`),
    under the recorded allocator / BLAS environment variables.

    Args:
        graph: the rebuilt graph, when the caller has it (`graph_from_json`).

    Returns:
        (`monet.simulate.SimResult` with its timeline, the trace's nodes with the ``sim_*`` columns
        recomputed).

    Raises:
        TraceMismatchError, TraceFormatError: see `graph_from_json`.
    """
    from monet.executor import build_modules
    from monet.impls import apply_impls

    meta = trace.meta
    if graph is None:
        graph = graph_from_json(meta["graph"]["joint"], meta["graph"]["fingerprint"], meta["device"].get("capability"))
    schedule = schedule_from_json(meta["schedule"])
    g = apply_impls(graph, schedule.impl)
    if meta.get("lowered"):  # what the executor ran (traces recorded before it lowered: as they were)
        from monet.impls import lower_for_device
        g = lower_for_device(g)
    fw, bw = build_modules(g, schedule, **meta.get("executor", {"buffers_in_place": False}))
    ws = meta["workspace"]
    workspace = (np.asarray(ws["fwd"], dtype=np.int64), np.asarray(ws["bwd"], dtype=np.int64))
    with _recorded_env(meta["device"].get("env", {})):
        sim = _simulate(g, fw, bw, workspace)
    return sim, _with_simulation(trace.nodes, sim)


def is_trace_file(path: str | Path) -> bool:
    """Whether ``path`` is a gzip file holding a monet trace (reads its first bytes only)."""
    try:
        with gzip.open(path, "rt", encoding="utf-8") as f:
            head = f.read(64)
    except (OSError, EOFError, UnicodeDecodeError):
        return False
    return f'"format":"{FORMAT}"' in head.replace(" ", "")
