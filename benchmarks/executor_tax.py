"""The executor's own cost: MONeT keeping every activation (nothing recomputed) against plain PyTorch.

    python benchmarks/executor_tax.py                      # CPU rows (CUDA rows too where there is a GPU)
    python benchmarks/executor_tax.py --device cuda        # the GPU rows only
    python benchmarks/executor_tax.py --rows demo,gpt2-b2 --pairs 200
    python benchmarks/executor_tax.py --device cpu --threads 1 --clock cpu   # least noise on a shared CPU

At a 100 % budget MONeT's schedule keeps everything, so whatever its iteration costs beyond plain
PyTorch's is the executor's own: the wrapper's per-call work, AOTAutograd's runtime around the
forward and backward modules, the generated code calling one ATen op per node (the backward in
Python, where plain PyTorch's autograd engine runs C++), and what AOTAutograd's functional graph
adds (BatchNorm's running statistics copied back after the forward).  The goal is at most `GOAL`
over plain PyTorch.

Each row builds the model (weights from seed 0, its loss inside the captured graph:
`reach_table.build`), captures it, wraps a copy with the schedule that keeps everything
(`monet.profiling.dispatch.keep_all`) and times one training iteration of each
(`phase_step`: gradients set to None, forward, loss, backward, the clock read between the passes), plain
PyTorch and MONeT alternately in this process after `WARMUP` iterations of each, ``--pairs`` times
(default: about ``--target-s`` seconds per side, at least `MIN_PAIRS`).  The tax is the median over
the pairs of MONeT's time over plain PyTorch's in the same pair, minus 1
(`monet.profiling.measure.paired_ratio`); the spread is the interquartile range of those ratios, in
points: on this project's shared 2-core CPUs one iteration's time moves by tens of percent while
other jobs run, and the median of paired ratios is what stays.  "goal" says whether `GOAL` is met
(``met``: the upper quartile is under it; ``not met``: the lower quartile is over it; ``within
spread`` otherwise).  "tax of forward / backward" is the same median of paired ratios for each pass
alone (the forward pass with its loss): where the tax is paid.  ``--clock cpu`` times this process's CPU time instead of wall time (CPU rows):
other jobs on a shared machine delay a process more than they slow it, so its spread is smaller;
with one thread (``--threads 1``) it is the time the iteration itself took.

Rows (`ROWS`): the demo's quarter-width ResNet-50 (``monet demo``: batch 64, 3x64x64), the zoo's
ResNet-50 and MobileNetV2 at `benchmarks/bench.py`'s CPU configurations and at batch 2 (where the
per-node cost shows), the reach suite's tiny GPT-2 (transformers) at batch 16 and 2, the depth
benchmark's GPT-2, Llama and BERT with 24 layers (``benchmarks/depth.py``: hidden 256, 2 x 256
tokens; the deep-network goal is the same 2 %), and GPT-2 and BERT at 4, 16, 48 and 96
layers (the tax against depth; ``--bf16`` runs them under bf16 autocast, as the depth benchmark's
bf16 rows train); on CUDA
MONeT's ResNet-50 (batch 184, 3x224x224), the same at batch 16 and 3x64x64 (the GPU's first
session's small case), MobileNetV2 at batch 64 and the tiny GPT-2.  Progress goes to stderr, the
table (markdown) to stdout.
"""
from __future__ import annotations

import argparse
import gc
import os
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import bench  # noqa: E402  (first: sets OMP_WAIT_POLICY=PASSIVE before torch loads)
import reach_table as rt  # noqa: E402

import numpy as np  # noqa: E402
import torch  # noqa: E402

GOAL = 0.02  # the executor's own cost at a 100 % budget, over plain PyTorch
WARMUP = 3  # iterations of each side before timing (the first traces and compiles)
MIN_PAIRS = 15


@dataclass(frozen=True)
class Case:
    """One row: ``model`` as `reach_table.build` names it (``zoo/<name>`` or a reach model), its
    batch, and for a zoo model one sample's ``shape`` and factory ``kwargs`` (None: bench.py's)."""

    label: str
    model: str
    batch: int
    device: str
    shape: tuple | None = None
    kwargs: dict | None = None
    layers: int = 0  # a ``depth/<name>`` model: `depth.build`'s transformers model with this many layers


QUARTER = {"base_width": 16}  # monet demo's ResNet-50 (monet/cli/demo.py: DEMO_WIDTH)
ROWS: dict[str, Case] = {c.label: c for c in (
    Case("demo", "zoo/resnet50", 64, "cpu", (3, 64, 64), QUARTER),
    Case("resnet50", "zoo/resnet50", 8, "cpu"),
    Case("resnet50-b2", "zoo/resnet50", 2, "cpu"),
    Case("mobilenet_v2", "zoo/mobilenet_v2", 8, "cpu"),
    Case("mobilenet_v2-b2", "zoo/mobilenet_v2", 2, "cpu"),
    Case("gpt2", "transformers/gpt2", 16, "cpu"),
    Case("gpt2-b2", "transformers/gpt2", 2, "cpu"),
    Case("gpt2-24-layers", "depth/gpt2", 2, "cpu", layers=24),
    Case("llama-24-layers", "depth/llama", 2, "cpu", layers=24),
    Case("bert-24-layers", "depth/bert", 2, "cpu", layers=24),
    # the tax against depth (per layer, not per iteration: `monet.profiling.shallow.carried_record`)
    *(Case(f"{m}-{n}-layers", f"depth/{m}", 2, "cpu", layers=n) for m in ("gpt2", "bert") for n in (4, 16, 48, 96)),
    Case("cuda-resnet50-b184", "zoo/resnet50", 184, "cuda", (3, 224, 224), {}),
    Case("cuda-resnet50-b16", "zoo/resnet50", 16, "cuda", (3, 64, 64), {}),
    Case("cuda-demo", "zoo/resnet50", 64, "cuda", (3, 64, 64), QUARTER),
    Case("cuda-mobilenet_v2-b64", "zoo/mobilenet_v2", 64, "cuda", (3, 224, 224), {}),
    Case("cuda-gpt2", "transformers/gpt2", 16, "cuda"),
)}


@dataclass
class Result:
    """One row's figures: seconds, fractions; ``error`` instead where the row failed."""

    case: Case
    inputs: str = ""
    nodes: str = ""
    plain_s: float | None = None
    monet_s: float | None = None
    tax: float | None = None
    q25: float | None = None
    q75: float | None = None
    forward_tax: float | None = None  # the same, of the forward pass alone (loss included)
    backward_tax: float | None = None  # of the backward pass alone
    pairs: int = 0
    error: str | None = None
    notes: list[str] = field(default_factory=list)


def _log(msg: str) -> None:
    print(f"[executor_tax] {msg}", file=sys.stderr, flush=True)


def _on(device: str, model, inputs):
    from monet.inputs import ExampleInputs

    return model.to(device), ExampleInputs.of(inputs).to(device)


def phase_step(model, inputs, clock, into: list, autocast=None) -> None:
    """`monet.profiling.measure.training_step` (gradients set to None, forward, loss, backward; the
    forward under ``autocast``, a `monet.mixed_precision` setting) with ``clock`` read after its
    loss: appends ``(forward seconds, backward seconds)`` to ``into``, the forward pass with its
    loss."""
    from monet.profiling.measure import loss_of, training_step

    marks = [clock()]

    def loss_then_mark(out):
        loss = loss_of(out)
        marks.append(clock())
        return loss

    training_step(model, inputs, loss_fn=loss_then_mark, autocast=autocast)
    into.append((marks[1] - marks[0], clock() - marks[1]))


def measure(case: Case, pairs: int | None, target_s: float, clock=time.perf_counter, bf16: bool = False) -> Result:
    """Time ``case``: plain PyTorch and MONeT keeping everything, alternately (module docstring),
    with ``clock`` (wall time, or ``time.process_time``: ``--clock cpu``); ``bf16``: each forward
    pass under bf16 autocast on ``case.device``, the graph captured so (``--bf16``)."""
    from monet.capture import capture
    from monet.inputs import ExampleInputs
    from monet.plan import WithLoss
    from monet.profiling.measure import interleaved_times_of, paired_ratio
    from monet.profiling.costs import analytic_costs, costs_for
    from monet.profiling.dispatch import keep_all

    res = Result(case)
    if case.model.startswith("depth/"):  # the depth benchmark's configuration (hidden 256, 256 tokens)
        import depth

        model, raw = depth.build(case.model.split("/", 1)[1], case.layers, 256, 256, case.batch, 1024)
        target = loss_fn = None
    else:
        model, raw, target, loss_fn = rt.build(case.model, case.batch, case.shape, case.kwargs)
    inputs = ExampleInputs.of(raw)
    if target is not None:
        model = WithLoss(model, loss_fn)
        inputs = ExampleInputs(inputs.args, {**inputs.kwargs, "target": target})
    model, inputs = _on(case.device, model, inputs)
    t0 = time.perf_counter()
    amp = (case.device, "bfloat16") if bf16 else None
    graph = capture(model, inputs, autocast_dtype=torch.bfloat16 if bf16 else None)
    res.nodes, res.inputs = f"{len(graph.fwd)}+{len(graph.bwd)}", inputs.describe()
    monet = keep_all(model, inputs, graph, costs_for(graph, analytic_costs(graph)))
    _log(f"{case.label}: {inputs.describe()} on {case.device}, {res.nodes} nodes, captured in "
         f"{time.perf_counter() - t0:.1f} s")
    phases = ([], [])  # (forward s, backward s) of each call, plain PyTorch's and MONeT's
    plain_step, monet_step = (lambda: phase_step(model, inputs, clock, phases[0], amp)), \
        (lambda: phase_step(monet, inputs, clock, phases[1], amp))
    for _ in range(WARMUP):
        plain_step()
        monet_step()
    if pairs is None:
        t0 = time.perf_counter()
        plain_step()
        pairs = max(MIN_PAIRS, int(target_s / max(time.perf_counter() - t0, 1e-6)))
    for p in phases:
        p.clear()  # the warm-up's
    times_plain, times_monet = interleaved_times_of((plain_step, monet_step), pairs, 0, case.device, clock)
    (fp, bp), (fm, bm) = (np.asarray(p).T for p in phases)
    res.forward_tax, res.backward_tax = paired_ratio(fm, fp) - 1.0, paired_ratio(bm, bp) - 1.0
    ratios = np.asarray(times_monet) / np.asarray(times_plain)
    res.plain_s, res.monet_s = float(np.median(times_plain)), float(np.median(times_monet))
    res.tax = paired_ratio(times_monet, times_plain) - 1.0
    res.q25, res.q75 = (float(q) - 1.0 for q in np.percentile(ratios, [25, 75]))
    res.pairs = pairs
    _log(f"  plain {1e3 * res.plain_s:.2f} ms, MONeT {1e3 * res.monet_s:.2f} ms: tax {100 * res.tax:+.1f} % "
         f"(quartiles {100 * res.q25:+.1f} / {100 * res.q75:+.1f} %, {pairs} pairs; forward "
         f"{100 * res.forward_tax:+.1f} %, backward {100 * res.backward_tax:+.1f} %)")
    return res


def goal(res: Result) -> str:
    """Whether the row meets `GOAL`: its upper quartile under it, its lower quartile over it, or neither."""
    if res.tax is None:
        return ""
    if res.q75 <= GOAL:
        return "met"
    if res.q25 > GOAL:
        return "not met"
    return "within spread"


HEADER = ["row", "model", "batch", "inputs", "device", "nodes (fwd+bwd)", "plain ms", "MONeT keep-all ms", "tax %",
          "spread: quartiles %", "pairs", f"goal <= {100 * GOAL:g} %", "tax of forward / backward %"]


def table_rows(results: list[Result]) -> list[list[str]]:
    """One row of cells (`HEADER`) per result."""
    rows = []
    for r in results:
        c = r.case
        if r.error:
            rows.append([c.label, c.model, str(c.batch), r.inputs, c.device, "", "", "", "", r.error, "", "", ""])
            continue
        rows.append([c.label, c.model, str(c.batch), r.inputs, c.device, r.nodes, f"{1e3 * r.plain_s:.2f}",
                     f"{1e3 * r.monet_s:.2f}", f"{100 * r.tax:+.1f}",
                     f"{100 * r.q25:+.1f} / {100 * r.q75:+.1f}", str(r.pairs), goal(r),
                     f"{100 * r.forward_tax:+.1f} / {100 * r.backward_tax:+.1f}"])
    return rows


def table(results: list[Result]) -> str:
    """The markdown table of ``results``."""
    from monet.profiling.markdown import md_table

    return md_table(HEADER, table_rows(results))


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--device", default="auto", help="cpu, cuda, or auto (default): the CPU rows, and the CUDA "
                                                     "rows where CUDA is available")
    p.add_argument("--rows", default=None, help=f"comma-separated rows of {', '.join(ROWS)}")
    p.add_argument("--csv", type=Path, default=None, help="append the rows, with their provenance, to this raw "
                   "results file (benchmarks/results/executor-tax.csv: `benchmarks/report.py` renders it)")
    p.add_argument("--pairs", type=int, default=None, help=f"timed pairs per row (default: about --target-s "
                                                           f"seconds per side, at least {MIN_PAIRS})")
    p.add_argument("--target-s", type=float, default=10.0, help="seconds per side when --pairs is not given")
    p.add_argument("--threads", type=int, default=None, help="torch.set_num_threads (default: torch's)")
    p.add_argument("--clock", choices=("wall", "cpu"), default="wall",
                   help="wall time (default), or this process's CPU time (time.process_time; CPU rows only), "
                        "which other jobs on a shared machine move less")
    p.add_argument("--bf16", action="store_true",
                   help="each forward pass under bf16 autocast (the backward outside it, as the AMP recipe "
                        "runs it), the graph captured so")
    p.add_argument("--no-lowering", action="store_true",
                   help="run the executor without the CPU's fp32 dropout lowering "
                        "(monet.impls.dropout.lower_dropout: forward and backward), to set it against the default")
    p.add_argument("--out-of-place", action="store_true",
                   help="run the executor without its in-place pass (monet.inplace.make_inplace)")
    args = p.parse_args(argv)
    if args.pairs is not None and args.pairs < 3:
        p.error("--pairs must be >= 3")
    return args


def main(argv=None) -> int:
    args = parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    devices = {"auto": ("cpu", "cuda") if torch.cuda.is_available() else ("cpu",)}.get(args.device, (args.device,))
    if "cuda" in devices and not torch.cuda.is_available():
        _log("--device cuda: CUDA is not available")
        return 1
    names = args.rows.split(",") if args.rows else [n for n, c in ROWS.items() if c.device in devices]
    unknown = [n for n in names if n not in ROWS]
    if unknown:
        _log(f"unknown rows {unknown}: choose from {', '.join(ROWS)}")
        return 1
    info = bench.machine()
    if "cuda" in devices:
        info["GPU"] = torch.cuda.get_device_name()
    _log(", ".join(f"{k} {v}" for k, v in info.items()))
    if args.clock == "cpu" and "cuda" in devices:
        _log("--clock cpu does not see a GPU's work: use it with --device cpu")
        return 1
    clock = time.process_time if args.clock == "cpu" else time.perf_counter
    if args.no_lowering:
        from monet.impls import dropout

        dropout.lower_dropout = lambda graph: 0
    if args.out_of_place:
        import monet.executor

        monet.executor.make_inplace = lambda graph: 0
    started, load_before = time.time(), os.getloadavg()[0]
    results = []
    for name in names:
        case = ROWS[name]
        try:
            results.append(measure(case, args.pairs, args.target_s, clock, args.bf16))
        except Exception as e:  # noqa: BLE001 - a failed row is a row, the others still run
            results.append(Result(case, error=bench.error_text(e)))
            _log(f"{name} failed: {results[-1].error}")
        gc.collect()
        if torch.cuda.is_available():
            torch.cuda.empty_cache()
    print(f"Executor tax (MONeT keeping everything vs plain PyTorch), torch {torch.__version__}, "
          f"{info['CPU']}, {info['torch threads']} threads" + (f", {info['GPU']}" if "GPU" in info else "")
          + f", {args.clock} clock" + (", without the CPU dropout lowering" if args.no_lowering else "")
          + (", out of place" if args.out_of_place else "") + (", bf16 autocast" if args.bf16 else "")
          + f"; load average {load_before:.1f} before, {os.getloadavg()[0]:.1f} after; {time.time() - started:.0f} s")
    print()
    print(table(results))
    if args.csv:
        from monet.profiling.raw_results import append_rows, command_line, provenance

        append_rows(args.csv, [dict(zip(HEADER, r)) for r in table_rows(results)],
                    provenance(command_line("python benchmarks/executor_tax.py", argv)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
