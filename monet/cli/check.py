"""monet check: run a solution against plain PyTorch: gradients, measured peak memory, time overhead."""
from __future__ import annotations

import copy
import sys

from monet.cli.common import (EXIT_CHECK_FAILED, CLIError, build_model, fmt_mib, fmt_pct, fmt_size, print_json,
                              resolve_device, rows_table, solution_fields, timed_step)

GRAD_TOLERANCE = 1e-5  # relative; DESIGN.md, "What must stay true"


EPILOG = """\
examples:
  monet check r50.pkl                               # all checks
  monet check r50.pkl --check-diff                  # gradients only
  monet check r50.pkl --run-bs --json               # measured peak memory, JSON last line
  monet check my_net.pkl --model my_net.py:build    # when meta.model is not importable as is

Peak memory is one forward+backward iteration after warm-up, no optimizer step, at the allocator
(CPU: the profiler's allocation events; CUDA: max_memory_allocated). Overhead is the median
iteration time of the schedule over plain PyTorch's, interleaved in one process, minus 1.
Exit status 1 when the measured peak exceeds the budget or a gradient differs by more than 1e-5
(relative). A solution solved with --autocast is checked under that autocast (forward inside
torch.autocast, backward outside, for both), with a tolerance of one unit of the 16-bit precision
(bf16: 2^-7, fp16: 2^-10) for implementations that round differently; recomputation alone is
bitwise.
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



def run(args) -> int:
    """Run the ``monet check`` checks of ``args``; 0 when they pass, `EXIT_CHECK_FAILED` when one fails.

    Raises:
        CLIError: a solution without its model, the wrong device for its autocast, a mismatch.
    """
    import torch

    from monet import mixed_precision
    from monet.profiling import check as chk
    from monet.solution import SolutionMismatchError, describe, load_solution
    from monet.wrapper import MONeTWrapper

    sol = load_solution(args.file)
    meta = sol.meta
    model_name = args.model or meta.model
    if not model_name:
        raise CLIError(f"{args.file} does not name its model: pass --model MODEL")
    do_all = not (args.check_diff or args.check_runtime or args.run_bs)
    want_diff, want_bs, want_rt = (args.check_diff or do_all, args.run_bs or do_all,
                                   args.check_runtime or do_all)
    if args.device:
        device = resolve_device(args.device)
    else:
        device = "cuda" if meta.device == "cuda" and torch.cuda.is_available() else "cpu"
    amp = getattr(meta, "autocast", None)  # checked under the autocast it was solved for
    if amp and torch.device(device).type != amp[0]:
        raise CLIError(f"{args.file} was solved under {mixed_precision.describe(amp)}: check it with "
                       f"--device {amp[0]}" + ("" if amp[0] == "cpu" or torch.cuda.is_available()
                                               else " on a machine with CUDA"))
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

    def wrapped_model():
        return MONeTWrapper(copy.deepcopy(model), sol, meta.input_shape)

    results = dict(peak_bytes=None, eager_measured_peak_bytes=None, grad_rel_error=None,
                   grads_bitwise_equal=None, buffers_bitwise_equal=None, overhead=None,
                   median_time_s=None, eager_median_time_s=None)
    try:
        if want_diff:
            with timed_step("comparing gradients with plain PyTorch (one iteration, same weights and RNG)"):
                diff, equal, bequal = chk.compare_gradients(lambda: copy.deepcopy(model), wrapped_model, x, g,
                                                            autocast=amp)
            results.update(grad_rel_error=diff, grads_bitwise_equal=equal, buffers_bitwise_equal=bequal)
        if want_bs or want_rt:
            wrapped, plain = wrapped_model(), copy.deepcopy(model)
        if want_bs:
            with timed_step("measuring the peak memory of one iteration: schedule, then plain PyTorch"):
                results["peak_bytes"] = chk.measure_iteration_peak(wrapped, x, g, autocast=amp)
                results["eager_measured_peak_bytes"] = chk.measure_iteration_peak(plain, x, g, autocast=amp)
        if want_rt:
            with timed_step(f"timing the schedule against plain PyTorch ({args.repeats} interleaved iterations)"):
                frac, tw, tp = chk.overhead(plain, wrapped, x, g, repeats=args.repeats,
                                            warmup=0 if want_bs else 1, autocast=amp)
            results.update(overhead=frac, median_time_s=tw, eager_median_time_s=tp)
    except SolutionMismatchError as e:
        raise CLIError(f"{args.file} does not fit {model_name}: {e}") from None

    failures = []
    peak, budget = results["peak_bytes"], meta.budget_bytes
    if peak is not None and peak > budget:
        failures.append(f"measured peak {peak} bytes ({fmt_size(peak)}) exceeds the budget {budget} bytes "
                        f"({fmt_size(budget)})")
    diff = results["grad_rel_error"]
    if diff is not None and not diff <= tolerance:
        failures.append(f"gradients differ from plain PyTorch by {diff:.3g} (relative), more than "
                        f"{tolerance:g}" + (f" (one unit of {amp[1]} precision)" if amp else ""))

    rows = [("budget", fmt_mib(budget)), ("predicted peak (schedule)", fmt_mib(meta.predicted_peak_bytes)),
            ("simulated peak (plain PyTorch)", fmt_mib(meta.eager_peak_bytes))]
    if peak is not None:
        eager_m = results["eager_measured_peak_bytes"]
        rows += [("measured peak (schedule)", fmt_mib(peak)),
                 ("measured peak (plain PyTorch)", fmt_mib(eager_m)),
                 ("measured / budget", f"{peak / budget:.3f}"),
                 ("predicted / measured", f"{meta.predicted_peak_bytes / peak:.3f}"),
                 ("memory saved", f"{100 * (1 - peak / eager_m):.1f} %" if eager_m else "-")]
    if diff is not None:
        rows += [("gradient difference (relative, all gradients)", f"{diff:.3g}"),
                 ("gradients bitwise equal", str(results["grads_bitwise_equal"])),
                 ("buffers bitwise equal", str(results["buffers_bitwise_equal"]))]
    if results["overhead"] is not None:
        rows += [("median iteration (schedule)", f"{1e3 * results['median_time_s']:.2f} ms"),
                 ("median iteration (plain PyTorch)", f"{1e3 * results['eager_median_time_s']:.2f} ms"),
                 ("overhead (measured)", fmt_pct(results["overhead"]))]
    rows.append(("result", "FAILED" if failures else "passed"))
    print(rows_table(rows))
    for f in failures:
        print(f"monet: check failed: {f}", file=sys.stderr)
    if args.json:
        print_json({**solution_fields(meta), **results, "file": str(args.file), "check_device": device,
                    "passed": not failures, "failures": failures})
    return EXIT_CHECK_FAILED if failures else 0
