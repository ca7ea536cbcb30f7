"""Measured per-node costs: run the joint graph once with real tensors and time every node.

`profile_costs` executes ``graph.joint`` (the AOTAutograd joint forward+backward graph) with a
`torch.fx.Interpreter` on the model's own parameters and buffers, the example input and random
tangents.  Each FX node that is the main op of a forward or backward `Node` is run once for the
value passed on to the rest of the graph, then re-run for its measurements:

* **time** (seconds): ``warmup`` discarded runs, then the median of ``repeats`` timed runs.  CPU:
  ``time.perf_counter`` around each run; CUDA: a pair of ``torch.cuda.Event`` per run, read after
  one ``synchronize``.
* **once per signature**: a node whose op signature (`monet.graph.op_signature`: operator,
  arguments' shapes, strides, dtypes and values) was measured already takes that node's time and
  workspace, so the identical layers of a deep network cost one layer's measurements.
* **workspace** (bytes): one more run under `monet.profiling.peak.measure_peak`: the peak bytes
  allocated during the call minus what was allocated before it (the op's inputs and everything
  else live) minus the bytes of the op's new output storages, clamped at 0.  On CUDA the caching
  allocator's ``max_memory_allocated`` (outputs rounded to its 512-byte blocks); on CPU the
  profiler's raw allocator events, so kernel temporaries (oneDNN reorders and scratchpads, im2col
  buffers) count.

Random ops (dropout) run for real exactly once in the graph's data flow: the value passed
downstream comes from that single run; the extra runs for timing and memory are discarded.
The caller's RNG state is left untouched (the profile runs inside ``torch.random.fork_rng``).

Profiles are cached on disk (`load_or_profile`) as CSV files keyed by the graph's fingerprint, the
device name and the torch version; see `cache_path`.
"""
from __future__ import annotations

import contextlib
import os
import platform
import re
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any, Callable

import pandas as pd
import torch
import torch.fx as fx
import torch.nn as nn

from monet.graph import Node, OpGraph, PRIMAL, TANGENT, op_signature
from monet.profiling.costs import (DEFAULT_IMPL, costs_for, make_table, node_bytes_moved, node_flops,
                                   validate_costs)
from monet.profiling.peak import measure_peak

__all__ = [
    "profile_costs",
    "pooled_medians",
    "load_or_profile",
    "save_costs",
    "load_costs",
    "cache_path",
    "default_cache_dir",
    "device_name",
    "joint_inputs",
]

_CUDA_BLOCK = 512  # the CUDA caching allocator rounds every allocation up to 512 bytes
# pandas < 3 parses floats approximately unless asked; pandas 3 round-trips by default and
# deprecates the argument.
_READ_KW = {"float_precision": "round_trip"} if int(pd.__version__.split(".")[0]) < 3 else {}


# ----------------------------------------------------------------------------------------------
# devices
# ----------------------------------------------------------------------------------------------


def _cpu_model() -> str:
    name = platform.processor()
    if name:
        return name
    try:  # Linux: platform.processor() is often empty
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip() or "cpu"
    except OSError:
        pass
    return "cpu"


def device_name(device: torch.device | str) -> str:
    """A human-readable name of ``device``: the GPU's name (``torch.cuda.get_device_name``) for
    CUDA, the processor's for CPU (``platform.processor()``, else /proc/cpuinfo, else ``"cpu"``).

    Raises:
        ValueError: for a device type other than cpu and cuda.
    """
    dev = torch.device(device)
    if dev.type == "cuda":
        return torch.cuda.get_device_name(dev)
    if dev.type == "cpu":
        return _cpu_model()
    raise ValueError(f"profiling supports 'cpu' and 'cuda' devices, not {dev.type!r}")


# ----------------------------------------------------------------------------------------------
# inputs of the joint graph
# ----------------------------------------------------------------------------------------------


def _placeholders(joint: fx.GraphModule) -> list[fx.Node]:
    return [n for n in joint.graph.nodes if n.op == "placeholder"]


def joint_inputs(model: nn.Module, example_inputs, graph: OpGraph,
                 device: torch.device | str) -> list:
    """The flat argument list of ``graph.joint``, in placeholder order, on ``device``.

    ``primals_*``: the model's parameters (``named_parameters()`` order), buffers
    (``named_buffers()`` order) and the leaves of ``example_inputs`` (a tensor, a tuple of
    arguments, a dict of keyword arguments or an `ExampleInputs`, flattened as AOTAutograd does),
    tensors detached and moved to ``device`` (no copy when already there: the joint graph is
    functional and does not write to them), other leaves (``use_cache=False``) as they are.
    ``tangents_*``: standard-normal tensors with the shape, strides and dtype traced for each
    tangent (the gradients of the forward outputs); uses the global RNG.

    Raises:
        ValueError: if the model or inputs do not match the graph (count, shape or dtype of a
            placeholder); the message names the placeholder.
    """
    from monet.inputs import ExampleInputs

    if graph.joint is None:
        raise ValueError("the graph has no joint graph (graph.joint is None); re-capture the model")
    dev = torch.device(device)
    leaves = ExampleInputs.of(example_inputs).leaves()
    params = list(model.named_parameters())
    buffers = list(model.named_buffers())
    if graph.primal_sources is not None:  # the parameters and buffers the forward uses, by name
        named = dict(model.named_parameters(remove_duplicate=False))
        named.update(model.named_buffers(remove_duplicate=False))
        primals = []
        for kind, key in graph.primal_sources:
            if kind in ("param", "buffer"):
                if key not in named:
                    raise ValueError(f"the graph reads {kind} {key!r}, which the model does not have: "
                                     f"the graph was captured from another model")
                primals.append((f"{'parameter' if kind == 'param' else 'buffer'} {key}", named[key]))
            elif kind == "constant":
                primals.append(("constant", key))
            else:
                primals.append((f"input {key}", leaves[key] if key < len(leaves) else None))
        params = [p for p in primals if p[0].startswith("parameter")]
        buffers = [p for p in primals if not p[0].startswith(("parameter", "input"))]
    else:
        primals = ([("parameter " + n, t) for n, t in params] + [("buffer " + n, t) for n, t in buffers]
                   + [(f"input {k}", v) for k, v in enumerate(leaves)])
    phs = _placeholders(graph.joint)
    n_primal = sum(p.name.startswith(PRIMAL) for p in phs)
    if n_primal != len(primals):
        raise ValueError(f"the graph has {n_primal} primal inputs but the model gives {len(primals)} "
                         f"({len(params)} parameters, {len(buffers)} buffers, {len(leaves)} inputs): "
                         f"the graph was captured from another model")
    args: list = []
    it = iter(primals)
    for ph in phs:
        val = ph.meta.get("val")
        if ph.name.startswith(PRIMAL):
            what, t = next(it)
            if not isinstance(val, torch.Tensor):  # a constant argument of the call
                args.append(t)
                continue
            if (not isinstance(t, torch.Tensor) or tuple(t.shape) != tuple(val.shape)
                    or t.dtype != val.dtype):
                got = f"{tuple(t.shape)} {t.dtype}" if isinstance(t, torch.Tensor) else type(t).__name__
                raise ValueError(f"placeholder {ph.name} ({what}) was traced as {tuple(val.shape)} {val.dtype} "
                                 f"but is {got}: the graph was captured from another model or input shape")
            args.append(t.detach().to(dev))
        elif ph.name.startswith(TANGENT):
            if not isinstance(val, torch.Tensor):
                raise ValueError(f"placeholder {ph.name} has no traced tensor value")
            args.append(torch.empty_strided(tuple(val.shape), tuple(val.stride()), dtype=val.dtype,
                                            device=dev).normal_())
        else:
            raise ValueError(f"unexpected placeholder {ph.name} in the joint graph")
    return args


# ----------------------------------------------------------------------------------------------
# measuring
# ----------------------------------------------------------------------------------------------


def _tensor_leaves(x) -> list[torch.Tensor]:
    if isinstance(x, torch.Tensor):
        return [x]
    if isinstance(x, (list, tuple)):
        return [t for v in x for t in _tensor_leaves(v)]
    if isinstance(x, dict):
        return [t for v in x.values() for t in _tensor_leaves(v)]
    return []


def _new_storage_bytes(result, args, kwargs, cuda: bool) -> int:
    """Bytes of the storages ``result`` holds that none of the inputs held (the op's allocations)."""
    inputs = {t.untyped_storage().data_ptr() for t in _tensor_leaves((args, kwargs)) if t.layout == torch.strided}
    seen: set[int] = set()
    total = 0
    for t in _tensor_leaves(result):
        if t.layout != torch.strided:
            continue
        s = t.untyped_storage()
        ptr, nbytes = s.data_ptr(), s.nbytes()
        if ptr == 0 or nbytes == 0 or ptr in inputs or ptr in seen:
            continue
        seen.add(ptr)
        total += -(-nbytes // _CUDA_BLOCK) * _CUDA_BLOCK if cuda else nbytes
    return total


class _Timer:
    """Times calls of ``fn`` on one device (seconds)."""

    def __init__(self, device: torch.device):
        self.device = device
        self.cuda = device.type == "cuda"

    def sync(self):
        if self.cuda:
            torch.cuda.synchronize(self.device)

    def median(self, fn: Callable[[], Any], repeats: int) -> float:
        if self.cuda:
            self.sync()
            events = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True))
                      for _ in range(repeats)]
            for start, end in events:
                start.record()
                out = fn()
                end.record()
                del out
            self.sync()
            times = [start.elapsed_time(end) / 1e3 for start, end in events]
        else:
            times = []
            for _ in range(repeats):
                t0 = time.perf_counter()
                out = fn()
                t1 = time.perf_counter()
                del out
                times.append(t1 - t0)
        return float(statistics.median(times))


class ProfilingInterpreter(fx.Interpreter):
    """Runs the joint graph and measures each node that is a forward or backward `Node`'s op: its
    workspace, and (unless ``in_context``) its median time over ``repeats`` calls in a loop.  A
    node whose `monet.graph.op_signature` (operator, argument shapes, strides, dtypes and values)
    was measured already in this run takes those numbers (``reused`` counts them): the twelve
    layers of a 12-layer transformer are measured once."""

    def __init__(self, graph: OpGraph, device: torch.device, repeats: int, warmup: int, pbar, source: str,
                 only=None, in_context: bool = False):
        super().__init__(graph.joint, garbage_collect_values=True)
        self.main: dict[str, Node] = {n.name: n for n in list(graph.fwd) + list(graph.bwd)
                                      if only is None or (n.kind, n.id) in only}
        self.measured: dict[str, tuple[int, float]] = {}  # op signature -> (workspace, seconds)
        self.reused = 0
        self.device = device
        self.timer = _Timer(device)
        self.repeats = repeats
        self.warmup = warmup
        self.pbar = pbar
        self.source = source
        self.in_context = in_context
        self.rows: dict[tuple[str, int], dict] = {}
        self.signatures: dict[tuple[str, int], object] = {}  # (kind, id) -> op signature

    def run_node(self, n: fx.Node) -> Any:
        node = self.main.get(n.name)
        if node is None:
            return super().run_node(n)
        with self._set_current_node(n):
            args, kwargs = self.fetch_args_kwargs_from_env(n)
            if n.op != "call_function":
                raise ValueError(f"node {n.name} is a {n.op}, expected an ATen call_function")
            target = n.target

            def call():
                return target(*args, **kwargs)

            # The one run whose value flows on (a random op's sample is drawn here, once).
            result = call()
            self.timer.sync()
            key = op_signature(n)
            self.signatures[(node.kind, node.id)] = key
            if key in self.measured:  # the same kernel on the same shapes: measured once (a layer's twin)
                workspace, seconds = self.measured[key]
                self.reused += 1
            else:
                out_bytes = _new_storage_bytes(result, args, kwargs, self.timer.cuda)
                for _ in range(self.warmup):
                    call()
                self.timer.sync()
                peak = measure_peak(call, self.device)
                workspace = max(0, int(peak.delta_bytes) - out_bytes)
                seconds = float("nan") if self.in_context else self.timer.median(call, self.repeats)
                self.measured[key] = (workspace, seconds)
        self.rows[(node.kind, node.id)] = dict(
            kind=node.kind, node=node.id, op=node.op, impl=DEFAULT_IMPL, time_s=seconds,
            recompute_s=seconds, workspace_bytes=workspace, flops=0, bytes_moved=0, source=self.source)
        self.pbar.update(1)
        return result


def pooled_medians(times: dict, signatures: dict) -> dict:
    """The median seconds of each op signature (`monet.graph.op_signature`) over every call of every
    node that has it: ``times`` maps (kind, id) to that node's timed calls in an iteration's
    sequence (`ContextTimer`), ``signatures`` (kind, id) to its signature.  The nodes of one
    signature are the same kernel on the same shapes (a layer's twins, which `ProfilingInterpreter`
    measures once): pooled, a 12-layer transformer's operator is the median of 36 calls, not of 3.
    The recomputation of one 12-layer GPT-2 schedule read 13.4 to 16.3 % of the operators' sum in
    three costings in a row node by node, 11.2 to 13.6 % pooled: the machine's drift between
    costings, which pooling does not see, is most of what is left."""
    pooled: dict = {}
    for key, sig in signatures.items():
        pooled.setdefault(sig, []).extend(times[key])
    return {sig: float(statistics.median(samples)) for sig, samples in pooled.items()}


class ContextTimer(fx.Interpreter):
    """Runs the joint graph once and times each call of the nodes in ``main`` (fx name -> `Node`)
    once, in the sequence of an iteration, appending seconds to ``times[(kind, id)]``.

    A node timed in a loop of its own (`ProfilingInterpreter`) reuses one output buffer and warm
    inputs; in an iteration it writes to memory the allocator hands out after other operators ran.
    On the CPU the two differ most for element-wise operators: MobileNetV2 (batch 8, 96x96) summed
    its ReLU6 nodes to 8.1 ms in a loop and 3.6 ms in an iteration (torch.profiler), its additions
    to 6.2 ms and 0.4 ms (BENCHMARKS.md, "Predicted against measured overhead", has the predictions).
    """

    def __init__(self, graph: OpGraph, device: torch.device, main: dict, times: dict):
        super().__init__(graph.joint, garbage_collect_values=True)
        self.main = main
        self.timer = _Timer(device)
        self.times = times

    def run_node(self, n: fx.Node) -> Any:
        node = self.main.get(n.name)
        if node is None:
            return super().run_node(n)
        with self._set_current_node(n):
            args, kwargs = self.fetch_args_kwargs_from_env(n)
            self.timer.sync()
            t0 = time.perf_counter()
            result = n.target(*args, **kwargs)
            self.timer.sync()
            self.times.setdefault((node.kind, node.id), []).append(time.perf_counter() - t0)
        return result


def profile_costs(model: nn.Module, example_input: torch.Tensor, graph: OpGraph,
                  device: torch.device | str, repeats: int = 5, warmup: int = 2,
                  progress: bool = True, only=None, in_context: bool = False) -> pd.DataFrame:
    """Measure every forward and backward node of ``graph`` on ``device``.

    Args:
        model: the model ``graph`` was captured from (its parameters and buffers are read, moved
            to ``device`` when elsewhere; the model itself is not modified).
        example_input: the example inputs the graph was captured with (a tensor, a tuple of
            arguments, a dict of keyword arguments or an `ExampleInputs`), of its shapes and dtypes.
        graph: from `monet.capture.capture` (``graph.joint`` is executed).
        device: ``"cpu"`` or a CUDA device.
        repeats: timed runs per node (>= 1); the median is reported.
        warmup: discarded runs per node before measuring (>= 0).
        progress: show a tqdm progress bar.
        only: optional set of (kind, id) pairs: measure these nodes only (the others run once,
            unmeasured, and have no row).
        in_context: time each node in the sequence of an iteration (`ContextTimer`: ``warmup``
            discarded and ``repeats`` timed runs of the whole joint graph, one call of each node
            per run) instead of in a loop of its own.  Workspace is measured the same way either way.

    Returns:
        A cost table (see `monet.profiling.costs`), one row per node with ``impl == "default"``:
        ``time_s`` = ``recompute_s`` (seconds; the same kernel runs when recomputed),
        ``workspace_bytes`` >= 0 (bytes), ``flops`` and ``bytes_moved`` from the analytic model
        (`monet.profiling.costs.node_flops` / ``node_bytes_moved``), ``source`` =
        ``"profile:<device name>"``.  Forward nodes in id order, then backward nodes.

    Raises:
        ValueError: bad ``repeats`` / ``warmup`` / device, or a model that does not match the graph.
    """
    from tqdm.auto import tqdm

    if repeats < 1:
        raise ValueError(f"repeats must be >= 1, got {repeats}")
    if warmup < 0:
        raise ValueError(f"warmup must be >= 0, got {warmup}")
    dev = torch.device(device)
    if dev.type == "cuda" and dev.index is None:
        dev = torch.device("cuda", torch.cuda.current_device())
    source = f"profile:{device_name(dev)}"
    total = len(graph.fwd) + len(graph.bwd) if only is None else len(only)
    rng_devices = [dev.index] if dev.type == "cuda" else []
    on_device = torch.cuda.device(dev) if dev.type == "cuda" else contextlib.nullcontext()
    with on_device, torch.random.fork_rng(devices=rng_devices), torch.no_grad(), \
            tqdm(total=total, disable=not progress, desc=f"profiling on {dev}", unit="op") as pbar:
        torch.manual_seed(0)
        # what the executor runs (`monet.impls.lower_for_device`: cuDNN's BatchNorm on CUDA, fp32
        # dropout's backward on the CPU); the rows keep ``graph``'s node ids and op names
        from monet.impls import lower_for_device

        run = lower_for_device(graph)
        args = joint_inputs(model, example_input, run, dev)
        interp = ProfilingInterpreter(run, dev, repeats, warmup, pbar, source, only, in_context)
        interp.run(*args, enable_io_processing=False)
        if in_context:
            times: dict = {}
            pbar.set_description(f"timing {len(interp.main)} ops in sequence on {dev}")
            for i in range(warmup + repeats):
                ContextTimer(run, dev, interp.main, times if i >= warmup else {}).run(
                    *args, enable_io_processing=False)
            pooled = pooled_medians(times, interp.signatures)
            for key, row in interp.rows.items():
                row["time_s"] = row["recompute_s"] = pooled[interp.signatures[key]]
        del args
    by_name = {n.name: n for n in graph.joint.graph.nodes}
    rows = []
    for node in list(graph.fwd) + list(graph.bwd):
        row = interp.rows.get((node.kind, node.id))
        if row is None and only is not None:
            continue
        if row is None:  # every node of the graph is an op of the joint graph, so it ran
            raise RuntimeError(f"{node.kind} node {node.id} ({node.name}) was not executed by the joint graph")
        row["op"] = node.op  # a lowered node is costed as the op it stands for
        row["flops"] = node_flops(by_name[node.name])
        row["bytes_moved"] = node_bytes_moved(by_name[node.name])
        rows.append(row)
    return make_table(rows)


# ----------------------------------------------------------------------------------------------
# files and the cache
# ----------------------------------------------------------------------------------------------


def default_cache_dir() -> Path:
    """``~/.cache/monet/profiles`` (never relative to the working directory)."""
    return Path.home() / ".cache" / "monet" / "profiles"


def _sanitize(s: str) -> str:
    return re.sub(r"[^A-Za-z0-9._-]+", "-", s).strip("-.") or "unknown"


def cache_path(graph: OpGraph, device: torch.device | str, cache_dir: Path | None = None) -> Path:
    """Where the profile of ``graph`` on ``device`` is cached:
    ``<cache_dir>/<fingerprint[:16]>_<device name>_torch<version>.csv`` (names sanitised)."""
    directory = Path(cache_dir) if cache_dir is not None else default_cache_dir()
    name = f"{graph.fingerprint[:16]}_{_sanitize(device_name(device))}_torch{_sanitize(torch.__version__)}.csv"
    return directory / name


def save_costs(table: pd.DataFrame, path: str | os.PathLike) -> Path:
    """Write a cost table as CSV (pandas only), atomically (temporary file, then rename).

    Creates the parent directory.  Returns the path.

    Raises:
        ValueError: if the table is not a valid cost table (`validate_costs`).
    """
    path = Path(path)
    table = validate_costs(table, "cost table to save")
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=path.name + ".", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "w", newline="") as f:
            table.to_csv(f, index=False)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return path


def load_costs(path: str | os.PathLike) -> pd.DataFrame:
    """Read a cost table written by `save_costs` and validate it.

    Floats round-trip exactly (pandas 3 by default; ``float_precision="round_trip"`` before).

    Raises:
        FileNotFoundError: if the file does not exist.
        ValueError: if it is not a valid cost table; the message names the file and what is wrong.
    """
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"no cost table at {path}")
    try:
        table = pd.read_csv(path, **_READ_KW)
    except (pd.errors.ParserError, pd.errors.EmptyDataError, UnicodeDecodeError, ValueError) as e:
        raise ValueError(f"{path}: not a readable CSV cost table ({type(e).__name__}: {e})") from None
    return validate_costs(table, str(path))


def load_or_profile(model: nn.Module, example_input: torch.Tensor, graph: OpGraph,
                    device: torch.device | str, cache_dir: Path | None = None, **kw) -> pd.DataFrame:
    """The cached profile of ``graph`` on ``device``, measuring and caching it when absent.

    Args:
        model, example_input, graph, device: as for `profile_costs`.
        cache_dir: directory of the cache; `default_cache_dir` (``~/.cache/monet/profiles``) if None.
        **kw: passed to `profile_costs` (``repeats``, ``warmup``, ``progress``).

    Returns:
        The cost table (see `monet.profiling.costs`).

    Raises:
        ValueError: if the cached file is corrupt or does not describe ``graph`` (the message names
            the file; delete it to profile again), or as `profile_costs`.
    """
    path = cache_path(graph, device, cache_dir)
    if path.exists():
        table = load_costs(path)
        try:
            costs_for(graph, table, where=str(path))
        except ValueError as e:
            raise ValueError(f"{e}; delete {path} to profile again") from None
        return table
    table = profile_costs(model, example_input, graph, device, **kw)
    save_costs(table, path)
    return table
