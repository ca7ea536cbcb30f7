"""monet demo: the whole job (solve, train side by side with plain PyTorch, measure) on a default model."""
from __future__ import annotations

import collections
import copy
import time
from pathlib import Path

from monet.cli.common import (CLIError, add_inputs_args, build_model, capture_graph, check_inputs_spec,
                              cost_arrays, cost_fn_for, costs_table, fmt_mib, fmt_pct, fmt_size, log,
                              parse_budget_arg, parse_shape, resolve_device, rows_table, timed_step)

DEMO_MODEL = "resnet50"
DEMO_BATCH = 8
DEMO_SHAPE = (3, 96, 96)


EPILOG = f"""\
The demo builds {DEMO_MODEL} (the real architecture) at batch {DEMO_BATCH} and input
{"x".join(map(str, DEMO_SHAPE))}, captures it, costs it (analytic times, workspace from a quick
profile, cached), solves the ILP at --budget (default 80 % of plain PyTorch's simulated peak: at
this batch and input, parameters and their gradients are two thirds of the peak, so 80 % drops about
60 % of the activations; the smallest feasible budget the solver finds is used instead, and said,
when the budget is infeasible), then trains 3 SGD steps with
the schedule and with plain PyTorch from the same weights and data, and prints the measured peaks,
the overhead, the gradient difference and whether the losses are bit-identical. When the schedule
runs implementations other than PyTorch's (another convolution kernel changes the arithmetic: on
ResNet-50 at this size PyTorch's own CPU kernels, oneDNN on or off, differ by 2.5 % in gradients),
a third copy runs those implementations without the schedule, and the schedule is compared with it
too: recomputation itself must change nothing (bitwise).
"""


HELP = "the whole job on ResNet-50 on the CPU in about three minutes"
DESCRIPTION = "Solve, train and measure a default model end to end."


def add_arguments(p) -> None:
    """The options of ``monet demo`` on its parser ``p``."""
    p.add_argument("--model", default=DEMO_MODEL, help="MODEL (see monet --help)")
    p.add_argument("--batch-size", "-b", type=int, default=None,
                   help=f"batch size (default {DEMO_BATCH}, or the inputs' of a factory that returns "
                        "(model, example_inputs))")
    add_inputs_args(p, shape_help=f"one sample's shape (default {','.join(map(str, DEMO_SHAPE))} for "
                                  f"{DEMO_MODEL}, else the zoo model's)")
    p.add_argument("--device", default="auto", help="cpu, cuda, cuda:N or auto (CUDA if available)")
    p.add_argument("--steps", type=int, default=3, help="SGD steps to train")
    p.add_argument("--repeats", type=int, default=3, help="timed iterations of each for the overhead")
    p.add_argument("--budget", default="80%", help='memory budget, as for monet solve ("80%%", "200MiB", bytes)')
    p.add_argument("--time-limit", type=float, default=30.0, metavar="S", help="solver time limit per solve")
    p.add_argument("--cache-dir", type=Path, default=None,
                   help="profile cache (default ~/.cache/monet/profiles)")


def run(args) -> int:
    """Build, capture, cost (hybrid), solve at --budget (or the smallest feasible budget found),
    train side by side with plain PyTorch (`monet.profiling.training`), measure; prints a table."""
    from monet.models import input_info
    from monet.profiling import check as chk
    from monet.profiling.sources import gpu_spec_for_hybrid
    from monet.profiling.training import random_target_loss, train_side_by_side
    from monet.solution import describe
    from monet.solver.ilp import InfeasibleBudgetError
    from monet.solver.solve import eager_peak, same_kernels_solution, solve
    from monet.wrapper import MONeTWrapper
    from monet.zoo.models import MODELS

    t_start = time.perf_counter()
    device = resolve_device(args.device)
    shape = parse_shape(args.input_shape)
    spec = check_inputs_spec(args.inputs)
    if shape is None and spec is None and args.model == DEMO_MODEL:
        shape = DEMO_SHAPE
    batch = args.batch_size
    if batch is None:  # a file model without --input-shape or --inputs must bring its own inputs (and batch)
        own = shape is None and spec is None and ".py:" in args.model
        batch = None if own else DEMO_BATCH
    with timed_step(f"building {args.model} on {device}") as s:
        model, x = build_model(args.model, batch, shape, device, inputs_spec=spec)
        s["note"] = (f"{sum(p.numel() for p in model.parameters()) / 1e6:.1f} M parameters, "
                     f"inputs {x.describe()}")
    shape = tuple(x.first.shape[1:])
    with timed_step("capturing the forward and backward graph") as s:
        graph = capture_graph(model, x)
        s["note"] = graph.describe()
    with timed_step("costing: analytic times, workspace from a quick profile (cached after the first run)"):
        gpu_spec = gpu_spec_for_hybrid(device)  # a GPU without a preset: h100's roofline ranks recomputations
        table = costs_table("hybrid", model, x, graph, device, gpu_spec, args.cache_dir)
        costs = cost_arrays(graph, table)
    cost_fn = cost_fn_for("hybrid", model, x, graph, table, device, gpu_spec)
    mode = "inplace_conv_multiway_newnode"
    kw = dict(time_limit=args.time_limit, info=None, device=device.split(":")[0], cost_fn=cost_fn)
    eager = eager_peak(graph, costs)
    budget = parse_budget_arg(args.budget, eager)
    kw["info"] = dict(model=args.model, device=device.split(":")[0], **input_info(x, spec))
    log(f"plain PyTorch's simulated peak: {fmt_size(eager)}; target budget {args.budget}: {fmt_size(budget)}")
    note = ""
    solving = f"(mode {mode}, CBC, time limit {args.time_limit:g} s)"
    try:
        with timed_step(f"solving the ILP at {fmt_size(budget)} {solving}") as s:
            try:
                sol = solve(graph, costs, budget, mode, **kw)
                s["note"] = f"{sol.meta.status}, predicted peak {fmt_size(sol.meta.predicted_peak_bytes)}"
            except InfeasibleBudgetError as e:
                if e.min_budget_bytes is None:
                    raise
                s["note"] = "infeasible"
                note = (f"the budget {args.budget} ({fmt_size(budget)}) is infeasible for this model: "
                        f"solved at the smallest feasible budget found, {fmt_size(e.min_budget_bytes)} "
                        f"({100 * e.min_budget_bytes / eager:.0f} %)")
                budget = e.min_budget_bytes
        if note:
            log(note)
            with timed_step(f"solving the ILP at {fmt_size(budget)} {solving}") as s:
                sol = solve(graph, costs, budget, mode, **kw)
                s["note"] = f"{sol.meta.status}, predicted peak {fmt_size(sol.meta.predicted_peak_bytes)}"
    except RuntimeError as e:
        raise CLIError(str(e)) from None
    print(describe(sol))

    # train side by side from the same weights, data and RNG; implementations with other
    # arithmetic than PyTorch's change gradients by themselves: the same implementations without the
    # schedule (keep everything) separate their effect from the schedule's
    tokens = args.model in MODELS and MODELS[args.model].input_kind == "tokens"
    plain = copy.deepcopy(model)
    wrapped = MONeTWrapper(copy.deepcopy(model), sol, shape)
    impls = collections.Counter(sol.schedule.impl.values())
    same = (MONeTWrapper(copy.deepcopy(model), same_kernels_solution(graph, costs, sol, kw["device"], cost_fn), shape)
            if impls else None)
    loss_fn = random_target_loss(model, x, tokens)
    with timed_step(f"training {args.steps} SGD steps with the schedule and with plain PyTorch"):
        trained = train_side_by_side(wrapped, plain, x, loss_fn, args.steps, same=same, log=log)
    g = chk.output_grad(model, x)
    with timed_step("measuring the peak memory of one iteration: schedule, then plain PyTorch"):
        peak_w = chk.measure_iteration_peak(wrapped, x, g)
        peak_p = chk.measure_iteration_peak(plain, x, g)
    with timed_step(f"timing {args.repeats} interleaved iterations of each"):  # both warm by now
        frac, tw, tp = chk.overhead(plain, wrapped, x, g, repeats=args.repeats, warmup=0)

    rows = [("model", f"{args.model}, inputs {x.describe()}, {device}"),
            ("plain PyTorch peak (measured)", fmt_mib(peak_p)),
            ("monet peak (measured)", fmt_mib(peak_w)),
            ("budget", fmt_mib(budget) + (" (smallest feasible found)" if note
                                          else f" ({args.budget} of simulated plain peak)")),
            ("monet peak (predicted)", fmt_mib(sol.meta.predicted_peak_bytes)),
            ("memory saved", f"{100 * (1 - peak_w / peak_p):.1f} %"),
            ("overhead (measured)", f"{fmt_pct(frac)} ({1e3 * tw:.0f} ms vs {1e3 * tp:.0f} ms per iteration)"),
            ("overhead (predicted)", fmt_pct(sol.meta.objective_s / sol.meta.eager_time_s - 1)
             if sol.meta.eager_time_s else "-"),
            ("implementations other than PyTorch's", ", ".join(f"{k} x{n}" for k, n in sorted(impls.items()))
             or "none"),
            ("gradient difference, step 1 (relative, all gradients)", f"{trained.grad_diff:.3g}"),
            (f"losses bit-identical ({args.steps} steps)", "yes" if trained.identical else "no")]
    if same is not None:
        rows += [("  the same implementations without the schedule:", ""),
                 (f"  gradient difference, all {args.steps} steps (relative)", f"{trained.same_diff:.3g}"),
                 (f"  losses bit-identical ({args.steps} steps)", "yes" if trained.identical_to_same else "no")]
    rows += [("within budget", "yes" if peak_w <= budget else "NO")]
    print()
    print(rows_table(rows))
    if note:
        print(f"note: {note}")
    log(f"demo finished in {time.perf_counter() - t_start:.0f} s")
    return 0
