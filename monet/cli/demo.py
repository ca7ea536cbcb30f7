"""monet demo: what monet is for, in one table: plain PyTorch, Chen's sqrt(n) checkpointing,
``torch.compile``'s activation memory budget and monet at two budgets, trained from the same
weights and measured side by side (peak, overhead, gradients), with the frontier as a PNG."""
from __future__ import annotations

import copy
import time
from pathlib import Path

from monet.cli.common import (CLIError, add_inputs_args, build_model, check_inputs_spec, fmt_pct, log,
                              parse_budget_arg, parse_shape, reported, resolve_device, timed_step)

DEMO_MODEL = "resnet50"
DEMO_WIDTH = 16  # ResNet-50's depth at a quarter of its width: 1.9 M parameters
DEMO_BATCH = 64
DEMO_SHAPE = (3, 64, 64)
OTHER_BATCH = 8  # another --model's default batch
DEMO_BUDGETS = "50%,40%"
COMPILE_BUDGET = 0.5
MiB = 2**20

EPILOG = f"""\
The default model is {DEMO_MODEL} (the real architecture) at a quarter of its width (base width
{DEMO_WIDTH}), batch {DEMO_BATCH}, input {"x".join(map(str, DEMO_SHAPE))}: its parameters and their gradients are about 13 % of
plain PyTorch's peak, the activations most of the rest, as on a GPU at MONeT's batch sizes. The
demo captures and costs it once (hybrid: a quick profile's workspace, and on the CPU its times;
cached), solves the ILP in --mode (default normal: keep or recompute) at each of --budgets (a budget below the
smallest feasible one is solved at the smallest found, and said), then measures, each against
plain PyTorch from the same weights and data: plain PyTorch, Chen's sqrt(n) checkpointing
(torch.utils.checkpoint), torch.compile with activation_memory_budget {COMPILE_BUDGET:g} (--compile-budget),
and monet at each budget.

Columns: the measured peak of one training iteration (allocator level) and its share of plain
PyTorch's; the overhead (iteration time over plain PyTorch's, interleaved: the median of each turn's ratio, minus 1); the
gradient check (losses of --steps SGD steps and the first step's gradients: "bitwise" when equal
to plain PyTorch's bit for bit, else the largest relative gradient difference of one tensor); for
monet the budget and the solver's predicted peak. The frontier (peak on x, overhead on y) goes
to --plot.

In full mode (--mode full) the schedule also picks operator implementations; on the CPU those
change the arithmetic (another convolution kernel: PyTorch's own CPU kernels, oneDNN on or off,
differ by about 2 % in ResNet-50's gradients), so its gradient check shows a relative error, not
"bitwise". torch.compile decomposes operators, which changes the rounding: its gradient error is
the same at activation_memory_budget 1, where nothing is recomputed. Overheads are medians of a
few iterations on a shared CPU: a few percent are noise. Takes about a minute on 2 CPU cores
(the first run also profiles workspace, then caches it).

examples:
  monet demo
  monet demo --budgets 70%,min --plot frontier.png
  monet demo --mode full
  monet demo --model my_net.py:build --batch-size 32 --input-shape 3,64,64
"""

HELP = "plain PyTorch, Chen, torch.compile and monet at two budgets on a ResNet-50, CPU, about a minute"
DESCRIPTION = "Compare monet with plain PyTorch and its peers on a default model: one table, one plot."


def add_arguments(p) -> None:
    """The options of ``monet demo`` on its parser ``p``."""
    p.add_argument("--model", default=None,
                   help=f"MODEL (see monet --help; default {DEMO_MODEL} at base width {DEMO_WIDTH})")
    p.add_argument("--batch-size", "-b", type=int, default=None,
                   help=f"batch size (default {DEMO_BATCH} for the default model, {OTHER_BATCH} for another, "
                        "or the inputs' of a factory that returns (model, example_inputs))")
    add_inputs_args(p, shape_help=f"one sample's shape (default {','.join(map(str, DEMO_SHAPE))} for the "
                                  "default model, else the zoo model's)")
    p.add_argument("--device", default="auto", help="cpu, cuda, cuda:N or auto (CUDA if available)")
    p.add_argument("--budgets", "--budget", default=DEMO_BUDGETS, metavar="B1,B2",
                   help='monet\'s memory budgets, comma-separated, each as for monet solve ("50%%", "200MiB", '
                        'bytes) or "min" (the smallest feasible budget the solver finds)')
    p.add_argument("--mode", default="normal", help='"normal" (keep or recompute) or "full" (operator '
                                                    "implementations chosen too)")
    p.add_argument("--compile-budget", type=float, default=COMPILE_BUDGET, metavar="F",
                   help="torch.compile's activation_memory_budget, in [0, 1]")
    p.add_argument("--compile", action="store_true",
                   help="also monet compiled by Inductor at the first of --budgets (monet.optimize(..., "
                        "compile=True)) and torch.compile with Inductor at --compile-budget (each compiles: "
                        "minutes on a CPU)")
    p.add_argument("--steps", type=int, default=3, help="SGD steps of the gradient check")
    p.add_argument("--repeats", type=int, default=7, help="timed iterations of each method for the overhead (interleaved with plain PyTorch; the median of each turn's ratio is taken)")
    # 10 s: with measured CPU costs a 5 s solve at 40 % left a +186 % schedule (1233 recomputations)
    # where 10 s finds +34 % (138)
    p.add_argument("--time-limit", type=float, default=10.0, metavar="S",
                   help="solver time limit per solve (default %(default)g)")
    p.add_argument("--csv", type=Path, default=None, metavar="FILE.csv",
                   help="also append the table's rows, with their date, machine, torch release and command, to "
                        "this raw results file (benchmarks/results/demo.csv renders into BENCHMARKS.md)")
    p.add_argument("--plot", type=Path, default=Path("monet_demo.png"), metavar="PATH",
                   help="where to write the frontier plot (PNG)")
    p.add_argument("--cache-dir", type=Path, default=None,
                   help="profile cache (default ~/.cache/monet/profiles)")


def _is_min(budget: str) -> bool:
    return budget.lower() == "min"


def _budgets(text: str) -> list[str]:
    """--budgets as a list, each checked before any slow step (a percentage is checked against 1 TiB).

    Raises:
        CLIError: no budget, or one that is neither "min" nor a budget `parse_budget_arg` reads.
    """
    budgets = [b.strip() for b in text.split(",") if b.strip()]
    if not budgets:
        raise CLIError(f"--budgets {text!r} names no budget: give e.g. 50%,40% or 70%,min")
    for b in budgets:
        if not _is_min(b):
            parse_budget_arg(b, 2**40)
    return budgets


def _build(args, device: str):
    """(model, inputs, name) for the options: the default model, or --model."""
    shape = parse_shape(args.input_shape)
    spec = check_inputs_spec(args.inputs)
    if args.model is None:
        return (*build_model(DEMO_MODEL, args.batch_size or DEMO_BATCH, shape or DEMO_SHAPE, device,
                             inputs_spec=spec, base_width=DEMO_WIDTH), f"{DEMO_MODEL} (base width {DEMO_WIDTH})")
    batch = args.batch_size
    if batch is None:  # a file model without --input-shape or --inputs must bring its own inputs (and batch)
        own = shape is None and spec is None and ".py:" in args.model
        batch = None if own else OTHER_BATCH
    return (*build_model(args.model, batch, shape, device, inputs_spec=spec), args.model)


def _gradients(r) -> str:
    if r.bitwise is None:
        return "-"
    return "bitwise" if r.bitwise else f"max rel. error {r.grad_error:.1e}"


def results_table(results, plain_peak: int):
    """The demo's table (a pandas DataFrame, one row per `MethodResult`, the first plain PyTorch's):
    peaks in MiB, share of ``plain_peak`` (bytes), predicted and measured overhead in percent."""
    import pandas as pd

    def mib(b):  # a tiny model's peaks are fractions of a MiB
        return "-" if b is None else (f"{b / MiB:.1f}" if b >= MiB else f"{b / MiB:.3f}")

    return pd.DataFrame([{
        "method": r.method,
        "budget MiB": mib(r.budget_bytes),
        "predicted MiB": mib(r.predicted_peak_bytes),
        "peak MiB": mib(r.peak_bytes),
        "% of plain": "-" if r.peak_bytes is None else f"{100 * r.peak_bytes / plain_peak:.0f} %",
        "predicted overhead": "-" if r.predicted_overhead is None else fmt_pct(r.predicted_overhead),
        "overhead": "reference" if r is results[0] else ("-" if r.overhead is None else fmt_pct(r.overhead)),
        "gradients vs plain": "reference" if r is results[0] else _gradients(r),
    } for r in results])


def _check_options(args) -> list[str]:
    """The budgets of --budgets; every option checked before any slow step.

    Raises:
        CLIError: a bad --budgets, --compile-budget, --steps or --repeats, or a --plot folder that does not exist.
    """
    budgets = _budgets(args.budgets)
    if not 0.0 <= args.compile_budget <= 1.0:
        raise CLIError(f"--compile-budget must lie in [0, 1] (a fraction of the activations), "
                       f"got {args.compile_budget:g}")
    if args.steps < 1 or args.repeats < 1:
        raise CLIError("--steps and --repeats must be at least 1")
    if not args.plot.parent.is_dir():
        raise CLIError(f"--plot {args.plot}: the folder {args.plot.parent} does not exist; create it or give "
                       "another PATH")
    return budgets


def _solve(plan, budget: str, args, mode: str | None = None):
    """(budget, `Solution`, note) of ``plan`` at ``budget`` in ``mode`` (default --mode; at the
    smallest feasible budget found when ``budget`` is below it: the note says so).

    Raises:
        CLIError: the solver failed (the message says why).
    """
    mode = mode or args.mode
    with timed_step(f"solving at {budget} ({mode}, CBC, time limit {args.time_limit:g} s)") as s:
        try:
            with reported(f"--budgets {budget}: "):
                # the cost model's prediction, uncalibrated: timing each schedule at solve time
                # (monet.profiling.calibration) doubled the demo's minute, and the demo times every
                # schedule anyway
                sol = plan.solve(budget, mode=mode, time_limit=args.time_limit, if_infeasible="smallest",
                                 calibrate=False)
        except RuntimeError as e:
            raise CLIError(str(e)) from None
        meta = sol.meta
        s["note"] = (f"{meta.status}, budget {meta.budget_bytes / MiB:.1f} MiB, predicted peak "
                     f"{meta.predicted_peak_bytes / MiB:.1f} MiB, {sol.schedule.recompute_count()} recomputations")
    asked = None if _is_min(budget) else parse_budget_arg(budget, plan.eager_peak_bytes)
    note = ("" if asked is None or meta.budget_bytes <= asked else
            f"{budget} ({asked / MiB:.1f} MiB) is below the smallest feasible budget: solved at the "
            f"smallest found, {meta.budget_bytes / MiB:.1f} MiB")
    return budget, sol, note


def _print_table(results) -> None:
    """`results_table` of ``results`` (plain PyTorch's first) on stdout, method names left-aligned,
    then a note per method that has one and per schedule whose measured peak is above its budget."""
    table = results_table(results, results[0].peak_bytes)
    width = int(table["method"].str.len().max())
    table["method"] = table["method"].str.ljust(width)
    print(table.rename(columns={"method": "method".ljust(width)}).to_string(index=False))
    for r in results:
        if r.note:
            print(f"note: {r.method}: {r.note}")
    for r in results:
        if r.budget_bytes is not None and r.peak_bytes is not None and r.peak_bytes > r.budget_bytes:
            print(f"note: {r.method}'s measured peak is above its budget")


def run(args) -> int:
    """Build, capture and cost once (`monet.plan.prepare`), solve at each budget, measure every method
    against plain PyTorch (`monet.profiling.comparison`); prints the table, writes the plot."""
    import torch

    from monet.zoo.models import MODELS
    from monet.plan import WithLoss, prepare
    from monet.profiling.baselines import chen_checkpoint, compile_with_activation_budget
    from monet.profiling.measure import loss_of, step_peak
    from monet.profiling.comparison import MethodResult, Training, measure_method
    from monet.profiling.training import random_target

    t_start = time.perf_counter()
    budgets = _check_options(args)
    device = resolve_device(args.device)
    with timed_step("building the model") as s:
        model, x, name = _build(args, device)
        params = sum(p.numel() for p in model.parameters())
        s["note"] = f"{name}, {params / 1e6:.1f} M parameters, inputs {x.describe()}"
    tokens = args.model in MODELS and MODELS[args.model].input_kind == "tokens"
    found = random_target(model, x, tokens)
    loss_fn, target = found if found is not None else (None, None)

    def fresh(m=None):
        """A copy of the model from the same weights (or ``m``), trained as every method is: with its loss."""
        m = copy.deepcopy(model) if m is None else m
        return WithLoss(m, loss_fn) if loss_fn is not None else m

    with timed_step("capturing and costing (hybrid: a quick profile of every operator, cached)") as s:
        with reported():
            plan = prepare(copy.deepcopy(model), x, loss_fn=loss_fn, target=target, cost="hybrid",
                           cache_dir=args.cache_dir, progress=False)
        s["note"] = f"{plan.graph.describe()}; plain PyTorch's simulated peak {plan.eager_peak_bytes / MiB:.1f} MiB"
    inputs = plan.inputs
    solutions = [_solve(plan, budget, args) for budget in budgets]

    plain = fresh()
    with timed_step(f"measuring plain PyTorch: peak, {args.steps} SGD steps (the reference)"):
        base = MethodResult("plain PyTorch", peak_bytes=step_peak(plain, inputs, loss_of), overhead=0.0, bitwise=True)
        reference = Training.of(fresh(), inputs, args.steps, loss_of)
    chen = (MethodResult("Chen sqrt(n)"), lambda: fresh(chen_checkpoint(copy.deepcopy(model))[0]))
    compiled = (MethodResult(f"torch.compile {args.compile_budget:g}"),
                lambda: compile_with_activation_budget(fresh(), args.compile_budget))
    schedules = [(MethodResult(f"monet {budget}", budget_bytes=sol.meta.budget_bytes,
                               predicted_peak_bytes=sol.meta.predicted_peak_bytes,
                               predicted_overhead=sol.meta.predicted_overhead(), note=note),
                  lambda sol=sol: plan.wrap(sol, fresh())) for budget, sol, note in solutions]
    inductor = _compiled_methods(model, x, loss_fn, target, budgets[0], args, fresh) if args.compile else []
    for r, make in [chen, *schedules, *inductor, compiled]:  # torch.compile's last: they reset dynamo's caches
        with timed_step(f"measuring {r.method}: peak, {args.steps} SGD steps, {args.repeats} timed iterations"):
            try:
                candidate = make()
            except ValueError as e:  # Chen's method on a model without a sequence of units
                r.note = f"n/a: {e}"
                log(f"  {r.method}: {r.note}")
                continue
            measure_method(r, candidate, plain, reference, inputs, args.steps, args.repeats, loss_of, log)
    torch.compiler.reset()
    ordered = [base, chen[0], compiled[0], *(r for r, _ in schedules), *(r for r, _ in inductor)]

    print()
    print(f"{name}, inputs {x.describe()}, {device}; monet in {args.mode} mode, budgets of plain PyTorch's "
          f"simulated peak ({plan.eager_peak_bytes / MiB:.1f} MiB)")
    _print_table(ordered)
    _write_outputs(ordered, args, title=f"{name}, inputs {x.describe()}, {device}")
    log(f"demo finished in {time.perf_counter() - t_start:.0f} s")
    return 0


def _compiled_methods(model, x, loss_fn, target, budget, args, fresh) -> list:
    """(result, make) of monet compiled at ``budget`` and of ``torch.compile`` with Inductor's
    kernels at ``args.compile_budget``; ``fresh(m)`` gives a model trained as every method is."""
    from monet.plan import prepare
    from monet.profiling.baselines import compile_with_activation_budget
    from monet.profiling.comparison import MethodResult

    with timed_step("capturing and costing the compiled step"):
        with reported():
            plan = prepare(copy.deepcopy(model), x, loss_fn=loss_fn, target=target, cost="hybrid",
                           cache_dir=args.cache_dir, progress=False, compile=True)
    budget, sol, note = _solve(plan, budget, args, mode="normal")
    return [(MethodResult(f"monet compiled {budget}", budget_bytes=sol.meta.budget_bytes,
                          predicted_peak_bytes=sol.meta.predicted_peak_bytes, predicted_overhead=None, note=note),
             lambda: plan.wrap(sol, fresh())),
            (MethodResult(f"torch.compile {args.compile_budget:g} inductor"),
             lambda: compile_with_activation_budget(fresh(), args.compile_budget, backend="inductor"))]


def _write_outputs(ordered, args, title: str) -> None:
    """The raw rows (``--csv``, with their provenance) and the frontier plot (``--plot``) of the
    measured ``ordered`` results (plain PyTorch's first).

    Raises:
        CLIError: the plot cannot be written."""
    from monet.profiling.frontier import frontier_plot

    if args.csv:
        from monet.profiling.raw_results import append_rows, command_line, provenance

        rows = results_table(ordered, ordered[0].peak_bytes).to_dict("records")
        append_rows(args.csv, rows, provenance(command_line("monet demo", getattr(args, "argv", [])[1:])))
        log(f"appended {len(rows)} rows to {args.csv}")
    with timed_step(f"plotting the frontier to {args.plot}"):
        try:
            frontier_plot(ordered, args.plot, title=title)
        except OSError as e:
            raise CLIError(f"cannot write the plot to {args.plot}: {e}; give another --plot PATH") from None
