"""How far plain ``torch.compile``, monet compiled and monet eager are from eager PyTorch's gradients,
in float32 and in float64, on ``monet demo``'s quarter-width ResNet-50.

    python benchmarks/gradient_precision.py --csv benchmarks/results/gradient_precision.csv

Every method takes one training step (cross-entropy against the demo's random target) from the same
weights and batch; ``vs_eager`` and ``vs_compile`` are `monet.profiling.measure.max_rel_diff` of its
gradients against eager PyTorch's and against plain ``torch.compile``'s (Inductor, no budget);
monet's at `BUDGET` of the plain peak, or at the smallest feasible budget where that is below it
(``budget``: the solved budget as a share of the plain peak).  A
gap that float64 closes is the network's rounding, not a different computation: docs/design.md,
"Known limitations", cites these rows.  Raw rows only, with date, machine and command.
"""
from __future__ import annotations

import argparse
import copy
import sys
from pathlib import Path

from monet.profiling.raw_results import append_rows, command_line, provenance

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))
BUDGET = "50%"


def rows(dtype_name: str, time_limit: float) -> list[dict]:
    """The rows of one dtype ("fp32" or "fp64")."""
    import torch

    import monet
    from monet.cli.common import build_model
    from monet.cli.demo import DEMO_BATCH, DEMO_MODEL, DEMO_SHAPE, DEMO_WIDTH
    from monet.inputs import ExampleInputs
    from monet.plan import WithLoss
    from monet.profiling.measure import max_rel_diff, training_step
    from monet.profiling.training import random_target

    dtype = {"fp32": torch.float32, "fp64": torch.float64}[dtype_name]
    model, x = build_model(DEMO_MODEL, DEMO_BATCH, DEMO_SHAPE, "cpu", base_width=DEMO_WIDTH)
    model = model.to(dtype)
    x = ExampleInputs(tuple(a.to(dtype) for a in x.args), x.kwargs)
    loss_fn, target = random_target(model, x, False)
    inputs = ExampleInputs(x.args, {**x.kwargs, "target": target})

    def grads(module) -> dict:
        for p in module.parameters():
            p.grad = None
        torch.manual_seed(0)
        training_step(module, inputs)
        return {k: p.grad.detach().clone() for k, p in enumerate(module.parameters()) if p.grad is not None}

    eager = grads(WithLoss(copy.deepcopy(model), loss_fn))
    compiled = torch.compile(WithLoss(copy.deepcopy(model), loss_fn))
    grads(compiled)  # the first step compiles
    reference = grads(compiled)
    out = [dict(method="torch.compile", budget="", vs_eager=max_rel_diff(reference, eager), vs_compile=0.0)]
    for name, compile_ in (("monet compiled", True), ("monet", False)):
        torch.compiler.reset()
        w = monet.optimize(copy.deepcopy(model), x, budget=BUDGET, loss_fn=loss_fn, target=target, compile=compile_,
                           cost="analytic", time_limit=time_limit, progress=False, if_infeasible="smallest")
        grads(w)
        g = grads(w)
        meta = w.solution.meta
        out.append(dict(method=name, budget=f"{meta.budget_bytes / meta.eager_peak_bytes:.0%}", vs_eager=max_rel_diff(g, eager), vs_compile=max_rel_diff(g, reference)))
    return [dict(model=f"{DEMO_MODEL} (base width {DEMO_WIDTH})", dtype=dtype_name, **r) for r in out]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--dtypes", default="fp32,fp64", help="comma-separated: fp32, fp64 (default: both)")
    ap.add_argument("--time-limit", type=float, default=20.0, help="seconds per monet solve (default 20)")
    ap.add_argument("--csv", type=Path, help="append the rows to this CSV (written with a header if new)")
    args = ap.parse_args(argv)
    prov = provenance(command_line("python benchmarks/gradient_precision.py", argv))
    found = [r for d in args.dtypes.split(",") for r in rows(d.strip(), args.time_limit)]
    for r in found:
        print(f"{r['dtype']:5} {r['method']:15} vs eager {r['vs_eager']:.1e}  vs torch.compile {r['vs_compile']:.1e}")
    if args.csv:
        append_rows(args.csv, [{k: (f"{v:.2e}" if isinstance(v, float) else v) for k, v in r.items()} for r in found],
                    prov)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
