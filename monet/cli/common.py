"""What every ``monet`` command shares: exit codes, `CLIError`, progress and result output, and the
checks that turn a bad argument into one line on stderr before any slow step (`reported`)."""
from __future__ import annotations

import argparse
import json
import math
import sys
import time
from contextlib import contextmanager

from monet.terms import fmt_size  # noqa: F401 - the commands' size format (monet.cli.solve and check import it from here)

EXIT_ERROR = 2  # a known error: bad arguments, infeasible budget, unreadable solution ...
EXIT_CHECK_FAILED = 1  # monet check: measured peak above the budget, or gradients differ
MiB = 2**20
GiB = 2**30

INPUTS_HELP = """\
the model's inputs instead of one float tensor: comma-separated [NAME=]SHAPE[:DTYPE[:HIGH]], one
entry per argument (NAME= for a keyword argument, positional entries first), SHAPE one sample's
sizes without the batch joined by 'x' (3x224x224; empty for a scalar per sample), DTYPE float32
(default), bfloat16, float16, float64, int64, int32, int16, int8, uint8 or bool, HIGH the exclusive
upper bound of integer values (default 2). Floats are standard normal, integers uniform in
[0, HIGH), from a fixed seed. E.g. --inputs "input_ids=16:int64:50257,labels=16:int64:50257"
"""


class CLIError(Exception):
    """A known error: printed as ``monet: error: <message>``, exit status `EXIT_ERROR`."""

    def __init__(self, message: str, code: int = EXIT_ERROR, **extra):
        super().__init__(message)
        self.code = code
        self.extra = extra


@contextmanager
def reported(prefix: str = ""):
    """A ValueError raised inside (a library's answer to a bad argument) becomes a `CLIError`:
    ``monet: error: <prefix><message>``, exit status `EXIT_ERROR`, no traceback."""
    try:
        yield
    except ValueError as e:
        raise CLIError(prefix + str(e)) from None


# ----------------------------------------------------------------------------------------------
# output
# ----------------------------------------------------------------------------------------------


def log(message: str) -> None:
    """``monet: <message>`` on stderr (progress; results go to stdout)."""
    print(f"monet: {message}", file=sys.stderr, flush=True)


@contextmanager
def timed_step(what: str):
    """Log ``what ...`` then ``what: done in X s`` (to stderr)."""
    log(f"{what} ...")
    t0 = time.perf_counter()
    info: dict = {}
    yield info
    extra = f" ({info['note']})" if info.get("note") else ""
    log(f"{what}: done in {time.perf_counter() - t0:.1f} s{extra}")


def fmt_mib(nbytes) -> str:
    """Bytes as "1,234.5 MiB" ("-" for None)."""
    return "-" if nbytes is None else f"{nbytes / MiB:,.1f} MiB"


def fmt_pct(fraction) -> str:
    """A fraction as a signed percentage, "+12.3 %" ("-" for None)."""
    return "-" if fraction is None else f"{100 * fraction:+.1f} %"


def _json_value(v):
    if isinstance(v, float) and not math.isfinite(v):
        return None if math.isnan(v) else ("inf" if v > 0 else "-inf")
    if isinstance(v, tuple):
        return list(v)
    return v


def print_json(obj: dict) -> None:
    """``obj`` as one JSON line on stdout (non-finite floats as null / "inf", tuples as lists)."""
    print(json.dumps({k: _json_value(v) for k, v in obj.items()}), flush=True)


def rows_table(rows: list[tuple[str, str]]) -> str:
    """(label, value) rows as a two-column text table."""
    import pandas as pd

    frame = pd.DataFrame(rows, columns=["", "value"]).set_index("")
    frame.index.name = None
    return frame.to_string()


# ----------------------------------------------------------------------------------------------
# arguments
# ----------------------------------------------------------------------------------------------


class Formatter(argparse.RawDescriptionHelpFormatter):
    """Keeps the epilog's examples as written; adds a default to an option's help when it has one."""

    def _get_help_string(self, action):
        text = action.help or ""
        if action.default in (None, False, argparse.SUPPRESS) or "default" in text or not action.option_strings:
            return text
        return text + " (default: %(default)s)"


def add_model_args(p: argparse.ArgumentParser) -> None:
    """MODEL, --batch-size and the inputs' options (`add_inputs_args`) on a command's parser."""
    p.add_argument("model", metavar="MODEL",
                   help='zoo name, "torchvision.models.resnet50()" or "path/to/file.py:factory"')
    p.add_argument("--batch-size", "-b", type=int, default=None,
                   help="batch size (required, except for a factory that returns (model, example_inputs): "
                        "its batch is then the inputs', and a different --batch-size is an error)")
    add_inputs_args(p)


def add_inputs_args(p: argparse.ArgumentParser,
                    shape_help: str = "one sample's shape without the batch dimension, one float32 tensor "
                                      "(default: the zoo model's; other models need it or --inputs)") -> None:
    """--input-shape or --inputs (one of them) on a command's parser."""
    shape = p.add_mutually_exclusive_group()
    shape.add_argument("--input-shape", metavar="C,H,W", default=None, help=shape_help)
    shape.add_argument("--inputs", metavar="SPEC", default=None, help=INPUTS_HELP)


def parse_shape(text: str | None) -> tuple[int, ...] | None:
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


def dtype_name(dtype) -> str:
    """torch.float32 -> "float32"."""
    return str(dtype).removeprefix("torch.")


def check_inputs_spec(text: str | None) -> str | None:
    """The --inputs spec, stripped, after checking its syntax (before any slow step)."""
    if text is None:
        return None
    from monet.inputs import parse_inputs_spec

    with reported("--inputs: "):
        parse_inputs_spec(text)
    return text.strip()


def resolve_device(text: str | None) -> str:
    """--device: "auto" (or None) is CUDA where available, else the CPU; CUDA must be available."""
    import torch

    if text in (None, "auto"):
        return "cuda" if torch.cuda.is_available() else "cpu"
    if text.startswith("cuda") and not torch.cuda.is_available():
        raise CLIError(f"--device {text}: CUDA is not available on this machine (torch "
                       f"{torch.__version__}); use --device cpu")
    if not (text == "cpu" or text.startswith("cuda")):
        raise CLIError(f"--device must be cpu, cuda, cuda:N or auto, got {text!r}")
    return text


def autocast_dtype(name: str | None, device: str, on: str):
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


def parse_budget_arg(text: str, eager_peak_bytes: int | None = None) -> int:
    """--budget in bytes (`monet.solver.solve.parse_budget`; a percentage needs ``eager_peak_bytes``)."""
    from monet.solver.solve import parse_budget

    with reported():
        return parse_budget(text, eager_peak_bytes)


# ----------------------------------------------------------------------------------------------
# model, graph, costs: the library's steps, their ValueErrors reported as CLIErrors
# ----------------------------------------------------------------------------------------------


def build_model(model_name: str, batch_size: int | None, input_shape: tuple[int, ...] | None = None,
                device: str = "cpu", dtype=None, inputs_spec: str | None = None, **model_kwargs):
    """`monet.models.build` (the same weights and inputs on every call); a known error becomes a `CLIError`."""
    from monet.models import build

    with reported():
        return build(model_name, batch_size, input_shape, device, dtype, inputs_spec, **model_kwargs)


def build_and_capture(model_name: str, batch_size: int | None, input_shape, device: str, inputs_spec: str | None,
                      amp=None, building: str | None = None):
    """(model, inputs, graph): `build_model` and `capture_graph` (under autocast ``amp``, a dtype,
    when given), each a timed step; ``building`` replaces the first step's message."""
    with timed_step(building or f"building {model_name} on {device}") as s:
        model, x = build_model(model_name, batch_size, input_shape, device, inputs_spec=inputs_spec)
        s["note"] = f"inputs {x.describe()}"
    under = f" under {dtype_name(amp)} autocast" if amp else ""
    with timed_step(f"capturing the forward and backward graph{under}") as s:
        graph = capture_graph(model, x, amp)
        s["note"] = graph.describe()
    return model, x, graph


def capture_graph(model, x, autocast_dtype=None):
    """`monet.capture.capture`; a model that cannot be traced is a `CLIError`."""
    from monet.capture import CaptureError, capture

    try:
        return capture(model, x, autocast_dtype=autocast_dtype)
    except CaptureError as e:
        raise CLIError(str(e)) from None
    except ValueError as e:  # no output requires a gradient
        raise CLIError(f"cannot capture the model: {e}") from None


def checked_device_spec(gpu_spec: str | None, device: str):
    """The roofline model for --cost analytic: --gpu-spec, else the visible GPU's, else the CPU's
    (`monet.profiling.sources.device_spec`)."""
    from monet.profiling.sources import device_spec

    with reported():
        return device_spec(gpu_spec, device)


def costs_table(cost: str, model, x, graph, device: str, gpu_spec, cache_dir):
    """``(cost table, CostArrays)`` for --cost analytic, workspace, hybrid or profile
    (`monet.profiling.sources.solver_costs`)."""
    from monet.profiling.sources import solver_costs

    checked_device_spec(gpu_spec, device)  # an unknown preset is a CLI error before any measurement
    with reported():
        return solver_costs(cost, model, x, graph, device, gpu_spec, cache_dir)


def cost_fn_for(cost: str, model, x, graph, table, device: str, gpu_spec, cache_dir=None):
    """Costs of the variant graphs of operator implementations, made the way --cost made ``table``."""
    from monet.profiling.sources import variant_cost_fn

    checked_device_spec(gpu_spec, device)
    return variant_cost_fn(cost, model, x, graph, table, device, gpu_spec, cache_dir)


def profile_table(model, x, graph, device: str, cache_dir, **kw):
    """`monet.profiling.profiler.load_or_profile`: the cached profile, or a new one."""
    from monet.profiling.profiler import load_or_profile

    with reported():
        return load_or_profile(model, x, graph, device, cache_dir=cache_dir, **kw)


def solution_fields(meta) -> dict:
    """The solution's figures as ``--json`` reports them (bytes, seconds, fractions)."""
    overhead = meta.predicted_overhead()
    return dict(status=meta.status, objective=meta.objective_s, bound=meta.bound_s, gap=meta.gap,
                solve_time_s=meta.solve_time_s, budget_bytes=meta.budget_bytes,
                predicted_peak_bytes=meta.predicted_peak_bytes, eager_peak_bytes=meta.eager_peak_bytes,
                predicted_overhead=overhead, model=meta.model, batch_size=meta.batch_size,
                input_shape=list(meta.input_shape), dtype=meta.dtype, mode=meta.mode, solver=meta.solver,
                device=meta.device, cost_source=meta.cost_source, inputs=meta.inputs_spec,
                autocast=meta.autocast[1] if getattr(meta, "autocast", None) else None)
