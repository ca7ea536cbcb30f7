"""The solution file: an explicit schedule, its ILP matrices and what it was made for.

A solution binds a schedule to one joint graph (MONeT, Shah et al. ICLR 2021, Sec. 4): which forward
outputs the forward pass keeps, and for each backward stage which forward nodes are recomputed
before it and released after it.  The solver writes it, the simulator, the executor and the checks
read the same `Schedule` object.

On disk a solution is a header followed by a pickle (protocol 4)::

    b"MONET-SOLUTION\\n"  one format-version byte  pickle(Solution)

The pickle is read with a restricted unpickler that admits only this module's dataclasses and numpy
array reconstruction, never any other class or function: loading a file never runs code from it.
Anything else (a missing file, another kind of file, a newer format, a truncated or corrupt pickle, a
forbidden global) is a `SolutionFileError` that names the file and what is wrong.
"""
from __future__ import annotations

import dataclasses
import importlib
import io
import os
import pickle
import tempfile
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path

import numpy as np

from monet import mixed_precision
from monet.errors import AutocastMismatchError, SolutionFileError, SolutionMismatchError
from monet.steps import RECOMPUTE, Step, steps
from monet.zoo.index import is_reference, resolve

MAGIC = b"MONET-SOLUTION\n"
FORMAT_VERSION = 1
PICKLE_PROTOCOL = 4
STATUSES = ("optimal", "gap", "time_limit", "heuristic")
GiB = 2**30


def _ints(xs) -> tuple[int, ...]:
    return tuple(int(x) for x in xs)


def _opt_float(x) -> float | None:
    return None if x is None else float(x)


@dataclass
class Stage:
    """Backward stage t (MONeT Sec. 4).

    Recompute the forward nodes ``recompute`` (ids, in this order), run backward node ``backward``,
    then release the forward nodes in ``release`` (their outputs are no longer kept).
    """
    backward: int
    recompute: tuple[int, ...] = ()
    release: tuple[int, ...] = ()

    def __post_init__(self):
        self.backward = int(self.backward)
        self.recompute = _ints(self.recompute)
        self.release = _ints(self.release)


@dataclass
class Schedule:
    """The explicit schedule consumed by the simulator, the executor and the checks; what a solution
    file stores.  Its readers read it as typed steps (`steps`, `monet.steps`).

    Attributes:
        saved: forward node ids whose outputs are kept from the forward pass (stage 0).
        stages: one `Stage` per backward node, in execution order.
        impl: ``"fwd:<id>"`` / ``"bwd:<id>"`` -> implementation name (`monet.impls`); nodes not
            listed use PyTorch's own kernel.
        inplace: ReLU, hardtanh and add overwrite their input where it has no later user
            (`monet.inplace`): the same bits as out of place, never more memory, and no fresh
            allocation (which on the CPU costs the new pages' faults: the executor's tax,
            BENCHMARKS.md).  Every schedule the solvers make sets it, in every mode; files
            written before it was the default keep what they hold.
        offload: kept values moved to host memory (`solver.offload`, `monet.offload`), each
            ``(value, release, prefetch)``: the joint graph's FX name of the value, the forward
            node after which its device copy is freed, the backward stage at whose start it is
            copied back.  Empty without offload; files written before the field existed load
            with it empty (a class attribute).
    """
    saved: tuple[int, ...]
    stages: list[Stage]
    impl: dict[str, str] = field(default_factory=dict)
    inplace: bool = True
    offload: tuple = ()

    def __post_init__(self):
        self.saved = _ints(self.saved)
        self.stages = list(self.stages)
        self.impl = {(k if isinstance(k, str) else f"fwd:{int(k)}"): str(v) for k, v in self.impl.items()}
        self.inplace = bool(self.inplace)
        self.offload = tuple((str(v), int(r), int(p)) for v, r, p in self.offload)

    def steps(self, n_fwd: int | None = None) -> list[Step]:
        """The schedule as typed steps in execution order (`monet.steps.steps`): compute (the
        forward pass's ``n_fwd`` nodes; None: left out), offload, keep, prefetch, recompute,
        backward, free."""
        return steps(self, n_fwd)

    def recompute_count(self) -> int:
        """Number of forward-node recomputations over all backward stages (a node recomputed in two
        stages counts twice): the schedule's recompute steps."""
        return sum(s.kind == RECOMPUTE for s in self.steps())



@dataclass(frozen=True)
class RunInfo:
    """What a solver is told about the run it solves for, recorded in the `SolutionMeta` it makes:
    the model's name, the batch size, one sample's input shape (without the batch), the input
    dtype's name, the device type, the inputs spec (None: one tensor, or the factory's own inputs)
    and the loss traced with the model (`monet.with_loss.loss_name`).  None: taken from the graph."""
    model: str = ""
    batch_size: int | None = None
    input_shape: tuple | None = None
    dtype: str | None = None
    device: str = "cpu"
    inputs_spec: str | None = None
    loss: str | None = None

    @classmethod
    def of(cls, info: "RunInfo | dict | None") -> "RunInfo":
        """``info`` as a `RunInfo` (a dict's keys are its fields; None: every default).

        Raises:
            TypeError: a key that is no field."""
        if info is None:
            return cls()
        if isinstance(info, cls):
            return info
        unknown = sorted(set(info) - {f.name for f in dataclasses.fields(cls)})
        if unknown:
            raise TypeError(f"unknown run information {', '.join(map(repr, unknown))}: a RunInfo has "
                            f"{', '.join(f.name for f in dataclasses.fields(cls))}")
        return cls(**info)


@dataclass
class SolutionMeta:
    """What a solution was made for and how it was found.

    Attributes:
        model: model name or MODEL string ("" when unknown).
        batch_size: batch size the graph was traced with.
        input_shape: shape of one input sample, without the batch dimension, e.g. (3, 224, 224).
        dtype: parameter/activation dtype name, e.g. "float32" (no "torch." prefix).
        budget_bytes: memory budget in bytes.
        mode: the ILP mode (which implementation choices were allowed).
        device: device the costs are for, e.g. "cuda" or "cpu".
        cost_source: where the costs came from ("analytic", "profile", a profile path ...).
        predicted_peak_bytes: peak memory of the schedule by the simulator, in bytes.
        eager_peak_bytes: predicted peak of plain PyTorch (keep everything), in bytes.
        objective_s: objective value: predicted forward + recomputation + backward time, in seconds.
        bound_s: the solver's best lower bound on the objective, in seconds (None if unknown).
        gap: relative optimality gap, (objective - bound) / objective (None if unknown).
        solve_time_s: wall time of the solve, in seconds.
        status: one of `STATUSES`: "optimal", "gap" (proven within the gap asked for), "time_limit" or "heuristic".
        solver: solver name ("CBC", "HIGHS", "chen-sqrt" ...).
        torch_version, monet_version: versions the solution was made with.
        fingerprint: `OpGraph.fingerprint` of the joint graph.
        graph_summary: `OpGraph.summary`, one line per joint-graph node, so that a mismatch can say
            what differs.
        n_fwd, n_bwd: numbers of forward and backward nodes.
        created: creation time, ISO 8601 (defaults to now, UTC).
        eager_time_s: time of one plain-PyTorch iteration, in seconds (None if unknown): measured
            where the CPU costs measure it (`monet.profiling.costs.CostArrays.plain_time`), else the
            costs' sum; with it `describe` reports the predicted overhead.
        autocast: the autocast setting the graph was captured under: None (full precision) or
            ``(device_type, dtype)``, e.g. ``("cpu", "bfloat16")`` (`monet.mixed_precision`).  It
            is the last line of ``graph_summary`` (so part of the fingerprint) and is read from
            there when not given; a value that disagrees with the summary is an error.
        inputs_spec: the input spec the example inputs were made from (`monet.inputs.SPEC_FORMAT`,
            e.g. ``"input_ids=16:int64:50257,labels=16:int64:50257"``), so that ``monet check`` can
            rebuild them; None when the inputs were one float tensor of ``input_shape`` or came from
            the model's factory.  Files written before this field existed load with None.
        offload_bandwidth: bytes per second (each direction) the offload to host memory was
            planned for (`solver.offload`); None: no offload (and files written before it).
        loss: the loss function traced with the model (``monet.optimize(..., loss_fn=)``, the
            graph is then that of `monet.WithLoss`), by its importable name, e.g.
            ``"torch.nn.functional.cross_entropy"`` (`monet.with_loss.loss_name`); None: the model's
            own output (a transformers model given labels computes its loss inside), and files
            written before it.  `MONeTWrapper` rebuilds ``WithLoss`` from it.
        compiled: solved for the step compiled by Inductor (``monet.optimize(..., compile=True)``,
            `monet.compiled`): its costs are those of fused kernels and a recomputed random op
            reads its saved outputs; `MONeTWrapper` compiles it.  False for files written before it.
        measured_peak_bytes: the compiled step's peak, bytes, measured at the allocator where it
            was solved (`monet.held.hold_budget`), at or under ``budget_bytes``; None where it was
            not measured (the eager step, whose simulation is its measured peak).
        compile_pinned: the compiled step's backward is pinned to the schedule's stages that
            recompute (`monet.compiled.compilers`' ``pinned``), as its measurement asked
            (`monet.held.hold_budget`); `MONeTWrapper` compiles it so.  False for files written
            before it.
    """
    model: str
    batch_size: int
    input_shape: tuple[int, ...]
    dtype: str
    budget_bytes: int
    mode: str
    device: str
    cost_source: str
    predicted_peak_bytes: int
    eager_peak_bytes: int
    objective_s: float
    bound_s: float | None
    gap: float | None
    solve_time_s: float
    status: str
    solver: str
    torch_version: str
    monet_version: str
    fingerprint: str
    graph_summary: list[str]
    n_fwd: int
    n_bwd: int
    created: str = field(default_factory=lambda: datetime.now(timezone.utc).isoformat(timespec="seconds"))
    eager_time_s: float | None = None
    autocast: tuple[str, str] | None = None
    inputs_spec: str | None = None  # a class attribute too: old pickles without the field read None
    offload_bandwidth: float | None = None  # likewise
    loss: str | None = None  # likewise
    compiled: bool = False  # likewise
    measured_peak_bytes: int | None = None  # likewise
    compile_pinned: bool = False  # likewise

    def __post_init__(self):
        # Plain Python types only: a numpy scalar from the solver would otherwise end up in the pickle.
        self.model = str(self.model or "")
        self.batch_size = int(self.batch_size)
        self.input_shape = _ints(self.input_shape)
        self.dtype = _dtype_name(self.dtype)
        for name in ("budget_bytes", "predicted_peak_bytes", "eager_peak_bytes", "n_fwd", "n_bwd"):
            setattr(self, name, int(getattr(self, name)))
        for name in ("objective_s", "solve_time_s"):
            setattr(self, name, float(getattr(self, name)))
        for name in ("bound_s", "gap", "eager_time_s", "offload_bandwidth"):
            setattr(self, name, _opt_float(getattr(self, name)))
        if self.measured_peak_bytes is not None:
            self.measured_peak_bytes = int(self.measured_peak_bytes)
        self.compile_pinned = bool(self.compile_pinned)
        for name in ("mode", "device", "cost_source", "status", "solver", "torch_version",
                     "monet_version", "fingerprint", "created"):
            setattr(self, name, str(getattr(self, name)))
        self.graph_summary = [str(line) for line in self.graph_summary]
        self.inputs_spec = None if self.inputs_spec is None else str(self.inputs_spec)
        self.loss = None if self.loss is None else str(self.loss)
        self.compiled = bool(self.compiled)
        recorded = mixed_precision.from_summary(self.graph_summary)
        if self.autocast is not None and mixed_precision.normalize(self.autocast) != recorded:
            raise ValueError(f"autocast {self.autocast!r} disagrees with the graph, which was captured with "
                             f"{mixed_precision.describe(recorded)}")
        self.autocast = recorded
        if self.status not in STATUSES:
            raise ValueError(f"status must be one of {STATUSES}, got {self.status!r}")

    def predicted_overhead(self) -> float | None:
        """The schedule's predicted iteration time over plain PyTorch's, minus 1 (0.1 = +10 %):
        objective_s / eager_time_s - 1 (the objective a sum of the cost table's seconds, the plain
        iteration measured on the CPU, `eager_time_s`); None without an ``eager_time_s``.  On the CPU, with measured costs, BENCHMARKS.md "Predicted against
        measured overhead" holds it against the measured overhead."""
        if not self.eager_time_s:
            return None
        return self.objective_s / self.eager_time_s - 1.0


@dataclass(eq=False)
class Solution:
    """A schedule with the ILP's matrices and its metadata.

    Attributes:
        schedule: the explicit schedule.
        S: (T, N) bool or uint8; S[t, i] = the output of forward node i is kept at the start of
            backward stage t.
        R: (T, N) bool; R[t, i] = forward node i is recomputed in stage t.
        meta: what the solution was made for (`SolutionMeta`).
    """
    schedule: Schedule
    S: np.ndarray
    R: np.ndarray
    meta: SolutionMeta

    def __post_init__(self):
        self.S = np.asarray(self.S)
        self.R = np.asarray(self.R)

    def __eq__(self, other):
        if not isinstance(other, Solution):
            return NotImplemented
        return (self.schedule == other.schedule and self.meta == other.meta
                and self.S.dtype == other.S.dtype and self.R.dtype == other.R.dtype
                and np.array_equal(self.S, other.S) and np.array_equal(self.R, other.R))

    def save(self, path) -> None:
        """Write the solution file (`save_solution`), e.g. to load it later with
        ``MONeTWrapper(model, path)``."""
        save_solution(self, path)


def _dtype_name(dtype) -> str:
    """"torch.float32" or torch.float32 -> "float32"."""
    return str(dtype).removeprefix("torch.")


def _check_solution(sol, where: str) -> None:
    """Raise SolutionFileError if `sol` is not a well-formed Solution (types and array shapes)."""
    def bad(what):
        raise SolutionFileError(f"{where}: {what}")

    if not isinstance(sol, Solution):
        bad(f"does not hold a monet Solution (found {type(sol).__name__}): re-run monet solve")
    if not isinstance(sol.schedule, Schedule) or not isinstance(sol.meta, SolutionMeta):
        bad("the solution's schedule or metadata has the wrong type: the file is corrupt")
    if not all(isinstance(s, Stage) for s in sol.schedule.stages):
        bad("a schedule stage has the wrong type: the file is corrupt")
    for name in ("S", "R"):
        a = getattr(sol, name)
        if not isinstance(a, np.ndarray) or a.ndim != 2 or a.dtype.kind not in "biu":
            bad(f"{name} must be a 2-d bool/integer array, got "
                f"{getattr(a, 'dtype', type(a).__name__)} {getattr(a, 'shape', '')}")
    if sol.S.shape != sol.R.shape:
        bad(f"S has shape {sol.S.shape} but R has shape {sol.R.shape}")
    if sol.S.shape[1] != sol.meta.n_fwd:
        bad(f"S and R have {sol.S.shape[1]} columns but the graph has {sol.meta.n_fwd} forward nodes")
    if getattr(sol.meta, "autocast", None) != mixed_precision.from_summary(sol.meta.graph_summary):
        bad(f"the recorded autocast setting {sol.meta.autocast!r} disagrees with the graph's: the file is corrupt")


def save_solution(sol: Solution, path) -> None:
    """Write `sol` to `path`: magic, format version, pickle (protocol 4).

    The file is written to a temporary file in the same folder and moved into place with
    `os.replace`, so `path` is either the old file or the complete new one, never half written.
    """
    path = Path(path)
    _check_solution(sol, f"cannot save to {path}")
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(MAGIC + bytes([FORMAT_VERSION]))
            pickle.dump(sol, f, protocol=PICKLE_PROTOCOL)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        raise


def _numpy_multiarray():
    try:
        return importlib.import_module("numpy._core.multiarray")  # numpy >= 2
    except ImportError:  # pragma: no cover - numpy 1.x
        return importlib.import_module("numpy.core.multiarray")


def _allowed_globals() -> dict[tuple[str, str], object]:
    """(module, name) -> object: every global a solution pickle may reference.

    numpy 2 pickles an array as numpy._core.multiarray._reconstruct + numpy.ndarray + numpy.dtype
    and a numpy scalar as numpy._core.multiarray.scalar + numpy.dtype; numpy 1.x wrote
    numpy.core.multiarray instead.  Tuples, lists, dicts and sets have their own pickle opcodes, so
    no builtin is needed (tests/test_solution_file.py checks this on a real solution).
    """
    multiarray = _numpy_multiarray()
    allowed: dict[tuple[str, str], object] = {
        (__name__, cls.__name__): cls for cls in (Solution, SolutionMeta, Schedule, Stage)
    }
    allowed[("numpy", "ndarray")] = np.ndarray
    allowed[("numpy", "dtype")] = np.dtype
    for module in ("numpy._core.multiarray", "numpy.core.multiarray"):
        allowed[(module, "_reconstruct")] = multiarray._reconstruct
        allowed[(module, "scalar")] = multiarray.scalar
    return allowed


_ALLOWED_GLOBALS = _allowed_globals()


class _ForbiddenGlobal(pickle.UnpicklingError):
    def __init__(self, module: str, name: str):
        super().__init__(f"{module}.{name}")
        self.qualified = f"{module}.{name}"


class _RestrictedUnpickler(pickle.Unpickler):
    """Resolves only the globals of `_allowed_globals`; anything else is refused before import."""

    def find_class(self, module, name):
        try:
            return _ALLOWED_GLOBALS[(module, name)]
        except (KeyError, TypeError):
            raise _ForbiddenGlobal(str(module), str(name)) from None

    def persistent_load(self, pid):
        raise pickle.UnpicklingError("persistent ids are not allowed")


def load_solution(path) -> Solution:
    """Read a solution written by `save_solution`, without running any code from the file.

    ``path`` may also be ``"zoo:NAME"``: the zoo's prebuilt solution NAME (`monet.zoo.index`), read
    the same way.  This is the one place such references are resolved, so every caller that takes a
    solution file (MONeTWrapper, ``monet check``) takes them too.

    Raises:
        monet.zoo.index.ZooEntryError: (a SolutionFileError) no zoo entry NAME; the message lists them.
        SolutionFileError: the file is missing or unreadable, is not a monet solution file, has an
            unsupported format version, is truncated or corrupt, or references a class or function
            that is not a monet type or a numpy array; the message names the file and the reason.
    """
    if is_reference(path):
        path = resolve(path)
    path = Path(path)
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        raise SolutionFileError(f"{path}: no such solution file") from None
    except OSError as e:
        raise SolutionFileError(f"{path}: cannot read the solution file: {e.strerror or e}") from None

    header = len(MAGIC) + 1
    if not data:
        raise SolutionFileError(f"{path}: not a monet solution file (the file is empty)")
    if len(data) < header and MAGIC.startswith(data[:len(MAGIC)]):
        raise SolutionFileError(f"{path}: file is truncated or corrupt: re-run monet solve")
    if not data.startswith(MAGIC):
        raise SolutionFileError(f"{path}: not a monet solution file (it does not start with {MAGIC!r})")
    version = data[len(MAGIC)]
    if version != FORMAT_VERSION:
        newer = " (made by a newer monet: upgrade monet)" if version > FORMAT_VERSION else ""
        raise SolutionFileError(f"{path}: unsupported solution format version {version}; this monet "
                                f"reads version {FORMAT_VERSION}{newer}; or re-run monet solve")
    try:
        sol = _RestrictedUnpickler(io.BytesIO(data[header:])).load()
    except _ForbiddenGlobal as e:
        raise SolutionFileError(f"{path}: refusing to load: the file references {e.qualified}, "
                                f"which is not a monet type") from None
    except Exception as e:  # pickle raises many types on bad input: EOFError, KeyError, struct.error ...
        raise SolutionFileError(f"{path}: file is truncated or corrupt: re-run monet solve "
                                f"({type(e).__name__}: {e})") from None
    _check_solution(sol, str(path))
    return sol


def _clip(line: str, width: int = 240) -> str:
    return line if len(line) <= width else line[:width - 3] + "..."


def check_compatible(meta: SolutionMeta, fingerprint: str, summary: list[str], *, model: str | None = None,
                     batch_size: int, input_shape: tuple, dtype: str, nodes: tuple[int, int] | None = None) -> None:
    """Raise SolutionMismatchError unless the solution described by `meta` was made for this graph.

    Args:
        meta: the solution's metadata.
        fingerprint, summary: `OpGraph.fingerprint` and `OpGraph.summary` of the graph to run.
        model: this model's name, or None if unknown (then the name is not compared).
        batch_size: batch size of the call.
        input_shape: shape of one input sample, without the batch dimension.
        dtype: dtype of the call ("float32" or torch.float32).
        nodes: (forward, backward) node counts of the `OpGraph` the schedule will run on; with the
            same fingerprint they differ only when the solution's monet grouped the joint graph's
            ops into nodes differently (node ids in its schedule would then name other ops).

    The message lists every difference in model, batch size, input shape and dtype; when those all
    agree but the fingerprint differs, it gives the first differing joint-graph node (index and both
    summary lines) and the node counts.
    """
    from monet.graph import fingerprint as fingerprint_of, portable_summary

    diffs = []
    if model and meta.model and model != meta.model:
        diffs.append(f"model differs (made for {meta.model}, called with {model})")
    if int(batch_size) != meta.batch_size:
        diffs.append(f"batch size differs (made for {meta.batch_size}, called with {int(batch_size)})")
    shape = _ints(input_shape)
    if shape != meta.input_shape:
        hint = (" - input_shape excludes the batch dimension"
                if shape == (meta.batch_size, *meta.input_shape) else "")
        diffs.append(f"input shape differs (made for {meta.input_shape}, called with {shape}{hint})")
    if _dtype_name(dtype) != meta.dtype:
        diffs.append(f"dtype differs (made for {meta.dtype}, called with {_dtype_name(dtype)})")
    theirs = mixed_precision.from_summary(summary)
    if theirs != getattr(meta, "autocast", None):  # a graph traced under another autocast setting
        diffs.append(f"autocast differs (made for {mixed_precision.describe(meta.autocast)}, "
                     f"this graph was traced with {mixed_precision.describe(theirs)})")
    if diffs:
        raise SolutionMismatchError("the solution was made for another graph: " + "; ".join(diffs))
    # the same graph captured on another admitted torch release: equal portable summaries, and the
    # solution's fingerprint is its own summary's (a file whose fingerprint is not is refused below)
    other_release = (meta.fingerprint == fingerprint_of(list(meta.graph_summary))
                     and portable_summary(meta.graph_summary) == portable_summary(summary))
    if fingerprint == meta.fingerprint or other_release:
        if nodes is not None and tuple(nodes) != (meta.n_fwd, meta.n_bwd):
            raise SolutionMismatchError(
                f"the solution's schedule is for {meta.n_fwd} forward and {meta.n_bwd} backward nodes, this "
                f"monet makes {nodes[0]} and {nodes[1]} of the same graph (the solution was made with monet "
                f"{meta.monet_version}, which grouped its ops differently): re-solve it")
        return

    ours, theirs = portable_summary(meta.graph_summary), portable_summary(summary)
    counts = (f"the solution's joint graph has {len(ours)} nodes ({meta.n_fwd} forward, "
              f"{meta.n_bwd} backward nodes), this model's has {len(theirs)}")
    # The first differing line.  Summary lines name their arguments by node index, so after an inserted
    # or removed node every later line differs too: the first difference is the one worth reading.
    first = next((i for i, (a, b) in enumerate(zip(ours, theirs)) if a != b), min(len(ours), len(theirs)))
    if first < len(ours) or first < len(theirs):
        has = _clip(ours[first]) if first < len(ours) else "(no such node)"
        other = _clip(theirs[first]) if first < len(theirs) else "(no such node)"
        detail = f"first difference at node {first}: solution has `{has}`, this model has `{other}`"
    else:
        detail = (f"the graph summaries agree but the fingerprints do not ({meta.fingerprint[:12]} vs "
                  f"{fingerprint[:12]}): the solution was made with monet {meta.monet_version}, "
                  f"torch {meta.torch_version}")
    raise SolutionMismatchError(f"the solution was made for another graph (fingerprint differs): "
                                f"{detail}; {counts}")


def describe(sol: Solution) -> str:
    """A human summary: model, batch, budget and predicted peak in GiB, overhead, solver status."""
    m = sol.meta
    model = m.model or "(unnamed model)"
    amp = f" under {mixed_precision.describe(m.autocast)}" if getattr(m, "autocast", None) else ""
    inputs = f", inputs {m.inputs_spec}" if m.inputs_spec else ""
    lines = [f"monet solution for {model}, batch {m.batch_size}, input {m.input_shape}, {m.dtype}{inputs}{amp}"]
    lines.append(f"budget {m.budget_bytes / GiB:.2f} GiB ({m.budget_bytes} bytes), mode {m.mode}, "
                 f"device {m.device}, costs from {m.cost_source}")
    peak = f"predicted peak {m.predicted_peak_bytes / GiB:.2f} GiB"
    if m.eager_peak_bytes > 0:
        peak += (f", PyTorch (keep everything) {m.eager_peak_bytes / GiB:.2f} GiB "
                 f"({m.predicted_peak_bytes / m.eager_peak_bytes:.2f}x)")
    lines.append(peak)
    time = f"predicted iteration time {m.objective_s * 1e3:.2f} ms"
    if m.eager_time_s:
        time += f", overhead {100 * m.predicted_overhead():+.2f} % over PyTorch"
    else:
        time += ", overhead unknown (no eager time recorded)"
    lines.append(time)
    sched = sol.schedule
    lines.append(f"keeps {len(sched.saved)} of {m.n_fwd} forward outputs, {sched.recompute_count()} "
                 f"recomputations over {len(sched.stages)} backward stages")
    if sched.offload:
        lines.append(f"offloads {len(sched.offload)} kept values to host memory, planned at "
                     f"{(m.offload_bandwidth or 0) / 1e9:.1f} GB/s")
    gap = "unknown" if m.gap is None else f"{100 * m.gap:.2f} %"
    bound = "" if m.bound_s is None else f", bound {m.bound_s * 1e3:.2f} ms"
    lines.append(f"solver {m.solver}: {m.status}, gap {gap}{bound}, solved in {m.solve_time_s:.1f} s")
    lines.append(f"graph {m.n_fwd} forward / {m.n_bwd} backward nodes, fingerprint {m.fingerprint[:12]}; "
                 f"created {m.created} with monet {m.monet_version}, torch {m.torch_version}")
    return "\n".join(lines)


__all__ = ["MAGIC", "FORMAT_VERSION", "STATUSES", "Stage", "Schedule", "RunInfo", "SolutionMeta", "Solution",
           "SolutionFileError", "SolutionMismatchError", "AutocastMismatchError", "save_solution", "load_solution",
           "check_compatible", "describe"]
