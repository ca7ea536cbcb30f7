"""Mixed precision: the autocast setting a graph is captured under and a solution is bound to.

A graph traced inside ``torch.autocast(device_type, dtype)`` is another graph: AOTAutograd records
what autocast did, so the joint graph holds the casts (``aten._to_copy`` of the weights and inputs
to bf16/fp16, of the weight gradients back to fp32) and 16-bit activations, whose bytes the memory
model counts at 2 per element.  A schedule solved for that graph keeps, drops and recomputes those
16-bit tensors (and the casts), so it only fits a training loop that runs the same autocast.

An autocast *setting* is ``None`` (no autocast: the model's own dtypes) or a tuple
``(device_type, dtype_name)``, e.g. ``("cpu", "bfloat16")`` or ``("cuda", "float16")``: autocast
policies (which ops run in 16 bits, which in fp32) differ between device types, so the device
type is part of the setting.  The setting enters the graph's summary as one last line
(``autocast cpu bfloat16``), hence its fingerprint; an fp32 graph has no such line, so
fingerprints of graphs captured without autocast are what they always were.

This module is torch-free at import (`monet.solution` reads settings from a summary without torch).
"""
from __future__ import annotations

import contextlib

from monet.terms import arg

#: ``--autocast`` names and the dtype names they stand for.
CLI_NAMES = {"bf16": "bfloat16", "fp16": "float16", "bfloat16": "bfloat16", "float16": "float16"}
#: 16-bit float dtypes autocast can run in.
DTYPES = ("bfloat16", "float16")
_LINE = "autocast"


def _dtype_name(dtype) -> str:
    return str(dtype).removeprefix("torch.")


def normalize(setting) -> tuple[str, str] | None:
    """``None`` or ``(device_type, dtype)`` (dtype a ``torch.dtype`` or a name, device type a string
    or ``torch.device``) -> ``None`` or ``("cpu", "bfloat16")``.

    Raises:
        ValueError: for anything else, or a dtype autocast does not run in.
    """
    if setting is None:
        return None
    if not isinstance(setting, (tuple, list)) or len(setting) != 2:
        raise ValueError(f"an autocast setting is None or (device_type, dtype), got {setting!r}")
    device, dtype = setting
    device = str(getattr(device, "type", device)).split(":")[0]
    dtype = CLI_NAMES.get(_dtype_name(dtype), _dtype_name(dtype))
    if dtype not in DTYPES:
        raise ValueError(f"autocast runs in bfloat16 or float16, not {dtype!r}")
    return (device, dtype)


def current(device_type: str) -> tuple[str, str] | None:
    """The autocast setting in force for tensors on ``device_type`` ("cpu", "cuda") right now;
    None also for a device autocast does not know (``meta``, used to capture without memory)."""
    import torch

    device_type = str(getattr(device_type, "type", device_type)).split(":")[0]
    try:
        enabled = torch.is_autocast_enabled(device_type)
    except RuntimeError:  # "unknown device type for autocast"
        return None
    if not enabled:
        return None
    return (device_type, _dtype_name(torch.get_autocast_dtype(device_type)))


def context(setting):
    """A context manager that runs under ``setting``: ``torch.autocast(device_type, dtype)``, or
    nothing for ``None``."""
    setting = normalize(setting)
    if setting is None:
        return contextlib.nullcontext()
    import torch

    return torch.autocast(setting[0], dtype=getattr(torch, setting[1]))


def describe(setting) -> str:
    """``"bfloat16 autocast on cpu"`` or ``"no autocast"``."""
    setting = normalize(setting)
    return "no autocast" if setting is None else f"{setting[1]} autocast on {setting[0]}"


def summary_line(setting) -> str | None:
    """The graph-summary line of a setting (``None`` for no autocast: fp32 summaries are unchanged)."""
    setting = normalize(setting)
    return None if setting is None else f"{_LINE} {setting[0]} {setting[1]}"


def from_summary(lines) -> tuple[str, str] | None:
    """The setting recorded in a graph summary (`monet.graph.OpGraph.summary`)."""
    lines = list(lines)
    parts = str(lines[-1]).split() if lines else []
    if len(parts) == 3 and parts[0] == _LINE:  # the autocast line, when there is one, is the last
        return normalize((parts[1], parts[2]))
    return None


def mismatch_message(solution, running) -> str | None:
    """Why a solution made under ``solution`` cannot run under ``running`` (None when it can).

    The message names both settings and what to do: enter or leave ``torch.autocast``, or solve again
    with (or without) ``--autocast``.
    """
    solution, running = normalize(solution), normalize(running)
    if solution == running:
        return None
    made = f"the solution was made for {describe(solution)}"
    if solution is None:
        flag = "bf16" if running[1] == "bfloat16" else "fp16"
        return (f"the solution was made without autocast (full precision) but the forward pass runs under "
                f"{describe(running)} "
                f"(torch.autocast({running[0]!r}, dtype=torch.{running[1]})): its graph has other casts, dtypes "
                f"and sizes. Either call the model outside the autocast context, or solve a schedule for "
                f"mixed precision: "
                + arg(f"autocast_dtype=torch.{running[1]} (monet.optimize, capture)", f"`monet solve ... --autocast {flag}`"))
    enter = f"torch.autocast({solution[0]!r}, dtype=torch.{solution[1]})"
    if running is None:
        return (f"{made} but the forward pass runs without autocast. Call the model inside "
                f"`with {enter}:` as the solution was solved for, or solve again without "
                + arg("autocast_dtype", "--autocast"))
    if running == ("cpu", "float16"):  # the CLI solves fp16 for CUDA only
        again = "solve again for this setting (capture(model, x, autocast_dtype=torch.float16))"
    else:
        flag = "bf16" if running[1] == "bfloat16" else "fp16"
        again = "solve again for this setting (" + arg(f"autocast_dtype=torch.{running[1]} on {running[0]}",
                                                      f"monet solve --autocast {flag} --device {running[0]}") + ")"
    if solution[0] != running[0]:  # autocast's casts differ between device types
        return f"{made} but the forward pass runs under {describe(running)}: {again}"
    return (f"{made} but the forward pass runs under {describe(running)}. Call the model inside "
            f"`with {enter}:`, or {again}")


__all__ = ["CLI_NAMES", "DTYPES", "normalize", "current", "context", "describe", "summary_line",
           "from_summary", "mismatch_message"]
