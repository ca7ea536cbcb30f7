"""Wall time of `monet.optimize` against its ``time_limit``: where the call spends its time.

    python benchmarks/optimize_walltime.py                    # demo model + reach suite
    python benchmarks/optimize_walltime.py --models demo --time-limits 20
    python benchmarks/optimize_walltime.py --models gpt2-96,resnet50-b16 --time-limits 60 --fresh   # deep networks
    python benchmarks/optimize_walltime.py --models densenet121 --budget min --time-limits 60 --fresh

For each model (the demo's quarter-width ResNet-50 at batch 64, 3x64x64, and the reach suite's
torchvision, timm and transformers models at their table batches, `tests/reach_models.py`) and each
time limit, one call as a user makes it, ``monet.optimize(model, inputs, budget="50%",
time_limit=T, if_infeasible="smallest")`` (with ``loss_fn=F.cross_entropy`` and the target for a
classifier), run as it runs (`monet.plan.prepare`, then `Plan.solve` in `monet.plan.solve_limit`'s
share of the limit) and timed in phases (`monet.progress.Progress`): capture, costs, solve,
calibration, and the whole call.  The promise: the call returns within ``time_limit`` plus the capture and
the costing it reports, so the column "solve + calibration" is held against T.  Costs are measured
on this CPU once per model and cached (``--cache-dir``): the first time limit's row pays the
costing, later rows read the cache (the table says which); ``--fresh`` starts each model from an
empty cache, as on a machine that has not costed it before.  The deep networks are
`DEEP`'s configurations (``gpt2-96``: transformers' GPT-2 with 96 layers, hidden 256, 2 x 256
tokens; ``gpt2-small``: GPT-2 small's size, 12 layers, hidden 768, 2 x 512 tokens, vocab 50257;
``resnet50-b16``: torchvision's ResNet-50 at batch 16, 3x128x128; ``densenet121`` and ``swin_t``: at batch 2,
3x64x64), held against ``2 x T`` for the whole call (column "within 2T").

Each model runs in a process of its own (Dynamo's caches and the allocator start clean).  Prints
the table; ``--csv`` appends its rows, with their provenance, to a raw results file.
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


#: deep-network configurations: name -> (builder, arguments)
DEEP = {"gpt2-96": ("depth", ("gpt2", 96)), "llama-96": ("depth", ("llama", 96)), "bert-96": ("depth", ("bert", 96)),
        "gpt2-48": ("depth", ("gpt2", 48)), "gpt2-small": ("depth", ("gpt2", 12, 768, 512, 2, 50257)),
        "resnet50-b16": ("torchvision", ("resnet50", 16, 128)),
        "densenet121": ("torchvision", ("densenet121", 2, 64)), "swin_t": ("torchvision", ("swin_t", 2, 64))}


def build_deep(name: str):
    """(model, inputs, loss_fn, target) of a `DEEP` configuration."""
    import torch
    import torch.nn.functional as F

    kind, args = DEEP[name]
    sys.path.insert(0, str(ROOT / "tests"))
    if kind == "depth":
        sys.path.insert(0, str(ROOT / "benchmarks"))
        import depth

        model, inputs = depth.build(*args, *(256, 256, 2, 1024)[len(args) - 2:])  # hidden, seq, batch, vocab
        return model, inputs, None, None
    from reach_models import declare_torchvision_ops

    declare_torchvision_ops()
    import torchvision

    arch, batch, size = args
    torch.manual_seed(0)
    model = getattr(torchvision.models, arch)(num_classes=10).train()
    return model, torch.randn(batch, 3, size, size), F.cross_entropy, torch.randint(0, 10, (batch,))


def build(name: str):
    """(model, example inputs, loss_fn, target) of ``name``: "demo", a `DEEP` configuration or a
    reach-suite name."""
    import torch
    import torch.nn.functional as F

    if name in DEEP:
        return build_deep(name)
    if name == "demo":
        from monet.zoo.models import get_model

        torch.manual_seed(0)
        return get_model("resnet50", base_width=16).train(), torch.randn(64, 3, 64, 64), None, None
    sys.path.insert(0, str(ROOT / "tests"))
    import reach_models as rm

    model, inputs, target = rm.build(name, rm.TABLE_BATCH[name])
    if target is None:
        return model, inputs, None, None
    return model, inputs, F.cross_entropy, target


def gradients_against_plain(plan, solution, model, inputs, target) -> str:
    """One training step of ``plan``'s wrapper with ``solution`` against plain PyTorch's from the
    same weights (copies) and seed: ``bitwise`` or the largest relative difference
    (`depth.gradients`, `depth.grad_cell`)."""
    import copy

    sys.path.insert(0, str(ROOT / "benchmarks"))
    import depth
    from monet.inputs import ExampleInputs
    from monet.plan import WithLoss

    plain = plan.module
    wrapper = plan.wrap(solution, copy.deepcopy(plain))
    inputs = ExampleInputs.of(inputs)
    if target is not None:
        inputs = ExampleInputs(inputs.args, {**inputs.kwargs, "target": target})
    base = (lambda m: m.model if isinstance(m, WithLoss) else m)
    amp = plan.graph.autocast  # each forward pass as the graph was captured (None: no autocast)
    ours = depth.gradients(wrapper, inputs, amp, base(wrapper.model))
    reference = copy.deepcopy(plain)
    return depth.grad_cell(ours, depth.gradients(reference, inputs, amp, base(reference)))


def one(name: str, limits: list[float], cache_dir: str, budget: str = "50%", check_grads: bool = False) -> list[dict]:
    """The rows of one model (run in this process)."""
    from monet.plan import prepare, solve_limit
    from monet.progress import Progress

    model, inputs, loss_fn, target = build(name)
    rows = []
    for k, limit in enumerate(limits):
        bar = Progress(False)
        t0 = time.perf_counter()
        plan = prepare(model, inputs, loss_fn=loss_fn, target=target, cache_dir=cache_dir, progress=bar)
        # as `monet.optimize` does: what the capture and the costs leave of 2 x the limit
        sol = plan.solve(budget, time_limit=solve_limit(limit, time.perf_counter() - t0), if_infeasible="smallest",
                         progress=bar)
        total = time.perf_counter() - t0
        e = bar.elapsed
        after = e.get("solve", 0.0) + e.get("calibration", 0.0)
        rows.append(dict(model=name, time_limit_s=limit, capture_s=e.get("capture", 0.0), costs_s=e.get("costs", 0.0),
                         costs_cached=k > 0, solve_s=e.get("solve", 0.0), calibration_s=e.get("calibration", 0.0),
                         after_capture_and_costs_s=after, total_s=total, within=after <= limit,
                         within_twice=total <= 2 * limit, predicted_overhead=sol.meta.predicted_overhead(),
                         status=sol.meta.status, cost_source=str(sol.meta.cost_source),
                         budget_fraction=sol.meta.budget_bytes / plan.eager_peak_bytes,
                         gradients=gradients_against_plain(plan, sol, model, inputs, target) if check_grads else None))
        print(json.dumps(rows[-1]), file=sys.stderr, flush=True)
    return rows


HEADER = ["model", "T s", "capture s", "costs s", "solve s", "calibration s", "after s", "within T", "total s",
          "within 2T", "status", "budget", "predicted overhead", "gradients"]


def cells(rows: list[dict]) -> list[dict]:
    """The calls' rows as the table shows them: one dict of string cells (`HEADER`) per call; "after"
    is solve + calibration, the part the time limit covers."""
    out = []
    for r in rows:
        if "error" in r:
            out.append(dict.fromkeys(HEADER, "") | {"model": r["model"], "T s": str(r.get("time_limit_s", "")),
                                                    "status": r["error"][:80]})
            continue
        out.append(dict(zip(HEADER, [
            r["model"], f"{r['time_limit_s']:g}", f"{r['capture_s']:.1f}",
            f"{r['costs_s']:.1f}{' (cached)' if r['costs_cached'] else ''}", f"{r['solve_s']:.1f}",
            f"{r['calibration_s']:.1f}", f"{r['after_capture_and_costs_s']:.1f}", "yes" if r["within"] else "NO",
            f"{r['total_s']:.1f}", "yes" if r["within_twice"] else "NO", r["status"],
            f"{100 * r['budget_fraction']:.0f} %",
            "-" if r.get("predicted_overhead") is None else f"{100 * r['predicted_overhead']:+.1f} %",
            r.get("gradients") or "-"])))
    return out


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--models", default="all", help="comma-separated: demo and reach-suite names (default: all)")
    p.add_argument("--time-limits", default="10,20,60", help="comma-separated seconds (default 10,20,60)")
    p.add_argument("--cache-dir", default=str(Path.home() / ".cache" / "monet" / "profiles"))
    p.add_argument("--fresh", action="store_true", help="an empty cost cache per model (a machine that has not "
                   "costed it before; --cache-dir is then not read)")
    p.add_argument("--budget", default="50%", help="the budget of every call: a percentage or min (default 50%%)")
    p.add_argument("--check-grads", action="store_true", help="after each call, one training step of the wrapper "
                   "against plain PyTorch's: the gradients column (bitwise or the largest relative difference)")
    p.add_argument("--csv", type=Path, default=None, help="append the rows, with their provenance, to this raw "
                   "results file (benchmarks/results/optimize-walltime-deep.csv: `benchmarks/report.py` renders it)")
    p.add_argument("--one", default=None, help=argparse.SUPPRESS)  # child process: one model, JSON on stdout
    args = p.parse_args(argv)
    limits = [float(t) for t in args.time_limits.split(",")]
    if args.one:
        print(json.dumps(one(args.one, limits, args.cache_dir, args.budget, args.check_grads)))
        return 0
    if args.models == "all":
        sys.path.insert(0, str(ROOT / "tests"))
        import reach_models as rm
        names = ["demo"] + list(rm.MODELS)
    else:
        names = args.models.split(",")
    rows = []
    for name in names:
        cache = tempfile.mkdtemp(prefix="monet-fresh-") if args.fresh else args.cache_dir
        proc = subprocess.run([sys.executable, __file__, "--one", name, "--time-limits", args.time_limits,
                               "--cache-dir", cache, "--budget", args.budget]
                              + (["--check-grads"] if args.check_grads else []), capture_output=True, text=True)
        if proc.returncode != 0:
            rows.append(dict(model=name, error=(proc.stderr.strip().splitlines() or ["failed"])[-1]))
        else:
            rows += json.loads(proc.stdout.strip().splitlines()[-1])
        print(f"{name}: done", file=sys.stderr, flush=True)
    from monet.profiling.markdown import md_table
    from monet.profiling.raw_results import append_rows, command_line, provenance

    shown = cells(rows)
    print(md_table(HEADER, [list(r.values()) for r in shown]))
    if args.csv:
        append_rows(args.csv, shown, provenance(command_line("python benchmarks/optimize_walltime.py", argv)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
