"""The ``monet`` command line: solve, check, profile, demo, zoo.

One module per command (`monet.cli.solve`, `.check`, `.profile`, `.demo`, `.zoo`: its help texts,
its options and its ``run(args)``), what they share in `monet.cli.common`; the work itself is the
library's.

Every command writes its progress to stderr and its results to stdout.  With ``--json`` the last line of
stdout is one JSON object (``{"error": ...}`` when the command fails), so scripts can read it with
``tail -n 1``.  Known errors (an infeasible budget, a corrupt or mismatched solution file, a model that
cannot be traced, a malformed argument) end the command with ``monet: error: <message>`` on stderr and
exit status 2, without a traceback; ``monet check`` exits with 1 when the schedule fails a check.
"""
from __future__ import annotations

import argparse
import os
import sys

from monet.cli import check, demo, profile, solve, zoo
from monet.cli.common import EXIT_ERROR, CLIError, Formatter, print_json
from monet.terms import cli_terms

COMMANDS = (solve, check, profile, demo, zoo)  # in the order of ``monet --help``

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
  demo      plain PyTorch, Chen, torch.compile and monet at two budgets, side by side (CPU, a minute)
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


def build_parser() -> argparse.ArgumentParser:
    """The ``monet`` parser: one subcommand per module of `COMMANDS`."""
    from monet import __version__

    parser = argparse.ArgumentParser(prog="monet", description=_DESCRIPTION, epilog=_EPILOG,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--version", action="version", version=f"monet {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    sub.required = True
    for command in COMMANDS:  # each module: HELP, DESCRIPTION, EPILOG, add_arguments(p), run(args)
        p = sub.add_parser(command.__name__.rsplit(".", 1)[-1], help=command.HELP, description=command.DESCRIPTION,
                           epilog=command.EPILOG, formatter_class=Formatter)
        command.add_arguments(p)
        p.set_defaults(func=command.run)
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
    args.argv = list(sys.argv[1:] if argv is None else argv)  # the command line, for records that name it
    _quiet_and_steady_environment()
    try:
        known = _known_errors()
        with cli_terms():  # errors name the flags (`monet.terms`)
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
            print_json({"error": message, **extra})
        return getattr(e, "code", EXIT_ERROR)
    return code


__all__ = ["CLIError", "build_parser", "main"]
