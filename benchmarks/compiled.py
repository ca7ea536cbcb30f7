"""monet compiled (``monet.optimize(..., compile=True)``) against what a ``torch.compile`` user has.

    python benchmarks/compiled.py --models gpt2,llama,bert --layers 12,24 --dtypes fp32,bf16 \\
        --csv benchmarks/results/compiled.csv
    python benchmarks/compiled.py --models resnet --csv benchmarks/results/compiled.csv

For each configuration (transformers' GPT-2, Llama and BERT built from a config as in
``benchmarks/depth.py``, or ``monet demo``'s quarter-width ResNet-50; fp32, or bf16 autocast on the
CPU), in a process of its own, every method trains the same batch from the same weights and is
measured side by side with plain ``torch.compile`` (Inductor, no budget), the reference of every
row:

* ``torch.compile`` with ``activation_memory_budget`` 0.5, 0.3 and 0.1 (Inductor);
* transformers' per-block activation checkpointing under ``torch.compile``;
* monet compiled at 50 %, 30 % and 100 % (keep everything) of plain PyTorch's simulated peak and at
  each peer's measured peak.

Columns (raw, one CSV row per method): ``peak`` (bytes, one training iteration at the allocator,
`monet.profiling.measure.step_peak`), ``overhead`` against plain ``torch.compile`` (median of paired
interleaved iterations, minus 1: `monet.profiling.measure.step_overhead`), monet's
``predicted_overhead``, ``first_step_s`` (the first training step: Dynamo, AOTAutograd and
Inductor; monet's solve compiles and measures its step, `monet.held`), monet's ``startup_s``
(``monet.optimize`` plus the first step, the 50 % row) and its ``solve_s`` (with that
measurement), ``grads`` (the largest relative gradient difference against plain
``torch.compile`` after one step) and, in bf16, ``loss_drift`` (the largest relative difference of the loss from
``torch.compile``'s over `LOSS_STEPS` SGD steps).  Each row carries its provenance (date,
machine, torch, command); ``python benchmarks/report.py`` renders BENCHMARKS.md from the file.
"""
from __future__ import annotations

import argparse
import copy
import json
import subprocess
import sys
import time
from pathlib import Path

from monet.profiling.raw_results import append_rows, command_line, provenance

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))
LOSS_STEPS = 20
PEER_BUDGETS = (0.5, 0.3, 0.1)
COLUMNS = ["model", "layers", "dtype", "device", "hidden", "seq", "batch", "vocab", "dropout", "method", "budget", "peak",
           "predicted_peak", "overhead", "predicted_overhead", "first_step_s", "startup_s", "solve_s", "grads",
           "loss_drift", "status", "error"]
#: the columns that name a configuration: a run of the same one replaces its rows
CONFIG_KEYS = ("model", "layers", "dtype", "device", "hidden", "seq", "batch", "vocab", "dropout")


def build(cfg: dict):
    """(model, inputs (keyword arguments or one tensor), loss_fn or None, target or None)."""
    if cfg["model"] == "resnet":
        from monet.cli.common import build_model
        from monet.cli.demo import DEMO_BATCH, DEMO_MODEL, DEMO_SHAPE, DEMO_WIDTH
        from monet.profiling.training import random_target

        model, x = build_model(DEMO_MODEL, DEMO_BATCH, DEMO_SHAPE, "cpu", base_width=DEMO_WIDTH)
        loss_fn, target = random_target(model, x, False)
        return model, x, loss_fn, target
    from depth import build as build_transformer

    model, inputs = build_transformer(cfg["model"], cfg["layers"], cfg["hidden"], cfg["seq"], cfg["batch"],
                                      cfg["vocab"], dropout=cfg["dropout"])
    return model, inputs, None, None


def peers(model, loss):
    """(name, module) of the compiled peers, each compiling its own copy of ``model``."""
    from monet.profiling.baselines import compile_with_activation_budget, compiled_alone

    def budgeted(b):
        return compile_with_activation_budget(loss(copy.deepcopy(model)), b, backend="inductor", reset=False)

    for b in PEER_BUDGETS:
        yield f"torch.compile budget {b}", lambda b=b: budgeted(b)
    if hasattr(model, "activation_checkpointing_enable") or hasattr(model, "gradient_checkpointing_enable"):
        def blocks():
            m = copy.deepcopy(model)
            args = {"use_reentrant": False}
            if hasattr(m, "activation_checkpointing_enable"):
                m.activation_checkpointing_enable(activation_checkpointing_kwargs=args)
            else:
                m.gradient_checkpointing_enable(gradient_checkpointing_kwargs=args)
            return compiled_alone(loss(m))
        yield "transformers every 1, torch.compile", blocks


def one(cfg: dict) -> None:
    """The rows of one configuration, each printed as one JSON line as it is made."""
    from monet import compat

    with compat.dynamo_recompile_limit(64):  # one compilation per compiled copy of the model
        _rows(cfg)


def _rows(cfg: dict) -> None:
    import torch

    import monet
    from monet import mixed_precision
    from monet.inputs import ExampleInputs
    from monet.plan import WithLoss
    from monet.profiling.measure import max_rel_diff, step_overhead, step_peak, training_step
    from monet.solver.solve import parse_budget

    model, raw, loss_fn, target = build(cfg)
    device = torch.device(cfg.get("device", "cpu"))
    model = model.to(device)
    moved = lambda v: v.to(device) if isinstance(v, torch.Tensor) else v  # noqa: E731
    raw = ({k: moved(v) for k, v in raw.items()} if isinstance(raw, dict) else
           ExampleInputs(tuple(map(moved, raw.args)), {k: moved(v) for k, v in raw.kwargs.items()})
           if isinstance(raw, ExampleInputs) else moved(raw))
    target = moved(target)
    bf16 = cfg["dtype"] == "bf16"
    amp = (device.type, "bfloat16") if bf16 else None
    loss = (lambda m: WithLoss(m, loss_fn)) if loss_fn else (lambda m: m)
    inputs = ExampleInputs.of(raw)
    if target is not None:
        inputs = ExampleInputs(inputs.args, {**inputs.kwargs, "target": target})

    def report(**row):
        print(json.dumps({**{k: cfg[k] for k in COLUMNS if k in cfg}, **row}), flush=True)

    def first_step(module) -> float:
        t0 = time.perf_counter()
        training_step(module, inputs, autocast=amp)
        return time.perf_counter() - t0

    def gradients(module) -> dict:
        for p in module.parameters():
            p.grad = None
        torch.manual_seed(0)
        training_step(module, inputs, autocast=amp)
        return {k: p.grad.detach().clone() for k, p in enumerate(module.parameters()) if p.grad is not None}

    def losses(module) -> list[float]:
        opt = torch.optim.SGD(module.parameters(), lr=1e-3)
        out = []
        torch.manual_seed(0)
        for _ in range(LOSS_STEPS):
            opt.zero_grad(set_to_none=True)
            with mixed_precision.context(amp):
                value = inputs.call(module)
            value = value if isinstance(value, torch.Tensor) else value["loss"]
            value.backward()
            opt.step()
            out.append(float(value.detach()))
        return out

    reference = torch.compile(loss(copy.deepcopy(model)))
    ref_first = first_step(reference)
    ref_grads = gradients(reference)
    report(method="torch.compile", peak=step_peak(reference, inputs, autocast=amp), overhead=0.0,
           first_step_s=ref_first, grads="reference")
    ref_losses = losses(torch.compile(loss(copy.deepcopy(model)))) if bf16 else None

    def measure(name, module, **extra):
        first = first_step(module)
        peak = step_peak(module, inputs, autocast=amp)
        ovh = step_overhead(reference, module, inputs, repeats=cfg["repeats"], warmup=1, autocast=amp)[0]
        grads = max_rel_diff(gradients(module), ref_grads)
        row = dict(method=name, peak=peak, overhead=ovh, first_step_s=first, grads=f"{grads:.1e}", **extra)
        report(**row)
        return row

    targets = []
    for name, make in peers(model, loss):
        try:
            targets.append((name, measure(name, make())["peak"]))
        except Exception as e:  # noqa: BLE001 - a peer that fails is a row that says so
            report(method=name, error=f"{type(e).__name__}: {str(e).splitlines()[0][:160]}")

    kw = dict(loss_fn=loss_fn, target=target, autocast_dtype=torch.bfloat16 if bf16 else None, compile=True,
              progress=False)
    t0 = time.perf_counter()
    try:
        wrapper = monet.optimize(copy.deepcopy(model), raw, budget="50%", time_limit=cfg["time_limit"], **kw)
    except Exception as e:  # noqa: BLE001 - an infeasible budget is a row that says so
        report(method="monet compiled 50%", error=f"{type(e).__name__}: {str(e)[:160]}")
        wrapper = None
    startup = None if wrapper is None else time.perf_counter() - t0 + first_step(wrapper)
    plan = monet.prepare(copy.deepcopy(model), raw, **{k: v for k, v in kw.items() if k != "progress"},
                         progress=False)
    budgets = [("monet compiled 30%", parse_budget("30%", plan.eager_peak_bytes)),
               ("monet compiled 100%", plan.eager_peak_bytes)]
    budgets += [(f"monet compiled at {name}", peak) for name, peak in targets]

    def monet_row(name, w, solve_s, **extra):
        meta = w.solution.meta
        row = measure(name, w, budget=meta.budget_bytes, predicted_peak=meta.predicted_peak_bytes,
                      predicted_overhead=meta.predicted_overhead(), solve_s=solve_s, status=meta.status, **extra)
        if bf16:
            fresh = plan.wrap(w.solution, loss(copy.deepcopy(model)))
            mine = losses(fresh)
            report(method=name + " (losses)", loss_drift=max(abs(a - b) / abs(b) for a, b in zip(mine, ref_losses)))
        return row

    if wrapper is not None:
        monet_row("monet compiled 50%", wrapper, wrapper.solution.meta.solve_time_s, startup_s=startup)
        del wrapper
    for name, budget in budgets:
        t0 = time.perf_counter()
        try:
            sol = plan.solve(budget, time_limit=cfg["time_limit"])
        except Exception as e:  # noqa: BLE001 - an infeasible budget is a row that says so
            report(method=name, budget=budget, error=f"{type(e).__name__}: {str(e)[:160]}")
            continue
        monet_row(name, plan.wrap(sol), time.perf_counter() - t0)  # compiled and measured by the solve


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], epilog=__doc__.split("\n\n", 2)[-1],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--models", default="gpt2", help="comma-separated: gpt2, llama, bert, resnet")
    ap.add_argument("--layers", default="12", help="comma-separated depths (transformers)")
    ap.add_argument("--dtypes", default="fp32", help="comma-separated: fp32, bf16")
    ap.add_argument("--hidden", type=int, default=256)
    ap.add_argument("--seq", type=int, default=256)
    ap.add_argument("--batch", type=int, default=2)
    ap.add_argument("--vocab", type=int, default=1024)
    ap.add_argument("--dropout", type=float, default=0.0,
                    help="every dropout probability of the transformers (default 0: the gradient column compares "
                         "with torch.compile, whose random numbers depend on its partition)")
    ap.add_argument("--repeats", type=int, default=9, help="paired timed iterations per method")
    ap.add_argument("--device", default="cpu", help="cpu or cuda")
    ap.add_argument("--time-limit", type=float, default=60.0, help="seconds per monet solve")
    ap.add_argument("--csv", type=Path, help="raw results: appended, one row per method (required)")
    ap.add_argument("--one", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.one:
        one(json.loads(args.one))
        return 0
    if args.csv is None:
        ap.error("--csv is required: the file the rows are appended to")
    configs = []
    for model in args.models.split(","):
        for layers in ([0] if model == "resnet" else [int(v) for v in args.layers.split(",")]):
            for dtype in args.dtypes.split(","):
                configs.append(dict(model=model, layers=layers, dtype=dtype, hidden=args.hidden, seq=args.seq,
                                    batch=args.batch, vocab=args.vocab, dropout=args.dropout, repeats=args.repeats,
                                    time_limit=args.time_limit, device=args.device))
    prov = provenance(command_line("python benchmarks/compiled.py", argv))
    for cfg in configs:
        print(f"== {cfg['model']} {cfg['layers']} {cfg['dtype']}", file=sys.stderr, flush=True)
        proc = subprocess.run([sys.executable, __file__, "--one", json.dumps(cfg)], stdout=subprocess.PIPE, text=True)
        first = True
        for line in proc.stdout.splitlines():
            try:
                row = json.loads(line)
            except ValueError:
                continue
            if isinstance(row, dict) and "method" in row:
                # written as it comes; the configuration's first row replaces its earlier run
                append_rows(args.csv, [{k: row.get(k, "") for k in COLUMNS}], prov,
                            replaces=(lambda old, cfg=cfg: same_config(old, cfg)) if first else None)
                first = False
                print(line, file=sys.stderr)
        if proc.returncode:
            print(f"== the configuration's process exited {proc.returncode}", file=sys.stderr)
    return 0


def same_config(row: dict, cfg: dict) -> bool:
    """Whether a results row (strings, as read back) was measured on configuration ``cfg``."""
    return all(str(row.get(k, "")) == str(cfg[k]) for k in CONFIG_KEYS)


if __name__ == "__main__":
    raise SystemExit(main())
