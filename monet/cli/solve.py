"""monet solve: capture a model, cost its operators, solve the ILP at a budget, write a solution file."""
from __future__ import annotations

import time
from pathlib import Path

from monet.solver import DEFAULT_GAP
from monet.cli.common import (CLIError, add_model_args, autocast_dtype, build_and_capture, check_inputs_spec,
                              cost_fn_for, costs_table, fmt_size, log, parse_budget_arg, parse_shape,
                              print_json, reported, resolve_device, solution_fields, timed_step)


EPILOG = """\
examples:
  monet solve resnet50 --batch-size 184 --budget 6GB -o resnet50_184.pkl
  monet solve resnet50 --batch-size 32 --input-shape 3,128,128 --budget 50% --json -o r50.pkl
  monet solve "torchvision.models.resnet50()" --batch-size 64 --min-budget -o r50_min.pkl
  monet solve my_net.py:build --batch-size 16 --input-shape 3,64,64 --budget 300MiB -o my_net.pkl
  monet solve resnet50 --batch-size 184 --budget 6GB --cost analytic --gpu-spec p100 -o r50_p100.pkl
  monet solve resnet50 --batch-size 32 --input-shape 3,128,128 --budget 50% --autocast bf16 -o r50_bf16.pkl
  monet solve lm.py:build --batch-size 8 --budget 50% -o lm.pkl \\
      --inputs "input_ids=128:int64:50257,attention_mask=128:int64:2,labels=128:int64:50257"
  monet solve lm.py:build_with_inputs --budget 50% -o lm.pkl   # build_with_inputs() -> (model, inputs)
  monet solve gpt2-small --batch-size 8 --budget 33% --mode normal --device cuda --cost analytic \
      --gpu-spec h100 --offload-bandwidth pcie5 -o gpt2_offload.pkl

MODEL "path/to/file.py:factory": factory() returns the nn.Module, or (model, example_inputs) with
example_inputs a tensor, a tuple of positional or a dict of keyword arguments (the first tensor's
first dimension is the batch; --batch-size may be left out). --inputs gives inputs of any names,
dtypes and shapes to any MODEL: --inputs "input_ids=128:int64:50257" calls
model(input_ids=<(B, 128) int64 in [0, 50257)>); --inputs 3x64x64 equals --input-shape 3,64,64.
A model whose output is not a tensor (ModelOutput, dict) is trained through its "loss".

Progress goes to stderr; a summary of the solution to stdout (with --json, then one JSON line:
status (optimal; gap: proven within --gap of the bound; time_limit: stopped by the time limit with
a bound; heuristic: the search's schedule, no bound), objective, bound, gap, solve_time_s, budget_bytes,
predicted_peak_bytes, eager_peak_bytes, output ...). A budget below the smallest feasible one exits
with status 2 and names that budget.
"""


OFFLOAD_PRESETS = ("pcie4", "pcie5", "nvlink-c2c")  # solver.offload.DEFAULT_BANDWIDTHS (not imported: --help stays fast)


def offload_bandwidth(value: str | None, mode: str, device: str) -> float | None:
    """Bytes/s of ``--offload-bandwidth`` (None: no offload).

    Raises:
        CLIError: not a number, a preset or 'measure'; a mode other than normal; a device other than CUDA.
    """
    if value is None:
        return None
    from monet.solver.offload import DEFAULT_BANDWIDTHS

    if mode != "normal":
        raise CLIError(f"--offload-bandwidth plans offload in --mode normal only (got --mode {mode}): "
                       f"add --mode normal")
    if not device.startswith("cuda"):
        raise CLIError("--offload-bandwidth needs --device cuda: offload saves device memory by moving "
                       "activations to host memory, and on the CPU they are the same memory")
    if value in DEFAULT_BANDWIDTHS:
        return DEFAULT_BANDWIDTHS[value]
    if value == "measure":
        from monet.profiling.bandwidth import measure_host_bandwidth

        bw = measure_host_bandwidth(device=device)
        log(f"measured host<->device bandwidth: {bw / 1e9:.1f} GB/s")
        return bw
    try:
        bw = float(value)
    except ValueError:
        raise CLIError(f"--offload-bandwidth must be bytes per second (e.g. 50e9), one of "
                       f"{', '.join(DEFAULT_BANDWIDTHS)} or 'measure', got {value!r}") from None
    if bw <= 0:
        raise CLIError(f"--offload-bandwidth must be > 0 bytes per second, got {value!r}")
    return bw


HELP = "solve the ILP for a model, batch size and budget"
DESCRIPTION = ("Capture MODEL, cost every operator, solve MONeT's ILP at a memory\n"
               "budget and write the schedule to a solution file.")


def add_arguments(p) -> None:
    """The options of ``monet solve`` on its parser ``p``: the model's, the schedule's, the costs',
    then the output's."""
    add_model_args(p)
    _add_schedule_arguments(p)
    _add_cost_arguments(p)
    p.add_argument("--json", action="store_true", help="print one JSON object as the last line of stdout")
    p.add_argument("--offload-bandwidth", default=None, metavar="BW",
                   help="let the ILP offload kept activations to pinned host memory over a link of BW "
                        "bytes/s per direction (a number such as 50e9, a preset: "
                        f"{', '.join(OFFLOAD_PRESETS)}, or 'measure' on a CUDA device); --mode normal "
                        "only; off by default and on CPU")
    p.add_argument("-o", "--output", required=True, metavar="FILE", help="solution file to write")


def _add_schedule_arguments(p) -> None:
    """What the schedule is solved for and how long: budget, mode, --compile, the solver's limits."""
    budget = p.add_mutually_exclusive_group(required=True)
    budget.add_argument("--budget", metavar="BUDGET",
                        help='memory budget: "6GB" (6 x 2^30 bytes), "6GiB", "6000MiB", bytes, or '
                             '"50%%" of plain PyTorch\'s simulated peak')
    budget.add_argument("--min-budget", action="store_true",
                        help="solve at the smallest feasible budget (found by a first search); in --mode normal "
                             "where one percent of plain PyTorch's peak less would cost more than 10 points of "
                             "overhead (the log says what each further MiB would cost)")
    p.add_argument("--mode", default=None,
                   help="what the ILP may choose (MONeT's modes): none (keep everything: plain PyTorch), "
                        "normal (recompute or store), or tokens joined by '_': conv (convolution "
                        "algorithms), multiway (store a node's input or output), newnode (compact "
                        "values: 1-bit ReLU/dropout masks, 4-bit max-pool offsets), inplace (ReLU and add "
                        "overwrite their input; every mode does it now), attention (SDPA backends). Default: "
                        "inplace_conv_multiway_newnode (MONeT's full mode), normal with --compile; 'full' is "
                        "every token, attention included")
    p.add_argument("--compile", action="store_true",
                   help="solve for the step compiled by Inductor (monet.optimize(..., compile=True)): the "
                        "compiled step's costs, --mode normal; on the device it is for, the compiled step is "
                        "measured (it compiles) and solved again where over the budget; the solution runs "
                        "compiled")
    p.add_argument("--time-limit", type=float, default=60.0, metavar="S",
                   help="seconds for everything after the capture and the costing: the smallest-budget "
                        "search (--min-budget: half of it), the solve and the timing of the solved "
                        "schedule (CPU, measured costs: the solver gets half) share one deadline; the "
                        "best schedule found by then is kept")
    p.add_argument("--gap", type=float, default=DEFAULT_GAP, metavar="FRACTION",
                   help="stop once the schedule is proven within this fraction of the best bound "
                        "(default %(default)g; 0: optimal)")
    p.add_argument("--solver", type=str.upper, choices=["CBC", "HIGHS", "SCIP"], default="CBC",
                   help="MILP solver (HIGHS and SCIP need highspy / pyscipopt)")


def _add_cost_arguments(p) -> None:
    """Where the operators' costs come from: --cost, calibration, device, autocast, GPU preset, cache."""
    p.add_argument("--cost", choices=["analytic", "workspace", "hybrid", "profile"], default="hybrid",
                   help="operator costs (default hybrid). analytic: a roofline model of --gpu-spec, needs "
                        "no device; each operator's workspace is charged at an upper bound from its "
                        "shapes (per op family, measured on CPU; see monet.profiling.workspace), so "
                        "the budget holds where the schedule runs, at the price of a smallest budget "
                        "a few percent higher and a predicted peak that is a bound; workspace: the "
                        "roofline's times and hybrid's measured workspace (nothing timed); hybrid: workspace from a "
                        "quick profile of every operator on --device (median of 3 warm runs, cached), "
                        "times from it on the CPU and from the roofline on a GPU; "
                        "profile: times and workspace measured on --device (cached). Measured CPU times "
                        "also carry each node's share of the executor's time between operators, and the "
                        "predicted overhead is against plain PyTorch's measured iteration (both timed once "
                        "per graph, cached)")
    p.add_argument("--no-calibrate", dest="calibrate", action="store_false",
                   help="on the CPU with measured costs (hybrid, profile), do not time the solved schedule "
                        "(default: time it, a few seconds of training iterations, and predict its overhead "
                        "from its measured recomputation; in full mode solve again with it and keep the "
                        "faster schedule, within --time-limit)")
    p.add_argument("--device", default="cpu", help="device the schedule is for: cpu, cuda or cuda:N")
    p.add_argument("--autocast", choices=["bf16", "fp16"], default=None,
                   help="mixed precision: solve for training under torch.autocast(device, dtype=bfloat16 "
                        "or float16) (fp16 on CUDA only); the solution then runs only inside that "
                        "autocast (default: no autocast)")
    p.add_argument("--gpu-spec", default=None, metavar="NAME",
                   help="roofline preset for --cost analytic: p100, v100, a100, h100, h100-pcie, "
                        "h200 (default: the CPU's, or the visible GPU's with --device cuda)")
    p.add_argument("--cache-dir", type=Path, default=None,
                   help="profile cache (default ~/.cache/monet/profiles)")


def run(args) -> int:
    """Solve ``args`` (the parsed ``monet solve`` options), write the solution file; 0 on success.

    Raises:
        CLIError: a bad argument, a model that cannot be built or traced, no schedule in time.
    """
    import torch

    from monet.models import input_info
    from monet.solution import RunInfo
    from monet.plan import CALIBRATED_SOLVE_SHARE, loss_outside_note
    from monet.profiling.calibration import applies as calibrates, timing_fits
    from monet.solution import describe, save_solution
    from monet.solver.deadline import Deadline
    from monet.solver.solve import eager_peak

    output, shape, spec, budget = _check_arguments(args)
    # --cost analytic needs no device: a schedule for a GPU can be solved on a laptop
    device = resolve_device(args.device) if args.cost != "analytic" else args.device
    if not (device == "cpu" or device.startswith("cuda")):
        raise CLIError(f"--device must be cpu, cuda or cuda:N, got {device!r}")
    on = device if (device == "cpu" or torch.cuda.is_available()) else "cpu"
    bandwidth = offload_bandwidth(args.offload_bandwidth, args.mode, device)
    amp = autocast_dtype(args.autocast, device, on)

    t0 = time.perf_counter()
    model, x, graph = build_and_capture(args.model, args.batch_size, shape, on, spec, amp,
                                        building=f"building {args.model}")
    capture_s = time.perf_counter() - t0  # about what each trace of a timed executor costs
    graph = graph.for_compile(args.compile)
    with timed_step(f"costing ({args.cost})") as s:
        table, costs = costs_table(args.cost, model, x, graph, device, args.gpu_spec, args.cache_dir)
        s["note"] = f"operators {1e3 * costs.total_time:.1f} ms per iteration"
    cost_fn = None if args.compile else cost_fn_for(args.cost, model, x, graph, table, device, args.gpu_spec,
                                                    args.cache_dir)
    if args.cost == "analytic":
        log("note: analytic costs charge every operator an upper bound on its workspace (per op family; "
            "monet.profiling.workspace), so the predicted peak is a bound; --cost hybrid or --cost "
            "profile measure the workspace and give a lower smallest budget")
    eager = eager_peak(graph, costs)
    log(f"plain PyTorch's simulated peak: {fmt_size(eager)} ({eager} bytes)")
    note = loss_outside_note(graph, eager, remedy=(
        "leave room for it below the GPU's memory, or trace the loss with the model from Python "
        "(monet.optimize(..., loss_fn=, target=))"))
    if note:
        log(f"note: {note}")
    deadline = Deadline(args.time_limit)  # one for the search, the solve and the timing
    calibrating = args.calibrate and calibrates(args.cost, device) and not args.compile  # times the eager step
    calibrating = calibrating and timing_fits(costs, deadline.left() * (1 - CALIBRATED_SOLVE_SHARE), 2, capture_s, log)
    solving = Deadline(deadline.left() * (CALIBRATED_SOLVE_SHARE if calibrating else 1.0))
    try:
        if args.min_budget:
            budget = _smallest_budget(args, graph, costs, eager, device, cost_fn, bandwidth, solving)
        elif budget is None:
            budget = parse_budget_arg(args.budget, eager)
        info = RunInfo(model=args.model, device=device.split(":")[0], **input_info(x, spec))
        kw = dict(solver=args.solver, info=info, device=device.split(":")[0], cost_fn=cost_fn, progress=log, gap=args.gap,
                  offload_bandwidth=bandwidth)
        sol = _solve_at(args, budget, model, x, graph, costs, kw, solving, deadline if calibrating else None, capture_s)
        if args.compile:
            sol = _measured(args, sol, None if args.min_budget else budget, model, x, graph, costs, kw, on == device)
    except RuntimeError as e:  # the solver found no schedule in time
        raise CLIError(str(e)) from None
    save_solution(sol, output)
    log(f"wrote {output}")
    print(describe(sol))
    if args.json:
        print_json({**solution_fields(sol.meta), "output": str(output)})
    return 0


def _check_arguments(args) -> tuple[Path, tuple | None, dict | None, int | None]:
    """(output path, input shape, inputs spec, budget in bytes or None for a percentage), checked
    before any slow step; fills in ``args.mode``'s default (normal when compiled, else full).

    Raises:
        CLIError: a mode Inductor cannot compile, an unknown mode, a missing output folder, a bad
            shape, inputs spec or budget."""
    from monet.impls import mode_tokens

    if args.mode is None:
        args.mode = "normal" if args.compile else "inplace_conv_multiway_newnode"
    if args.compile and args.mode != "normal":
        raise CLIError(f"--compile solves in --mode normal (keep or recompute): mode {args.mode!r} chooses operator "
                       "implementations of monet's own, which Inductor does not compile")
    with reported():
        mode_tokens(args.mode)
    output = Path(args.output)
    if not output.parent.is_dir():
        raise CLIError(f"cannot write {output}: the folder {output.parent} does not exist")
    shape, spec = parse_shape(args.input_shape), check_inputs_spec(args.inputs)
    budget = None
    if args.budget is not None and not args.budget.strip().endswith("%"):
        budget = parse_budget_arg(args.budget)  # fail before the slow steps; "50%" needs the peak
    return output, shape, spec, budget


def _smallest_budget(args, graph, costs, eager: int, device: str, cost_fn, bandwidth, solving) -> int:
    """``--min-budget``: the smallest feasible budget (bytes) found in `SEARCH_SHARE` of ``solving``;
    in normal mode without offload, the smallest one worth its recomputation (`monet.solver.smallest.knee`)."""
    from monet.solver.smallest import _smallest, frontier, knee
    from monet.solver.solve import SEARCH_SHARE, min_budget, min_budget_lower

    where = device.split(":")[0]
    with timed_step(f"finding the smallest feasible budget ({args.solver}, "
                    f"{SEARCH_SHARE * solving.limit_s:g} s of the time limit)") as s:
        budget, proven = min_budget(graph, costs, args.mode, args.solver, solving.share(SEARCH_SHARE), where, cost_fn,
                                    progress=log, offload_bandwidth=bandwidth)
        # the same search, cached (with offload: a search of its own, not run for this note)
        lower = None if bandwidth else min_budget_lower(graph, costs, args.mode, args.solver, args.time_limit, where,
                                                        cost_fn)
        s["note"] = f"{fmt_size(budget)}, " + ("proven minimal" if proven else "not proven minimal") + (
            "" if proven or lower is None else f"; no schedule below {fmt_size(lower)} (LP bound)")
    if args.mode == "normal" and not bandwidth:  # the smallest budget worth its recomputation
        least_recomputation = _smallest(graph, costs, args.mode, args.solver, 0.0, where, cost_fn)[5]
        budget, why = knee(frontier(graph, costs, budget, least_recomputation), costs.plain_time, eager)
        if why:
            log(f"note: {why}")
    return budget


def _measured(args, sol, budget: int | None, model, x, graph, costs, kw: dict, here: bool):
    """``sol`` held to ``budget`` bytes (None: the smallest budget) by measuring its compiled step on
    this machine (`monet.held.hold_budget`, as `monet.plan.Plan.solve` does), each new solve in
    ``--time-limit`` again; ``sol`` as it is, said in the log, where the device it is for is not
    ``here`` (on this machine)."""
    from monet.held import compiled_peak, hold_budget
    from monet.solver.deadline import Deadline
    from monet.solver.solve import solve
    from monet.wrapper import MONeTWrapper

    if not here:
        log(f"note: the compiled step is not measured: {kw['device']} is not on this machine (its budget is "
            "the simulation's; monet check measures it there)")
        return sol

    def measure(s):
        return compiled_peak(MONeTWrapper(model, s, s.meta.input_shape), model, x, graph.autocast)

    def resolve(b: int):
        return solve(graph, costs, b, args.mode, deadline=Deadline(args.time_limit), **kw)

    with timed_step("measuring the compiled step (it compiles)") as s:
        sol = hold_budget(sol, budget, measure, resolve, log)
        s["note"] = f"{fmt_size(sol.meta.measured_peak_bytes)} at the allocator"
    return sol


def _solve_at(args, budget: int, model, x, graph, costs, kw: dict, solving, calibration, capture_s: float):
    """The schedule at ``budget`` (bytes) within ``solving``; with a ``calibration`` deadline, timed
    and re-solved on this machine (`monet.profiling.calibration.calibrated_solve`)."""
    from monet.profiling.calibration import calibrated_solve
    from monet.solver.deadline import Deadline
    from monet.solver.solve import solve

    with timed_step(f"solving at a budget of {fmt_size(budget)} ({budget} bytes), mode {args.mode}, "
                    f"{args.solver}, {solving.left():.0f} s of the time limit {args.time_limit:g} s") as s:
        sol = solve(graph, costs, budget, args.mode, deadline=solving, **kw)
        if calibration is not None:
            first = sol
            sol = calibrated_solve(model, x, graph, costs, first,
                                   lambda scaled, again=None: solve(graph, scaled, first.meta.budget_bytes, args.mode,
                                                                    deadline=again or Deadline(0.0), **kw),
                                   device="cpu", cost_fn=kw["cost_fn"], log=log, deadline=calibration,
                                   trace_s=capture_s)
        s["note"] = f"{sol.meta.status}, predicted peak {fmt_size(sol.meta.predicted_peak_bytes)}"
    return sol
