"""monet profile: measure every operator's time and workspace on a device, write the cost table."""
from __future__ import annotations

from pathlib import Path

from monet.cli.common import (CLIError, MiB, add_model_args, autocast_dtype, build_and_capture, check_inputs_spec,
                              fmt_mib, log, parse_shape, profile_table, resolve_device, timed_step)


EPILOG = """\
examples:
  monet profile resnet50 --batch-size 184 --device cuda -o resnet50_184.profile
  monet profile resnet50 --batch-size 8 --input-shape 3,96,96 --repeats 3

The table (CSV: kind, node, op, impl, time_s, recompute_s, workspace_bytes, flops, bytes_moved,
source) is written to -o, or without -o to the profile cache, where "monet solve --cost profile"
finds it (keyed by the graph's fingerprint, the device name and the torch version).
"""


HELP = "measure operator times and workspace, write the cost table"
DESCRIPTION = ("Run MODEL's joint forward+backward graph op by op on a device and\n"
               "record each operator's time and workspace.")


def add_arguments(p) -> None:
    """The options of ``monet profile`` on its parser ``p``."""
    add_model_args(p)
    p.add_argument("--device", default="cpu", help="cpu, cuda, cuda:N or auto")
    p.add_argument("--autocast", choices=["bf16", "fp16"], default=None,
                   help="profile the graph captured under torch.autocast (as monet solve --autocast)")
    p.add_argument("--repeats", type=int, default=5, help="timed runs per operator (the median is kept)")
    p.add_argument("--warmup", type=int, default=2, help="discarded runs per operator before timing")
    p.add_argument("--top", type=int, default=15, help="how many of the slowest operators to list")
    p.add_argument("--cache-dir", type=Path, default=None,
                   help="profile cache, where `monet solve --cost profile` (same --cache-dir) reads the table "
                        "(default ~/.cache/monet/profiles)")
    p.add_argument("-o", "--output", default=None, metavar="FILE.csv",
                   help="also write a copy of the cost table here (a pandas CSV to read or share; monet solve "
                        "reads the cache, not this file)")



def run(args) -> int:
    """Profile ``args.model`` on ``args.device`` and write (or cache) its cost table; 0 on success.

    Raises:
        CLIError: a bad argument, a model that cannot be built or traced.
    """
    import pandas as pd

    from monet.profiling.profiler import cache_path, save_costs

    if args.repeats < 1:
        raise CLIError(f"--repeats must be >= 1, got {args.repeats}")
    device = resolve_device(args.device)
    shape = parse_shape(args.input_shape)
    spec = check_inputs_spec(args.inputs)
    amp = autocast_dtype(args.autocast, device, device)
    model, x, graph = build_and_capture(args.model, args.batch_size, shape, device, spec, amp)
    with timed_step(f"profiling {len(graph.fwd) + len(graph.bwd)} operators on {device} "
                    f"({args.repeats} timed runs each)"):
        path = cache_path(graph, device, args.cache_dir)
        if path.exists():
            log(f"using the cached profile {path} (delete it to measure again)")
        table = profile_table(model, x, graph, device, args.cache_dir, repeats=args.repeats, warmup=args.warmup)
    log(f"cached {path}: monet solve --cost profile reads it" + (f" (with --cache-dir {args.cache_dir})"
                                                                 if args.cache_dir else ""))
    if args.output:
        path = save_costs(table, args.output)
        log(f"wrote a copy to {path}")
    fwd = table[table["kind"] == "fwd"]
    bwd = table[table["kind"] == "bwd"]
    print(f"{args.model}, inputs {x.describe()}, on {device}: "
          f"forward {1e3 * fwd['time_s'].sum():.1f} ms, backward {1e3 * bwd['time_s'].sum():.1f} ms, "
          f"largest workspace {fmt_mib(int(table['workspace_bytes'].max()))}")
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
