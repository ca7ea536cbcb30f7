"""monet check: run a solution against plain PyTorch: gradients, measured peak memory, time overhead."""
from __future__ import annotations

import copy
import dataclasses
import sys

from monet.cli.common import (EXIT_CHECK_FAILED, CLIError, build_model, fmt_mib, fmt_pct, fmt_size, print_json,
                              resolve_device, rows_table, solution_fields, timed_step)

GRAD_TOLERANCE = 1e-5  # relative; docs/design.md, "What must stay true"


EPILOG = """\
examples:
  monet check r50.pkl                               # all checks
  monet check r50.pkl --check-diff                  # gradients only
  monet check r50.pkl --run-bs --json               # measured peak memory, JSON last line
  monet check my_net.pkl --model my_net.py:build    # when meta.model is not importable as is
  monet check r50.pkl --trace --trace-out r50.json.gz   # node by node: measured vs simulated bytes
  monet check r50.json.gz                           # a recorded trace, simulated again here (no GPU)

Peak memory is one forward+backward iteration after warm-up, no optimizer step, at the allocator
(CPU: the profiler's allocation events; CUDA: max_memory_allocated). Overhead is the median
iteration time of the schedule over plain PyTorch's, interleaved in one process, minus 1.
Exit status 1 when the measured peak exceeds the budget or a gradient differs by more than 1e-5
(relative). A solution of monet solve --compile runs compiled by Inductor and is checked against
torch.compile with no budget (gradients, peak, time). A solution solved with --autocast is checked under that autocast (forward inside
torch.autocast, backward outside, for both), with a tolerance of one unit of the 16-bit precision
(bf16: 2^-7, fp16: 2^-10) for implementations that round differently; recomputation alone is
bitwise.

--trace runs one iteration node by node and prints, for every node of the forward pass and of each
backward stage (with its recomputations), the bytes allocated after it and at its peak, measured
(CPU: the profiler's allocator events inside the node; CUDA: the caching allocator's counters, and
its event history) and simulated (monet.simulate); it names the first node where the two part and
compares the peaks. --trace-out keeps the recording (gzip JSON): "monet check TRACE.json.gz"
simulates it again on any machine. Exit status 1 when the simulated peak is not within 2 % of the
measured one.
"""


HELP = "check a solution: gradients, peak memory, overhead"
DESCRIPTION = ("Rebuild the solution's model and run its schedule against plain\n"
               "PyTorch. With no check flag, all three checks run.")


def add_arguments(p) -> None:
    """The options of ``monet check`` on its parser ``p``."""
    p.add_argument("file", metavar="FILE", help="solution file from monet solve")
    p.add_argument("--model", default=None,
                   help="MODEL to rebuild (default: the solution's own meta.model)")
    p.add_argument("--check-diff", action="store_true",
                   help="gradients and buffers after one iteration vs plain PyTorch")
    p.add_argument("--run-bs", action="store_true",
                   help="measured peak memory of one iteration, schedule and plain PyTorch, vs the budget "
                        "and the prediction")
    p.add_argument("--check-runtime", action="store_true",
                   help="time overhead over plain PyTorch (interleaved medians)")
    p.add_argument("--repeats", type=int, default=5, help="timed iterations of each for --check-runtime")
    p.add_argument("--device", default=None,
                   help="cpu, cuda, cuda:N or auto (default: the solution's device if available, else cpu)")
    p.add_argument("--json", action="store_true", help="print one JSON object as the last line of stdout")
    p.add_argument("--compile", action="store_true",
                   help="check the compiled step (a solution of monet solve --compile, which is checked so "
                        "anyway) against torch.compile with no budget instead of eager PyTorch")
    p.add_argument("--trace", action="store_true",
                   help="record one iteration node by node, measured against simulated bytes (only this check)")
    p.add_argument("--trace-out", metavar="PATH", default=None,
                   help="write the recorded trace to PATH (gzip JSON, e.g. trace.json.gz); implies --trace")
    p.add_argument("--profile", metavar="CSV", default=None,
                   help="with --trace: the per-node workspace to simulate with, from a cost table of monet profile "
                        "(default: derived from the recording itself)")
    p.add_argument("--tolerance", type=int, default=None, metavar="BYTES",
                   help="with --trace: bytes measured and simulated may differ before a node counts as parting "
                        "(default 0.2 %% of the measured peak)")
    p.add_argument("--rows", type=int, default=None, metavar="N",
                   help="with --trace: print only N rows either side of the first parting node (default: all)")



def run(args) -> int:
    """Run the ``monet check`` checks of ``args``; 0 when they pass, `EXIT_CHECK_FAILED` when one fails.

    Raises:
        CLIError: a solution without its model, the wrong device for its autocast, a mismatch.
    """
    import torch

    from monet.profiling import measure as chk
    from monet.profiling.trace import is_trace_file
    from monet.solution import describe, load_solution

    if is_trace_file(args.file):
        return _replay(args)
    sol = load_solution(args.file)
    meta = sol.meta
    model_name = args.model or meta.model
    if not model_name:
        raise CLIError(f"{args.file} does not name its model: pass --model MODEL")
    device = _check_device(args, meta)
    amp = getattr(meta, "autocast", None)  # checked under the autocast it was solved for
    tolerance = GRAD_TOLERANCE if not amp else float(torch.finfo(getattr(torch, amp[1])).eps)
    print(describe(sol))
    try:
        dtype = getattr(torch, meta.dtype)
    except AttributeError:
        raise CLIError(f"{args.file}: unknown dtype {meta.dtype!r}") from None
    spec = meta.inputs_spec  # None: one tensor of input_shape, or the factory's own inputs
    what = f"inputs {spec}" if spec else f"input {meta.input_shape} {meta.dtype}"
    with timed_step(f"building {model_name} (batch {meta.batch_size}, {what}) on {device}"):
        model, x = build_model(model_name, meta.batch_size, None if spec else meta.input_shape, device,
                               dtype=None if spec else dtype, inputs_spec=spec)
        g = chk.output_grad(model, x, autocast=amp)  # None: trained through its loss (loss_of)

    compiled = bool(getattr(meta, "compiled", False))
    if args.compile and not compiled:
        raise CLIError(f"{args.file} was solved for the eager step: solve it with monet solve --compile to check "
                       "the compiled step")
    if (args.trace or args.trace_out) and compiled:
        raise CLIError("--trace runs the schedule node by node, eagerly: a compiled solution has no such step")
    if args.trace or args.trace_out:
        return _record(args, sol, model_name, model, x, g, amp, device)
    reference = "torch.compile" if compiled else "plain PyTorch"
    results = _measure(args, sol, model_name, model, x, g, amp, reference)
    failures = _failures(results, meta, tolerance, amp, reference)
    print(rows_table(_report_rows(results, meta, reference) + [("result", "FAILED" if failures else "passed")]))
    for f in failures:
        print(f"monet: check failed: {f}", file=sys.stderr)
    if args.json:
        print_json({**solution_fields(meta), **dataclasses.asdict(results), "file": str(args.file), "check_device": device,
                    "passed": not failures, "failures": failures})
    return EXIT_CHECK_FAILED if failures else 0


def _check_device(args, meta) -> str:
    """The device to check on: ``--device``, else the solution's own where this machine has it.

    Raises:
        CLIError: a CUDA solution without ``--device`` on a machine without CUDA, or a device other
            than the one its autocast was solved for."""
    import torch

    from monet import mixed_precision

    if args.device:
        device = resolve_device(args.device)
    elif meta.device == "cuda" and torch.cuda.is_available():
        device = "cuda"
    elif meta.device == "cuda":
        # a GPU-sized schedule (the zoo's ResNet-50 at batch 184: 15 GiB in plain PyTorch) would
        # run on the CPU for minutes and take its memory: only when asked for
        raise CLIError(f"{args.file} was solved for a CUDA GPU (batch {meta.batch_size}, plain PyTorch's simulated peak "
                       f"{fmt_size(meta.eager_peak_bytes)}, budget {fmt_size(meta.budget_bytes)}) and this machine has "
                       "none: checking it runs that model and batch on the CPU, in that much host memory; pass "
                       "--device cpu to do so")
    else:
        device = "cpu"
    amp = getattr(meta, "autocast", None)
    if amp and torch.device(device).type != amp[0]:
        raise CLIError(f"{args.file} was solved under {mixed_precision.describe(amp)}: check it with "
                       f"--device {amp[0]}" + ("" if amp[0] == "cpu" or torch.cuda.is_available()
                                               else " on a machine with CUDA"))
    return device


def _measure(args, sol, model_name, model, x, g, amp, reference: str):
    """The checks ``args`` asks for (all by default) of the schedule ``sol`` on ``model`` against
    ``reference`` (plain PyTorch, or ``torch.compile`` for a compiled solution), as a
    `monet.profiling.measure.CheckResult`: gradients, peaks (bytes) and the overhead; a check not
    run is None.

    Raises:
        CLIError: the solution does not fit the model."""
    import torch

    from monet.profiling import measure as chk
    from monet.solution import SolutionMismatchError
    from monet.wrapper import MONeTWrapper

    do_all = not (args.check_diff or args.check_runtime or args.run_bs)
    want_diff, want_bs, want_rt = (args.check_diff or do_all, args.run_bs or do_all, args.check_runtime or do_all)

    def wrapped_model():
        return MONeTWrapper(copy.deepcopy(model), sol, sol.meta.input_shape)

    def plain_model():
        plain = copy.deepcopy(model)
        return torch.compile(plain) if reference == "torch.compile" else plain

    results = chk.CheckResult()
    try:
        if want_diff:
            with timed_step(f"comparing gradients with {reference} (one iteration, same weights and RNG)"):
                diff, equal, bequal = chk.compare_gradients(plain_model, wrapped_model, x, g, autocast=amp)
            results.grad_rel_error, results.grads_bitwise_equal, results.buffers_bitwise_equal = diff, equal, bequal
        if want_bs or want_rt:
            wrapped, plain = wrapped_model(), plain_model()
        if want_bs:
            with timed_step(f"measuring the peak memory of one iteration: schedule, then {reference}"):
                results.peak_bytes = chk.measure_iteration_peak(wrapped, x, g, autocast=amp)
                results.eager_measured_peak_bytes = chk.measure_iteration_peak(plain, x, g, autocast=amp)
        if want_rt:
            with timed_step(f"timing the schedule against {reference} ({args.repeats} interleaved iterations)"):
                frac, tw, tp = chk.overhead(plain, wrapped, x, g, repeats=args.repeats,
                                            warmup=0 if want_bs else 1, autocast=amp)
            results.overhead, results.median_time_s, results.eager_median_time_s = frac, tw, tp
    except SolutionMismatchError as e:
        raise CLIError(f"{args.file} does not fit {model_name}: {e}") from None
    return results


def _failures(results, meta, tolerance: float, amp, reference: str) -> list[str]:
    """What failed: a measured peak above the budget, gradients further than ``tolerance``."""
    failures = []
    peak, budget = results.peak_bytes, meta.budget_bytes
    if peak is not None and peak > budget:
        failures.append(f"measured peak {peak} bytes ({fmt_size(peak)}) exceeds the budget {budget} bytes "
                        f"({fmt_size(budget)})")
    diff = results.grad_rel_error
    if diff is not None and not diff <= tolerance:
        failures.append(f"gradients differ from {reference} by {diff:.3g} (relative), more than "
                        f"{tolerance:g}" + (f" (one unit of {amp[1]} precision)" if amp else ""))
    return failures


def _report_rows(results, meta, reference: str) -> list[tuple[str, str]]:
    """The (label, value) rows of the report: sizes, then each check that ran."""
    peak, budget = results.peak_bytes, meta.budget_bytes
    rows = [("budget", fmt_mib(budget)), ("predicted peak (schedule)", fmt_mib(meta.predicted_peak_bytes)),
            ("simulated peak (plain PyTorch)", fmt_mib(meta.eager_peak_bytes))]
    if peak is not None:
        eager_m = results.eager_measured_peak_bytes
        rows += [("measured peak (schedule)", fmt_mib(peak)),
                 (f"measured peak ({reference})", fmt_mib(eager_m)),
                 ("measured / budget", f"{peak / budget:.3f}"),
                 ("predicted / measured", f"{meta.predicted_peak_bytes / peak:.3f}"),
                 ("memory saved", f"{100 * (1 - peak / eager_m):.1f} %" if eager_m else "-")]
    if results.grad_rel_error is not None:
        rows += [("gradient difference (relative, all gradients)", f"{results.grad_rel_error:.3g}"),
                 ("gradients bitwise equal", str(results.grads_bitwise_equal)),
                 ("buffers bitwise equal", str(results.buffers_bitwise_equal))]
    if results.overhead is not None:
        rows += [("median iteration (schedule)", f"{1e3 * results.median_time_s:.2f} ms"),
                 (f"median iteration ({reference})", f"{1e3 * results.eager_median_time_s:.2f} ms"),
                 ("overhead (measured)", fmt_pct(results.overhead))]
    return rows


def _trace_result(args, trace, comparison, path=None) -> int:
    """Print a trace's comparison (`monet.profiling.trace_compare.format_report`); the exit status."""
    from monet.profiling.trace import PEAK_TOLERANCE
    from monet.profiling.trace_compare import format_report

    print(format_report(comparison, trace.meta, rows=args.rows))
    failed = not comparison.within
    if failed:
        print(f"monet: check failed: simulated peak {comparison.simulated_peak} bytes is not within "
              f"{PEAK_TOLERANCE:.0%} of the measured {comparison.measured_peak} bytes", file=sys.stderr)
    if args.json:
        f = comparison.first_parting
        print_json({"file": str(args.file), "trace": str(path) if path else None,
                    "measured_peak_bytes": comparison.measured_peak, "simulated_peak_bytes": comparison.simulated_peak,
                    "peak_ratio": comparison.peak_ratio, "within": comparison.within,
                    "first_parting": None if f is None else {"row": int(f["row"]), "name": f["name"], "op": f["op"],
                                                             "pass": f["pass"], "quantity": f["quantity"],
                                                             "difference_bytes": int(f["difference"])},
                    "passed": not failed})
    return EXIT_CHECK_FAILED if failed else 0


def _record(args, sol, model_name, model, x, g, amp, device) -> int:
    """``monet check FILE --trace``: record one iteration node by node and compare."""
    from monet.profiling.trace import record_trace
    from monet.profiling.trace_compare import compare_trace

    workspace, source = None, None
    if args.profile:
        from monet.profiling.costs import costs_for
        from monet.profiling.profiler import load_costs

        table = load_costs(args.profile)

        def workspace(graph):
            c = costs_for(graph, table, where=str(args.profile))
            return c.fwd_workspace, c.bwd_workspace

        source = f"profile {args.profile}"
    with timed_step(f"recording one iteration node by node on {device}"):
        trace = record_trace(model, x, sol, model_name=model_name, g=g, workspace=workspace,
                             workspace_source=source, label=f"{fmt_size(sol.meta.budget_bytes)} {sol.meta.mode}",
                             autocast=amp)
    path = trace.save(args.trace_out) if args.trace_out else None
    if path:
        print(f"trace written to {path}", file=sys.stderr)
    return _trace_result(args, trace, compare_trace(trace, replay=False, tolerance_bytes=args.tolerance), path)


def _replay(args) -> int:
    """``monet check TRACE.json.gz``: simulate a recorded trace again here and compare."""
    from monet.profiling.trace import Trace, TraceFormatError, TraceMismatchError
    from monet.profiling.trace_compare import compare_trace

    try:
        trace = Trace.load(args.file)
        with timed_step("rebuilding the recorded graph with fake tensors and simulating its schedule"):
            comparison = compare_trace(trace, tolerance_bytes=args.tolerance)
    except (TraceFormatError, TraceMismatchError) as e:
        raise CLIError(str(e)) from None
    return _trace_result(args, trace, comparison)
