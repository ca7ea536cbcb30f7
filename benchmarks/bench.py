"""Benchmarks: MONeT's schedules against plain PyTorch and the peers, measured on CPU in one process.

    python benchmarks/bench.py [--models resnet50,vgg16,...] [--batch-size N] [--image-size S]
                                    [--seq-len L] [--time-limit SECONDS] [--repeats R]
                                    [--modes normal,inplace_conv_multiway_newnode] [--out FILE]

For each zoo model, at a CPU-sized configuration (`CONFIGS`; ``--batch-size``, ``--image-size`` and
``--seq-len`` override it for every model), in this order:

1. **Costs**: capture the joint graph; analytic times (`analytic_costs`) with the
   ``workspace_bytes`` column replaced by a quick CPU profile's (`profile_costs`, one run per op, no
   warm-up: workspaces are deterministic -- oneDNN's reorder buffers are real temporaries).
2. **Plain PyTorch**: simulated peak (the keep-everything schedule), measured peak
   (`measure_iteration_peak`: allocator level, after one warm-up iteration) and median iteration
   time.
3. **MONeT, in each mode of ``--modes``** (default ``normal`` and the full mode
   ``inplace_conv_multiway_newnode``, rows "MONeT full"), at 80 %, 60 % and 50 % of the simulated
   plain peak and at the mode's smallest feasible budget (`min_budget`): predicted peak, measured
   peak, whether measured <= budget, predicted-vs-measured error, overhead (`overhead`: interleaved
   medians against plain PyTorch), solve time, solver status and gap, and for the full mode how
   many operators run another implementation.  The implementations' costs come from
   `hybrid_cost_fn` (their operators measured once).  An infeasible budget is a table row, not a
   crash.
4. **Peers**: Chen's sqrt(n) checkpointing and ``torch.compile`` with
   ``activation_memory_budget`` 1.0, 0.5, 0.1 and 0.0 (`monet.profiling.baselines`): measured peak and
   overhead.  A failure is reported in its row.

Memory is reported in MiB (2^20 bytes), overhead as (median time / median plain time - 1).  Under
each table, `observations` lists what departs from the design's promises (a measured peak above its
budget, predicted vs measured beyond 2 %, contradictory infeasibility reports, a peer below MONeT's
lowest peak).  The markdown file is rewritten after every model, so an interrupted run keeps what it
measured.  Progress goes to stderr.
"""
from __future__ import annotations

import argparse
import datetime as _dt
import gc
import os
import platform
import shlex
import statistics
import sys
import time
import traceback
from dataclasses import dataclass, field
from pathlib import Path

# Spinning OpenMP threads slow down up to tenfold, and erratically, when other processes share the
# cores (measured on the shared 2-core machines): wait passively.  libgomp reads this when torch
# loads it, so it only takes effect when this module is imported before torch.
_OMP_PASSIVE_SET_HERE = "torch" not in sys.modules and "OMP_WAIT_POLICY" not in os.environ
if _OMP_PASSIVE_SET_HERE:
    os.environ["OMP_WAIT_POLICY"] = "PASSIVE"

import torch  # noqa: E402

from monet.profiling.markdown import md_table  # noqa: E402

MiB = 2 ** 20
PERCENTS = (80, 60, 50)
COMPILE_BUDGETS = (1.0, 0.5, 0.1, 0.0)


@dataclass(frozen=True)
class BenchConfig:
    """One model's benchmark configuration: factory kwargs, batch size and per-sample input shape."""

    kwargs: dict
    batch_size: int
    input_shape: tuple[int, ...]
    why: str = ""


#: Default CPU-sized configurations (2 cores, the whole run in about a quarter of an hour).
CONFIGS: dict[str, BenchConfig] = {
    "resnet50": BenchConfig({"base_width": 16}, 8, (3, 96, 96),
                            "quarter width (base_width 16): activations, not weights, dominate"),
    "vgg16": BenchConfig({"width": 8, "hidden": 128}, 16, (3, 128, 128),
                         "1/8-width convolutions, 128-wide classifier: activations dominate"),
    "mobilenet_v2": BenchConfig({}, 8, (3, 96, 96), "full width"),
    "googlenet": BenchConfig({"num_classes": 100}, 8, (3, 96, 96), "full width, 100 classes"),
    "unet": BenchConfig({"base_channels": 16}, 2, (3, 128, 128),
                        "quarter width (16 base channels): activations dominate"),
    "gpt2-small": BenchConfig({"n_embd": 128, "n_head": 4, "vocab_size": 4096, "n_positions": 256}, 2, (128,),
                              "12 layers at width 128, 4096-token vocabulary, 128 tokens: GPT-2 small "
                              "itself needs ~190 GFLOP per step, minutes here"),
}


# ----------------------------------------------------------------------------------------------
# progress
# ----------------------------------------------------------------------------------------------


class Log:
    """Timestamped progress lines on stderr."""

    def __init__(self):
        self.t0 = time.perf_counter()

    def __call__(self, msg: str) -> None:
        print(f"[bench {time.perf_counter() - self.t0:7.1f} s] {msg}", file=sys.stderr, flush=True)


# ----------------------------------------------------------------------------------------------
# rows
# ----------------------------------------------------------------------------------------------


@dataclass
class Row:
    """One table row; bytes and seconds, None where not applicable or not measured."""

    method: str
    budget: int | None = None
    predicted: int | None = None
    measured: int | None = None
    overhead: float | None = None
    median_s: float | None = None
    solve_s: float | None = None
    first_call_s: float | None = None
    status: str = ""
    gap: float | None = None
    note: str = ""

    @property
    def fits(self) -> bool | None:
        if self.budget is None or self.measured is None:
            return None
        return self.measured <= self.budget

    @property
    def pred_error(self) -> float | None:
        if self.predicted is None or self.measured is None or not self.predicted:
            return None
        return self.measured / self.predicted - 1.0


@dataclass
class ModelResult:
    name: str
    config: BenchConfig
    n_params: int = 0
    n_fwd: int = 0
    n_bwd: int = 0
    eager_sim: int | None = None
    largest_workspace: str = ""
    plain_measured: int | None = None
    plain_time: float | None = None
    rows: list[Row] = field(default_factory=list)
    repeats: int = 0
    plain_medians: list[float] = field(default_factory=list)
    seconds: float = 0.0
    error: str = ""


def error_text(e: BaseException, width: int = 160) -> str:
    text = " ".join(f"{type(e).__name__}: {e}".split())
    return text if len(text) <= width else text[: width - 3] + "..."


# ----------------------------------------------------------------------------------------------
# measuring one model
# ----------------------------------------------------------------------------------------------


def _release():
    gc.collect()


def one_iteration_s(model, x, g, autocast=None) -> float:
    """Seconds of one training iteration (no synchronisation: CPU)."""
    from monet.profiling.measure import run_iteration
    t0 = time.perf_counter()
    run_iteration(model, x, g, autocast)
    return time.perf_counter() - t0


def timed_repeats(iteration_s: float, minimum: int, target_s: float = 2.0, cap: int = 11) -> int:
    """Timed iterations per side: at least ``minimum``, more for short iterations (about
    ``target_s`` seconds per side), at most ``cap``; odd, so the median is one measurement."""
    n = max(minimum, min(cap, int(target_s / max(iteration_s, 1e-6)) + 1))
    return n if n % 2 else n + 1


def _measure(res: ModelResult, row: Row, model, candidate, x, g, warmup: int, log) -> None:
    """Measured peak and interleaved overhead of ``candidate`` against ``model`` into ``row``."""
    from monet.profiling.measure import measure_iteration_peak, overhead

    t0 = time.perf_counter()
    row.measured = measure_iteration_peak(candidate, x, g)  # its warm-up iteration traces / compiles
    row.first_call_s = time.perf_counter() - t0
    row.overhead, row.median_s, plain_s = overhead(model, candidate, x, g, repeats=res.repeats, warmup=warmup)
    res.plain_medians.append(plain_s)
    log(f"  {row.method}: measured {row.measured / MiB:.1f} MiB, overhead {row.overhead * 100:+.1f} % "
        f"(median {row.median_s:.3f} s vs plain {plain_s:.3f} s; peak measurement incl. first call "
        f"{row.first_call_s:.1f} s)")


def bench_model(res: ModelResult, args, log: Log, save=lambda: None) -> ModelResult:
    """Measure one model into ``res``; rows are appended as they are measured and ``save()`` is
    called after each, so a failure or a kill part-way keeps what was measured before it."""
    from monet.capture import capture
    from monet.profiling.measure import measure_iteration_peak, output_grad
    from monet.profiling.costs import analytic_costs, costs_for
    from monet.profiling.sources import with_measured_workspace
    from monet.profiling.baselines import chen_sqrt_checkpoint, compile_with_activation_budget
    from monet.solver.ilp import InfeasibleBudgetError
    from monet.solver.solve import eager_peak, min_budget, parse_budget, solve
    from monet.wrapper import MONeTWrapper
    from monet.zoo.models import MODELS, example_input, get_model

    name, cfg = res.name, res.config
    t_model = time.perf_counter()
    torch.manual_seed(0)
    model = get_model(name, **cfg.kwargs)
    model.train()
    res.n_params = sum(p.numel() for p in model.parameters())
    spec = MODELS[name]
    vocab = getattr(model, "vocab_size", None) if spec.input_kind == "tokens" else None
    x = example_input(name, cfg.batch_size, cfg.input_shape, vocab_size=vocab)
    g = output_grad(model, x)
    info = dict(model=name, batch_size=cfg.batch_size, input_shape=cfg.input_shape,
                dtype=str(x.dtype).removeprefix("torch."), device="cpu")

    log(f"{name}: batch {cfg.batch_size}, input {cfg.input_shape}, {res.n_params / 1e6:.1f} M parameters; capturing")
    graph = capture(model, x)
    res.n_fwd, res.n_bwd = len(graph.fwd), len(graph.bwd)
    log(f"  graph: {res.n_fwd} forward, {res.n_bwd} backward nodes; profiling workspaces")
    table = with_measured_workspace(analytic_costs(graph), model, x, graph, "cpu")
    costs = costs_for(graph, table)
    log(f"  workspace: {int((table['workspace_bytes'] > 0).sum())} of {len(table)} nodes have temporaries, "
        f"largest {table['workspace_bytes'].max() / MiB:.1f} MiB")
    top = table.loc[table["workspace_bytes"].idxmax()]
    res.largest_workspace = (f"{top['workspace_bytes'] / MiB:.1f} MiB ({top['kind']} node {top['node']}, "
                             f"{str(top['op']).removeprefix('aten.')})")
    res.eager_sim = eager_peak(graph, costs)

    log("  plain PyTorch")
    res.plain_measured = measure_iteration_peak(model, x, g)
    one = min(one_iteration_s(model, x, g) for _ in range(2))
    res.repeats = timed_repeats(one, args.repeats)
    plain_row = Row("PyTorch", predicted=res.eager_sim, measured=res.plain_measured, overhead=0.0)
    res.rows.append(plain_row)
    log(f"  plain: simulated {res.eager_sim / MiB:.1f} MiB, measured {res.plain_measured / MiB:.1f} MiB, "
        f"one iteration {one:.3f} s: {res.repeats} timed repeats per side")

    # MONeT, in each mode
    from monet.profiling.variant_costs import hybrid_cost_fn

    cost_fn = hybrid_cost_fn(model, x, graph, table)
    targets: list[tuple[str, str, int | None]] = []
    for mode in args.modes:
        targets += [(mode, f"{p} %", parse_budget(f"{p}%", res.eager_sim)) for p in PERCENTS]
        targets.append((mode, "min budget", None))
    for mode, label, budget in targets:
        mode_label = "full" if mode == "inplace_conv_multiway_newnode" else mode
        row = Row(f"MONeT {mode_label}, {label}", budget=budget)
        res.rows.append(row)
        t0 = time.perf_counter()
        try:
            if budget is None:
                log(f"  MONeT: smallest feasible budget (time limit {args.time_limit:.0f} s)")
                budget, proven = min_budget(graph, costs, mode, time_limit=args.time_limit, cost_fn=cost_fn)
                row.budget = budget
                row.note = "min budget proven" if proven else "min budget not proven (time limit)"
                log(f"  min budget {budget / MiB:.1f} MiB ({row.note}) in {time.perf_counter() - t0:.1f} s")
            log(f"  MONeT at {label}: solving for {budget / MiB:.1f} MiB")
            sol = solve(graph, costs, budget, mode, time_limit=args.time_limit, info=info, cost_fn=cost_fn)
        except InfeasibleBudgetError as e:
            row.solve_s = time.perf_counter() - t0
            row.status = "infeasible"
            if e.min_budget_bytes is not None:
                row.note = f"smallest feasible {e.min_budget_bytes / MiB:.1f} MiB"
            log(f"  {label}: infeasible ({row.note})")
            save()
            continue
        except Exception as e:  # noqa: BLE001 - reported in the table
            row.solve_s = time.perf_counter() - t0
            row.status = "error"
            row.note = error_text(e)
            log(f"  {label}: solve failed: {row.note}")
            traceback.print_exc(file=sys.stderr)
            save()
            continue
        row.solve_s = time.perf_counter() - t0
        m = sol.meta
        row.predicted, row.status, row.gap = m.predicted_peak_bytes, m.status, m.gap
        rc = getattr(sol.schedule, "recompute_count", None)
        rc = rc() if callable(rc) else rc
        if rc is not None:
            row.note = "; ".join(s for s in (row.note, f"{rc} recomputations") if s)
        if sol.schedule.impl:
            from collections import Counter
            kinds = Counter(v.split(".")[0] for v in sol.schedule.impl.values())
            row.note = "; ".join([row.note] + [", ".join(f"{n} {k}" for k, n in sorted(kinds.items()))])
        log(f"  solved in {row.solve_s:.1f} s: {m.status}, predicted {m.predicted_peak_bytes / MiB:.1f} MiB, "
            f"gap {m.gap if m.gap is not None else float('nan'):.3%}")
        try:
            wrapped = MONeTWrapper(model, sol, cfg.input_shape)
            _measure(res, row, model, wrapped, x, g, args.warmup, log)
        except Exception as e:  # noqa: BLE001
            row.note = "; ".join(s for s in (row.note, "run failed: " + error_text(e)) if s)
            log(f"  {label}: run failed: {error_text(e)}")
            traceback.print_exc(file=sys.stderr)
        wrapped = sol = None
        _release()
        save()

    # peers
    peers = [("Chen sqrt(n) checkpoint", lambda: chen_sqrt_checkpoint(model))]
    peers += [(f"torch.compile budget {b:g}", (lambda b=b: compile_with_activation_budget(model, b)))
              for b in args.compile_budgets]
    for label, make in peers:
        row = Row(label)
        res.rows.append(row)
        log(f"  {label}")
        try:
            peer = make()
            if hasattr(peer, "segments"):
                row.note = peer.extra_repr()
            _measure(res, row, model, peer, x, g, args.warmup, log)
            row.status = "ok"
            if "compile" in label:
                row.note = f"first (compiling) call + peak measurement {row.first_call_s:.0f} s"
        except Exception as e:  # noqa: BLE001 - reported in the table
            row.status = "error"
            row.note = error_text(e)
            log(f"  {label} failed: {row.note}")
            traceback.print_exc(file=sys.stderr)
        peer = None
        _release()
        save()
    torch.compiler.reset()
    if res.plain_medians:
        res.plain_time = plain_row.median_s = statistics.median(res.plain_medians)
    res.seconds = time.perf_counter() - t_model
    log(f"{name} done in {res.seconds:.0f} s")
    return res


# ----------------------------------------------------------------------------------------------
# markdown
# ----------------------------------------------------------------------------------------------


def _mib(b) -> str:
    return "" if b is None else f"{b / MiB:.1f}"


def pct(f, signed=True) -> str:
    if f is None:
        return ""
    return f"{f * 100:+.1f} %" if signed else f"{f * 100:.2f} %"


def model_table(res: ModelResult) -> str:
    header = ["method", "budget MiB", "predicted MiB", "measured MiB", "vs plain", "fits budget",
              "pred. error", "overhead", "median s", "solve s", "status", "gap", "notes"]
    rows = []
    for r in res.rows:
        vs = "" if (r.measured is None or not res.plain_measured) else f"{r.measured / res.plain_measured:.2f}x"
        fits = {None: "", True: "yes", False: "**NO**"}[r.fits]
        rows.append([r.method, _mib(r.budget), _mib(r.predicted), _mib(r.measured), vs, fits,
                     pct(r.pred_error), pct(r.overhead), "" if r.median_s is None else f"{r.median_s:.3f}",
                     "" if r.solve_s is None else f"{r.solve_s:.1f}", r.status,
                     "" if r.gap is None else pct(r.gap, signed=False), r.note])
    return md_table(header, rows, "lrrrrlrrrrlll")


def machine() -> dict[str, str]:
    cpu = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    omp = os.environ.get("OMP_WAIT_POLICY", "unset")
    return {"CPU": cpu, "cores": str(os.cpu_count()), "torch threads": str(torch.get_num_threads()),
            "OMP_WAIT_POLICY": omp + (" (set by the bench)" if _OMP_PASSIVE_SET_HERE else ""),
            "torch": torch.__version__, "python": platform.python_version(),
            "OS": f"{platform.system()} {platform.release()}"}


GPU_TABLE = """| model (batch) | PyTorch GB | MONeT GB @ overhead |
|---|---|---|
| ResNet-50 (184) | 15.06 | 10.01 @ 3.22 %, 8.01 @ 5.56 %, 6.00 @ 9.31 %, 4.99 @ 11.95 % |
| GoogLeNet (320) | 14.93 | 9.98 @ 7.13 %, 8.01 @ 8.44 %, 6.01 @ 12.14 %, 4.99 @ 15.77 % |
| UNet (11) | 14.32 | 10.01 @ -4.10 %, 8.02 @ -0.09 %, 6.01 @ 4.95 %, 5.01 @ 11.51 % |
| MobileNetV2 (272) | 14.46 | 10.02 @ 2.40 %, 8.02 @ 4.77 %, 6.01 @ 7.55 %, 5.01 @ 8.72 % |
| VGG-16 (176) | 14.12 | 9.71 @ -5.30 %, 7.88 @ -2.18 %, 5.90 @ 5.44 %, 5.51 @ 9.11 % |"""

NOTES = """\
- **Memory** is the peak bytes allocated by tensors during one forward+backward iteration (parameter
  gradients None at the start, no optimizer step), measured at the CPU allocator from the profiler's
  raw allocation events (`monet.profiling.peak.measure_peak`), so kernel temporaries (oneDNN
  reorders, scratchpads) count; parameters, buffers, the input and the output gradient are included.
  MiB = 2^20 bytes. *vs plain* is measured peak / plain PyTorch's measured peak.
- **Budgets** are percentages of the *simulated* plain-PyTorch peak (the keep-everything schedule
  replayed by `monet.simulate`), shown in the PyTorch row's *predicted* column; *min budget* is
  `monet.solver.solve.min_budget`. *fits budget* compares the measured peak with the budget;
  *pred. error* is measured / predicted - 1 (the design asks for |error| <= 2 %).
- **Costs** for the solver: analytic times (`analytic_costs`, roofline of a nominal CPU) with the
  analytic table's `workspace_bytes` column replaced by the one of a quick CPU profile
  (`profile_costs`, repeats=1, warmup=0: a workspace is deterministic, oneDNN's reorders are real
  temporaries). Times are therefore not measured ones: the ILP minimises modelled recomputation time.
  For the full mode's implementations, the operators they change are measured once each
  (`hybrid_cost_fn`): workspace as measured, time = analytic time x measured ratio to PyTorch's kernel.
- **Modes**: *MONeT normal* recomputes or stores; *MONeT full* (`inplace_conv_multiway_newnode`) also
  chooses each operator's implementation (its *notes* count the operators per implementation family
  that do not run PyTorch's kernel) and runs ReLU/add in place where the input is dead.
- **Overhead** is median iteration time / median plain-PyTorch time - 1, both measured in this process,
  interleaved (`monet.profiling.measure.overhead`: WARMUP warm-up, then at least REPEATS timed iterations
  per side, more for short iterations, see each model's line). CPU times on
  these shared machines drift by about 20 % between runs (other processes share the 2 cores): only
  the interleaved ratios in one process are worth quoting, and differences of a few percent are noise.
  The bench sets `OMP_WAIT_POLICY=PASSIVE` (unless set already): with the default spinning OpenMP
  threads an iteration here took 0.4 to 6 s depending on what else ran, passively waiting threads
  gave stable times.
  *median s* is the candidate's own median; the PyTorch row's is the median of plain PyTorch's
  medians over all the interleaved measurements of the model.
- **Solve s** is wall time of the solve call (for *min budget*: the min-budget ILP plus the solve at
  that budget). *status*: `optimal`; `time_limit` (CBC stopped at the time limit with the gap shown,
  whose bound is the LP relaxation); `heuristic` (the ILP gave no integral schedule; a rounded and
  repaired one whose simulated peak fits was taken); `infeasible`; `error` (the message is in
  *notes*). *notes* counts recomputations (forward nodes recomputed, summed over backward stages).
  *Observations* under each table are generated from it by `observations()`.
- **Peers.** *Chen sqrt(n)*: `torch.utils.checkpoint` (use_reentrant=False, preserve_rng_state=True) on
  round(sqrt(n)) segments of the model's sequential units, cut as `checkpoint_sequential` cuts them;
  U-Net, which is not sequential, checkpoints each of its 9 encoder/decoder blocks individually
  (`monet.profiling.baselines`). Plain `torch.utils.checkpoint` updates BatchNorm running statistics a
  second time when it recomputes a segment (gradients are unaffected); the peer restores them around
  the recomputation (`restore_bn_stats=True`), which costs a copy of the BatchNorm buffers (KiB).
  *torch.compile budget b*: `torch.compile(model, backend="aot_eager_decomp_partition")` compiled
  under `torch._functorch.config.activation_memory_budget = b` after `torch._dynamo.reset()`; its first
  (compiling) call is the warm-up and is not timed. Its gradients agree with eager within float
  rounding (decompositions change the arithmetic), and dropout draws other random numbers.
- **GPU**: not measured in this session -- no GPU was lent. MONeT's published GPU table (16 GB P100,
  fp32, PyTorch 1.5.1; docs/design.md, "Measuring") for reference:
"""


def observations(res: ModelResult) -> list[str]:
    """What in a model's table departs from the design's promises or from expectation."""
    obs = []
    monet = [r for r in res.rows if r.method.startswith("MONeT")]
    solved = [r for r in monet if r.predicted is not None]
    for r in monet:
        if r.fits is False:
            obs.append(f"{r.method}: measured peak {_mib(r.measured)} MiB is ABOVE the budget {_mib(r.budget)} MiB.")
        if r.pred_error is not None and abs(r.pred_error) > 0.02:
            obs.append(f"{r.method}: predicted {_mib(r.predicted)} MiB vs measured {_mib(r.measured)} MiB "
                       f"({pct(r.pred_error)}), beyond the 2 % the design allows.")
        if r.status == "error":
            obs.append(f"{r.method}: the solve failed ({r.note}).")
        if r.status == "infeasible" and r.note.startswith("smallest feasible"):
            least = float(r.note.split()[2]) * MiB
            better = [s for s in solved if s.predicted < r.budget]
            if r.budget is not None and least < r.budget:
                obs.append(f"{r.method}: reported infeasible although the smallest feasible budget it names "
                           f"({r.note.split()[2]} MiB) is below this budget ({_mib(r.budget)} MiB).")
            elif better:
                obs.append(f"{r.method}: reported infeasible, yet {better[0].method} found a schedule whose "
                           f"predicted peak ({_mib(better[0].predicted)} MiB) fits this budget.")
    mins = [r for r in monet if r.method.endswith("min budget") and r.budget is not None]
    for least in mins:  # per mode: "MONeT normal, ..." and "MONeT full, ..."
        mode = least.method.split(",")[0]
        same = [r for r in solved if r.method.split(",")[0] == mode]
        lowest = min(same, key=lambda r: r.predicted) if same else None
        if lowest is not None and lowest.predicted < least.budget:
            obs.append(f"{mode}: the smallest feasible budget ({_mib(least.budget)} MiB) is above the predicted "
                       f"peak of {lowest.method} ({_mib(lowest.predicted)} MiB): the ILP's memory model is above "
                       "the simulator's peak for these schedules.")
    for r in solved:
        if r.budget and r.predicted < 0.97 * r.budget and not r.method.endswith("min budget"):
            obs.append(f"{r.method}: predicted peak {_mib(r.predicted)} MiB is {(1 - r.predicted / r.budget) * 100:.0f} % "
                       f"below its budget {_mib(r.budget)} MiB.")
    plain = res.rows[0] if res.rows and res.rows[0].method == "PyTorch" else None
    if plain is not None and plain.pred_error is not None and abs(plain.pred_error) > 0.02:
        obs.append(f"Plain PyTorch: simulated {_mib(plain.predicted)} MiB vs measured {_mib(plain.measured)} MiB "
                   f"({pct(plain.pred_error)}).")
    measured = [r for r in monet if r.measured is not None]
    if measured:
        best = min(measured, key=lambda r: r.measured)
        for r in res.rows:
            if not r.method.startswith(("MONeT", "PyTorch")) and r.measured is not None and r.measured < best.measured:
                obs.append(f"{r.method} reaches {_mib(r.measured)} MiB, below MONeT's lowest measured peak "
                           f"({_mib(best.measured)} MiB, {best.method}).")
    if mins and res.eager_sim and min(m.budget for m in mins) >= 0.99 * res.eager_sim:
        obs.append("No schedule lowers the peak below plain PyTorch's: the peak is set where nothing can be "
                   f"freed or recomputed (largest temporary of one op: {res.largest_workspace}).")
    return obs


#: the first line of the file this script writes (and the only file it overwrites)
TITLE = "# Benchmarks: benchmarks/bench.py"


def write_markdown(path: Path, results: list[ModelResult], args, command: str, started: str,
                   elapsed: float, finished: bool) -> None:
    mach = machine()
    out = [TITLE, "",
           f"Generated by `benchmarks/bench.py` on {started} (UTC); "
           f"{'completed' if finished else 'INCOMPLETE (run still going or interrupted)'} in "
           f"{elapsed / 60:.1f} min.", "",
           "```", command, "```", "",
           "Machine: " + "; ".join(f"{k} {v}" for k, v in mach.items()) + ".", ""]
    cfg_rows = []
    for r in results:
        c = r.config
        kw = ", ".join(f"{k}={v}" for k, v in c.kwargs.items()) or "defaults"
        cfg_rows.append([r.name, str(c.batch_size), "x".join(map(str, c.input_shape)), kw,
                         f"{r.n_params / 1e6:.2f} M", f"{r.n_fwd} / {r.n_bwd}", c.why,
                         f"{r.seconds:.0f}"])
    out += ["## Configurations", "",
            md_table(["model", "batch", "input", "factory kwargs", "parameters", "fwd / bwd nodes",
                      "why", "bench s"], cfg_rows, "lrllrrlr"), ""]
    for r in results:
        out += [f"## {r.name}", ""]
        if r.error:
            out += [f"The benchmark of this model failed: `{r.error}`", ""]
        if r.rows:
            out += [f"Plain PyTorch: simulated peak {_mib(r.eager_sim)} MiB, measured {_mib(r.plain_measured)} MiB, "
                    + (f"median iteration {r.plain_time:.3f} s" if r.plain_time is not None else "")
                    + f"; {r.repeats} timed iterations per side in each overhead measurement; "
                    f"largest temporary of one op: {r.largest_workspace}.", "",
                    model_table(r), ""]
            obs = observations(r)
            if obs:
                out += ["Observations (generated from the table):", ""] + [f"- {o}" for o in obs] + [""]
    notes = NOTES.replace("REPEATS", str(args.repeats)).replace("WARMUP", str(args.warmup))
    out += ["## Notes", "", notes, GPU_TABLE, ""]
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text("\n".join(out))
    os.replace(tmp, path)


# ----------------------------------------------------------------------------------------------
# command line
# ----------------------------------------------------------------------------------------------


def parse_args(argv=None):
    p = argparse.ArgumentParser(prog="python benchmarks/bench.py", description=__doc__.split("\n\n")[0])
    p.add_argument("--models", default=",".join(CONFIGS),
                   help=f"comma-separated zoo names (default: {','.join(CONFIGS)})")
    p.add_argument("--batch-size", type=int, default=None, help="override every model's batch size")
    p.add_argument("--image-size", type=int, default=None, help="override the image side (image models)")
    p.add_argument("--seq-len", type=int, default=None, help="override the sequence length (gpt2-small)")
    p.add_argument("--time-limit", type=float, default=10.0, help="seconds per ILP solve (default 10)")
    p.add_argument("--modes", default="normal,inplace_conv_multiway_newnode",
                   type=lambda t: [m for m in t.split(",") if m],
                   help="ILP modes to benchmark, comma-separated (default: normal and the full mode)")
    p.add_argument("--repeats", type=int, default=5,
                   help="least timed iterations per side in `overhead`, more for short iterations (default 5)")
    p.add_argument("--warmup", type=int, default=1, help="warm-up iterations before timing (default 1)")
    p.add_argument("--compile-budgets", default=",".join(f"{b:g}" for b in COMPILE_BUDGETS),
                   help="activation_memory_budget settings for the torch.compile peer")
    p.add_argument("--out", default="bench.md",
                   help="markdown file of its own to write (default bench.md in the working folder; "
                        "benchmarks/results/ holds raw rows only); a file this script did not write "
                        "(BENCHMARKS.md) is refused")
    args = p.parse_args(argv)
    args.compile_budgets = [float(b) for b in args.compile_budgets.split(",") if b.strip()]
    names = [n.strip() for n in args.models.split(",") if n.strip()]
    unknown = [n for n in names if n not in CONFIGS]
    if unknown:
        p.error(f"unknown model(s) {unknown}; choose from {', '.join(CONFIGS)}")
    args.model_names = names
    return args


def config_for(name: str, args) -> BenchConfig:
    c = CONFIGS[name]
    batch = args.batch_size or c.batch_size
    shape = c.input_shape
    if len(shape) == 3 and args.image_size:
        shape = (shape[0], args.image_size, args.image_size)
    if len(shape) == 1 and args.seq_len:
        shape = (args.seq_len,)
    return BenchConfig(c.kwargs, batch, shape, c.why)


def main(argv=None) -> int:
    args = parse_args(argv)
    log = Log()
    argv_list = sys.argv[1:] if argv is None else list(argv)
    command = "python benchmarks/bench.py" + ("" if not argv_list else " " + shlex.join(argv_list))
    started = _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%d %H:%M")
    out = Path(args.out)
    if out.exists() and not out.read_text().startswith(TITLE):
        raise SystemExit(f"bench.py: {out} was not written by this script ({TITLE!r} is not its first line): "
                         "it would be overwritten as a whole; give --out a file of its own "
                         "(default bench.md)")
    out.parent.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    results: list[ModelResult] = []
    for name in args.model_names:
        cfg = config_for(name, args)
        res = ModelResult(name, cfg)
        results.append(res)
        t_model = time.perf_counter()
        try:
            bench_model(res, args, log, save=lambda: write_markdown(
                out, results, args, command, started, time.perf_counter() - t0, finished=False))
        except Exception as e:  # noqa: BLE001 - the other models still run
            log(f"{name} failed: {error_text(e)}")
            traceback.print_exc(file=sys.stderr)
            res.error = error_text(e, 400)
            res.seconds = time.perf_counter() - t_model
        _release()
        write_markdown(out, results, args, command, started, time.perf_counter() - t0, finished=False)
    write_markdown(out, results, args, command, started, time.perf_counter() - t0, finished=True)
    log(f"wrote {out} ({(time.perf_counter() - t0) / 60:.1f} min)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
