"""Building, checking and plotting the zoo of prebuilt schedules (``monet zoo build / verify / plot``).

What is built (`CONFIGS`): MONeT's five configurations (Shah et al., ICLR 2021, Table 2: ResNet-50
at batch 184, GoogLeNet 320, UNet 11, MobileNetV2 272, VGG-16 176; fp32, input 3x224x224, the UNet
at the zoo model's 3x416x608) at MONeT's budgets 10, 9, 8, 7, 6 and 5 GB ("6GB" = 6 x 2^30 bytes),
and GPT-2 small (batch 8, 1024 tokens) at 50 % and 33 % of its plain peak, all in full mode
(``inplace_conv_multiway_newnode``) for a CUDA device.

How: each model is captured on the meta device (parameters and input are meta tensors, the trace
uses fake tensors: nothing of the real size is allocated), then costed: from a profile in
``zoo/profiles/`` when one exists for the captured graph (a cost table from ``monet profile``, named
as the profile cache names it, ``<fingerprint[:16]>_<device name>_torch<version>.csv``), else by the
analytic roofline model of MONeT's GPU, a 16 GB P100 (`DeviceSpec.named("p100")`, as ``monet solve
--cost analytic --gpu-spec p100`` does).  Analytic costs count no kernel workspace.

An infeasible budget (below the smallest feasible one the solver finds) is not skipped silently:
the log names the smallest feasible budget, and the zoo records one entry ``<model>-<batch>-min``
at that budget instead (its ``substitute_for`` lists the budgets it stands in for); smaller budgets
of the same model are then skipped without solving.  So every model has a schedule for its tightest
reachable budget, and no entry is named after a budget it does not meet.

Each entry is held against the best schedule known (`monet.solver.best_known`, the committed
``benchmarks/best_known.csv``): ``best_known_s``, the lowest objective (seconds) of the table's rows
for its model and batch whose budget fits the entry's, and ``vs_best`` = objective / best known - 1
(negative: a new best), for the configurations the table is for (`comparable`).  ``record_best_by``
(``monet zoo build --record-best``) writes the new bests into the table.
"""
from __future__ import annotations

import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from monet.solution import RunInfo
from monet.solver import DEFAULT_GAP
from monet.solver.best_known import BEST_KNOWN, SAME, best_fitting, budget_key, load_best_known, record_best_known
from monet.zoo.index import SCHEDULES, ZOO_DIR, GiB, load_index, pct, save_index

MODE = "inplace_conv_multiway_newnode"
CNN_BUDGETS = ("10GB", "9GB", "8GB", "7GB", "6GB", "5GB")  # MONeT's budgets (GB = 2^30 bytes)
GPT_BUDGETS = ("50%", "33%")
DEFAULT_TIME_LIMIT = 60.0  # seconds per solve: `monet solve`'s default (`monet.solver.solve.solve`'s time_limit)
PROFILES = "profiles"


@dataclass(frozen=True)
class ZooConfig:
    """One model and batch size of the zoo and the budgets to solve it at.

    Attributes:
        model: zoo model name (`monet.zoo.models.MODELS`).
        batch_size: batch size.
        budgets: budget strings as `monet.solver.solve.parse_budget` reads them ("6GB", "50%").
        input_shape: one sample's shape; None: the zoo model's.
        mode: ILP mode.
        device: device type the schedules are for (which implementations the solver may pick).
        gpu_spec: roofline preset of the analytic costs when no profile exists.
    """

    model: str
    batch_size: int
    budgets: tuple[str, ...]
    input_shape: tuple[int, ...] | None = None
    mode: str = MODE
    device: str = "cuda"
    gpu_spec: str = "p100"

    @property
    def shape(self) -> tuple[int, ...]:
        from monet.zoo.models.registry import MODELS

        return tuple(self.input_shape) if self.input_shape is not None else tuple(MODELS[self.model].input_shape)

    def entry_name(self, budget: str) -> str:
        """``resnet50-184-6GB``, ``gpt2-small-8-50pct``, ``resnet50-184-min``; a non-default input
        shape is part of the name (``resnet50-2-3x32x32-60pct``)."""
        from monet.zoo.models.registry import MODELS

        label = budget.strip().replace(" ", "").replace("%", "pct")
        shape = ""
        if self.input_shape is not None and tuple(self.input_shape) != tuple(MODELS[self.model].input_shape):
            shape = "-" + "x".join(map(str, self.input_shape))
        return f"{self.model}-{self.batch_size}{shape}-{label}"


CONFIGS: tuple[ZooConfig, ...] = (
    ZooConfig("resnet50", 184, CNN_BUDGETS),
    ZooConfig("googlenet", 320, CNN_BUDGETS),
    ZooConfig("unet", 11, CNN_BUDGETS),
    ZooConfig("mobilenet_v2", 272, CNN_BUDGETS),
    ZooConfig("vgg16", 176, CNN_BUDGETS),
    ZooConfig("gpt2-small", 8, GPT_BUDGETS),
)
BATCH = {c.model: c.batch_size for c in CONFIGS}  # MONeT's batch sizes (and GPT-2 small's)


def _log(message: str) -> None:
    print(f"monet zoo: {message}", file=sys.stderr, flush=True)


# ----------------------------------------------------------------------------------------------
# capture and costs
# ----------------------------------------------------------------------------------------------


def capture_config(model: str, batch_size: int, input_shape=None):
    """The `OpGraph` of zoo model ``model`` at ``batch_size`` (and ``input_shape``, default the
    model's), captured on the meta device: no parameter or activation is allocated, so the
    full-scale configurations capture in seconds on a laptop.  Same fingerprint as a capture on
    real tensors (the summary names no device)."""
    import torch

    from monet.capture import capture
    from monet.zoo.models.registry import MODELS, get_model

    spec = MODELS[model]
    shape = tuple(input_shape) if input_shape is not None else tuple(spec.input_shape)
    with torch.device("meta"):
        net = get_model(model)
    dtype = torch.long if spec.input_kind == "tokens" else torch.float32
    return capture(net, torch.empty((batch_size, *shape), dtype=dtype, device="meta"))


@dataclass
class ZooCosts:
    """Costs of a captured graph for the zoo: arrays, their label, and the ``cost_fn`` of variant
    graphs (`monet.solver.choices.implementation_options`)."""

    costs: object  # CostArrays
    source: str  # "analytic p100" or "profile <device name>"
    cost_fn: object
    profile: Path | None = None


def find_profile(graph, profiles_dir: Path | str | None = None) -> Path | None:
    """The cost table in ``profiles_dir`` (default ``zoo/profiles``) made for ``graph``, by the
    fingerprint prefix of its name (`monet.profiling.profiler.cache_path`'s naming), or None."""
    folder = Path(profiles_dir) if profiles_dir is not None else ZOO_DIR / PROFILES
    if not folder.is_dir():
        return None
    found = sorted(folder.glob(f"{graph.fingerprint[:16]}_*.csv"))
    return found[0] if found else None


def _preset_for(device_name: str, default: str):
    """The roofline preset whose name appears in a GPU's name ("Tesla P100-PCIE-16GB" -> p100)."""
    from monet.profiling.costs import PRESETS, DeviceSpec

    name = device_name.lower().replace("-", " ")
    for key in sorted(PRESETS, key=len, reverse=True):  # "h100-pcie" before "h100"
        if key.replace("-", " ") in name:
            return PRESETS[key]
    return DeviceSpec.named(default)


def _profile_cost_fn(base_graph, table, spec):
    """``cost_fn`` for variant graphs when the base costs are a measured profile: every node keeps
    the profile's workspace (node ids do not change under implementations); a node an
    implementation changed gets the analytic time of its new op scaled by the profile's measured /
    analytic ratio of the node it replaced, the others the profile's time."""
    from monet.profiling.costs import DEFAULT_IMPL, analytic_costs, costs_for, make_table

    base = table[table["impl"] == DEFAULT_IMPL].set_index(["kind", "node"])
    base_analytic = analytic_costs(base_graph, spec).set_index(["kind", "node"])["time_s"]

    def cost_fn(graph, keys, governed):
        changed = {(k[:3], int(k[4:])) for k in keys} | {("bwd", t) for k in keys for t in governed.get(k, ())}
        rows = []
        for r in analytic_costs(graph, spec).to_dict("records"):
            key = (r["kind"], r["node"])
            b = base.loc[key]
            if key in changed:
                a0 = float(base_analytic.loc[key])
                scale = float(b["time_s"]) / a0 if a0 > 0 else 1.0
                r["time_s"] = r["recompute_s"] = r["time_s"] * scale
                r["source"] = f"{b['source']}+analytic-ratio"
            else:
                r.update(time_s=float(b["time_s"]), recompute_s=float(b["recompute_s"]), source=str(b["source"]))
            r["workspace_bytes"] = int(b["workspace_bytes"])
            rows.append(r)
        return costs_for(graph, make_table(rows))
    return cost_fn


def zoo_costs(graph, gpu_spec: str = "p100", profiles_dir: Path | str | None = None) -> ZooCosts:
    """Costs of ``graph``: its profile from ``zoo/profiles`` (`find_profile`) if there is one, else
    the analytic roofline model of ``gpu_spec`` (MONeT's P100 by default)."""
    from monet.profiling.costs import DeviceSpec, analytic_costs, costs_for
    from monet.profiling.profiler import load_costs
    from monet.solver.solve import analytic_cost_fn

    path = find_profile(graph, profiles_dir)
    if path is not None:
        table = load_costs(path)
        costs = costs_for(graph, table, where=str(path))
        device = next((s.split(":", 1)[1] for s in costs.source if s.startswith("profile:")), path.stem)
        spec = _preset_for(device, gpu_spec)
        return ZooCosts(costs, f"profile {device}", _profile_cost_fn(graph, table, spec), path)
    spec = DeviceSpec.named(gpu_spec)
    return ZooCosts(costs_for(graph, analytic_costs(graph, spec)), f"analytic {spec.name}", analytic_cost_fn(spec))


# ----------------------------------------------------------------------------------------------
# building
# ----------------------------------------------------------------------------------------------


def record_of(sol, *, name: str, budget: str, file: str, file_bytes: int, time_limit_s: float,
              substitute_for=None) -> dict:
    """The index record (`monet.zoo.index.FIELDS`) of a solution saved as ``file``."""
    m = sol.meta
    overhead = m.predicted_overhead()
    return dict(name=name, model=m.model, batch_size=m.batch_size, input_shape=list(m.input_shape), dtype=m.dtype,
                budget=budget, budget_bytes=m.budget_bytes, substitute_for=list(substitute_for or []),
                mode=m.mode, device=m.device, cost_source=m.cost_source,
                predicted_peak_bytes=m.predicted_peak_bytes, eager_peak_bytes=m.eager_peak_bytes,
                predicted_overhead=overhead, objective_s=m.objective_s, eager_time_s=m.eager_time_s,
                bound_s=m.bound_s, gap=m.gap, status=m.status, solver=m.solver,
                solve_time_s=round(m.solve_time_s, 2), time_limit_s=time_limit_s,
                recomputations=sol.schedule.recompute_count(), file=file, file_bytes=file_bytes,
                fingerprint=m.fingerprint, monet_version=m.monet_version, torch_version=m.torch_version,
                created=m.created)


@dataclass
class _Ctx:
    root: Path
    time_limit: float
    gap: float
    solver: str
    solver_log: bool
    existing: dict = field(default_factory=dict)
    skip_existing: bool = False
    best: dict = field(default_factory=dict)  # `load_best_known`'s table the entries are held against


def comparable(cfg: ZooConfig) -> bool:
    """Whether ``cfg``'s entries can be held against the best-known table: the table's rows are for
    the zoo model's own input shape, the full mode, a CUDA device and the P100 costs."""
    from monet.zoo.models.registry import MODELS

    return (cfg.mode == MODE and cfg.device == "cuda" and cfg.gpu_spec == "p100"
            and cfg.shape == tuple(MODELS[cfg.model].input_shape))


def best_known_fields(rec: dict, best: dict, eager_bytes: int) -> dict:
    """The best-known fields of index record ``rec`` (`monet.zoo.index.FIELDS`): ``best_known_s``,
    the lowest objective known (seconds, `best_fitting`) among the table's rows of the same model and
    batch whose budget fits the entry's ``budget_bytes``; ``best_known_budget``, that row's key;
    ``vs_best`` = objective / best known - 1 (negative: the entry beats every schedule known).  All
    None when no row fits (or ``best`` is empty: a configuration the table does not cover).

    ``eager_bytes``: plain PyTorch's simulated peak (bytes), for the table's percent budgets.
    """
    budget = int(rec["budget_bytes"])
    found = best_fitting(best, rec["model"], rec["batch_size"], budget, eager_bytes)
    if found is None:
        return dict(best_known_s=None, best_known_budget=None, vs_best=None)
    value, row = found
    return dict(best_known_s=value, best_known_budget=row, vs_best=rec["objective_s"] / value - 1.0)


def beats_best(rec: dict) -> bool:
    """Whether entry ``rec`` has a budget key (`budget_key`) and beats the best schedule known
    within its budget (``vs_best`` < 0, beyond float noise: `SAME`).  An entry no row fits has
    nothing to beat (``vs_best`` None): it is not recorded."""
    return budget_key(rec["budget"]) is not None and rec.get("vs_best") is not None and rec["vs_best"] < -SAME


def record_best(records: list[dict], command: str, path: Path | str = BEST_KNOWN) -> list[dict]:
    """Write the entries of ``records`` that beat the best schedule known within their budget
    (`beats_best`) into the best-known table at ``path`` under their budget key (``"10GB"``,
    ``"50"`` for ``"50%"``), with ``command`` as ``found_by``; returns the rows written
    (`monet.solver.best_known.record_best_known`).

    Raises:
        OSError: the table cannot be written.
    """
    rows = [dict(model=r["model"], batch=r["batch_size"], _key=budget_key(r["budget"]), _value=r["objective_s"])
            for r in records if beats_best(r)]
    return record_best_known(rows, command, path) if rows else []


def _held(rec: dict, cfg: ZooConfig, ctx: _Ctx, eager: int) -> dict:
    """`best_known_fields` of ``rec``, against the build's table where it covers ``cfg``."""
    return best_known_fields(rec, ctx.best if comparable(cfg) else {}, eager)


def _solve(graph, zc: ZooCosts, cfg: ZooConfig, name: str, budget: int, ctx: _Ctx):
    """(solution, wall seconds) at ``budget``; raises InfeasibleBudgetError as `solve` does."""
    from monet.solver.solve import solve

    _log(f"{name}: solving at {budget / GiB:.3f} GiB ({budget} bytes), {cfg.mode}, {ctx.solver}, "
         f"time limit {ctx.time_limit:g} s")
    info = RunInfo(model=cfg.model, batch_size=cfg.batch_size, input_shape=cfg.shape, dtype=graph.input_dtype,
                   device=cfg.device)
    progress = (lambda msg: _log(f"  {name}: {msg}")) if ctx.solver_log else None
    t0 = time.perf_counter()
    sol = solve(graph, zc.costs, budget, cfg.mode, solver=ctx.solver, time_limit=ctx.time_limit, info=info,
                device=cfg.device, cost_fn=zc.cost_fn, progress=progress, gap=ctx.gap)
    wall = time.perf_counter() - t0
    sol.meta.cost_source = zc.source
    # plain PyTorch's predicted time: PyTorch's kernels, no recomputation (the solver's figure is the
    # time of the chosen implementations without recomputation when it picked any)
    sol.meta.eager_time_s = float(zc.costs.total_time)
    if wall > 1.1 * ctx.time_limit + 5:
        _log(f"{name}: the solve OVERRAN its time limit: {wall:.0f} s > {ctx.time_limit:g} s")
    return sol, wall


def _reuse(sol, budget: int, source_name: str):
    """A copy of ``sol`` (a schedule of this configuration solved at another budget) for ``budget``,
    which its simulated peak fits: the solver found nothing better at ``budget``.  Its bound stays a
    valid lower bound (a smaller budget only removes schedules), so its gap is still an upper bound."""
    import copy

    out = copy.deepcopy(sol)
    out.meta.budget_bytes = int(budget)
    out.meta.solver = f"{sol.meta.solver} (schedule of {source_name})"
    return out


def _save_entry(sol, cfg: ZooConfig, label: str, ctx: _Ctx, wall: float, eager: int, substitute_for=None) -> dict:
    from monet.solution import save_solution

    name = cfg.entry_name(label)
    file = f"{name}.pkl"
    path = ctx.root / SCHEDULES / file
    save_solution(sol, path)
    path.chmod(0o644)  # package data: readable by everyone once installed (save_solution's temp file is 0600)
    rec = record_of(sol, name=name, budget=label, file=file, file_bytes=path.stat().st_size,
                    time_limit_s=ctx.time_limit, substitute_for=substitute_for)
    rec["wall_s"] = round(wall, 1)
    rec.update(_held(rec, cfg, ctx, eager))
    gap = "-" if sol.meta.gap is None else f"{100 * sol.meta.gap:.2f} %"
    _log(f"{name}: {sol.meta.status} ({sol.meta.solver}), budget {sol.meta.budget_bytes / GiB:.3f} GiB, predicted "
         f"peak {sol.meta.predicted_peak_bytes / GiB:.3f} GiB, overhead {pct(rec['predicted_overhead'])}, gap {gap}, "
         f"vs best known {pct(rec['vs_best'])}, {rec['recomputations']} recomputations, "
         f"{rec['file_bytes'] / 1024:.0f} KiB, {wall:.0f} s")
    return rec


def build_config(cfg: ZooConfig, ctx: _Ctx, on_entry=None) -> tuple[list[dict], list[str]]:
    """Capture, cost and solve one configuration at each of its budgets.

    At each budget the entry is the faster of the solver's schedule and the schedules already
    solved for this configuration at other budgets whose simulated peak fits (a solve stopped by its
    time limit, or an ILP whose memory model is stricter than the simulator, can miss them); where
    neither exists the budget is infeasible and a 'min' entry stands in (see the module docstring).

    Returns (records, failures: one line per entry that failed).  ``on_entry(record)`` is called as
    each entry is written (and again when a 'min' entry's ``substitute_for`` grows).
    """
    from monet.solver.ilp import InfeasibleBudgetError
    from monet.solver.solve import eager_peak, parse_budget

    t0 = time.perf_counter()
    graph = capture_config(cfg.model, cfg.batch_size, cfg.input_shape)
    zc = zoo_costs(graph, cfg.gpu_spec)
    eager = eager_peak(graph, zc.costs)
    _log(f"{cfg.model} batch {cfg.batch_size} input {'x'.join(map(str, cfg.shape))}: {graph.describe()}; "
         f"costs {zc.source}; plain PyTorch's simulated peak {eager / GiB:.2f} GiB; "
         f"captured and costed in {time.perf_counter() - t0:.1f} s")
    records: list[dict] = []
    failures: list[str] = []
    built: list[tuple[str, object]] = []  # (entry name, solution) solved in this build
    least = None  # the smallest feasible budget known, once a budget was infeasible
    min_rec = None

    emit = on_entry or (lambda rec: None)

    for label in cfg.budgets:
        name = cfg.entry_name(label)
        budget = parse_budget(label, eager)
        if least is not None and budget < least:
            _log(f"{name}: skipped: {budget / GiB:.3f} GiB is below the smallest feasible budget known, "
                 f"{least / GiB:.3f} GiB ({least} bytes); {min_rec['name'] if min_rec else 'no entry'} stands in")
            if min_rec is not None:
                min_rec["substitute_for"].append(label)
                emit(min_rec)
            continue
        kept = _kept_entry(name, graph, cfg, ctx, eager)
        if kept is not None:
            records.append(kept[0])
            built.append((name, kept[1]))
            continue
        try:
            sol, wall, found = None, 0.0, None
            try:
                sol, wall = _solve(graph, zc, cfg, name, budget, ctx)
            except InfeasibleBudgetError as e:
                found = e.min_budget_bytes
            fits = [(n, s) for n, s in built if s.meta.predicted_peak_bytes <= budget]
            prior = min(fits, key=lambda ns: ns[1].meta.objective_s, default=None)
            if prior is not None and (sol is None or prior[1].meta.objective_s < sol.meta.objective_s):
                _log(f"{name}: {prior[0]}'s schedule fits this budget and is faster than what the solver found "
                     f"({'nothing' if sol is None else f'{sol.meta.objective_s:.4f} s'}): using it")
                sol = _reuse(prior[1], budget, prior[0])
            if sol is not None:
                rec = _save_entry(sol, cfg, label, ctx, wall, eager)
                built.append((name, sol))
                records.append(rec)
                emit(rec)
                continue
            # infeasible: one 'min' entry at the smallest feasible budget known
            least, sol, wall = _at_smallest(graph, zc, cfg, ctx, name, built, found, eager)
            name = cfg.entry_name("min")
            min_rec = _save_entry(sol, cfg, "min", ctx, wall, eager, substitute_for=[label])
            records.append(min_rec)
            emit(min_rec)
        except Exception as e:  # noqa: BLE001 - one failed entry must not end the build
            failures.append(f"{name}: {type(e).__name__}: {e}")
            _log(f"{name}: FAILED: {type(e).__name__}: {e}")
    _use_faster_smaller(records, built, cfg, ctx, eager, emit)
    return records, failures


def _at_smallest(graph, zc, cfg: ZooConfig, ctx: _Ctx, name: str, built: list, found: int | None, eager: int):
    """(smallest feasible budget known in bytes, its schedule, solve seconds) for the 'min' entry
    that stands in for the infeasible entry ``name``: the smallest-peak schedule of this build where
    none smaller was ``found`` (bytes, from the solver's error), else a solve at ``found`` (searched
    for first if neither is known)."""
    from monet.solver.solve import min_budget

    smallest = min(built, key=lambda ns: ns[1].meta.predicted_peak_bytes, default=None)
    if found is None and smallest is None:
        found, _ = min_budget(graph, zc.costs, cfg.mode, ctx.solver, ctx.time_limit, cfg.device, zc.cost_fn)
    min_name = cfg.entry_name("min")
    if smallest is not None and (found is None or smallest[1].meta.predicted_peak_bytes <= found):
        least = smallest[1].meta.predicted_peak_bytes
        _log(f"{name}: infeasible: the smallest feasible budget known is {least / GiB:.3f} GiB ({least} bytes, "
             f"{100 * least / eager:.1f} % of plain PyTorch's peak), the peak of {smallest[0]}'s schedule; "
             f"recording {min_name} with that schedule at that budget")
        return least, _reuse(smallest[1], least, smallest[0]), 0.0
    _log(f"{name}: infeasible: the smallest feasible budget found is {found / GiB:.3f} GiB ({found} bytes, "
         f"{100 * found / eager:.1f} % of plain PyTorch's peak); recording {min_name} at that budget")
    sol, wall = _solve(graph, zc, cfg, min_name, found, ctx)
    return found, sol, wall


def _kept_entry(name: str, graph, cfg: ZooConfig, ctx: _Ctx, eager: int):
    """(record, solution) of the entry ``name`` already in the zoo for this graph, with
    ``--skip-existing``; None where it must be solved."""
    old = ctx.existing.get(name)
    if not (ctx.skip_existing and old is not None and old.get("fingerprint") == graph.fingerprint
            and (ctx.root / SCHEDULES / old["file"]).is_file()):
        return None
    from monet.solution import load_solution

    kept = load_solution(ctx.root / SCHEDULES / old["file"])
    # the same graph, unless an older monet grouped its ops into other nodes
    if (kept.meta.n_fwd, kept.meta.n_bwd) != (len(graph.fwd), len(graph.bwd)):
        return None
    _log(f"{name}: kept (already in the zoo for this graph)")
    return {**old, **_held(old, cfg, ctx, eager)}, kept


def _use_faster_smaller(records: list[dict], built: list, cfg: ZooConfig, ctx: _Ctx, eager: int, emit) -> None:
    """Replace, in ``records``, each entry whose budget another entry's schedule (``built``) fits
    and beats."""
    # the other direction: a schedule solved at a smaller budget that is faster than a larger
    # budget's (each solve stops at its time limit, so the frontier need not come out monotone)
    by_name = dict(built)
    for i, rec in enumerate(records):
        own = by_name.get(rec["name"])
        if own is None:
            continue
        fits = [(n, s) for n, s in built if s.meta.predicted_peak_bytes <= rec["budget_bytes"] and n != rec["name"]]
        best = min(fits, key=lambda ns: ns[1].meta.objective_s, default=None)
        if best is not None and best[1].meta.objective_s < own.meta.objective_s * (1 - 1e-9):
            _log(f"{rec['name']}: {best[0]}'s schedule fits this budget and is faster "
                 f"({best[1].meta.objective_s:.4f} s vs {own.meta.objective_s:.4f} s): using it")
            sol = _reuse(best[1], rec["budget_bytes"], best[0])
            # a smaller budget's bound is no bound here (a larger budget admits more schedules):
            # this budget's own solve gives the bound, and the gap against it
            m = sol.meta
            m.bound_s = own.meta.bound_s
            m.gap = None if m.bound_s is None else max(0.0, 1 - m.bound_s / m.objective_s)
            m.status = "gap" if m.gap is not None and m.gap <= ctx.gap else "heuristic"
            new = _save_entry(sol, cfg, rec["budget"], ctx, rec.get("wall_s", 0.0), eager,
                              substitute_for=rec.get("substitute_for") or None)
            records[i] = new
            by_name[rec["name"]] = sol
            emit(new)


def _build_worker(cfg: ZooConfig, ctx: _Ctx):
    return build_config(cfg, ctx)


def select_configs(models=None, budgets=None) -> list[ZooConfig]:
    """The zoo configurations of ``models`` (default all), with only ``budgets`` where given.

    Raises:
        ValueError: an unknown model or a malformed budget, before anything is solved.
    """
    by_model = {c.model: c for c in CONFIGS}
    names = list(by_model) if not models else list(models)
    unknown = [m for m in names if m not in by_model]
    if unknown:
        raise ValueError(f"no zoo configuration for {', '.join(unknown)}; choose from {', '.join(by_model)}")
    if budgets:
        from monet.solver.solve import parse_budget

        for b in budgets:
            parse_budget(b, 1)  # ValueError on a malformed budget, before anything is solved
    out = []
    for m in names:
        c = by_model[m]
        if budgets:
            c = ZooConfig(c.model, c.batch_size, tuple(budgets), c.input_shape, c.mode, c.device, c.gpu_spec)
        out.append(c)
    return out


def build(configs=None, *, root: Path | str | None = None, models=None, budgets=None,
          time_limit: float = DEFAULT_TIME_LIMIT, gap: float = DEFAULT_GAP, solver: str = "CBC", jobs: int = 1,
          skip_existing: bool = False, solver_log: bool = True, record_best_by: str | None = None,
          best_known: Path | str = BEST_KNOWN) -> tuple[list[dict], list[str]]:
    """(Re)build zoo entries and the index; returns (the index's records, failures).

    Args:
        configs: `ZooConfig` list; default `CONFIGS` (narrowed by ``models`` and ``budgets``).
        root: the zoo folder (index.json and schedules/); default the installed zoo (`ZOO_DIR`).
        time_limit: seconds per solve (`monet.solver.solve.solve`).
        jobs: configurations solved in parallel (one process each; 1: in this process).
        skip_existing: keep entries already in the index for the same graph instead of solving again.
        record_best_by: the command line of this build: each configuration's entries that beat the
            best schedule known within their budget are written into ``best_known`` under their
            budget key with it (`record_best`); None: the table is only read.
        best_known: the best-known table (`monet.solver.best_known`) each entry's ``best_known_s``
            and ``vs_best`` come from (only for configurations the table covers: `comparable`).

    Raises:
        OSError: the zoo folder or, with ``record_best_by``, the best-known table cannot be written.

    The index is rewritten after every entry (jobs=1) or configuration (jobs>1), so an interrupted
    build keeps what it finished.  Entries of a rebuilt configuration that this build did not produce
    again (a budget that became infeasible, a 'min' entry no longer needed) are removed with their
    files, unless their build failed.
    """
    root = Path(root) if root is not None else ZOO_DIR
    (root / SCHEDULES).mkdir(parents=True, exist_ok=True)
    configs = list(configs) if configs is not None else select_configs(models, budgets)
    index = {r["name"]: r for r in load_index(root)}
    ctx = _Ctx(root=root, time_limit=float(time_limit), gap=gap, solver=solver, solver_log=solver_log,
               existing=dict(index), skip_existing=skip_existing, best=load_best_known(best_known))
    failures: list[str] = []
    t0 = time.perf_counter()

    def on_entry(rec):
        index[rec["name"]] = rec
        save_index(list(index.values()), root)

    def finish(cfg, records, failed):
        produced = {r["name"] for r in records}
        failed_names = {f.split(":", 1)[0] for f in failed}
        candidates = {cfg.entry_name(b) for b in cfg.budgets} | {cfg.entry_name("min")}
        for name in sorted(candidates - produced - failed_names):
            old = index.pop(name, None)
            if old is not None:
                (root / SCHEDULES / old["file"]).unlink(missing_ok=True)
                _log(f"{name}: removed from the zoo (not produced by this build)")
        for r in records:
            index[r["name"]] = r
        save_index(list(index.values()), root)
        failures.extend(failed)
        if record_best_by is not None:
            for e in record_best(records, record_best_by, best_known):
                _log(f"new best known: {e['model']} {e['batch']} at {e['budget']}: {e['best']:.6g} {e['unit']}")

    _log(f"building {len(configs)} configuration(s) into {root}, time limit {time_limit:g} s per solve, "
         f"{jobs} job(s)")
    if jobs <= 1:
        for k, cfg in enumerate(configs, 1):
            _log(f"[{k}/{len(configs)}] {cfg.model} batch {cfg.batch_size}")
            records, failed = build_config(cfg, ctx, on_entry)
            finish(cfg, records, failed)
    else:
        import multiprocessing
        from concurrent.futures import ProcessPoolExecutor, as_completed

        with ProcessPoolExecutor(max_workers=jobs, mp_context=multiprocessing.get_context("spawn")) as pool:
            futures = {pool.submit(_build_worker, cfg, ctx): cfg for cfg in configs}
            for k, fut in enumerate(as_completed(futures), 1):
                cfg = futures[fut]
                try:
                    records, failed = fut.result()
                except Exception as e:  # noqa: BLE001 - capture failed: the whole configuration
                    records, failed = [], [f"{cfg.model}-{cfg.batch_size}: {type(e).__name__}: {e}"]
                finish(cfg, records, failed)
                _log(f"[{k}/{len(configs)}] {cfg.model} batch {cfg.batch_size} done")
    _log(f"done in {(time.perf_counter() - t0) / 60:.1f} min: {len(index)} entries in the zoo"
         + (f", {len(failures)} failed" if failures else ""))
    return sorted(index.values(), key=lambda r: r["name"]), failures


__all__ = ["CONFIGS", "ZooConfig", "MODE", "CNN_BUDGETS", "GPT_BUDGETS", "BATCH", "capture_config", "zoo_costs",
           "find_profile", "build", "build_config"]
