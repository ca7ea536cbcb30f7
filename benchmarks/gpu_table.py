"""MONeT's GPU table, reproduced: profile on the device, solve on a CPU, measure on the device.

    python benchmarks/gpu_table.py --step profile --models resnet50 --device cuda --work-dir W
    python benchmarks/gpu_table.py --step solve   --models resnet50 --device cuda --work-dir W   # any CPU
    python benchmarks/gpu_table.py --step measure --models resnet50 --device cuda --work-dir W --out T.md
    python benchmarks/gpu_table.py --step all --models vgg16 --device cpu --work-dir W --out T.md  # tiny, CPU

Steps (each one model per call stays under 10 minutes at MONeT's sizes; they share nothing but the
files in ``--work-dir``, so the solve can run on a laptop between two GPU sessions):

1. **profile** (on ``--device``): build the model at its configuration, capture the joint graph
   (`monet.capture.capture`, under bf16 autocast for GPT-2 small), measure every operator
   (`monet.profiling.profiler.profile_costs`) and save the table into ``--profiles-dir`` (default
   the zoo's ``zoo/profiles/``) under the profile cache's name
   (`monet.profiling.profiler.cache_path`: ``<fingerprint[:16]>_<device name>_torch<version>.csv``),
   which is where ``monet zoo build`` looks (`monet.zoo.build.find_profile`): the zoo can then be
   rebuilt for that GPU on a laptop.  Writes ``WORK/MODEL/profile.json``.
2. **solve** (on a CPU): capture the same graph on the meta device (an autocast graph on its own
   device type, so GPT-2's bf16 CUDA graph needs a machine with CUDA, though only its CPU works),
   count its bytes as the profiled device does (`monet.graph.OpGraph.counted_on`: on CUDA the
   allocator's 512-byte blocks and the cuBLAS workspaces of the GPU the profile recorded), cost it
   from that profile (`monet.zoo.build.zoo_costs`) and solve every budget in full mode
   (``inplace_conv_multiway_newnode``, ``--time-limit`` seconds each, default 60) with
   `monet.solver.solve.solve`.  Budgets: 10, 8, 6 and 5 GB (2^30 bytes) for MONeT's five
   configurations (ResNet-50 184, GoogLeNet 320, UNet 11 at 3x416x608, MobileNetV2 272, VGG-16 176,
   fp32), 50 % and 33 % of the simulated plain peak for GPT-2 small (batch 8 x 1024, bf16
   autocast).  An infeasible budget is a row with the smallest feasible budget, not a crash.
   Writes ``WORK/MODEL/solutions/*.pkl`` and ``WORK/MODEL/solve.json``.
3. **measure** (on ``--device``): plain PyTorch, each schedule (`monet.wrapper.MONeTWrapper`) and
   the peers (Chen's sqrt(n) checkpointing and ``torch.compile``'s activation memory budget,
   `monet.profiling.baselines`), each: peak allocated bytes of one forward+backward iteration after
   warm-up (CUDA ``max_memory_allocated``; CPU: allocator events, `monet.profiling.peak`), peak
   reserved bytes (CUDA ``max_memory_reserved``, after ``torch.cuda.empty_cache()`` so earlier
   candidates' cached blocks do not count) and reserved / allocated (fragmentation), overhead
   (interleaved with plain PyTorch, the median of each turn's ratio, `monet.profiling.measure.overhead`) and, for the
   schedules, the relative L2 error of all gradients against plain PyTorch
   (`monet.profiling.measure.compare_gradients`).  Writes ``WORK/MODEL/measure.json`` after every
   row and rewrites ``--out`` (markdown: one table per model beside MONeT's published row, with the
   device's name) from every ``measure.json`` in the work dir, so an interrupted run keeps its rows.

Reserved memory policy: the measure step runs with
``PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True``, set by this command before torch starts,
unless the environment already sets ``PYTORCH_CUDA_ALLOC_CONF`` (then the user's setting is kept);
the table records which.  Expandable segments let the caching allocator grow one mapping instead of
reserving new fixed segments, so reserved memory stays near the allocated peak; that ratio is only
measurable on a GPU (the CPU has no reserved memory: the column is empty).

``--device cpu`` (or ``--small``) uses tiny configurations (`SMALL`: batch 2-4, 64x64 images or 64
tokens, budgets 90 % and 75 % of the plain peak) so the three steps run on a CPU in about a minute
per model; its figures are a check of the command, not comparable with MONeT's.

Sizes are bytes in the JSON files; the table shows GiB (2^30 bytes, MONeT's "GB") for the GPU
configurations and MiB for the tiny ones.  Progress goes to stderr.
"""
from __future__ import annotations

import argparse
import copy
import gc
import json
import os
import sys
import time
import traceback
from dataclasses import asdict, dataclass, field
from pathlib import Path

ALLOC_CONF = "expandable_segments:True"
FULL_MODE = "inplace_conv_multiway_newnode"
STEPS = ("profile", "solve", "measure")
GiB, MiB = 2 ** 30, 2 ** 20
GRAD_TOLERANCE = 1e-5  # relative L2 error of all gradients (docs/design.md, "What must stay true"), fp32 schedules


@dataclass(frozen=True)
class Config:
    """One model's configuration: zoo name, factory kwargs, batch size, one sample's shape, budget
    strings (`monet.solver.solve.parse_budget`: "6GB" = 6 x 2^30 bytes, "50%" of the simulated
    plain peak) and autocast dtype (None: fp32)."""

    model: str
    batch_size: int
    input_shape: tuple[int, ...]
    budgets: tuple[str, ...]
    kwargs: dict = field(default_factory=dict)
    autocast: str | None = None


_CNN = ("10GB", "8GB", "6GB", "5GB")
#: MONeT's five configurations (fp32) and GPT-2 small (bf16 autocast), for a GPU.
GPU: dict[str, Config] = {
    "resnet50": Config("resnet50", 184, (3, 224, 224), _CNN),
    "googlenet": Config("googlenet", 320, (3, 224, 224), _CNN),
    "unet": Config("unet", 11, (3, 416, 608), _CNN),
    "mobilenet_v2": Config("mobilenet_v2", 272, (3, 224, 224), _CNN),
    "vgg16": Config("vgg16", 176, (3, 224, 224), _CNN),
    "gpt2-small": Config("gpt2-small", 8, (1024,), ("50%", "33%"), autocast="bfloat16"),
}


def small_configs() -> dict[str, Config]:
    """Tiny CPU configurations: the CPU benchmark's model widths (`CONFIGS` in `benchmarks/bench.py`)
    at smaller batches and inputs."""
    from bench import CONFIGS

    image, budgets = (3, 64, 64), ("90%", "75%")
    out = {m: Config(m, 4, image, budgets, CONFIGS[m].kwargs) for m in ("resnet50", "mobilenet_v2", "googlenet")}
    out["vgg16"] = Config("vgg16", 16, image, budgets, CONFIGS["vgg16"].kwargs)
    out["unet"] = Config("unet", 1, image, budgets, CONFIGS["unet"].kwargs)
    out["gpt2-small"] = Config("gpt2-small", 2, (64,), ("50%", "33%"), CONFIGS["gpt2-small"].kwargs, "bfloat16")
    return out


class Log:
    """Timestamped progress lines on stderr."""

    def __init__(self):
        self.t0 = time.perf_counter()

    def __call__(self, msg: str) -> None:
        print(f"[gpu_table {time.perf_counter() - self.t0:7.1f} s] {msg}", file=sys.stderr, flush=True)


class BenchError(Exception):
    """A user-facing error: what went wrong and what to do."""


def _write_json(path: Path, obj) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(obj, indent=1, default=str))
    os.replace(tmp, path)


def _read_json(path: Path, step: str, model: str) -> dict:
    if not path.is_file():
        raise BenchError(f"{path} is missing: run `--step {step} --models {model}` with this --work-dir first")
    return json.loads(path.read_text())


def _autocast(cfg: Config, device: str):
    """The `monet.mixed_precision` setting of ``cfg`` on ``device`` (None for fp32)."""
    return None if cfg.autocast is None else (device.split(":")[0], cfg.autocast)


def _build(cfg: Config, device: str):
    """(model, input) on ``device``, weights from seed 0, the model in training mode."""
    import torch

    from monet.zoo.models import MODELS, example_input, get_model

    torch.manual_seed(0)
    model = get_model(cfg.model, **cfg.kwargs).train()
    vocab = getattr(model, "vocab_size", None) if MODELS[cfg.model].input_kind == "tokens" else None
    x = example_input(cfg.model, cfg.batch_size, cfg.input_shape, vocab_size=vocab)
    return model.to(device), x.to(device)


def capture_config(cfg: Config, device: str):
    """The joint graph of ``cfg``: on the meta device for fp32 (nothing of full size is allocated),
    on ``device`` itself under autocast (its casts differ between device types)."""
    import torch

    from monet.capture import capture

    amp = _autocast(cfg, device)
    if amp is None:
        from monet.zoo.models import MODELS, get_model

        with torch.device("meta"):
            net = get_model(cfg.model, **cfg.kwargs).train()
        dtype = torch.long if MODELS[cfg.model].input_kind == "tokens" else torch.float32
        return capture(net, torch.empty((cfg.batch_size, *cfg.input_shape), dtype=dtype, device="meta"))
    if device.startswith("cuda") and not torch.cuda.is_available():
        raise BenchError(f"{cfg.model} runs under {cfg.autocast} autocast on CUDA, whose graph must be captured "
                         "on CUDA: run its solve step on a machine with CUDA (the solve itself uses the CPU)")
    model, x = _build(cfg, device)
    return capture(model, x, autocast_dtype=getattr(torch, cfg.autocast))


# ----------------------------------------------------------------------------------------------
# steps
# ----------------------------------------------------------------------------------------------


def step_profile(cfg: Config, args, log: Log) -> dict:
    """Profile ``cfg`` on ``args.device`` into ``args.profiles_dir``; returns the manifest."""
    import torch

    from monet.capture import capture
    from monet.profiling.profiler import cache_path, device_name, profile_costs, save_costs

    t0 = time.perf_counter()
    log(f"{cfg.model}: profile on {args.device}: building (batch {cfg.batch_size}, input {cfg.input_shape})")
    model, x = _build(cfg, args.device)
    amp = _autocast(cfg, args.device)
    graph = capture(model, x, autocast_dtype=getattr(torch, amp[1]) if amp else None)
    path = cache_path(graph, args.device, args.profiles_dir)
    log(f"  graph {graph.fingerprint[:16]}: {len(graph.fwd)} forward, {len(graph.bwd)} backward nodes; "
        f"profiling ({args.profile_repeats} timed runs each) into {path}")
    table = profile_costs(model, x, graph, args.device, repeats=args.profile_repeats,
                          warmup=args.profile_warmup, progress=args.progress)
    save_costs(table, path)
    capability = list(graph.cuda_capability) if graph.cuda_capability else None
    manifest = dict(config=asdict(cfg), device=args.device, device_name=device_name(args.device),
                    cuda_capability=capability, fingerprint=graph.fingerprint, profile=str(path), torch=torch.__version__,
                    seconds=time.perf_counter() - t0)
    _write_json(args.work_dir / cfg.model / "profile.json", manifest)
    log(f"  profiled in {manifest['seconds']:.1f} s: forward {table[table.kind == 'fwd'].time_s.sum() * 1e3:.1f} ms, "
        f"backward {table[table.kind == 'bwd'].time_s.sum() * 1e3:.1f} ms")
    return manifest


def step_solve(cfg: Config, args, log: Log) -> dict:
    """Solve ``cfg`` at each budget from its profile; returns the manifest (one row per budget)."""
    from monet.solution import save_solution
    from monet.solver.ilp import InfeasibleBudgetError
    from monet.solver.solve import eager_peak, parse_budget, solve
    from monet.zoo.build import zoo_costs

    prof = _read_json(args.work_dir / cfg.model / "profile.json", "profile", cfg.model)
    target = prof["device"].split(":")[0]
    log(f"{cfg.model}: solve for {prof['device_name']}: capturing")
    # count bytes as the profiled device does (a meta capture counts them as the CPU does): on CUDA
    # the allocator's blocks and the cuBLAS workspaces of the profiled GPU are in every budget
    graph = capture_config(cfg, target).counted_on(target, prof.get("cuda_capability"))
    if graph.fingerprint != prof["fingerprint"]:
        raise BenchError(f"{cfg.model}: the graph captured here ({graph.fingerprint[:16]}) is not the profiled one "
                         f"({prof['fingerprint'][:16]}, torch {prof['torch']}): solve with the torch version and "
                         "configuration of the profile step, or profile again")
    zc = zoo_costs(graph, profiles_dir=args.profiles_dir)
    if zc.profile is None:
        raise BenchError(f"{cfg.model}: no profile {prof['profile']} in {args.profiles_dir}: copy it there or pass "
                         "the --profiles-dir of the profile step")
    eager = eager_peak(graph, zc.costs)
    log(f"  costs: {zc.source}; plain PyTorch simulated peak {eager / MiB:.1f} MiB")
    info = dict(model=cfg.model, batch_size=cfg.batch_size, input_shape=cfg.input_shape,
                dtype=graph.input_dtype, device=target)
    rows = []
    manifest = dict(config=asdict(cfg), device=prof["device"], device_name=prof["device_name"],
                    cost_source=zc.source, eager_peak_bytes=int(eager), time_limit_s=args.time_limit, rows=rows)
    out = args.work_dir / cfg.model / "solve.json"
    for label in cfg.budgets:
        budget = parse_budget(label, eager)
        row = dict(budget=label, budget_bytes=int(budget))
        rows.append(row)
        log(f"  {label} = {budget / MiB:.1f} MiB: solving ({FULL_MODE}, time limit {args.time_limit:g} s)")
        t0 = time.perf_counter()
        try:
            sol = solve(graph, zc.costs, budget, FULL_MODE, time_limit=args.time_limit, info=info, device=target,
                        cost_fn=zc.cost_fn)
        except InfeasibleBudgetError as e:
            row.update(status="infeasible", solve_s=time.perf_counter() - t0, min_budget_bytes=e.min_budget_bytes)
            log(f"  {label}: infeasible" + (f" (smallest feasible {e.min_budget_bytes / MiB:.1f} MiB)"
                                           if e.min_budget_bytes else ""))
            _write_json(out, manifest)
            continue
        sol.meta.cost_source = zc.source
        file = args.work_dir / cfg.model / "solutions" / f"{cfg.model}-{cfg.batch_size}-{label.replace('%', 'pct')}.pkl"
        file.parent.mkdir(parents=True, exist_ok=True)
        save_solution(sol, file)
        m = sol.meta
        row.update(status=m.status, gap=m.gap, solve_s=time.perf_counter() - t0, file=str(file),
                   predicted_peak_bytes=int(m.predicted_peak_bytes),
                   predicted_overhead=m.predicted_overhead(),
                   recomputations=sol.schedule.recompute_count(), impls=len(sol.schedule.impl))
        log(f"  {label}: {m.status}, predicted peak {m.predicted_peak_bytes / MiB:.1f} MiB, predicted overhead "
            f"{row['predicted_overhead']:+.2%} in {row['solve_s']:.1f} s")
        _write_json(out, manifest)
    _write_json(out, manifest)
    return manifest


def _memory(model, x, g, amp) -> dict:
    """Allocated and (CUDA) reserved peak bytes of one iteration after warm-up."""
    import torch

    from monet.profiling.measure import measure_iteration_memory

    gc.collect()
    if x.device.type == "cuda":
        torch.cuda.empty_cache()  # reserved = this candidate's segments, not earlier candidates' cache
    pm = measure_iteration_memory(model, x, g, autocast=amp)
    return dict(allocated_bytes=int(pm.peak_bytes),
                reserved_bytes=None if pm.reserved_bytes is None else int(pm.reserved_bytes))


def step_measure(cfg: Config, args, log: Log) -> dict:
    """Measure plain PyTorch, every solved schedule and the peers on ``args.device``."""
    import torch

    from bench import one_iteration_s, timed_repeats
    from monet.profiling.measure import compare_gradients, output_grad, overhead
    from monet.profiling.baselines import chen_sqrt_checkpoint, compile_with_activation_budget
    from monet.profiling.profiler import device_name
    from monet.solution import load_solution
    from monet.wrapper import MONeTWrapper

    solved = _read_json(args.work_dir / cfg.model / "solve.json", "solve", cfg.model)
    dev = args.device
    if solved["device"].split(":")[0] != dev.split(":")[0]:
        raise BenchError(f"{cfg.model}: the schedules in {args.work_dir} were solved for {solved['device']}, "
                         f"not {dev}: measure with --device {solved['device']}")
    amp = _autocast(cfg, dev)
    model, x = _build(cfg, dev)
    g = output_grad(model, x, autocast=amp)
    rows = []
    res = dict(config=asdict(cfg), device=dev, device_name=device_name(dev), torch=torch.__version__,
               alloc_conf=args.alloc_conf, budgets_from=solved["cost_source"],
               eager_peak_bytes=solved["eager_peak_bytes"], rows=rows, finished=False)
    out = args.work_dir / cfg.model / "measure.json"

    def save():
        _write_json(out, res)
        write_table(args)

    log(f"{cfg.model}: measure on {res['device_name']}: plain PyTorch")
    plain = dict(method="PyTorch", **_memory(model, x, g, amp), overhead=0.0)
    rows.append(plain)
    repeats = args.repeats or timed_repeats(min(one_iteration_s(model, x, g, amp) for _ in range(2)), 5)
    res["repeats"] = repeats
    log(f"  plain: {plain['allocated_bytes'] / MiB:.1f} MiB allocated; {repeats} timed iterations per side")
    save()

    def measure(row, candidate, grads_of=None):
        t0 = time.perf_counter()
        try:
            row.update(_memory(candidate, x, g, amp))
            row["overhead"], row["median_s"], row["plain_median_s"] = overhead(
                model, candidate, x, g, repeats=repeats, warmup=args.warmup, autocast=amp)
            if grads_of is not None:
                row["grad_rel_error"] = compare_gradients(lambda: copy.deepcopy(model), grads_of, x, g,
                                                          autocast=amp)[0]
            log(f"  {row['method']}: {row['allocated_bytes'] / MiB:.1f} MiB allocated, overhead "
                f"{row['overhead']:+.2%}" + (f", gradient error {row['grad_rel_error']:.2e}" if grads_of else "")
                + f" ({time.perf_counter() - t0:.1f} s)")
        except Exception as e:  # noqa: BLE001 - a failed candidate is a row, the others still run
            row["error"] = " ".join(f"{type(e).__name__}: {e}".split())[:300]
            log(f"  {row['method']} failed: {row['error']}")
            traceback.print_exc(file=sys.stderr)

    for s in solved["rows"]:
        row = dict(method=f"MONeT {s['budget']}", budget=s["budget"], budget_bytes=s["budget_bytes"],
                   status=s["status"], predicted_peak_bytes=s.get("predicted_peak_bytes"))
        rows.append(row)
        if "file" not in s:
            log(f"  {row['method']}: {s['status']}, nothing to measure")
            save()
            continue
        sol = load_solution(s["file"])
        measure(row, MONeTWrapper(model, sol, cfg.input_shape),
                grads_of=lambda sol=sol: MONeTWrapper(copy.deepcopy(model), sol, cfg.input_shape))
        gc.collect()
        save()
    peers = [] if args.no_chen else [("Chen sqrt(n)", lambda: chen_sqrt_checkpoint(model))]
    peers += [(f"torch.compile budget {b:g}", lambda b=b: compile_with_activation_budget(model, b))
              for b in args.compile_budgets]
    for label, make in peers:
        row = dict(method=label)
        rows.append(row)
        log(f"  {label}")
        try:
            measure(row, make())
        except Exception as e:  # noqa: BLE001
            row["error"] = " ".join(f"{type(e).__name__}: {e}".split())[:300]
            log(f"  {label} failed: {row['error']}")
        gc.collect()
        save()
    if args.compile_budgets:
        torch.compiler.reset()
    res["finished"] = True
    save()
    return res


# ----------------------------------------------------------------------------------------------
# the table
# ----------------------------------------------------------------------------------------------

_PUBLISHED_NAMES = {"ResNet-50": "resnet50", "GoogLeNet": "googlenet", "UNet": "unet",
                    "MobileNetV2": "mobilenet_v2", "VGG-16": "vgg16"}


def published() -> dict[str, dict]:
    """MONeT's published GPU row per zoo model (16 GB P100, fp32, PyTorch 1.5.1), parsed from the
    table `GPU_TABLE` in `benchmarks/bench.py` quotes: ``{"plain_gb": 15.06, "points": [(10.01,
    0.0322), ...]}`` (GB = 2^30 bytes, overhead as a fraction), in budget order 10, 8, 6, 5 GB."""
    from bench import GPU_TABLE

    out = {}
    for line in GPU_TABLE.splitlines()[2:]:
        cells = [c.strip() for c in line.strip("|").split("|")]
        name = _PUBLISHED_NAMES.get(cells[0].split(" (")[0])
        if name is None:
            continue
        points = [p.split("@") for p in cells[2].split(",")]
        out[name] = dict(plain_gb=float(cells[1]),
                         points=[(float(gb), float(ov.strip(" %")) / 100) for gb, ov in points])
    return out


def model_frame(res: dict):
    """One model's measured rows as a pandas DataFrame (display strings), MONeT's published figure
    beside each budget row of MONeT's configurations."""
    import pandas as pd

    pub = published().get(res["config"]["model"]) if res["device"].startswith("cuda") else None
    gpu_budgets = [b for b in res["config"]["budgets"] if b.endswith("GB")]
    unit, uname = (GiB, "GiB") if res["device"].startswith("cuda") else (MiB, "MiB")

    def size(b):
        return "" if b is None else f"{b / unit:.2f}"

    records = []
    for r in res["rows"]:
        alloc, resv, budget = r.get("allocated_bytes"), r.get("reserved_bytes"), r.get("budget_bytes")
        monet_pub = ""
        if pub is not None and r["method"] == "PyTorch":
            monet_pub = f"{pub['plain_gb']:.2f}"
        elif pub is not None and r.get("budget") in gpu_budgets:
            gb, ov = pub["points"][gpu_budgets.index(r["budget"])]
            monet_pub = f"{gb:.2f} @ {ov:+.2%}"
        err = r.get("grad_rel_error")
        records.append({
            "method": r["method"],
            f"budget {uname}": size(budget),
            f"predicted {uname}": size(r.get("predicted_peak_bytes")),
            f"allocated {uname}": size(alloc),
            f"reserved {uname}": size(resv),
            "reserved / allocated": "" if not (alloc and resv) else f"{resv / alloc:.3f}",
            "fits": "" if alloc is None or budget is None else ("yes" if alloc <= budget else "**NO**"),
            "overhead": "" if r.get("overhead") is None else f"{r['overhead']:+.2%}",
            "grad. error": "" if err is None else f"{err:.1e}",
            "MONeT (P100)": monet_pub,
            "notes": "; ".join(s for s in (r.get("status", ""), r.get("error", "")) if s),
        })
    return pd.DataFrame.from_records(records)


def write_table(args) -> Path | None:
    """Rewrite ``args.out`` from every ``measure.json`` under the work dir; returns its path."""
    from monet.profiling.markdown import md_table

    if args.out is None:
        return None
    found = sorted(args.work_dir.glob("*/measure.json"))
    lines = ["# MONeT's GPU table, measured by `benchmarks/gpu_table.py`", ""]
    for path in found:
        res = json.loads(path.read_text())
        c = res["config"]
        df = model_frame(res)
        amp = f", {c['autocast']} autocast" if c["autocast"] else ", fp32"
        lines += [f"## {c['model']} (batch {c['batch_size']}, input {'x'.join(map(str, c['input_shape']))}{amp})", "",
                  f"Device: {res['device_name']} ({res['device']}); torch {res['torch']}; "
                  f"PYTORCH_CUDA_ALLOC_CONF {res['alloc_conf']}; budgets solved with costs from {res['budgets_from']}; "
                  f"{res.get('repeats', '?')} timed iterations per side"
                  + ("" if res["finished"] else "; INCOMPLETE (measurement still going or interrupted)") + ".", "",
                  md_table(list(df.columns), df.astype(str).values.tolist(), "lrrrrrlrrll"), ""]
    lines += ["Sizes: allocated = peak `max_memory_allocated` (CPU: allocator events) of one forward+backward "
              "iteration after warm-up; reserved = peak `max_memory_reserved` (CUDA only); GiB = 2^30 bytes "
              "(MONeT's GB). Overhead: median over interleaved turns of the iteration time / plain PyTorch's, - 1. Grad. error: "
              "relative L2 error of all gradients against plain PyTorch. MONeT (P100): the published figure "
              "(16 GB P100, fp32, PyTorch 1.5.1) at the same budget, GB @ overhead.", ""]
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(out.name + ".tmp")
    tmp.write_text("\n".join(lines))
    os.replace(tmp, out)
    return out


# ----------------------------------------------------------------------------------------------
# command line
# ----------------------------------------------------------------------------------------------


def parse_args(argv=None):
    p = argparse.ArgumentParser(prog="python benchmarks/gpu_table.py", description=__doc__.split("\n\n")[0],
                                epilog=__doc__.split("\n\n", 1)[1], formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--step", choices=(*STEPS, "all"), default="all", help="which step to run (default all)")
    p.add_argument("--models", default=None,
                   help=f"comma-separated, from {', '.join(GPU)} (default: all of them on cuda, mobilenet_v2 on cpu: the tiny VGG-16, ResNet-50 and UNet need 82-100 %% of their plain peak)")
    p.add_argument("--device", default="cuda", help="cuda, cuda:N or cpu (default cuda); the device of the profile "
                   "and measure steps; the solve step solves for the profile's device")
    p.add_argument("--small", action="store_true", help="the tiny configurations (default with --device cpu)")
    p.add_argument("--work-dir", required=True, type=Path,
                   help="folder for profiles' manifests, solutions and results between steps")
    p.add_argument("--profiles-dir", type=Path, default=None,
                   help="where profiles are saved and read (default: the zoo's zoo/profiles/)")
    p.add_argument("--out", type=Path, default=None, help="markdown table to (re)write during the measure step")
    p.add_argument("--time-limit", type=float, default=60.0, help="seconds per solve (default 60)")
    p.add_argument("--budgets", default=None, help="override the budgets, comma-separated (\"6GB,50%%\")")
    p.add_argument("--profile-repeats", type=int, default=None, help="timed runs per operator (default 5; 1 small)")
    p.add_argument("--profile-warmup", type=int, default=None, help="warm-up runs per operator (default 2; 0 small)")
    p.add_argument("--repeats", type=int, default=None,
                   help="timed iterations per side in the overhead (default 11 on CUDA, by iteration time on CPU)")
    p.add_argument("--warmup", type=int, default=1, help="warm-up iterations before timing (default 1)")
    p.add_argument("--compile-budgets", default=None,
                   help="torch.compile activation_memory_budget values (default \"0.5\"; \"\" for none)")
    p.add_argument("--no-chen", action="store_true", help="skip the Chen sqrt(n) peer")
    p.add_argument("--no-progress", dest="progress", action="store_false", help="no tqdm bar while profiling")
    args = p.parse_args(argv)
    if not (args.device == "cpu" or args.device.startswith("cuda")):
        p.error(f"--device must be cuda, cuda:N or cpu, got {args.device!r}")
    args.small = args.small or args.device == "cpu"
    names = [n.strip() for n in (args.models or ("mobilenet_v2" if args.small else ",".join(GPU))).split(",") if n.strip()]
    unknown = [n for n in names if n not in GPU]
    if unknown:
        p.error(f"unknown model(s) {unknown}: choose from {', '.join(GPU)}")
    table = small_configs() if args.small else GPU
    args.configs = [table[n] for n in names]
    if args.budgets:
        budgets = tuple(b.strip() for b in args.budgets.split(",") if b.strip())
        args.configs = [Config(c.model, c.batch_size, c.input_shape, budgets, c.kwargs, c.autocast) for c in args.configs]
    args.profile_repeats = args.profile_repeats or (1 if args.small else 5)
    args.profile_warmup = args.profile_warmup if args.profile_warmup is not None else (0 if args.small else 2)
    if args.repeats is None and args.device.startswith("cuda"):
        args.repeats = 11
    cb = "0.5" if args.compile_budgets is None else args.compile_budgets
    args.compile_budgets = [float(b) for b in cb.split(",") if b.strip()]
    args.work_dir = args.work_dir.resolve()
    return args


def main(argv=None) -> int:
    args = parse_args(argv)
    log = Log()
    steps = STEPS if args.step == "all" else (args.step,)
    # the allocator reads its configuration when CUDA starts: set it before torch is imported
    if "measure" in steps and args.device.startswith("cuda"):
        if "PYTORCH_CUDA_ALLOC_CONF" in os.environ:
            args.alloc_conf = os.environ["PYTORCH_CUDA_ALLOC_CONF"] + " (set by the user)"
        else:
            os.environ["PYTORCH_CUDA_ALLOC_CONF"] = ALLOC_CONF
            args.alloc_conf = ALLOC_CONF + " (set by the command)"
    else:
        args.alloc_conf = os.environ.get("PYTORCH_CUDA_ALLOC_CONF", "unset") + (" (CPU: no effect)"
                                                                               if args.device == "cpu" else "")
    import torch

    from monet.zoo.build import PROFILES
    from monet.zoo.index import ZOO_DIR

    if args.device.startswith("cuda") and set(steps) & {"profile", "measure"} and not torch.cuda.is_available():
        print(f"gpu_table: error: --step {args.step} --device {args.device} needs a CUDA GPU, but torch "
              f"{torch.__version__} sees none: run the profile and measure steps on the GPU machine "
              "(the solve step alone runs anywhere), or use --device cpu for the tiny CPU configuration",
              file=sys.stderr)
        return 2
    args.profiles_dir = (args.profiles_dir or ZOO_DIR / PROFILES).resolve()
    log(f"steps {', '.join(steps)}; models {', '.join(c.model for c in args.configs)}; device {args.device}"
        f"{' (tiny configurations)' if args.small else ''}; work dir {args.work_dir}; profiles {args.profiles_dir}")
    failures = 0
    for cfg in args.configs:
        for step in steps:
            try:
                {"profile": step_profile, "solve": step_solve, "measure": step_measure}[step](cfg, args, log)
            except BenchError as e:
                print(f"gpu_table: error: {e}", file=sys.stderr)
                failures += 1
                break
            except Exception as e:  # noqa: BLE001 - the other models still run
                log(f"{cfg.model}: {step} failed: {type(e).__name__}: {e}")
                traceback.print_exc(file=sys.stderr)
                failures += 1
                break
    out = write_table(args) if "measure" in steps else None
    if out is not None:
        log(f"wrote {out}")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
