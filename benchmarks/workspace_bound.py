"""The analytic cost source's workspace bound against the workspace measured on this machine's CPU.

    python benchmarks/workspace_bound.py [--threads 2] [--batch 2] [--csv benchmarks/results/workspace-bound.csv]

For every forward and backward node of six models (the zoo's ResNet-50 and MobileNetV2 at 3x64x64,
and torchvision EfficientNet-B0, timm ConvNeXt-Atto and ViT-Tiny, transformers GPT-2 from
``tests/reach_models.py``), at batch ``--batch``: the workspace the profiler measures (one run per
node, `monet.profiling.profiler.profile_costs`: bytes allocated beyond the node's outputs while it
runs) and the bound the analytic source charges (`monet.profiling.workspace.workspace_bound` for
this thread count).  One row per op family: nodes, the largest measured workspace, the largest
bound, and the largest measured / bound ratio, which must stay at or under 1 for the analytic
source's schedules to hold their budget.  Progress goes to stderr.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

import pandas as pd
import torch

from monet.profiling.markdown import md_table
from monet.profiling.raw_results import append_rows, command_line, provenance

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))
LIBRARY_MODELS = ("torchvision/efficientnet_b0", "timm/convnext_atto", "timm/vit_tiny_patch16_224",
                  "transformers/gpt2")


def models(batch: int):
    """``(name, model, input)`` of the measured models."""
    import reach_models as rm
    from monet.zoo.models import get_model

    torch.manual_seed(0)
    for zoo in ("resnet50", "mobilenet_v2"):
        yield f"zoo/{zoo}", get_model(zoo), torch.randn(batch, 3, 64, 64)
    for name in LIBRARY_MODELS:
        model, x, _ = rm.build(name, batch)
        yield name, model, x


def measure(batch: int, threads: int) -> pd.DataFrame:
    """One row per node: model, op, family, measured workspace and bound (bytes), their ratio."""
    from monet.capture import capture
    from monet.profiling.profiler import profile_costs
    from monet.profiling.workspace import workspace_bound, workspace_family

    torch.set_num_threads(threads)
    rows = []
    for name, model, x in models(batch):
        print(f"workspace-bound: {name} ...", file=sys.stderr, flush=True)
        graph = capture(model, x)
        prof = profile_costs(model, x, graph, "cpu", repeats=1, warmup=0, progress=False).set_index(["kind", "node"])
        by_name = {n.name: n for n in graph.joint.graph.nodes}
        for node in list(graph.fwd) + list(graph.bwd):
            fx_node = by_name[node.name]
            rows.append(dict(model=name, op=node.op, family=workspace_family(fx_node),
                             measured=int(prof.loc[(node.kind, node.id), "workspace_bytes"]),
                             bound=workspace_bound(fx_node, "cpu", threads)))
    df = pd.DataFrame(rows)
    df["ratio"] = df.measured / df.bound
    return df


HEADER = ["family", "nodes", "largest measured MiB", "largest bound MiB", "max measured / bound", "node at the max ratio"]


def family_rows(df: pd.DataFrame) -> list[dict]:
    """One row of string cells (`HEADER`) per op family of the measured nodes ``df``."""
    t = df.groupby("family").agg(nodes=("measured", "size"), measured_max=("measured", "max"),
                                 bound_max=("bound", "max"), max_ratio=("ratio", "max"))
    worst = df.loc[df.groupby("family").ratio.idxmax()].set_index("family")
    rows = [[fam, str(int(r.nodes)), f"{r.measured_max / 2**20:.2f}", f"{r.bound_max / 2**20:.2f}",
             f"{r.max_ratio:.2f}", f"{worst.loc[fam, 'model']} `{worst.loc[fam, 'op']}`"] for fam, r in t.iterrows()]
    return [dict(zip(HEADER, r)) for r in rows]


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    p = argparse.ArgumentParser(prog="python benchmarks/workspace_bound.py", description=__doc__.split("\n\n")[0])
    p.add_argument("--threads", type=int, default=torch.get_num_threads(), help="torch threads (default: torch's)")
    p.add_argument("--batch", type=int, default=2, help="batch size of every model")
    p.add_argument("--csv", type=Path, default=None, help="append the rows, with their provenance, to this raw "
                   "results file (benchmarks/results/workspace-bound.csv: `benchmarks/report.py` renders it)")
    args = p.parse_args(argv)
    rows = family_rows(measure(args.batch, args.threads))
    print(md_table(HEADER, [list(r.values()) for r in rows], "lrrrrl"))
    if args.csv:
        append_rows(args.csv, rows, provenance(command_line("python benchmarks/workspace_bound.py", argv)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
