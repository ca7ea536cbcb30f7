"""Per-node memory traces: what the memory model predicts for each FX node of a schedule, against what
the allocator measured while that node ran, and a file that keeps the measurement.

**Recording** (`record_trace`).  One training iteration of a schedule is run through
`monet.wrapper.ScheduledModule` (the executor's forward and backward modules,
`monet.executor.build_modules`, under AOTAutograd) after one warm-up iteration, with every
``call_function`` node of both modules run by `ProbedInterpreter`: it runs the node, frees the values
whose last use it is (and its output when nothing reads it, as FX's generated code does), and wraps
all of that in a probe, so the frees a node causes belong to it.  Attribution:

* **CPU**: the probe is a ``torch.profiler.record_function("monet::<row>")``; the iteration runs under
  ``torch.profiler.profile(profile_memory=True)`` and each raw allocator event is attributed to the
  ``record_function`` that encloses it in the profiler's event tree
  (`monet.profiling.memory.cpu_scoped_allocation_events`).  Events outside every node (autograd's
  engine, AOTAutograd's runtime between the passes) are placed, by their time stamps, in the gap
  before the next node (``gap_peak_bytes``) or after the last one.  Bytes are the requested bytes,
  on top of the live tensors at the start (parameters, buffers, inputs, output gradient:
  `monet.profiling.memory.live_tensor_bytes`).
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
(`monet.profiling.cuda_memory`) and the per-node workspace the trace names.

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
schedule, and the captured joint graph as data (`graph_to_json`: per FX node its operator, arguments
and traced shapes, dtypes, storage bytes and device), so the simulation replays on any machine,
without the model's code, the solver or a GPU: `graph_from_json` rebuilds the joint graph with fake
tensors that report the recorded device (nothing is allocated) and checks its fingerprint.  (A
capture on the meta device, as `monet.zoo.build.capture_config` does, gives ResNet-50's CUDA graph,
fingerprint for fingerprint, but not GPT-2's: there ``scaled_dot_product_attention`` becomes matrix
products where CUDA runs its efficient-attention kernel.)  The model's name and arguments are kept
to record it again.

**Workspace**: a trace names the per-node workspace its simulation counts: ``"trace"`` (derived from
the recording itself: the largest ``peak - before - outputs`` over a node's runs, so the comparison
tests what is live, not the workspace estimate), or the profile or costs the schedule was solved
with (``"profile <file>"``, ``"analytic"``), whose numbers are copied into the file.

**Comparing** (`compare`): per row, measured minus simulated bytes after the node and while it runs;
the first row where either differs by more than the tolerance is where the memory model and the
allocator part; the peaks of the iteration are compared as docs/design.md ("What must stay true") promises (within 2 %).
"""
from __future__ import annotations

import copy
import dataclasses
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
import torch.fx as fx

from monet import compat
from monet.graph import op_name

__all__ = ["FORMAT", "VERSION", "SCOPE", "PEAK_TOLERANCE", "Trace", "TraceFormatError", "TraceMismatchError",
           "ProbedInterpreter", "record_trace", "trace_workspace", "replay_trace", "graph_to_json", "graph_from_json",
           "compare",
           "compare_trace", "is_trace_file", "Comparison",
           "format_report", "schedule_to_json", "schedule_from_json", "device_info"]

FORMAT = "monet-trace"
VERSION = 1
SCOPE = "monet::"  # record_function / allocator metadata prefix of a node's row
PEAK_TOLERANCE = 0.02  # docs/design.md, "What must stay true": predicted peak within 2 % of measured
ENV_KEYS = ("PYTORCH_CUDA_ALLOC_CONF", "PYTORCH_ALLOC_CONF", "CUBLAS_WORKSPACE_CONFIG", "CUBLASLT_WORKSPACE_SIZE",
            "TORCH_CUBLASLT_UNIFIED_WORKSPACE", "TORCH_CUDNN_V8_API_DISABLED")
MEASURED = ["gap_peak_bytes", "before_bytes", "peak_bytes", "after_bytes"]
SIMULATED = ["sim_peak_bytes", "sim_after_bytes", "sim_outputs_bytes", "sim_workspace_bytes"]


class TraceFormatError(ValueError):
    """A file that is not a monet trace, or of a newer format version; the message names the file."""


class TraceMismatchError(ValueError):
    """A trace whose model, rebuilt here, is not the graph it recorded (another fingerprint)."""


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


# ----------------------------------------------------------------------------------------------
# running a module node by node
# ----------------------------------------------------------------------------------------------


class ProbedInterpreter(fx.Interpreter):
    """Runs an FX module node by node, each ``call_function`` node inside ``probe.enter`` /
    ``probe.exit``, freeing inside the probe the values whose last use the node is, and the node's
    output when nothing reads it (what FX's generated code frees, at the same points).

    Args:
        gm: the forward or backward module.
        pass_: "forward" or "backward", passed to the probe.
        probe: ``enter(pass_, node) -> token`` and ``exit(token)``.
    """

    def __init__(self, gm: fx.GraphModule, pass_: str, probe):
        super().__init__(gm, garbage_collect_values=False)
        self.pass_, self.probe = pass_, probe
        seen: set = set()
        self.last_uses: dict[fx.Node, list[fx.Node]] = {}
        for node in reversed(self.graph.nodes):
            for a in node.all_input_nodes:
                if a not in seen:
                    seen.add(a)
                    self.last_uses.setdefault(node, []).append(a)

    def run_node(self, n: fx.Node):
        if n.op != "call_function":
            return super().run_node(n)
        token = self.probe.enter(self.pass_, n)
        try:
            result = super().run_node(n)
            for a in self.last_uses.get(n, ()):
                self.env.pop(a, None)
            if not n.users:
                result = None
        finally:
            self.probe.exit(token)
        return result

    def boxed(self):
        """The callable AOTAutograd calls (boxed: one list of inputs); the backward's list is
        cleared, so its inputs (the saved tensors) are freed after their last use."""
        placeholders = [n for n in self.graph.nodes if n.op == "placeholder"]
        clear = self.pass_ == "backward"

        def run(args):
            env = dict(zip(placeholders, args))
            if clear:
                args.clear()
            try:
                return self.run(initial_env=env, enable_io_processing=False)
            finally:
                self.env = {}

        return compat.boxed_list_function(run)


def _role(pass_: str, n: fx.Node, fwd_of: dict) -> tuple[str, int]:
    tag = n.meta.get("monet")
    if tag is not None:
        kind, i = tag
        role = {"fwd": "recompute", "bwd": "backward", "alias": "view", "offload": "offload"}.get(kind, "other")
        return role, int(i)
    if pass_ == "forward" and n.name in fwd_of:
        return "forward", fwd_of[n.name]
    return "other", -1


class _Probe:
    """Collects one row per node run; subclasses measure."""

    def __init__(self):
        self.rows: list[dict] = []
        self.fwd_of: dict = {}

    def _row(self, pass_: str, n: fx.Node) -> dict:
        role, i = _role(pass_, n, self.fwd_of)
        row = dict(row=len(self.rows), pass_=pass_, name=n.name, op=op_name(n), role=role, node_id=i)
        self.rows.append(row)
        return row


class _CpuProbe(_Probe):
    def enter(self, pass_, n):
        row = self._row(pass_, n)
        rf = torch.profiler.record_function(f"{SCOPE}{row['row']}")
        rf.__enter__()
        return rf

    def exit(self, rf):
        rf.__exit__(None, None, None)


class _CudaProbe(_Probe):
    def __init__(self, device):
        super().__init__()
        self.device = device
        self.labels = False

    def enter(self, pass_, n):
        row = self._row(pass_, n)
        row["gap_peak_bytes"] = torch.cuda.max_memory_allocated(self.device)
        row["before_bytes"] = torch.cuda.memory_allocated(self.device)
        torch.cuda.reset_peak_memory_stats(self.device)
        self.labels = compat.cuda_memory_metadata(f"{SCOPE}{row['row']}")
        return row

    def exit(self, row):
        compat.cuda_memory_metadata("")
        row["peak_bytes"] = torch.cuda.max_memory_allocated(self.device)
        row["after_bytes"] = torch.cuda.memory_allocated(self.device)
        torch.cuda.reset_peak_memory_stats(self.device)


# ----------------------------------------------------------------------------------------------
# recording
# ----------------------------------------------------------------------------------------------


def _blas_version() -> str | None:
    """cuBLAS's version from the cuBLAS library the process loaded (``cublasLtGetVersion``), None when
    it cannot be found."""
    import ctypes

    for line in open("/proc/self/maps", encoding="utf-8", errors="replace") if os.path.exists("/proc/self/maps") else ():
        path = line.split()[-1] if line.strip() else ""
        if "libcublasLt.so" in path:
            try:
                return str(ctypes.CDLL(path).cublasLtGetVersion())
            except (OSError, AttributeError):
                return None
    return None


def device_info(device) -> dict:
    """What a trace records of the device: type, name, compute capability, torch / CUDA / cuDNN /
    cuBLAS versions, numerics settings (`monet.compat.numerics`) and the allocator and BLAS
    environment variables that change byte counts."""
    from monet.profiling.profiler import device_name

    dev = torch.device(device)
    cuda = dev.type == "cuda"
    return {"type": dev.type, "name": device_name(dev),
            "capability": list(torch.cuda.get_device_capability(dev)) if cuda else None,
            "torch": torch.__version__, "cuda": torch.version.cuda if cuda else None,
            "cudnn": torch.backends.cudnn.version() if cuda else None,
            "cublas": _blas_version() if cuda else None, "numerics": compat.numerics(),
            "env": {k: os.environ[k] for k in ENV_KEYS if k in os.environ}}


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


def _cpu_measure(probe: _CpuProbe, events, scopes, baseline: int) -> tuple[dict, pd.DataFrame]:
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
        inputs: its inputs, as `monet.profiling.check.output_grad` takes them.
        schedule: a `monet.solution.Solution` (checked against the traced graph), a `Schedule`, or
            ``schedule(graph) -> Schedule`` (solved on the graph the wrapper traces).
        model_name, model_kwargs, inputs_spec: what rebuilds the model and its inputs (a MODEL
            string, its factory's arguments and an input spec, `monet.models.build`), to record it
            again (the replay needs only the recorded graph).
        g: the output gradient (default `monet.profiling.check.output_grad`'s).
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
    from monet.profiling.check import _backward, _forward, output_grad
    from monet.profiling.memory import cpu_scoped_allocation_events, live_tensor_bytes
    from monet.solution import Schedule, Solution, check_compatible
    from monet.executor import RUNTIME
    from monet.wrapper import ScheduledModule

    x = ExampleInputs.of(inputs)
    device = x.first.device
    if device.type not in ("cpu", "cuda"):
        raise ValueError(f"record_trace measures cpu and cuda devices, not {device.type!r}")
    model = copy.deepcopy(model)
    if g is None:
        g = output_grad(model, x, autocast=autocast)
    probe = _CpuProbe() if device.type == "cpu" else _CudaProbe(device)
    sol = schedule if isinstance(schedule, Solution) else None
    if sol is not None:
        def make_schedule(graph):
            m = sol.meta
            check_compatible(m, graph.fingerprint, graph.summary, batch_size=x.batch_size,
                             input_shape=tuple(x.first.shape[1:]), dtype=x.first.dtype,
                             nodes=(len(graph.fwd), len(graph.bwd)))
            return sol.schedule
    elif isinstance(schedule, Schedule):
        def make_schedule(graph):
            return schedule
    else:
        make_schedule = schedule
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
    measured: dict
    if device.type == "cpu":
        baseline = live_tensor_bytes(scheduled, x.tensors(), *([] if g is None else [g]), device="cpu")
        events, scopes = cpu_scoped_allocation_events(step, SCOPE)
        measured, events_df = _cpu_measure(probe, events, scopes, baseline)
    else:
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
    meta = {
        "created": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "monet_version": __import__("monet").__version__,
        "model": {"name": model_name, "kwargs": dict(model_kwargs or {}), "batch_size": int(x.batch_size),
                  "input_shape": list(x.first.shape[1:]), "dtype": str(x.first.dtype).removeprefix("torch."),
                  "inputs_spec": inputs_spec or (getattr(sol.meta, "inputs_spec", None) if sol is not None else None)},
        "device": device_info(device),
        "graph": {"fingerprint": graph.fingerprint, "n_fwd": len(graph.fwd), "n_bwd": len(graph.bwd),
                  "joint": graph_to_json(base["graph"])},
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
    return Trace(meta=meta, nodes=nodes, events=events_df)


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


# ---- the captured joint graph, as data: replayed with fake tensors of the recorded device, so a
# CUDA graph (its attention kernels are CUDA ops: a capture on the meta device decomposes GPT-2's
# scaled_dot_product_attention into matmuls instead) is simulated as it was recorded, on any machine


def _target_name(n: fx.Node) -> str:
    import operator

    if n.target is operator.getitem:
        return "operator.getitem"
    name = op_name(n)  # "aten.convolution.default" for an operator overload
    if name.count(".") < 2 or name.startswith("monet."):
        raise TraceFormatError(f"cannot record the graph's target {n.target!r}: only operator overloads and getitem")
    return name


def _resolve_target(name: str):
    import operator

    if name == "operator.getitem":
        return operator.getitem
    ns, *op, overload = name.split(".")
    try:
        return getattr(getattr(getattr(torch.ops, ns), ".".join(op)), overload)
    except (AttributeError, RuntimeError):
        raise TraceFormatError(f"operator {name} is not known to torch {torch.__version__}") from None


_ENUMS = {"mf": torch.memory_format, "layout": torch.layout}


def _enc(a):
    if isinstance(a, fx.Node):
        return {"n": a.name}
    if isinstance(a, bool) or a is None or isinstance(a, (int, str)):
        return a
    if isinstance(a, float):
        return a if np.isfinite(a) else {"f": repr(a)}
    if isinstance(a, tuple):
        return {"t": [_enc(x) for x in a]}
    if isinstance(a, list):
        return {"l": [_enc(x) for x in a]}
    if isinstance(a, dict):
        return {"d": {k: _enc(v) for k, v in a.items()}}
    if isinstance(a, torch.dtype):
        return {"dtype": str(a).removeprefix("torch.")}
    if isinstance(a, torch.device):
        return {"device": str(a)}
    if isinstance(a, torch.memory_format):
        return {"mf": str(a).removeprefix("torch.")}
    if isinstance(a, torch.layout):
        return {"layout": str(a).removeprefix("torch.")}
    if isinstance(a, torch.Tensor):
        return {"T": [list(a.shape), list(a.stride()), str(a.dtype).removeprefix("torch."), int(a.storage_offset()),
                      int(a.untyped_storage().nbytes()), str(a.device)]}
    raise TraceFormatError(f"cannot record the graph value {a!r} ({type(a).__name__})")


def _dec(a, env: dict, fake):
    if isinstance(a, list):  # a bare JSON list does not occur: lists and tuples are tagged
        raise TraceFormatError("malformed graph in the trace")
    if not isinstance(a, dict):
        return a
    (key, v), = a.items()
    if key == "n":
        return env[v]
    if key == "t":
        return tuple(_dec(x, env, fake) for x in v)
    if key == "l":
        return [_dec(x, env, fake) for x in v]
    if key == "d":
        return {k: _dec(x, env, fake) for k, x in v.items()}
    if key == "f":
        return float(v)
    if key == "dtype":
        return getattr(torch, v)
    if key == "device":
        return torch.device(v)
    if key in _ENUMS:
        return getattr(torch, v)
    if key == "T":
        shape, stride, dtype, offset, nbytes, device = v
        storage = torch.empty(nbytes, dtype=torch.uint8, device="meta").untyped_storage()
        meta = torch.empty(0, dtype=getattr(torch, dtype), device="meta").set_(storage, offset, shape, stride)
        return compat.fake_tensor_on(fake, meta, device)
    raise TraceFormatError(f"malformed graph in the trace (key {key!r})")


def graph_to_json(graph) -> dict:
    """The captured joint graph of an `OpGraph` as data (``meta.graph.joint`` of a trace): per FX
    node its kind, name, target, arguments and traced value (shapes, strides, dtypes, storage bytes,
    device), with the number of forward outputs, the primals' kinds and the autocast setting.

    Raises:
        TraceFormatError: a node whose target or argument cannot be written (not an ATen operator).
    """
    nodes = []
    for n in graph.joint.graph.nodes:
        target = _target_name(n) if n.op == "call_function" else n.target
        nodes.append([n.op, n.name, target, _enc(n.args), _enc(n.kwargs), _enc(n.meta.get("val"))])
    return {"nodes": nodes, "num_fwd_outputs": graph.num_fwd_outputs, "primal_kinds": dict(graph.primal_kinds),
            "autocast": list(graph.autocast) if graph.autocast else None}


def graph_from_json(doc: dict, fingerprint: str | None = None, capability=None):
    """The `OpGraph` `graph_to_json` wrote, rebuilt with fake tensors on the recorded devices (no GPU
    needed, nothing allocated): ``build_opgraph`` of the joint graph, its device ("cuda" for a CUDA
    recording) and ``cuda_capability``.

    Raises:
        TraceMismatchError: the rebuilt graph's fingerprint is not ``fingerprint``.
        TraceFormatError: an operator this torch does not know, or a malformed graph.
    """
    from monet.graph import build_opgraph

    fake = compat.fake_mode()
    graph, env, root = fx.Graph(), {}, torch.nn.Module()
    for op, name, target, args, kwargs, val in doc["nodes"]:
        a, k = _dec(args, env, fake), _dec(kwargs, env, fake)
        if op == "call_function":
            node = graph.create_node(op, _resolve_target(target), a, k, name=name)
        elif op == "placeholder":
            node = graph.create_node(op, target, (), {}, name=name)
        elif op == "get_attr":
            node = graph.create_node(op, target, (), {}, name=name)
            holder = root
            *path, leaf = target.split(".")
            for part in path:
                if not hasattr(holder, part):
                    holder.add_module(part, torch.nn.Module())
                holder = getattr(holder, part)
            holder.register_buffer(leaf, _dec(val, env, fake) if val is not None else None)
        elif op == "output":
            node = graph.create_node(op, target, a, k, name=name)
        else:
            raise TraceFormatError(f"malformed graph in the trace (node kind {op!r})")
        if node.name != name:
            raise TraceFormatError(f"malformed graph in the trace (node {name} became {node.name})")
        node.meta["val"] = _dec(val, env, fake)
        env[name] = node
    joint = fx.GraphModule(root, graph)
    autocast = tuple(doc["autocast"]) if doc.get("autocast") else None
    out = build_opgraph(joint, doc["num_fwd_outputs"], doc["primal_kinds"], autocast=autocast)
    if fingerprint is not None and out.fingerprint != fingerprint:
        raise TraceMismatchError(f"the trace's graph, rebuilt here, has fingerprint {out.fingerprint[:12]}, the "
                                 f"recording {fingerprint[:12]}: the trace was written by another monet or torch; "
                                 f"record it again")
    if capability is not None:
        out.cuda_capability = tuple(capability)
    return out


def replay_trace(trace: Trace, graph=None):
    """Recompute a trace's simulation here (any machine, no GPU): rebuild its joint graph with fake
    tensors of the recorded device (`graph_from_json`), build the executor's modules of the recorded
    schedule (`monet.executor.build_modules`), simulate them (`monet.simulate.simulate`) with the
    recorded workspace and the recorded device's byte counting (`monet.profiling.cuda_memory`),
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


# ----------------------------------------------------------------------------------------------
# comparing
# ----------------------------------------------------------------------------------------------


@dataclass
class Comparison:
    """Measured against simulated (bytes).

    Attributes:
        measured_peak, simulated_peak: the iteration's peaks; ``peak_ratio`` = simulated / measured.
        first_parting: the first row (a dict of the node's columns plus ``quantity``, "after" or
            "peak", and ``difference`` = measured - simulated) where the two differ by more than
            ``tolerance_bytes``; None when they never do.
        unmatched: rows the simulation has no node for (NaN ``sim_*``: the traced modules differ).
        nodes: the rows with ``diff_after`` and ``diff_peak`` columns.
    """

    measured_peak: int
    simulated_peak: int
    measured_peak_at: str
    simulated_peak_at: str
    tolerance_bytes: int
    first_parting: dict | None
    unmatched: int
    nodes: pd.DataFrame

    @property
    def peak_ratio(self) -> float:
        return self.simulated_peak / self.measured_peak if self.measured_peak else float("nan")

    @property
    def within(self) -> bool:
        """The simulated peak within `PEAK_TOLERANCE` (2 %) of the measured one."""
        return abs(self.simulated_peak - self.measured_peak) <= PEAK_TOLERANCE * self.measured_peak


def compare(nodes: pd.DataFrame, measured_peak: int, simulated_peak: int, *, simulated_peak_at: str = "",
            tolerance_bytes: int | None = None, rtol: float = 0.002) -> Comparison:
    """Compare a trace's measured and simulated columns row by row.

    Args:
        nodes: a trace's nodes with ``sim_*`` columns (`replay_trace`, or as recorded).
        measured_peak, simulated_peak: the iteration's peaks (bytes).
        tolerance_bytes: how far measured and simulated may differ before they "part"; default
            ``rtol`` of the measured peak.
    """
    tol = int(rtol * measured_peak) if tolerance_bytes is None else int(tolerance_bytes)
    df = nodes.copy()
    df["diff_after"] = df["after_bytes"] - df["sim_after_bytes"]
    df["diff_peak"] = df["peak_bytes"] - df["sim_peak_bytes"]
    unmatched = int(df["sim_after_bytes"].isna().sum())
    first = None
    for _, r in df.iterrows():
        if pd.isna(r["sim_after_bytes"]):
            continue
        for quantity in ("after", "peak"):
            d = r[f"diff_{quantity}"]
            if abs(d) > tol:
                first = {**r.to_dict(), "quantity": quantity, "difference": int(d)}
                break
        if first is not None:
            break
    at = str(df.loc[int(df["peak_bytes"].idxmax()), "name"]) if len(df) else ""
    return Comparison(measured_peak=int(measured_peak), simulated_peak=int(simulated_peak), measured_peak_at=at,
                      simulated_peak_at=simulated_peak_at, tolerance_bytes=tol, first_parting=first,
                      unmatched=unmatched, nodes=df)


def compare_trace(trace: Trace, *, replay: bool = True, tolerance_bytes: int | None = None) -> Comparison:
    """`compare` a trace's measurement with its simulation: recomputed here (`replay_trace`, the
    default) or as recorded (``replay=False``).

    Raises:
        TraceMismatchError: (replay) the model rebuilt here is another graph.
    """
    if replay:
        sim, nodes = replay_trace(trace)
        peak, at = sim.peak_bytes, sim.peak_at
    else:
        nodes, peak, at = trace.nodes, trace.meta["simulated"]["peak_bytes"], trace.meta["simulated"]["peak_at"]
    return compare(nodes, trace.meta["measured"]["peak_bytes"], peak, simulated_peak_at=at,
                   tolerance_bytes=tolerance_bytes)


def is_trace_file(path: str | Path) -> bool:
    """Whether ``path`` is a gzip file holding a monet trace (reads its first bytes only)."""
    try:
        with gzip.open(path, "rt", encoding="utf-8") as f:
            head = f.read(64)
    except (OSError, EOFError, UnicodeDecodeError):
        return False
    return f'"format":"{FORMAT}"' in head.replace(" ", "")


def _mib(b) -> str:
    return "-" if b is None or pd.isna(b) else f"{b / 2**20:,.2f}"


def format_report(c: Comparison, meta: dict | None = None, rows: int | None = None) -> str:
    """A text report: a table of every row (or of the ``rows`` either side of the first parting node,
    else of the measured peak), the first parting node and the peaks (MiB = 2^20 bytes)."""
    lines = []
    if meta:
        m, d, s = meta["model"], meta["device"], meta.get("solution", {})
        lines.append(f"trace of {m['name']} {m.get('kwargs') or ''} batch {m['batch_size']} {m['dtype']}, "
                     f"schedule {s.get('label') or '-'}, on {d['name']} (torch {d['torch']}), workspace from "
                     f"{meta['workspace']['source']}")
    df = c.nodes
    if rows is not None and len(df):
        k = int(c.first_parting["row"]) if c.first_parting is not None else int(df.loc[df["peak_bytes"].idxmax(), "row"])
        df = df[(df["row"] >= k - rows) & (df["row"] <= k + rows)]
    header = f"{'row':>5} {'pass':8} {'stage':>5} {'node':28} {'op':36} {'role':9} " \
             f"{'after MiB':>11} {'sim after':>11} {'peak MiB':>11} {'sim peak':>11}"
    lines.append(header)
    for _, r in df.iterrows():
        mark = " <" if c.first_parting is not None and int(r["row"]) == int(c.first_parting["row"]) else ""
        lines.append(f"{int(r['row']):>5} {r['pass']:8} {int(r['stage']):>5} {str(r['name'])[:28]:28} "
                     f"{str(r['op'])[:36]:36} {r['role']:9} {_mib(r['after_bytes']):>11} {_mib(r['sim_after_bytes']):>11} "
                     f"{_mib(r['peak_bytes']):>11} {_mib(r['sim_peak_bytes']):>11}{mark}")
    if c.first_parting is None:
        lines.append(f"measured and simulated agree at every node within {c.tolerance_bytes} bytes")
    else:
        f = c.first_parting
        lines.append(f"first parting node: row {int(f['row'])} {f['name']} ({f['op']}, {f['pass']} {f['role']}): "
                     f"measured {f['quantity']} - simulated = {f['difference']:+,} bytes "
                     f"(tolerance {c.tolerance_bytes:,})")
    if c.unmatched:
        lines.append(f"{c.unmatched} rows have no simulated node (the modules traced here differ from the recorded)")
    lines.append(f"peak: measured {c.measured_peak:,} bytes ({_mib(c.measured_peak)} MiB) at {c.measured_peak_at}, "
                 f"simulated {c.simulated_peak:,} bytes ({_mib(c.simulated_peak)} MiB) at {c.simulated_peak_at}; "
                 f"simulated / measured {c.peak_ratio:.4f} "
                 f"({'within' if c.within else 'NOT within'} {PEAK_TOLERANCE:.0%})")
    return "\n".join(lines)
