"""monet zoo: the prebuilt schedules: list, get, build, verify, plot."""
from __future__ import annotations

import shlex
import sys
from pathlib import Path

from monet.solver import DEFAULT_GAP
from monet.cli.common import (EXIT_CHECK_FAILED, CLIError, Formatter, fmt_size, log, print_json, solution_fields,
                              timed_step)


EPILOG = """\
examples:
  monet zoo list
  monet zoo get resnet50-184-6GB -o resnet50_184_6GB.pkl
  monet check zoo:resnet50-184-6GB --run-bs          # any solution path takes zoo:NAME
  monet zoo build                                     # regenerate everything (up to 60 s per solve)
  monet zoo build --record-best                       # ... and write new best schedules into best_known.csv
  monet zoo build --models vgg16 --budgets 10GB --time-limit 60 --out-dir /tmp/zoo
  monet zoo verify                                    # every entry: loads, fingerprint, simulated peak
  monet zoo plot -o docs/zoo_frontier.png --csv benchmarks/results/zoo.csv

In Python: MONeTWrapper(model, "zoo:resnet50-184-6GB", input_shape=(3, 224, 224)).
"""


HELP = "prebuilt schedules: list, get, build, verify, plot"
DESCRIPTION = ("Prebuilt schedules for MONeT's configurations (ResNet-50 184, GoogLeNet 320,\n"
               "UNet 11, MobileNetV2 272, VGG-16 176 at 10 ... 5 GB; GPT-2 small 8 at 50 and\n"
               "33 % of its plain peak). Use one as \"zoo:NAME\" wherever a solution file goes.")


def add_arguments(p) -> None:
    """The options of ``monet zoo`` on its parser ``p``."""
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
                       formatter_class=Formatter,
                       description="Regenerate the prebuilt schedules and index.json (in the installed zoo\n"
                                   "unless --out-dir). Costs: a profile in zoo/profiles/ for the graph, else the\n"
                                   "analytic P100 roofline. An infeasible budget is logged with the smallest\n"
                                   "feasible one, and one '<model>-<batch>-min' entry is made at that budget.\n"
                                   "Each entry records its gap to the best schedule known within its budget\n"
                                   "(benchmarks/best_known.csv): best_known_s and vs_best in index.json.")
    z.add_argument("--models", default=None, metavar="M1,M2",
                   help=f"comma-separated models (default: all: {', '.join(BATCH)})")
    z.add_argument("--budgets", default=None, metavar="B1,B2",
                   help="budgets instead of each model's own (default 10GB ... 5GB for the CNNs, 50%%,33%% for GPT-2)")
    z.add_argument("--time-limit", type=float, default=DEFAULT_TIME_LIMIT, metavar="S",
                   help="seconds per solve (default %(default)g, monet solve's)")
    z.add_argument("--gap", type=float, default=DEFAULT_GAP, metavar="FRACTION",
                   help="stop a solve once proven within this fraction of the bound (default %(default)g)")
    z.add_argument("--solver", type=str.upper, choices=["CBC", "HIGHS", "SCIP"], default="CBC", help="MILP solver")
    z.add_argument("--jobs", "-j", type=int, default=1, help="models solved in parallel, one process each")
    z.add_argument("--skip-existing", action="store_true",
                   help="keep entries already built for the same graph (resume an interrupted build)")
    z.add_argument("--quiet", action="store_true", help="no solver progress lines, only one line per entry")
    z.add_argument("--out-dir", type=Path, default=None, metavar="DIR",
                   help="zoo folder to write (index.json, schedules/); default the installed zoo")
    z.add_argument("--record-best", action="store_true",
                   help="write entries that beat the best schedule known within their budget into "
                        "benchmarks/best_known.csv (under '10GB', or '50' for 50%%), with this command line")
    z.add_argument("--json", action="store_true", help="print one JSON object as the last line of stdout")
    z = zoo.add_parser("verify", help="check entries: load, graph fingerprint, simulated peak within budget")
    z.add_argument("names", nargs="*", metavar="NAME", help="entries to check (default: all)")
    z.add_argument("--root", type=Path, default=None, metavar="DIR", help="zoo folder (default the installed zoo)")
    z.add_argument("--json", action="store_true", help="print one JSON object as the last line of stdout")
    z = zoo.add_parser("plot", help="plot the predicted frontier (peak vs overhead) per model; markdown table")
    z.add_argument("-o", "--output", required=True, metavar="FILE.png", help="PNG to write")
    z.add_argument("--csv", type=Path, default=None, metavar="FILE.csv",
                   help="(re)write the zoo's rows, with their provenance, to this raw results file "
                        "(benchmarks/results/zoo.csv, which `python benchmarks/report.py` renders)")
    z.add_argument("--root", type=Path, default=None, metavar="DIR", help="zoo folder (default the installed zoo)")


def run(args) -> int:
    """Run the ``monet zoo`` subcommand of ``args`` (list, get, build, verify, plot)."""
    return {"list": _zoo_list, "get": _zoo_get, "build": _zoo_build, "verify": _zoo_verify,
            "plot": _zoo_plot}[args.zoo_command](args)


def _zoo_list(args) -> int:
    from monet.zoo.index import index_path, list_entries, load_index

    records = load_index()
    if args.json:
        print_json({"entries": records, "index": str(index_path())})
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

    from monet.solution import describe, load_solution
    from monet.zoo.index import path_of

    src = path_of(args.name)
    sol = load_solution(src)  # unknown names and unreadable files fail here, before writing anything
    print(describe(sol))
    if args.output:
        out = Path(args.output)
        if not out.parent.is_dir():
            raise CLIError(f"cannot write {out}: the folder {out.parent} does not exist")
        shutil.copyfile(src, out)
        log(f"wrote {out}")
    else:
        print(f"file: {src}  (use -o FILE to copy it)")
    if args.json:
        print_json({**solution_fields(sol.meta), "name": args.name, "output": args.output, "file": str(src)})
    return 0


def _zoo_build(args) -> int:
    from monet.zoo import build as zb

    models = [m.strip() for m in args.models.split(",") if m.strip()] if args.models else None
    budgets = [b.strip() for b in args.budgets.split(",") if b.strip()] if args.budgets else None
    if args.jobs < 1:
        raise CLIError(f"--jobs must be >= 1, got {args.jobs}")
    try:
        configs = zb.select_configs(models, budgets)
    except ValueError as e:
        raise CLIError(str(e)) from None
    command = None
    if args.record_best:
        command = "monet " + shlex.join(args.argv)
    records, failures = zb.build(configs, root=args.out_dir, time_limit=args.time_limit, gap=args.gap,
                                 solver=args.solver, jobs=args.jobs, skip_existing=args.skip_existing,
                                 solver_log=not args.quiet, record_best_by=command)
    for f in failures:
        print(f"monet zoo: failed: {f}", file=sys.stderr)
    if args.json:
        print_json({"entries": len(records), "failures": failures})
    return EXIT_CHECK_FAILED if failures else 0


def _zoo_verify(args) -> int:
    from monet.zoo import build as zb
    from monet.zoo import verify as zv
    from monet.zoo.index import entry, load_index

    records = load_index(args.root)
    if args.names:
        records = [entry(name, args.root) for name in args.names]  # an unknown name lists the entries
    graphs: dict = {}
    results, bad = [], []
    for r in records:
        key = (r["model"], r["batch_size"], tuple(r["input_shape"]))
        if key not in graphs:
            with timed_step(f"capturing {r['model']} batch {r['batch_size']} (meta device)"):
                graphs[key] = zb.capture_config(*key)
        res = zv.verify(r["name"], graphs[key], args.root)
        results.append(res)
        ok = res["fits"] and res["matches_prediction"]
        if not ok:
            bad.append(r["name"])
        why = "over budget" if not res["fits"] else "differs from the recorded prediction"
        print(f"{r['name']}: simulated peak {fmt_size(res['peak_bytes'])}, budget {fmt_size(res['budget_bytes'])}, "
              + ("ok" if ok else f"FAILED ({why})"))
    print(f"{len(results) - len(bad)} of {len(results)} entries pass")
    if args.json:
        print_json({"results": results, "failed": bad})
    return EXIT_CHECK_FAILED if bad else 0


def _zoo_plot(args) -> int:
    from monet.zoo import report as zr
    from monet.zoo.index import load_index

    records = load_index(args.root)
    if not records:
        raise CLIError("the zoo is empty: build it with 'monet zoo build' first")
    out = zr.plot_frontier(records, args.output)
    log(f"wrote {out}")
    if args.csv:
        zr.write_csv(records, args.csv, "monet " + shlex.join(args.argv))
        log(f"wrote the zoo's rows to {args.csv}")
    else:
        print(zr.markdown_table(records))
    return 0
