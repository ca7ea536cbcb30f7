"""Record the per-node memory traces that test the memory model against a real allocator.

One visit of a GPU machine records, for each configuration, one training iteration of a schedule node
by node (`monet.profiling.trace.record_trace`: the caching allocator's counters around every FX node,
its event history attributed to the nodes) and writes it as a small gzip JSON file.  Committed under
``tests/data/traces/``, every CPU run of the suite replays them (tests/test_trace.py): the simulator,
with its CUDA terms (`monet.profiling.cuda_bytes`), against what the H100 allocated.

Configurations (`CONFIGS`; ``--tiny`` the same shapes of model at test size, for the CPU):

* ``resnet50-184-5GB-normal``: the zoo's ResNet-50, batch 184, 3x224x224 fp32, a normal-mode schedule
  solved here at 5 GiB with the per-node costs of ``--profile`` (by default the H100 profile
  ``benchmarks/profiles/dd595582476cd27f_NVIDIA-H100-80GB-HBM3_torch2.11.0-cu130.csv``,
  when its fingerprint fits; else analytic costs), whose measured workspace the trace's simulation
  then counts;
* ``resnet50-184-keepall``: the same, keeping everything (plain PyTorch's schedule);
* ``resnet50-184-5GB-full``: the 5 GiB budget in the GPU table's full mode (operator
  implementations, in-place ReLU and add);
* ``gpt2-small-8-50pct-normal``: the zoo's GPT-2 small, batch 8 x 1024 tokens, fp32, normal mode
  at 50 % of its simulated plain peak.

On the GPU machine (torch 2.11.0+cu130; about 3 minutes, most of it capturing and solving)::

    source .gpu/env.sh && python benchmarks/gpu_traces.py --out $OUT

then copy ``$OUT/*.json.gz`` to ``tests/data/traces/``.  The CPU path (``--device cpu --tiny``) is
what the committed CPU traces were recorded with and what the tests run.  Each file holds the
torch, CUDA, cuDNN and cuBLAS versions and the device name; the script prints one summary line per
configuration (measured and simulated peaks, the first node where they part) and writes
``versions.json``.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PROFILE_NAME = "dd595582476cd27f_NVIDIA-H100-80GB-HBM3_torch2.11.0-cu130.csv"


@dataclass(frozen=True)
class Config:
    """One trace to record.

    Attributes:
        name: the file's stem.
        model: zoo model name; ``kwargs`` its factory's scaling arguments.
        batch_size, input_shape: one batch (input_shape None: the zoo model's).
        budget: "5GB", "50%" (of the simulated plain peak) or None: keep everything.
        mode: ILP mode of the solve.
        inputs_spec: the inputs as `monet.inputs.SPEC_FORMAT` gives them (None: the zoo model's).
    """

    name: str
    model: str
    batch_size: int
    input_shape: tuple | None = None
    budget: str | None = None
    mode: str = "normal"
    kwargs: dict = field(default_factory=dict)
    inputs_spec: str | None = None


CONFIGS = (
    Config("resnet50-184-5GB-normal", "resnet50", 184, (3, 224, 224), "5GB"),
    Config("resnet50-184-keepall", "resnet50", 184, (3, 224, 224), None),
    # the GPU table's mode (operator implementations, in-place ReLU and add): its schedules went
    # 2-14 % over their budgets on the H100 where the normal-mode one held
    Config("resnet50-184-5GB-full", "resnet50", 184, (3, 224, 224), "5GB", mode="inplace_conv_multiway_newnode"),
    Config("gpt2-small-8-50pct-normal", "gpt2-small", 8, (1024,), "50%"),
)
_TINY_R50 = {"base_width": 8, "layers": (1, 1, 1, 1)}
_TINY_GPT2 = {"n_layer": 2, "n_embd": 64, "n_head": 2, "vocab_size": 512, "n_positions": 64}
TINY = (
    Config("resnet50-tiny-8-70pct-normal", "resnet50", 8, (3, 64, 64), "70%", kwargs=_TINY_R50),
    Config("resnet50-tiny-8-keepall", "resnet50", 8, (3, 64, 64), None, kwargs=_TINY_R50),
    Config("gpt2-tiny-4-70pct-normal", "gpt2-small", 4, None, "70%", kwargs=_TINY_GPT2, inputs_spec="64:int64:512"),
)


def _log(msg: str) -> None:
    print(f"[gpu_traces] {msg}", file=sys.stderr, flush=True)


def find_profile(explicit: str | None) -> Path | None:
    """``--profile``, else the H100 profile of ResNet-50 at batch 184 where the repository keeps one."""
    if explicit:
        return Path(explicit)
    for folder in (ROOT / "zoo" / "profiles", ROOT / "benchmarks" / "profiles"):
        if (folder / PROFILE_NAME).exists():
            return folder / PROFILE_NAME
    return None


def costs_of(graph, profile: Path | None, device: str):
    """(costs, source): the profile's when it was made for ``graph`` (same fingerprint prefix in its
    name), else the analytic roofline of an H100 (CUDA) or of this CPU."""
    from monet.profiling.costs import DeviceSpec, analytic_costs, costs_for
    from monet.profiling.profiler import load_costs

    if profile is not None and profile.name.startswith(graph.fingerprint[:16]):
        return costs_for(graph, load_costs(profile), where=str(profile)), f"profile {profile.name}"
    spec = DeviceSpec.named("h100") if device == "cuda" else None
    table = analytic_costs(graph, spec) if spec is not None else analytic_costs(graph)
    return costs_for(graph, table), "analytic"


def record(cfg: Config, device: str, out: Path, profile: Path | None, time_limit: float) -> dict:
    """Record ``cfg``'s trace on ``device`` into ``out``; returns its summary."""
    import torch

    from monet.models import build
    from monet.profiling.trace import record_trace
    from monet.profiling.trace_compare import compare_trace
    from monet.matrices import schedule_from_matrices
    from monet.solver.finish import eager_peak, keep_all_matrices
    from monet.solver.ilp import InfeasibleBudgetError
    from monet.solver.solve import parse_budget, solve

    t0 = time.perf_counter()
    model, x = build(cfg.model, cfg.batch_size, cfg.input_shape, device, None, cfg.inputs_spec, **cfg.kwargs)
    chosen: dict = {}

    def make_schedule(graph):
        costs, source = costs_of(graph, profile, device)
        chosen.update(costs=costs, source=source)
        if cfg.budget is None:
            return schedule_from_matrices(graph, *keep_all_matrices(graph))
        budget = parse_budget(cfg.budget, eager_peak(graph, costs))
        _log(f"{cfg.name}: solving {cfg.mode} at {budget} bytes with {source} costs, time limit {time_limit:g} s")
        info = dict(model=cfg.model, batch_size=cfg.batch_size, input_shape=tuple(x.first.shape[1:]),
                    dtype=str(x.first.dtype).removeprefix("torch."), device=device)
        try:
            sol = solve(graph, costs, budget, cfg.mode, time_limit=time_limit, device=device, info=info)
        except InfeasibleBudgetError as e:  # a schedule at the smallest budget found instead
            _log(f"{cfg.name}: {e}; solving at the smallest budget instead")
            sol = solve(graph, costs, None, cfg.mode, time_limit=time_limit, device=device, info=info)
            budget = sol.meta.budget_bytes
        chosen.update(budget=budget, predicted=sol.meta.predicted_peak_bytes)
        return sol.schedule

    def workspace(graph):  # a profile's workspace; analytic costs have none: derived from the recording
        if chosen["source"].startswith("profile"):
            return chosen["costs"].fwd_workspace, chosen["costs"].bwd_workspace, chosen["source"]
        return None

    _log(f"{cfg.name}: capturing and recording on {device}")
    trace = record_trace(model, x, make_schedule, model_name=cfg.model, model_kwargs=cfg.kwargs,
                         inputs_spec=cfg.inputs_spec, workspace=workspace,
                         label=f"{cfg.budget} {cfg.mode}" if cfg.budget else "keep all")
    trace.meta["solution"].update(mode=cfg.mode if cfg.budget else None, budget_bytes=chosen.get("budget"),
                                  predicted_peak_bytes=chosen.get("predicted"))
    path = trace.save(out / f"{cfg.name}.json.gz")
    c = compare_trace(trace, replay=False)
    f = c.first_parting
    summary = dict(name=cfg.name, file=str(path), bytes=path.stat().st_size, measured_peak=c.measured_peak,
                   simulated_peak=c.simulated_peak, ratio=round(c.peak_ratio, 4), within=c.within,
                   first_parting=None if f is None else f"row {int(f['row'])} {f['name']} ({f['op']}) "
                                                       f"{f['quantity']} {f['difference']:+d} bytes",
                   seconds=round(time.perf_counter() - t0, 1))
    _log(json.dumps(summary))
    del model, x
    if device == "cuda":
        torch.cuda.empty_cache()
    return summary


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", default=os.environ.get("OUT", "."), help="folder for the traces (default $OUT or .)")
    p.add_argument("--device", default="cuda", choices=("cuda", "cpu"))
    p.add_argument("--tiny", action="store_true", help="the test-size configurations (CPU)")
    p.add_argument("--only", nargs="*", default=None, metavar="NAME", help="configurations to record (default all)")
    p.add_argument("--profile", default=None, help="ResNet-50's cost table (default: the H100 one if present)")
    p.add_argument("--time-limit", type=float, default=20.0, help="seconds per solve")
    args = p.parse_args(argv)

    import torch

    from monet.profiling.probes import device_info

    if args.device == "cuda" and not torch.cuda.is_available():
        p.error("--device cuda needs a GPU; use --device cpu --tiny here")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    configs = TINY if args.tiny else CONFIGS
    if args.only:
        unknown = set(args.only) - {c.name for c in configs}
        if unknown:
            p.error(f"unknown configuration(s) {sorted(unknown)}; known: {[c.name for c in configs]}")
        configs = tuple(c for c in configs if c.name in args.only)
    profile = find_profile(args.profile)
    info = device_info(args.device)
    _log(f"device {info['name']}, torch {info['torch']}, CUDA {info['cuda']}, cuDNN {info['cudnn']}, "
         f"cuBLAS {info['cublas']}; profile {profile}")
    summaries = []
    for c in configs:  # one failure (a model this torch cannot trace ...) does not cost the others
        try:
            summaries.append(record(c, args.device, out, profile, args.time_limit))
        except Exception as e:  # noqa: BLE001 - reported, and the exit status says so
            _log(f"{c.name}: FAILED: {type(e).__name__}: {e}")
            summaries.append({"name": c.name, "error": f"{type(e).__name__}: {e}"})
            if args.device == "cuda":
                torch.cuda.empty_cache()
    (out / "versions.json").write_text(json.dumps({"device": info, "traces": summaries}, indent=1))
    for s in summaries:
        if "error" in s:
            print(f"{s['name']}: FAILED: {s['error']}")
        else:
            print(f"{s['name']}: measured {s['measured_peak']:,} B, simulated {s['simulated_peak']:,} B "
                  f"(ratio {s['ratio']}), first parting: {s['first_parting']}; {s['bytes']:,} B file, {s['seconds']} s")
    return 1 if any("error" in s for s in summaries) else 0


if __name__ == "__main__":
    raise SystemExit(main())
