"""The ``monet`` command line: solve, check, profile, demo, zoo.

Every command writes its progress to stderr and its results to stdout.  With ``--json`` the last line of
stdout is one JSON object (``{"error": ...}`` when the command fails), so scripts can read it with
``tail -n 1``.  Known errors (an infeasible budget, a corrupt or mismatched solution file, a model that
cannot be traced, a malformed argument) end the command with ``monet: error: <message>`` on stderr and
exit status 2, without a traceback; ``monet check`` exits with 1 when the schedule fails a check.
"""
from __future__ import annotations

import argparse
import collections
import copy
import json
import math
import os
import sys
import time
from contextlib import contextmanager
from pathlib import Path

EXIT_ERROR = 2  # a known error: bad arguments, infeasible budget, unreadable solution ...
EXIT_CHECK_FAILED = 1  # monet check: measured peak above the budget, or gradients differ
GRAD_TOLERANCE = 1e-5  # relative; DESIGN.md, "What must stay true"
MiB = 2**20
GiB = 2**30

DEMO_MODEL = "resnet50"
DEMO_BATCH = 8
DEMO_SHAPE = (3, 96, 96)

_DESCRIPTION = """\
monet trains deep networks in less memory (MONeT, Shah et al., ICLR 2021). For a model, an input
shape and a memory budget it solves an integer linear program that decides which activations the
forward pass keeps and which the backward pass recomputes, writes that schedule to a solution file,
and trains with it through monet.MONeTWrapper.

MODEL is a zoo name (resnet50, vgg16, mobilenet_v2, googlenet, unet, gpt2-small),
"torchvision.models.resnet50()" or "path/to/file.py:factory" (factory() returns the nn.Module, or
(model, example_inputs)). --inputs gives a model inputs of any names and dtypes (see solve --help).
A budget is "6GB" (= 6 x 2^30 bytes, as in MONeT's tables; "6GiB" and "6000MiB" too), a byte count,
or a percentage of plain PyTorch's simulated peak ("50%").
"""

_EPILOG = """\
commands:
  solve     capture MODEL, cost its operators, solve the ILP at a budget, write a solution file
  check     run a solution against plain PyTorch: gradients, measured peak memory, time overhead
  profile   measure every operator's time and workspace on a device, write the cost table (CSV)
  demo      the whole job on ResNet-50 (small batch and images) on the CPU, in about three minutes
  zoo       prebuilt schedules: list, get NAME -o FILE, build, verify, plot

examples:
  monet demo
  monet solve resnet50 --batch-size 184 --budget 6GB --time-limit 600 -o resnet50_184.pkl
  monet solve resnet50 --batch-size 32 --input-shape 3,128,128 --budget 50% --json -o r50.pkl
  monet solve my_net.py:build --batch-size 16 --input-shape 3,64,64 --min-budget -o my_net.pkl
  monet check r50.pkl                       # all three checks; or pick some:
  monet check r50.pkl --check-diff --check-runtime --run-bs --json
  monet profile resnet50 --batch-size 184 --device cuda -o resnet50_184.profile

benchmarks (from a checkout of the repository; not installed, see BENCHMARKS.md):
  python benchmarks/bench.py          CPU table: MONeT's schedules, plain PyTorch and the peers
  python benchmarks/bench_solver.py   the ILP at MONeT's full-scale configurations: size, time, gap
  python benchmarks/gpu_table.py      MONeT's GPU table: profile, solve, measure
  python benchmarks/reach_table.py    torchvision, timm and transformers models

Run "monet COMMAND --help" for a command's options.
"""

_INPUTS_HELP = """\
the model's inputs instead of one float tensor: comma-separated [NAME=]SHAPE[:DTYPE[:HIGH]], one
entry per argument (NAME= for a keyword argument, positional entries first), SHAPE one sample's
sizes without the batch joined by 'x' (3x224x224; empty for a scalar per sample), DTYPE float32
(default), bfloat16, float16, float64, int64, int32, int16, int8, uint8 or bool, HIGH the exclusive
upper bound of integer values (default 2). Floats are standard normal, integers uniform in
[0, HIGH), from a fixed seed. E.g. --inputs "input_ids=16:int64:50257,labels=16:int64:50257"
"""

_SOLVE_EPILOG = """\
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

MODEL "path/to/file.py:factory": factory() returns the nn.Module, or (model, example_inputs) with
example_inputs a tensor, a tuple of positional or a dict of keyword arguments (the first tensor's
first dimension is the batch; --batch-size may be left out). --inputs gives inputs of any names,
dtypes and shapes to any MODEL: --inputs "input_ids=128:int64:50257" calls
model(input_ids=<(B, 128) int64 in [0, 50257)>); --inputs 3x64x64 equals --input-shape 3,64,64.
A model whose output is not a tensor (ModelOutput, dict) is trained through its "loss".

Progress goes to stderr; a summary of the solution to stdout (with --json, then one JSON line:
status (optimal, time_limit or heuristic), objective, bound, gap, solve_time_s, budget_bytes,
predicted_peak_bytes, eager_peak_bytes, output ...). A budget below the smallest feasible one exits
with status 2 and names that budget.
"""

_CHECK_EPILOG = """\
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

_PROFILE_EPILOG = """\
examples:
  monet profile resnet50 --batch-size 184 --device cuda -o resnet50_184.profile
  monet profile resnet50 --batch-size 8 --input-shape 3,96,96 --repeats 3

The table (CSV: kind, node, op, impl, time_s, recompute_s, workspace_bytes, flops, bytes_moved,
source) is written to -o, or without -o to the profile cache, where "monet solve --cost profile"
finds it (keyed by the graph's fingerprint, the device name and the torch version).
"""

_DEMO_EPILOG = f"""\
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


_ZOO_EPILOG = """\
examples:
  monet zoo list
  monet zoo get resnet50-184-6GB -o resnet50_184_6GB.pkl
  monet check zoo:resnet50-184-6GB --run-bs          # any solution path takes zoo:NAME
  monet zoo build --time-limit 300                    # regenerate everything (hours on 2 cores)
  monet zoo build --models vgg16 --budgets 10GB --time-limit 60 --out-dir /tmp/zoo
  monet zoo verify                                    # every entry: loads, fingerprint, simulated peak
  monet zoo plot -o docs/zoo_frontier.png --markdown BENCHMARKS.md

In Python: MONeTWrapper(model, "zoo:resnet50-184-6GB", input_shape=(3, 224, 224)).
"""


class CLIError(Exception):
    """A known error: printed as ``monet: error: <message>``, exit status `EXIT_ERROR`."""

    def __init__(self, message: str, code: int = EXIT_ERROR, **extra):
        super().__init__(message)
        self.code = code
        self.extra = extra


# ----------------------------------------------------------------------------------------------
# output helpers
# ----------------------------------------------------------------------------------------------


def _log(message: str) -> None:
    print(f"monet: {message}", file=sys.stderr, flush=True)


@contextmanager
def _step(what: str):
    """Log ``what ...`` then ``what: done in X s`` (to stderr)."""
    _log(f"{what} ...")
    t0 = time.perf_counter()
    info: dict = {}
    yield info
    extra = f" ({info['note']})" if info.get("note") else ""
    _log(f"{what}: done in {time.perf_counter() - t0:.1f} s{extra}")


def _mib(nbytes) -> str:
    return "-" if nbytes is None else f"{nbytes / MiB:,.1f} MiB"


def _size(nbytes) -> str:
    if nbytes is None:
        return "-"
    return f"{nbytes / GiB:.2f} GiB" if nbytes >= GiB else f"{nbytes / MiB:.1f} MiB"


def _pct(fraction) -> str:
    return "-" if fraction is None else f"{100 * fraction:+.1f} %"


def _json_value(v):
    if isinstance(v, float) and not math.isfinite(v):
        return None if math.isnan(v) else ("inf" if v > 0 else "-inf")
    if isinstance(v, tuple):
        return list(v)
    return v


def _print_json(obj: dict) -> None:
    print(json.dumps({k: _json_value(v) for k, v in obj.items()}), flush=True)


def _table(rows: list[tuple[str, str]]) -> str:
    import pandas as pd

    frame = pd.DataFrame(rows, columns=["", "value"]).set_index("")
    frame.index.name = None
    return frame.to_string()


# ----------------------------------------------------------------------------------------------
# models, inputs, costs
# ----------------------------------------------------------------------------------------------


def _parse_shape(text: str | None) -> tuple[int, ...] | None:
    """"3,224,224" or "3x224x224" -> (3, 224, 224)."""
    if text is None:
        return None
    parts = [p for p in text.replace("x", ",").replace("X", ",").replace(" ", "").split(",") if p]
    try:
        shape = tuple(int(p) for p in parts)
    except ValueError:
        raise CLIError(f"cannot read input shape {text!r}: use comma-separated sizes without the "
                       "batch dimension, e.g. 3,224,224") from None
    if not shape or any(s < 1 for s in shape):
        raise CLIError(f"input shape {text!r} must be one or more positive sizes, e.g. 3,224,224")
    return shape


def _dtype_name(dtype) -> str:
    return str(dtype).removeprefix("torch.")


def _check_inputs_spec(text: str | None) -> str | None:
    """The --inputs spec, stripped, after checking its syntax (before any slow step)."""
    if text is None:
        return None
    from monet.inputs import parse_inputs_spec

    try:
        parse_inputs_spec(text)
    except ValueError as e:
        raise CLIError(f"--inputs: {e}") from None
    return text.strip()


def _build(model_name: str, batch_size: int | None, input_shape: tuple[int, ...] | None = None,
           device: str = "cpu", dtype=None, inputs_spec: str | None = None):
    """(model, `ExampleInputs`) on ``device``; the weights and inputs are the same on every call
    (seed 0). The inputs come from ``inputs_spec`` (--inputs), or the factory's own example inputs,
    or one tensor of ``(batch_size, *input_shape)`` (`monet.zoo.models.get_model_and_inputs`)."""
    import torch

    from monet.zoo.models import get_model_and_inputs

    if batch_size is not None and batch_size < 1:
        raise CLIError(f"--batch-size must be positive, got {batch_size}")
    torch.manual_seed(0)
    try:
        model, inputs = get_model_and_inputs(model_name, batch_size, input_shape, inputs_spec, dtype=dtype)
    except (ValueError, TypeError, FileNotFoundError, ImportError) as e:
        raise CLIError(f"cannot build model {model_name!r}: {e}") from None
    return model.to(device), inputs.to(device)


def _input_info(inputs, inputs_spec: str | None) -> dict:
    """What a solution records of its inputs: batch size, first tensor's sample shape and dtype,
    the --inputs spec (`monet.solution.SolutionMeta`)."""
    first = inputs.first
    return dict(batch_size=inputs.batch_size, input_shape=tuple(first.shape[1:]), dtype=_dtype_name(first.dtype),
                inputs_spec=inputs_spec)


def _resolve_device(text: str | None) -> str:
    import torch

    if text in (None, "auto"):
        return "cuda" if torch.cuda.is_available() else "cpu"
    if text.startswith("cuda") and not torch.cuda.is_available():
        raise CLIError(f"--device {text}: CUDA is not available on this machine (torch "
                       f"{torch.__version__}); use --device cpu")
    if not (text == "cpu" or text.startswith("cuda")):
        raise CLIError(f"--device must be cpu, cuda, cuda:N or auto, got {text!r}")
    return text


def _device_spec(gpu_spec: str | None, device: str):
    """The roofline model for --cost analytic: --gpu-spec, else the visible GPU's, else the CPU's."""
    from monet.profiling.sources import device_spec

    try:
        return device_spec(gpu_spec, device)
    except ValueError as e:
        raise CLIError(str(e)) from None


def _autocast_dtype(name: str | None, device: str, on: str):
    """The torch dtype of ``--autocast NAME`` for a schedule on ``device``, captured on ``on``."""
    if not name:
        return None
    import torch

    from monet.mixed_precision import CLI_NAMES

    dtype = CLI_NAMES[name]
    if dtype == "float16" and not device.startswith("cuda"):
        raise CLIError("--autocast fp16 is for CUDA only (--device cuda): on the CPU use --autocast bf16")
    if on.split(":")[0] != device.split(":")[0]:
        raise CLIError(f"--autocast needs the graph captured on {device} itself (autocast's casts differ "
                       f"between devices), but CUDA is not available here: solve on a machine with CUDA, "
                       f"or use --device cpu")
    return getattr(torch, dtype)


def _capture(model, x, autocast_dtype=None):
    from monet.capture import CaptureError, capture

    try:
        return capture(model, x, autocast_dtype=autocast_dtype)
    except CaptureError as e:
        raise CLIError(str(e)) from None
    except ValueError as e:  # no output requires a gradient
        raise CLIError(f"cannot capture the model: {e}") from None


def _profile_table(model, x, graph, device: str, cache_dir, **kw):
    from monet.profiling.profiler import load_or_profile

    try:
        return load_or_profile(model, x, graph, device, cache_dir=cache_dir, **kw)
    except ValueError as e:
        raise CLIError(str(e)) from None


# ----------------------------------------------------------------------------------------------
# monet solve
# ----------------------------------------------------------------------------------------------


def _solution_fields(meta) -> dict:
    """The solution's figures as ``--json`` reports them (bytes, seconds, fractions)."""
    overhead = (meta.objective_s / meta.eager_time_s - 1.0) if meta.eager_time_s else None
    return dict(status=meta.status, objective=meta.objective_s, bound=meta.bound_s, gap=meta.gap,
                solve_time_s=meta.solve_time_s, budget_bytes=meta.budget_bytes,
                predicted_peak_bytes=meta.predicted_peak_bytes, eager_peak_bytes=meta.eager_peak_bytes,
                predicted_overhead=overhead, model=meta.model, batch_size=meta.batch_size,
                input_shape=list(meta.input_shape), dtype=meta.dtype, mode=meta.mode, solver=meta.solver,
                device=meta.device, cost_source=meta.cost_source, inputs=meta.inputs_spec,
                autocast=meta.autocast[1] if getattr(meta, "autocast", None) else None)


def _parse_budget(text: str, eager_peak_bytes: int | None = None) -> int:
    from monet.solver.solve import parse_budget

    try:
        return parse_budget(text, eager_peak_bytes)
    except ValueError as e:
        raise CLIError(str(e)) from None


def _cmd_solve(args) -> int:
    from monet.solution import describe, save_solution
    from monet.impls import mode_tokens
    from monet.solver.solve import eager_peak, min_budget, min_budget_lower, solve

    try:
        mode_tokens(args.mode)
    except ValueError as e:
        raise CLIError(str(e)) from None
    output = Path(args.output)
    if not output.parent.is_dir():
        raise CLIError(f"cannot write {output}: the folder {output.parent} does not exist")
    shape = _parse_shape(args.input_shape)
    spec = _check_inputs_spec(args.inputs)
    budget = None
    if args.budget is not None and not args.budget.strip().endswith("%"):
        budget = _parse_budget(args.budget)  # fail before the slow steps; "50%" needs the peak
    import torch

    # --cost analytic needs no device: a schedule for a GPU can be solved on a laptop
    device = _resolve_device(args.device) if args.cost != "analytic" else args.device
    if not (device == "cpu" or device.startswith("cuda")):
        raise CLIError(f"--device must be cpu, cuda or cuda:N, got {device!r}")
    on = device if (device == "cpu" or torch.cuda.is_available()) else "cpu"
    amp = _autocast_dtype(args.autocast, device, on)

    with _step(f"building {args.model}") as s:
        model, x = _build(args.model, args.batch_size, shape, on, inputs_spec=spec)
        s["note"] = f"inputs {x.describe()}"
    under = f" under {_dtype_name(amp)} autocast" if amp else ""
    with _step(f"capturing the forward and backward graph{under}") as s:
        graph = _capture(model, x, amp)
        s["note"] = graph.describe()
    with _step(f"costing ({args.cost})") as s:
        table = _costs_table(args.cost, model, x, graph, device, args.gpu_spec, args.cache_dir)
        costs = _cost_arrays(graph, table)
        s["note"] = f"plain iteration {1e3 * costs.total_time:.1f} ms predicted"
    cost_fn = _cost_fn(args.cost, model, x, graph, table, device, args.gpu_spec)
    if args.cost == "analytic":
        _log("note: analytic costs count no kernel workspace, so the measured peak can exceed the "
             "budget by the kernels' temporaries; --cost hybrid or --cost profile measure them")
    eager = eager_peak(graph, costs)
    _log(f"plain PyTorch's simulated peak: {_size(eager)} ({eager} bytes)")
    info = dict(model=args.model, device=device.split(":")[0], **_input_info(x, spec))
    try:
        if args.min_budget:
            with _step(f"finding the smallest feasible budget ({args.solver}, "
                       f"time limit {args.time_limit:g} s)") as s:
                budget, proven = min_budget(graph, costs, args.mode, args.solver, args.time_limit,
                                            device.split(":")[0], cost_fn, progress=_log)
                lower = min_budget_lower(graph, costs, args.mode, args.solver, args.time_limit,
                                         device.split(":")[0], cost_fn)  # the same search, cached
                s["note"] = f"{_size(budget)}, " + ("proven minimal" if proven else "not proven minimal") + (
                    "" if proven or lower is None else f"; no schedule below {_size(lower)} (LP bound)")
        elif budget is None:
            budget = _parse_budget(args.budget, eager)
        with _step(f"solving at a budget of {_size(budget)} ({budget} bytes), mode {args.mode}, "
                   f"{args.solver}, time limit {args.time_limit:g} s") as s:
            sol = solve(graph, costs, budget, args.mode, solver=args.solver, time_limit=args.time_limit,
                        info=info, device=device.split(":")[0], cost_fn=cost_fn, progress=_log, gap=args.gap)
            s["note"] = f"{sol.meta.status}, predicted peak {_size(sol.meta.predicted_peak_bytes)}"
    except RuntimeError as e:  # the solver found no schedule in time
        raise CLIError(str(e)) from None
    save_solution(sol, output)
    _log(f"wrote {output}")
    print(describe(sol))
    if args.json:
        _print_json({**_solution_fields(sol.meta), "output": str(output)})
    return 0


def _costs_table(cost: str, model, x, graph, device: str, gpu_spec, cache_dir):
    """The cost table for --cost analytic, hybrid or profile (`monet.profiling.sources`)."""
    from monet.profiling.sources import cost_table

    _device_spec(gpu_spec, device)  # an unknown preset is a CLI error before any measurement
    try:
        return cost_table(cost, model, x, graph, device, gpu_spec, cache_dir)
    except ValueError as e:
        raise CLIError(str(e)) from None


def _cost_fn(cost: str, model, x, graph, table, device: str, gpu_spec):
    """Costs of the variant graphs of operator implementations, made the way --cost made ``table``."""
    from monet.profiling.sources import variant_cost_fn

    _device_spec(gpu_spec, device)
    return variant_cost_fn(cost, model, x, graph, table, device, gpu_spec)


def _cost_arrays(graph, table):
    from monet.profiling.costs import costs_for

    try:
        return costs_for(graph, table)
    except ValueError as e:
        raise CLIError(str(e)) from None


# ----------------------------------------------------------------------------------------------
# monet profile
# ----------------------------------------------------------------------------------------------


def _cmd_profile(args) -> int:
    import pandas as pd

    from monet.profiling.profiler import cache_path, profile_costs, save_costs

    if args.repeats < 1:
        raise CLIError(f"--repeats must be >= 1, got {args.repeats}")
    device = _resolve_device(args.device)
    shape = _parse_shape(args.input_shape)
    spec = _check_inputs_spec(args.inputs)
    amp = _autocast_dtype(args.autocast, device, device)
    with _step(f"building {args.model} on {device}") as s:
        model, x = _build(args.model, args.batch_size, shape, device, inputs_spec=spec)
        s["note"] = f"inputs {x.describe()}"
    under = f" under {_dtype_name(amp)} autocast" if amp else ""
    with _step(f"capturing the forward and backward graph{under}") as s:
        graph = _capture(model, x, amp)
        s["note"] = graph.describe()
    with _step(f"profiling {len(graph.fwd) + len(graph.bwd)} operators on {device} "
               f"({args.repeats} timed runs each)"):
        if args.output:
            table = profile_costs(model, x, graph, device, repeats=args.repeats, warmup=args.warmup)
            path = save_costs(table, args.output)
        else:
            path = cache_path(graph, device, args.cache_dir)
            if path.exists():
                _log(f"using the cached profile {path} (delete it to measure again)")
            table = _profile_table(model, x, graph, device, args.cache_dir, repeats=args.repeats,
                                   warmup=args.warmup)
    _log(f"wrote {path}")
    fwd = table[table["kind"] == "fwd"]
    bwd = table[table["kind"] == "bwd"]
    print(f"{args.model}, inputs {x.describe()}, on {device}: "
          f"forward {1e3 * fwd['time_s'].sum():.1f} ms, backward {1e3 * bwd['time_s'].sum():.1f} ms, "
          f"largest workspace {_mib(int(table['workspace_bytes'].max()))}")
    top = table.sort_values("time_s", ascending=False).head(args.top)
    view = pd.DataFrame({
        "kind": top["kind"], "node": top["node"], "op": top["op"].str.removeprefix("aten."),
        "time_ms": (1e3 * top["time_s"]).round(3),
        "share_%": (100 * top["time_s"] / table["time_s"].sum()).round(1),
        "workspace_MiB": (top["workspace_bytes"] / MiB).round(2),
        "GFLOP": (top["flops"] / 1e9).round(3),
    })
    print(f"slowest {len(view)} of {len(table)} operators:")
    print(view.to_string(index=False))
    print(f"cost table: {path}")
    return 0


# ----------------------------------------------------------------------------------------------
# monet check
# ----------------------------------------------------------------------------------------------


def _cmd_check(args) -> int:
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
        device = _resolve_device(args.device)
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
    with _step(f"building {model_name} (batch {meta.batch_size}, {what}) on {device}"):
        model, x = _build(model_name, meta.batch_size, None if spec else meta.input_shape, device,
                          dtype=None if spec else dtype, inputs_spec=spec)
        g = chk.output_grad(model, x, autocast=amp)  # None: trained through its loss (loss_of)

    def wrapped_model():
        return MONeTWrapper(copy.deepcopy(model), sol, meta.input_shape)

    results = dict(peak_bytes=None, eager_measured_peak_bytes=None, grad_rel_error=None,
                   grads_bitwise_equal=None, buffers_bitwise_equal=None, overhead=None,
                   median_time_s=None, eager_median_time_s=None)
    try:
        if want_diff:
            with _step("comparing gradients with plain PyTorch (one iteration, same weights and RNG)"):
                diff, equal, bequal = chk.compare_gradients(lambda: copy.deepcopy(model), wrapped_model, x, g,
                                                            autocast=amp)
            results.update(grad_rel_error=diff, grads_bitwise_equal=equal, buffers_bitwise_equal=bequal)
        if want_bs or want_rt:
            wrapped, plain = wrapped_model(), copy.deepcopy(model)
        if want_bs:
            with _step("measuring the peak memory of one iteration: schedule, then plain PyTorch"):
                results["peak_bytes"] = chk.measure_iteration_peak(wrapped, x, g, autocast=amp)
                results["eager_measured_peak_bytes"] = chk.measure_iteration_peak(plain, x, g, autocast=amp)
        if want_rt:
            with _step(f"timing the schedule against plain PyTorch ({args.repeats} interleaved iterations)"):
                frac, tw, tp = chk.overhead(plain, wrapped, x, g, repeats=args.repeats,
                                            warmup=0 if want_bs else 1, autocast=amp)
            results.update(overhead=frac, median_time_s=tw, eager_median_time_s=tp)
    except SolutionMismatchError as e:
        raise CLIError(f"{args.file} does not fit {model_name}: {e}") from None

    failures = []
    peak, budget = results["peak_bytes"], meta.budget_bytes
    if peak is not None and peak > budget:
        failures.append(f"measured peak {peak} bytes ({_size(peak)}) exceeds the budget {budget} bytes "
                        f"({_size(budget)})")
    diff = results["grad_rel_error"]
    if diff is not None and not diff <= tolerance:
        failures.append(f"gradients differ from plain PyTorch by {diff:.3g} (relative), more than "
                        f"{tolerance:g}" + (f" (one unit of {amp[1]} precision)" if amp else ""))

    rows = [("budget", _mib(budget)), ("predicted peak (schedule)", _mib(meta.predicted_peak_bytes)),
            ("simulated peak (plain PyTorch)", _mib(meta.eager_peak_bytes))]
    if peak is not None:
        eager_m = results["eager_measured_peak_bytes"]
        rows += [("measured peak (schedule)", _mib(peak)),
                 ("measured peak (plain PyTorch)", _mib(eager_m)),
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
                 ("overhead (measured)", _pct(results["overhead"]))]
    rows.append(("result", "FAILED" if failures else "passed"))
    print(_table(rows))
    for f in failures:
        print(f"monet: check failed: {f}", file=sys.stderr)
    if args.json:
        _print_json({**_solution_fields(meta), **results, "file": str(args.file), "check_device": device,
                     "passed": not failures, "failures": failures})
    return EXIT_CHECK_FAILED if failures else 0


# ----------------------------------------------------------------------------------------------
# monet demo
# ----------------------------------------------------------------------------------------------


def _loss(out, target, tokens: bool):
    import torch.nn.functional as F

    if tokens and out.dim() == 3:  # (B, T, V) -> classes on dim 1
        out = out.transpose(1, 2)
    return F.cross_entropy(out, target)


def _cmd_demo(args) -> int:
    import torch

    from monet.profiling import check as chk
    from monet.solution import describe
    from monet.solver.ilp import InfeasibleBudgetError
    from monet.solver.solve import eager_peak, same_kernels_solution, solve
    from monet.wrapper import MONeTWrapper
    from monet.zoo.models import MODELS

    t_start = time.perf_counter()
    device = _resolve_device(args.device)
    shape = _parse_shape(args.input_shape)
    spec = _check_inputs_spec(args.inputs)
    if shape is None and spec is None and args.model == DEMO_MODEL:
        shape = DEMO_SHAPE
    batch = args.batch_size
    if batch is None:  # a file model without --input-shape or --inputs must bring its own inputs (and batch)
        own = shape is None and spec is None and ".py:" in args.model
        batch = None if own else DEMO_BATCH
    with _step(f"building {args.model} on {device}") as s:
        model, x = _build(args.model, batch, shape, device, inputs_spec=spec)
        s["note"] = (f"{sum(p.numel() for p in model.parameters()) / 1e6:.1f} M parameters, "
                     f"inputs {x.describe()}")
    shape = tuple(x.first.shape[1:])
    with _step("capturing the forward and backward graph") as s:
        graph = _capture(model, x)
        s["note"] = graph.describe()
    with _step("costing: analytic times, workspace from a quick profile (cached after the first run)"):
        gpu_spec = None
        if device != "cpu":
            try:
                _device_spec(None, device)
            except CLIError:  # a GPU without a preset: h100's roofline ranks the recomputations
                gpu_spec = "h100"
        table = _costs_table("hybrid", model, x, graph, device, gpu_spec, args.cache_dir)
        costs = _cost_arrays(graph, table)
    cost_fn = _cost_fn("hybrid", model, x, graph, table, device, gpu_spec)
    mode = "inplace_conv_multiway_newnode"
    kw = dict(time_limit=args.time_limit, info=None, device=device.split(":")[0], cost_fn=cost_fn)
    eager = eager_peak(graph, costs)
    budget = _parse_budget(args.budget, eager)
    kw["info"] = dict(model=args.model, device=device.split(":")[0], **_input_info(x, spec))
    _log(f"plain PyTorch's simulated peak: {_size(eager)}; target budget {args.budget}: {_size(budget)}")
    note = ""
    try:
        with _step(f"solving the ILP at {_size(budget)} (mode {mode}, CBC, time limit {args.time_limit:g} s)") as s:
            try:
                sol = solve(graph, costs, budget, mode, **kw)
                s["note"] = f"{sol.meta.status}, predicted peak {_size(sol.meta.predicted_peak_bytes)}"
            except InfeasibleBudgetError as e:
                if e.min_budget_bytes is None:
                    raise
                s["note"] = "infeasible"
                note = (f"the budget {args.budget} ({_size(budget)}) is infeasible for this model: "
                        f"solved at the smallest feasible budget found, {_size(e.min_budget_bytes)} "
                        f"({100 * e.min_budget_bytes / eager:.0f} %)")
                budget = e.min_budget_bytes
        if note:
            _log(note)
            with _step(f"solving the ILP at {_size(budget)} (mode {mode}, CBC, time limit {args.time_limit:g} s)") as s:
                sol = solve(graph, costs, budget, mode, **kw)
                s["note"] = f"{sol.meta.status}, predicted peak {_size(sol.meta.predicted_peak_bytes)}"
    except RuntimeError as e:
        raise CLIError(str(e)) from None
    print(describe(sol))

    # train side by side from the same weights, data and RNG
    tokens = args.model in MODELS and MODELS[args.model].input_kind == "tokens"
    plain = copy.deepcopy(model)
    wrapped = MONeTWrapper(copy.deepcopy(model), sol, shape)
    # implementations with other arithmetic than PyTorch's change gradients by themselves; the
    # same implementations without the schedule (keep everything) separate their effect from the
    # schedule's
    impls = collections.Counter(sol.schedule.impl.values())
    same = (MONeTWrapper(copy.deepcopy(model), same_kernels_solution(graph, costs, sol, kw["device"], cost_fn), shape)
            if impls else None)
    opt_p = torch.optim.SGD(plain.parameters(), lr=0.01, momentum=0.9)
    opt_w = torch.optim.SGD(wrapped.parameters(), lr=0.01, momentum=0.9)
    gen = torch.Generator().manual_seed(1)
    with torch.no_grad():
        probe = x.call(copy.deepcopy(model).eval())
    if isinstance(probe, torch.Tensor):  # a classifier's logits: cross-entropy with a random target
        out_shape = probe.shape
        n_classes = out_shape[-1] if tokens else out_shape[1]
        target_shape = out_shape[:-1] if tokens else (out_shape[0], *out_shape[2:])
        target = torch.randint(0, n_classes, tuple(target_shape), generator=gen).to(device)

        def loss_fn(out):
            return _loss(out, target, tokens)
    else:  # a ModelOutput or dict: its own loss (transformers given labels), see check.loss_of
        loss_fn = chk.loss_of
    losses_p, losses_w, losses_s, grad_diff, same_diff = [], [], [], 0.0, 0.0
    opt_s = torch.optim.SGD(same.parameters(), lr=0.01, momentum=0.9) if same is not None else None
    runs = [(wrapped, opt_w, losses_w), (plain, opt_p, losses_p)] + ([(same, opt_s, losses_s)] if same else [])
    with _step(f"training {args.steps} SGD steps with the schedule and with plain PyTorch"):
        for step in range(args.steps):
            for m, opt, acc in runs:
                torch.manual_seed(step)
                opt.zero_grad(set_to_none=True)
                loss = loss_fn(x.call(m))
                loss.backward()
                acc.append(loss.detach().clone())
            # by position: the wrapper's parameter names carry a "model." prefix
            gw = {i: p.grad for i, p in enumerate(wrapped.parameters()) if p.grad is not None}
            gp = {i: p.grad for i, p in enumerate(plain.parameters()) if p.grad is not None}
            if step == 0:  # later steps start from weights the first step's difference moved
                grad_diff = chk.grad_rel_error(gw, gp)
            if same is not None:
                gs = {i: p.grad for i, p in enumerate(same.parameters()) if p.grad is not None}
                same_diff = max(same_diff, chk.grad_rel_error(gw, gs))
            opt_w.step()
            opt_p.step()
            if opt_s is not None:
                opt_s.step()
            _log(f"  step {step + 1}: loss {losses_w[-1].item():.6f} (schedule), "
                 f"{losses_p[-1].item():.6f} (plain PyTorch)")
    identical = all(torch.equal(a, b) for a, b in zip(losses_w, losses_p))
    g = chk.output_grad(model, x)
    with _step("measuring the peak memory of one iteration: schedule, then plain PyTorch"):
        peak_w = chk.measure_iteration_peak(wrapped, x, g)
        peak_p = chk.measure_iteration_peak(plain, x, g)
    with _step(f"timing {args.repeats} interleaved iterations of each"):  # both warm by now
        frac, tw, tp = chk.overhead(plain, wrapped, x, g, repeats=args.repeats, warmup=0)

    rows = [("model", f"{args.model}, inputs {x.describe()}, {device}"),
            ("plain PyTorch peak (measured)", _mib(peak_p)),
            ("monet peak (measured)", _mib(peak_w)),
            ("budget", _mib(budget) + (" (smallest feasible found)" if note
                                       else f" ({args.budget} of simulated plain peak)")),
            ("monet peak (predicted)", _mib(sol.meta.predicted_peak_bytes)),
            ("memory saved", f"{100 * (1 - peak_w / peak_p):.1f} %"),
            ("overhead (measured)", f"{_pct(frac)} ({1e3 * tw:.0f} ms vs {1e3 * tp:.0f} ms per iteration)"),
            ("overhead (predicted)", _pct(sol.meta.objective_s / sol.meta.eager_time_s - 1)
             if sol.meta.eager_time_s else "-"),
            ("implementations other than PyTorch's", ", ".join(f"{k} x{n}" for k, n in sorted(impls.items()))
             or "none"),
            ("gradient difference, step 1 (relative, all gradients)", f"{grad_diff:.3g}"),
            (f"losses bit-identical ({args.steps} steps)", "yes" if identical else "no")]
    if same is not None:
        rows += [("  the same implementations without the schedule:", ""),
                 (f"  gradient difference, all {args.steps} steps (relative)", f"{same_diff:.3g}"),
                 (f"  losses bit-identical ({args.steps} steps)",
                  "yes" if all(torch.equal(a, b) for a, b in zip(losses_w, losses_s)) else "no")]
    rows += [
            ("within budget", "yes" if peak_w <= budget else "NO")]
    print()
    print(_table(rows))
    if note:
        print(f"note: {note}")
    _log(f"demo finished in {time.perf_counter() - t_start:.0f} s")
    return 0


# ----------------------------------------------------------------------------------------------
# monet zoo
# ----------------------------------------------------------------------------------------------


def _cmd_zoo(args) -> int:
    return {"list": _zoo_list, "get": _zoo_get, "build": _zoo_build, "verify": _zoo_verify,
            "plot": _zoo_plot}[args.zoo_command](args)


def _zoo_list(args) -> int:
    from monet.zoo.index import index_path, list_entries, load_index

    records = load_index()
    if args.json:
        _print_json({"entries": records, "index": str(index_path())})
        return 0
    if not records:
        print(f"the zoo is empty ({index_path()} has no entries): build it with 'monet zoo build'")
        return 0
    print(list_entries().to_string(index=False))
    print(f"{len(records)} {'entry' if len(records) == 1 else 'entries'}; 'monet zoo get NAME -o FILE' writes one, "
          "MONeTWrapper(model, \"zoo:NAME\", input_shape) uses one")
    return 0


def _zoo_get(args) -> int:
    import shutil

    from monet.solution import describe
    from monet.zoo.index import get, path_of

    sol = get(args.name)  # unknown names and unreadable files fail here, before writing anything
    src = path_of(args.name)
    print(describe(sol))
    if args.output:
        out = Path(args.output)
        if not out.parent.is_dir():
            raise CLIError(f"cannot write {out}: the folder {out.parent} does not exist")
        shutil.copyfile(src, out)
        _log(f"wrote {out}")
    else:
        print(f"file: {src}  (use -o FILE to copy it)")
    if args.json:
        _print_json({**_solution_fields(sol.meta), "name": args.name, "output": args.output, "file": str(src)})
    return 0


def _zoo_build(args) -> int:
    from monet.zoo import build as zb

    models = [m.strip() for m in args.models.split(",") if m.strip()] if args.models else None
    budgets = [b.strip() for b in args.budgets.split(",") if b.strip()] if args.budgets else None
    if args.jobs < 1:
        raise CLIError(f"--jobs must be >= 1, got {args.jobs}")
    try:
        configs = zb._select(models, budgets)
    except ValueError as e:
        raise CLIError(str(e)) from None
    records, failures = zb.build(configs, root=args.out_dir, time_limit=args.time_limit, gap=args.gap,
                                 solver=args.solver, jobs=args.jobs, skip_existing=args.skip_existing,
                                 solver_log=not args.quiet)
    for f in failures:
        print(f"monet zoo: failed: {f}", file=sys.stderr)
    if args.json:
        _print_json({"entries": len(records), "failures": failures})
    return EXIT_CHECK_FAILED if failures else 0


def _zoo_verify(args) -> int:
    from monet.zoo import build as zb
    from monet.zoo.index import entry, load_index

    records = load_index(args.root)
    if args.names:
        records = [entry(name, args.root) for name in args.names]  # an unknown name lists the entries
    graphs: dict = {}
    results, bad = [], []
    for r in records:
        key = (r["model"], r["batch_size"], tuple(r["input_shape"]))
        if key not in graphs:
            with _step(f"capturing {r['model']} batch {r['batch_size']} (meta device)"):
                graphs[key] = zb.capture_config(*key)
        res = zb.verify(r["name"], graphs[key], args.root)
        results.append(res)
        ok = res["fits"] and res["matches_prediction"]
        if not ok:
            bad.append(r["name"])
        print(f"{r['name']}: simulated peak {_size(res['peak_bytes'])}, budget {_size(res['budget_bytes'])}, "
              f"{'ok' if ok else 'FAILED (' + ('over budget' if not res['fits'] else 'differs from the recorded prediction') + ')'}")
    print(f"{len(results) - len(bad)} of {len(results)} entries pass")
    if args.json:
        _print_json({"results": results, "failed": bad})
    return EXIT_CHECK_FAILED if bad else 0


def _zoo_plot(args) -> int:
    from monet.zoo import build as zb
    from monet.zoo.index import load_index

    records = load_index(args.root)
    if not records:
        raise CLIError("the zoo is empty: build it with 'monet zoo build' first")
    out = zb.plot_frontier(records, args.output)
    _log(f"wrote {out}")
    if args.markdown:
        zb.write_markdown(records, args.markdown, out)
        _log(f"wrote the zoo section of {args.markdown}")
    else:
        print(zb.markdown_table(records))
    return 0


# ----------------------------------------------------------------------------------------------
# argument parsing
# ----------------------------------------------------------------------------------------------


class _Formatter(argparse.RawDescriptionHelpFormatter):
    """Keeps the epilog's examples as written; adds a default to an option's help when it has one."""

    def _get_help_string(self, action):
        text = action.help or ""
        if action.default in (None, False, argparse.SUPPRESS) or "default" in text or not action.option_strings:
            return text
        return text + " (default: %(default)s)"


def build_parser() -> argparse.ArgumentParser:
    from monet import __version__

    parser = argparse.ArgumentParser(prog="monet", description=_DESCRIPTION, epilog=_EPILOG,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--version", action="version", version=f"monet {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    sub.required = True

    def model_args(p):
        p.add_argument("model", metavar="MODEL",
                       help='zoo name, "torchvision.models.resnet50()" or "path/to/file.py:factory"')
        p.add_argument("--batch-size", "-b", type=int, default=None,
                       help="batch size (required, except for a factory that returns (model, example_inputs): "
                            "its batch is then the inputs', and a different --batch-size is an error)")
        inputs_args(p)

    def inputs_args(p, shape_help="one sample's shape without the batch dimension, one float32 tensor "
                                  "(default: the zoo model's; other models need it or --inputs)"):
        shape = p.add_mutually_exclusive_group()
        shape.add_argument("--input-shape", metavar="C,H,W", default=None, help=shape_help)
        shape.add_argument("--inputs", metavar="SPEC", default=None, help=_INPUTS_HELP)

    # solve
    p = sub.add_parser("solve", help="solve the ILP for a model, batch size and budget",
                       description="Capture MODEL, cost every operator, solve MONeT's ILP at a memory\n"
                                   "budget and write the schedule to a solution file.",
                       epilog=_SOLVE_EPILOG, formatter_class=_Formatter)
    model_args(p)
    budget = p.add_mutually_exclusive_group(required=True)
    budget.add_argument("--budget", metavar="BUDGET",
                        help='memory budget: "6GB" (6 x 2^30 bytes), "6GiB", "6000MiB", bytes, or '
                             '"50%%" of plain PyTorch\'s simulated peak')
    budget.add_argument("--min-budget", action="store_true",
                        help="solve at the smallest feasible budget (found by a first ILP)")
    p.add_argument("--mode", default="inplace_conv_multiway_newnode",
                   help="what the ILP may choose (MONeT's modes): none (keep everything: plain PyTorch), "
                        "normal (recompute or store), or tokens joined by '_': conv (convolution "
                        "algorithms), multiway (store a node's input or output), newnode (compact "
                        "values: 1-bit ReLU/dropout masks, 4-bit max-pool offsets), inplace (ReLU and add "
                        "overwrite their input). Default: inplace_conv_multiway_newnode (all; 'full')")
    p.add_argument("--time-limit", type=float, default=60.0, metavar="S",
                   help="solver time limit in seconds; the best schedule found by then is kept")
    p.add_argument("--gap", type=float, default=0.02, metavar="FRACTION",
                   help="stop once the schedule is proven within this fraction of the best bound (0: optimal)")
    p.add_argument("--solver", type=str.upper, choices=["CBC", "HIGHS", "SCIP"], default="CBC",
                   help="MILP solver (HIGHS and SCIP need highspy / pyscipopt)")
    p.add_argument("--cost", choices=["analytic", "hybrid", "profile"], default="hybrid",
                   help="operator costs (default hybrid). analytic: a roofline model of --gpu-spec, deterministic, "
                        "needs no device, but counts no kernel workspace, so the measured peak can "
                        "exceed the budget by the kernels' temporaries; hybrid: analytic times, "
                        "workspace from a quick run of every operator on --device (cached); "
                        "profile: times and workspace measured on --device (cached)")
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
    p.add_argument("--json", action="store_true", help="print one JSON object as the last line of stdout")
    p.add_argument("-o", "--output", required=True, metavar="FILE", help="solution file to write")
    p.set_defaults(func=_cmd_solve)

    # check
    p = sub.add_parser("check", help="check a solution: gradients, peak memory, overhead",
                       description="Rebuild the solution's model and run its schedule against plain\n"
                                   "PyTorch. With no check flag, all three checks run.",
                       epilog=_CHECK_EPILOG, formatter_class=_Formatter)
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
    p.set_defaults(func=_cmd_check)

    # profile
    p = sub.add_parser("profile", help="measure operator times and workspace, write the cost table",
                       description="Run MODEL's joint forward+backward graph op by op on a device and\n"
                                   "record each operator's time and workspace.",
                       epilog=_PROFILE_EPILOG, formatter_class=_Formatter)
    model_args(p)
    p.add_argument("--device", default="cpu", help="cpu, cuda, cuda:N or auto")
    p.add_argument("--autocast", choices=["bf16", "fp16"], default=None,
                   help="profile the graph captured under torch.autocast (as monet solve --autocast)")
    p.add_argument("--repeats", type=int, default=5, help="timed runs per operator (the median is kept)")
    p.add_argument("--warmup", type=int, default=2, help="discarded runs per operator before timing")
    p.add_argument("--top", type=int, default=15, help="how many of the slowest operators to list")
    p.add_argument("--cache-dir", type=Path, default=None,
                   help="profile cache used without -o (default ~/.cache/monet/profiles)")
    p.add_argument("-o", "--output", default=None, metavar="FILE.csv",
                   help="write the cost table here (default: into the profile cache)")
    p.set_defaults(func=_cmd_profile)

    # demo
    p = sub.add_parser("demo", help="the whole job on ResNet-50 on the CPU in about three minutes",
                       description="Solve, train and measure a default model end to end.",
                       epilog=_DEMO_EPILOG, formatter_class=_Formatter)
    p.add_argument("--model", default=DEMO_MODEL, help="MODEL (see monet --help)")
    p.add_argument("--batch-size", "-b", type=int, default=None,
                   help=f"batch size (default {DEMO_BATCH}, or the inputs' of a factory that returns "
                        "(model, example_inputs))")
    inputs_args(p, shape_help=f"one sample's shape (default {','.join(map(str, DEMO_SHAPE))} for "
                              f"{DEMO_MODEL}, else the zoo model's)")
    p.add_argument("--device", default="auto", help="cpu, cuda, cuda:N or auto (CUDA if available)")
    p.add_argument("--steps", type=int, default=3, help="SGD steps to train")
    p.add_argument("--repeats", type=int, default=3, help="timed iterations of each for the overhead")
    p.add_argument("--budget", default="80%", help='memory budget, as for monet solve ("80%%", "200MiB", bytes)')
    p.add_argument("--time-limit", type=float, default=30.0, metavar="S", help="solver time limit per solve")
    p.add_argument("--cache-dir", type=Path, default=None,
                   help="profile cache (default ~/.cache/monet/profiles)")
    p.set_defaults(func=_cmd_demo)

    # zoo
    p = sub.add_parser("zoo", help="prebuilt schedules: list, get, build, verify, plot",
                       description="Prebuilt schedules for MONeT's configurations (ResNet-50 184, GoogLeNet 320,\n"
                                   "UNet 11, MobileNetV2 272, VGG-16 176 at 10 ... 5 GB; GPT-2 small 8 at 50 and\n"
                                   "33 % of its plain peak). Use one as \"zoo:NAME\" wherever a solution file goes.",
                       epilog=_ZOO_EPILOG, formatter_class=_Formatter)
    zoo = p.add_subparsers(dest="zoo_command", metavar="ZOO_COMMAND")
    zoo.required = True
    z = zoo.add_parser("list", help="table of the prebuilt schedules")
    z.add_argument("--json", action="store_true", help="print the index records as one JSON object")
    z = zoo.add_parser("get", help="describe a prebuilt schedule, or copy it to a file with -o")
    z.add_argument("name", metavar="NAME", help="entry name from 'monet zoo list', e.g. resnet50-184-6GB")
    z.add_argument("-o", "--output", metavar="FILE", help="write the solution file here")
    z.add_argument("--json", action="store_true", help="print one JSON object as the last line of stdout")
    from monet.zoo.build import BATCH, DEFAULT_TIME_LIMIT

    z = zoo.add_parser("build", help="(re)generate the zoo: capture, cost, solve every entry, write the index",
                       formatter_class=_Formatter,
                       description="Regenerate the prebuilt schedules and index.json (in the installed zoo\n"
                                   "unless --out-dir). Costs: a profile in zoo/profiles/ for the graph, else the\n"
                                   "analytic P100 roofline. An infeasible budget is logged with the smallest\n"
                                   "feasible one, and one '<model>-<batch>-min' entry is made at that budget.")
    z.add_argument("--models", default=None, metavar="M1,M2",
                   help=f"comma-separated models (default: all: {', '.join(BATCH)})")
    z.add_argument("--budgets", default=None, metavar="B1,B2",
                   help="budgets instead of each model's own (default 10GB ... 5GB for the CNNs, 50%%,33%% for GPT-2)")
    z.add_argument("--time-limit", type=float, default=DEFAULT_TIME_LIMIT, metavar="S", help="seconds per solve")
    z.add_argument("--gap", type=float, default=0.02, metavar="FRACTION",
                   help="stop a solve once proven within this fraction of the bound")
    z.add_argument("--solver", type=str.upper, choices=["CBC", "HIGHS", "SCIP"], default="CBC", help="MILP solver")
    z.add_argument("--jobs", "-j", type=int, default=1, help="models solved in parallel, one process each")
    z.add_argument("--skip-existing", action="store_true",
                   help="keep entries already built for the same graph (resume an interrupted build)")
    z.add_argument("--quiet", action="store_true", help="no solver progress lines, only one line per entry")
    z.add_argument("--out-dir", type=Path, default=None, metavar="DIR",
                   help="zoo folder to write (index.json, schedules/); default the installed zoo")
    z.add_argument("--json", action="store_true", help="print one JSON object as the last line of stdout")
    z = zoo.add_parser("verify", help="check entries: load, graph fingerprint, simulated peak within budget")
    z.add_argument("names", nargs="*", metavar="NAME", help="entries to check (default: all)")
    z.add_argument("--root", type=Path, default=None, metavar="DIR", help="zoo folder (default the installed zoo)")
    z.add_argument("--json", action="store_true", help="print one JSON object as the last line of stdout")
    z = zoo.add_parser("plot", help="plot the predicted frontier (peak vs overhead) per model; markdown table")
    z.add_argument("-o", "--output", required=True, metavar="FILE.png", help="PNG to write")
    z.add_argument("--markdown", type=Path, default=None, metavar="FILE.md",
                   help="(re)write the '## Schedule zoo' section of this file (e.g. BENCHMARKS.md)")
    z.add_argument("--root", type=Path, default=None, metavar="DIR", help="zoo folder (default the installed zoo)")
    p.set_defaults(func=_cmd_zoo)
    return parser


def _known_errors() -> tuple[type[BaseException], ...]:
    from monet.capture import CaptureError
    from monet.solution import SolutionFileError, SolutionMismatchError
    from monet.solver.ilp import InfeasibleBudgetError

    return CLIError, InfeasibleBudgetError, SolutionFileError, SolutionMismatchError, CaptureError


def _quiet_and_steady_environment() -> None:
    """Environment defaults for this process; a value the user set is kept.

    * ``KINETO_LOG_LEVEL=6``: torch.profiler, which measures CPU memory here, otherwise prints two
      kineto lines to stderr each time it starts and stops.
    * ``OMP_WAIT_POLICY=PASSIVE``, only if torch is not imported yet (OpenMP reads it once): spinning
      OpenMP threads made iterations 0.4 to 6 s on a shared 2-core machine, waiting ones are steady
      (see BENCHMARKS.md, which sets it for the same reason).
    """
    os.environ.setdefault("KINETO_LOG_LEVEL", "6")
    if "torch" not in sys.modules:
        os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")


def main(argv: list[str] | None = None) -> int:
    """Run the command line; returns the exit status (the console script exits with it)."""
    parser = build_parser()
    args = parser.parse_args(argv)
    _quiet_and_steady_environment()
    try:
        known = _known_errors()
        code = args.func(args)
    except KeyboardInterrupt:
        print("monet: interrupted", file=sys.stderr)
        return 130
    except Exception as e:  # known errors become one line, others keep their traceback
        if not isinstance(e, known):
            raise
        message = str(e).strip() or type(e).__name__
        print(f"monet: error: {message}", file=sys.stderr, flush=True)
        if getattr(args, "json", False):
            extra = getattr(e, "extra", {}) or {}
            if getattr(e, "min_budget_bytes", None) is not None:
                extra = {**extra, "min_budget_bytes": e.min_budget_bytes}
            _print_json({"error": message, **extra})
        return getattr(e, "code", EXIT_ERROR)
    return code


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
