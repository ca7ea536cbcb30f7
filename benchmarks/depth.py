"""Deep networks: monet against what a transformers user already has, at 12 to 96 layers.

    python benchmarks/depth.py --models gpt2 --layers 12 --csv benchmarks/results/depth-12.csv
    python benchmarks/depth.py --models gpt2,llama,bert --layers 24 --dtypes bf16 \\
        --csv benchmarks/results/depth-24-bf16.csv --plot docs/depth.png
    python benchmarks/depth.py --from-csv benchmarks/results/depth-12.csv,benchmarks/results/depth-24.csv \
        --plot docs/depth.png      # the plot of rows measured before

For each model (transformers' GPT-2, Llama and BERT, built from a config in the process: no
download), depth and dtype (fp32, or bf16 autocast on the CPU), one batch with labels (the loss in
the model) is trained by every method from the same weights, and each method is measured side by
side with plain PyTorch in one process:

* plain PyTorch;
* transformers' own activation checkpointing, `activation_checkpointing_enable` (formerly
  `gradient_checkpointing_enable`) with ``use_reentrant=False``, at ``every_n_layers`` 1, 2 and 4,
  and with ``offload=True`` (the saved block inputs in host memory: on the CPU no saving);
* torch's selective activation checkpointing around each layer with torchtitan's policy (keep what
  matrix products and attention compute, except every second matrix product; recompute the rest);
* ``torch.compile`` with ``torch._functorch.config.activation_memory_budget`` 0.5
  (`monet.profiling.baselines.compile_with_activation_budget`);
* monet (`monet.prepare` once, then one solve per budget, normal mode) at 50 % of plain PyTorch's
  simulated peak, at ``budget="min"`` (the smallest budget worth its recomputation,
  `monet.solver.smallest.knee`) and at each peer's measured peak.

Columns: the measured peak of one training iteration at the allocator
(`monet.profiling.measure.step_peak`), the overhead (`monet.profiling.measure.step_overhead`: the
median of paired interleaved iterations against plain PyTorch, minus 1), monet's predicted
overhead (against plain PyTorch's time as monet reckons it: with the chunked loss too, the time of
the model without it), the call's wall time split into capture, costs and solve, and the largest relative
gradient difference against plain PyTorch (``bitwise`` where equal).  Each configuration runs in a
process of its own (allocator and Dynamo caches start clean).  Appends the raw rows, with their
provenance, to ``--csv`` (``python benchmarks/report.py`` renders BENCHMARKS.md from them) and
plots overhead against peak.
"""
from __future__ import annotations

import argparse
import copy
import json
import subprocess
import sys
import time
from collections import defaultdict
from pathlib import Path

from monet.profiling.raw_results import append_rows, command_line, provenance

ROOT = Path(__file__).resolve().parents[1]
MODELS = ("gpt2", "llama", "bert")


def build(name: str, layers: int, hidden: int, seq: int, batch: int, vocab: int, dropout: float | None = None):
    """(model in training mode, seed 0; inputs with labels) of transformers' ``name``; ``dropout``:
    every dropout probability of its config (None: the library's defaults, GPT-2's and BERT's 0.1)."""
    sys.path.insert(0, str(ROOT / "tests"))
    from reach_models import declare_torchvision_ops

    declare_torchvision_ops()  # transformers imports torchvision when it is installed
    import torch
    import transformers as tr

    heads = max(1, hidden // 64)
    if name == "gpt2":
        cfg = tr.GPT2Config(n_layer=layers, n_embd=hidden, n_head=heads, vocab_size=vocab, n_positions=seq,
                            bos_token_id=0, eos_token_id=0)
        cls = tr.GPT2LMHeadModel
    elif name == "llama":
        cfg = tr.LlamaConfig(num_hidden_layers=layers, hidden_size=hidden, intermediate_size=int(8 * hidden / 3),
                             num_attention_heads=heads, num_key_value_heads=heads, vocab_size=vocab,
                             max_position_embeddings=seq, bos_token_id=0, eos_token_id=0, pad_token_id=0)
        cls = tr.LlamaForCausalLM
    elif name == "bert":
        cfg = tr.BertConfig(num_hidden_layers=layers, hidden_size=hidden, num_attention_heads=heads,
                            intermediate_size=4 * hidden, vocab_size=vocab, max_position_embeddings=seq,
                            pad_token_id=0)
        cls = tr.BertForMaskedLM
    else:
        raise ValueError(f"unknown model {name!r}: one of {', '.join(MODELS)}")
    if dropout is not None:
        for key in ("resid_pdrop", "embd_pdrop", "attn_pdrop", "attention_dropout", "hidden_dropout_prob",
                    "attention_probs_dropout_prob"):
            if hasattr(cfg, key):
                setattr(cfg, key, dropout)
    torch.manual_seed(0)
    model = cls(cfg).train()
    ids = torch.randint(1, vocab, (batch, seq), generator=torch.Generator().manual_seed(1))
    inputs = {"input_ids": ids, "labels": ids}
    if name != "bert":
        inputs["use_cache"] = False
    return model, inputs


def sac_context():
    """torchtitan's selective activation checkpointing policy as a ``context_fn``: save the
    outputs of matrix products (every second ``mm``/``addmm`` recomputed) and attention, recompute
    everything else."""
    import torch
    from torch.utils.checkpoint import CheckpointPolicy, create_selective_checkpoint_contexts

    aten = torch.ops.aten
    mms = {aten.mm.default, aten.addmm.default}
    save = mms | {aten.bmm.default, aten.baddbmm.default, aten.max.default}
    for name in ("_scaled_dot_product_efficient_attention", "_scaled_dot_product_flash_attention",
                 "_scaled_dot_product_flash_attention_for_cpu"):
        if hasattr(aten, name):
            save.add(getattr(aten, name).default)
    counts = defaultdict(int)

    def policy(ctx, func, *args, **kwargs):
        key = "recompute" if ctx.is_recompute else "forward"
        if func in mms:
            counts[key] += 1
        keep = func in save and not (func in mms and counts[key] % 2 == 0)
        return CheckpointPolicy.MUST_SAVE if keep else CheckpointPolicy.PREFER_RECOMPUTE

    return create_selective_checkpoint_contexts(policy)


def peers(model, wanted=None):
    """(name, module) of each peer whose name starts with one of ``wanted`` (None or empty: all),
    each on its own copy of ``model`` (made only for the peers asked for)."""
    from monet.profiling.baselines import compile_with_activation_budget

    def ckpt(**kw):
        m = copy.deepcopy(model)
        enable = getattr(m, "activation_checkpointing_enable", None)
        if enable is None:  # transformers before 5.x: the old name, without every_n_layers / offload
            if kw.get("every_n_layers", 1) != 1 or kw.get("offload") or "context_fn" in kw:
                return None
            m.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
            return m
        ctx = kw.pop("context_fn", None)
        args = {"use_reentrant": False, **({"context_fn": ctx} if ctx else {})}
        m.activation_checkpointing_enable(activation_checkpointing_kwargs=args, **kw)
        return m

    makers = [("transformers every 1", lambda: ckpt(every_n_layers=1)),
              ("transformers every 2", lambda: ckpt(every_n_layers=2)),
              ("transformers every 4", lambda: ckpt(every_n_layers=4)),
              ("transformers offload", lambda: ckpt(offload=True)),
              ("torch SAC (torchtitan)", lambda: ckpt(context_fn=sac_context)),
              ("torch.compile budget 0.5", lambda: compile_with_activation_budget(copy.deepcopy(model), 0.5))]
    for name, make in makers:
        if wanted and not any(name.startswith(w) for w in wanted):
            continue
        module = make()
        if module is not None:
            yield name, module
        del module  # one peer's copy alive at a time


def gradients(module, inputs, amp, base=None):
    """The parameter gradients of one training step of ``module`` (seed 0; the forward pass under
    the autocast setting ``amp``), by the parameter names of ``base``, the transformers model
    inside it (default ``module`` itself)."""
    import torch

    from monet.profiling.measure import training_step

    base = module if base is None else base
    for p in base.parameters():
        p.grad = None
    torch.manual_seed(0)
    training_step(module, inputs, autocast=amp)
    return {n: p.grad.detach().clone() for n, p in base.named_parameters() if p.grad is not None}


def grad_cell(a: dict, b: dict) -> str:
    import torch

    from monet.profiling.measure import max_rel_diff

    if a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a):
        return "bitwise"
    return f"{max_rel_diff(a, b):.1e}"


def one(cfg: dict) -> list[dict]:
    """The rows of one configuration (run in this process)."""

    import torch

    from monet.inputs import ExampleInputs
    from monet.plan import prepare
    from monet.profiling.baselines import CompiledWithBudget
    from monet.profiling.measure import step_overhead, step_peak

    torch.set_num_threads(cfg["threads"]) if cfg.get("threads") else None
    model, raw = build(cfg["model"], cfg["layers"], cfg["hidden"], cfg["seq"], cfg["batch"], cfg["vocab"])
    inputs = ExampleInputs.of(raw)
    bf16 = cfg["dtype"] == "bf16"
    # each iteration's forward pass under its own autocast context, the backward outside it (the AMP
    # recipe, `monet.profiling.measure.training_step`): one context around all of them kept autocast's
    # bf16 weight copies from the warm-up, and the peers' peaks missed them (17:28's rows, 19 MiB low)
    amp = ("cpu", "bfloat16") if bf16 else None
    plain = model
    rows = []

    def measure(name, module, extra, base):
        peak = step_peak(module, inputs, autocast=amp)
        ovh = step_overhead(plain, module, inputs, repeats=cfg["repeats"], warmup=1, autocast=amp)[0]
        grads = gradients(module, inputs, amp, base)
        row = dict(cfg, method=name, peak=int(peak), overhead=ovh, grads=grad_cell(grads, reference), **extra)
        report(row)
        return row

    def report(row):  # each row as made: the parent keeps those of a process killed later (out of memory)
        print(json.dumps(row), file=sys.stderr, flush=True)
        print(json.dumps(row), flush=True)
        rows.append(row)

    plain_peak = step_peak(plain, inputs, autocast=amp)
    reference = gradients(plain, inputs, amp)
    report(dict(cfg, method="plain PyTorch", peak=int(plain_peak), overhead=0.0, grads="reference"))
    targets = []
    wanted = cfg.get("peers")
    for name, module in peers(model, wanted):
        try:
            row = measure(name, module, {}, module.model if isinstance(module, CompiledWithBudget) else module)
            targets.append((name, row["peak"]))
        except Exception as e:  # noqa: BLE001 - a peer that fails is a row that says so
            report(dict(cfg, method=name, error=f"{type(e).__name__}: {str(e).splitlines()[0][:120]}"))
        del module
    from monet.solver.solve import parse_budget

    base_peak = base_time = None
    for lm_loss in ([None, "chunked"] if cfg.get("lm_loss") else [None]):
        t0 = time.perf_counter()
        plan = prepare(copy.deepcopy(model), raw, autocast_dtype=torch.bfloat16 if bf16 else None,
                       cache_dir=cfg.get("cache_dir"), progress=False, lm_loss=lm_loss)
        prepared_s = time.perf_counter() - t0
        base_peak = base_peak or plan.eager_peak_bytes  # percentages: of the model's own plain peak, both ways
        tag = "monet" if lm_loss is None else "monet chunked loss"
        budgets = [(f"{tag} {b}", b if b == "min" else parse_budget(b, base_peak)) for b in cfg.get("budgets", ["50%", "min"])]
        budgets += [(f"{tag} at {name}", peak) for name, peak in targets]
        for name, budget in budgets:
            t0 = time.perf_counter()
            try:
                sol = plan.solve(budget, mode="normal", time_limit=cfg["time_limit"])
            except Exception as e:  # noqa: BLE001 - an infeasible budget is a row that says so
                report(dict(cfg, method=name, budget=budget, error=f"{type(e).__name__}: {str(e)[:160]}"))
                continue
            solve_s = time.perf_counter() - t0
            wrapped = plan.wrap(sol)
            if lm_loss is None:
                base_time = base_time or sol.meta.eager_time_s
            # against plain PyTorch's predicted time, as the measured overhead is: a fused loss's own
            # plain time (its keep-everything schedule) is not plain PyTorch's
            ovh = sol.meta.objective_s / base_time - 1 if base_time else sol.meta.predicted_overhead()
            measure(name, wrapped, dict(budget=int(sol.meta.budget_bytes),
                                        predicted_peak=int(sol.meta.predicted_peak_bytes), predicted_overhead=ovh,
                                        capture_s=plan.capture_s, costs_s=prepared_s - plan.capture_s, solve_s=solve_s,
                                        status=sol.meta.status), plan.module)
            del wrapped
    return rows


def _row(line: str) -> dict | None:
    """A row a configuration's process printed on this line of its stdout, else None."""
    try:
        row = json.loads(line)
    except ValueError:
        return None
    return row if isinstance(row, dict) and "method" in row else None


def plot(rows: list[dict], path: Path) -> None:
    """Overhead (%) against peak (a fraction of plain PyTorch's), one panel per configuration: a
    row of panels per model, a column per depth and dtype; monet's points are circles, the peers'
    squares with their names."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    models = sorted({r["model"] for r in rows})
    columns = sorted({(int(r["layers"]), r["dtype"]) for r in rows})
    fig, axes = plt.subplots(len(models), len(columns), figsize=(3.6 * len(columns), 3.2 * len(models)),
                             squeeze=False)
    for i, model in enumerate(models):
        for j, (layers, dtype) in enumerate(columns):
            ax = axes[i][j]
            sub = [r for r in rows if (r["model"], int(r["layers"]), r["dtype"]) == (model, layers, dtype)
                   and "error" not in r and r.get("peak") is not None]
            base = next((r["peak"] for r in sub if r["method"] == "plain PyTorch"), None)
            ax.set_title(f"{model} {layers} layers {dtype}", fontsize=9)
            if base is None:
                ax.set_axis_off()
                continue
            for r in sub:
                monet = r["method"].startswith("monet")
                x, y = r["peak"] / base, 100 * (r.get("overhead") or 0.0)
                ax.scatter(x, y, marker="o" if monet else "s", s=18, color="C0" if monet else "C1")
                if not monet:
                    ax.annotate(r["method"].replace("transformers ", "tf ").replace(" (torchtitan)", ""), (x, y),
                                fontsize=6)
            ax.set_xlabel("peak / plain PyTorch's", fontsize=8)
            ax.set_ylabel("overhead %", fontsize=8)
            ax.tick_params(labelsize=7)
    fig.suptitle("monet (circles: 50 %, min, at each peer's peak) and the peers (squares): overhead against the "
                 "measured peak", fontsize=10)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=100)


def from_csvs(paths: list[Path]) -> list[dict]:
    """The rows of CSV files written by ``--csv`` (empty cells dropped)."""
    import pandas as pd

    out = []
    for path in paths:
        df = pd.read_csv(path).astype(object)
        df = df.where(df.notna(), None)
        out += [{k: v for k, v in r.items() if v is not None} for r in df.to_dict("records")]
    return out


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--models", default="gpt2", help=f"comma-separated, of {', '.join(MODELS)} (default gpt2)")
    p.add_argument("--layers", default="12", help="comma-separated depths (default 12)")
    p.add_argument("--dtypes", default="fp32", help="comma-separated: fp32, bf16 (autocast on the CPU)")
    p.add_argument("--hidden", type=int, default=256, help="hidden size (default 256)")
    p.add_argument("--seq", type=int, default=256, help="tokens per sequence (default 256)")
    p.add_argument("--batch", type=int, default=2, help="sequences per batch (default 2)")
    p.add_argument("--vocab", type=int, default=1024, help="vocabulary (default 1024)")
    p.add_argument("--time-limit", type=float, default=60.0, help="monet's time_limit per solve, s (default 60)")
    p.add_argument("--repeats", type=int, default=7, help="paired iterations per overhead (default 7)")
    p.add_argument("--threads", type=int, default=0, help="torch threads (default: torch's)")
    p.add_argument("--budgets", default="50%,min", help="monet's budgets besides the peers' peaks: percentages of plain "
                                                        "PyTorch's simulated peak, or min (default 50%%,min)")
    p.add_argument("--peers", default="", help="comma-separated prefixes of the peers to run (default: all)")
    p.add_argument("--lm-loss", action="store_true", help="also solve with the chunked language-model loss "
                                                          "(monet.lm_loss), at the same budgets in bytes")
    p.add_argument("--cache-dir", default=None, help="monet's cost cache (default: a fresh one per run)")
    p.add_argument("--csv", type=Path, default=None,
                   help="raw results: the rows are appended with their provenance, replacing the file's earlier rows "
                        "of the configurations (model, layers, dtype) run now (required to measure)")
    p.add_argument("--plot", type=Path, default=None, help="overhead against peak, one panel per configuration")
    p.add_argument("--from-csv", default=None, help="comma-separated CSV files written by --csv: measure nothing, "
                   "only --plot their rows")
    p.add_argument("--one", default=None, help=argparse.SUPPRESS)  # child process: one configuration as JSON
    args = p.parse_args(argv)
    if args.one:
        one(json.loads(args.one))  # its rows are printed as they are made
        return 0
    if args.from_csv:
        if args.plot is None:
            raise SystemExit("--from-csv needs --plot: the image to draw the rows in")
        plot(from_csvs([Path(x) for x in args.from_csv.split(",")]), args.plot)
        return 0
    if args.csv is None:
        p.error("--csv is required: the file the rows are appended to (benchmarks/report.py renders it)")
    import tempfile

    prov = provenance(command_line("python benchmarks/depth.py", argv))
    rows: list[dict] = []
    cache = args.cache_dir or tempfile.mkdtemp(prefix="monet-depth-")
    for model in args.models.split(","):
        for layers in (int(x) for x in args.layers.split(",")):
            for dtype in args.dtypes.split(","):
                cfg = dict(model=model, layers=layers, dtype=dtype, hidden=args.hidden, seq=args.seq, batch=args.batch,
                           vocab=args.vocab, time_limit=args.time_limit, repeats=args.repeats, threads=args.threads,
                           cache_dir=cache, budgets=args.budgets.split(","), lm_loss=args.lm_loss,
                           peers=[x for x in args.peers.split(",") if x])
                print(f"== {model} {layers} layers {dtype}", file=sys.stderr, flush=True)
                proc = subprocess.run([sys.executable, __file__, "--one", json.dumps(cfg)], stdout=subprocess.PIPE,
                                      text=True)
                made = [row for row in map(_row, proc.stdout.splitlines()) if row is not None]
                rows += made
                if proc.returncode != 0:
                    killed = " (killed: out of memory?)" if proc.returncode == -9 else ""
                    rows.append(dict(cfg, method="(the rest)", error=f"the configuration's process exited "
                                                                    f"{proc.returncode}{killed} after {len(made)} rows"))
    rows = [{k: v for k, v in r.items() if k != "cache_dir"} for r in rows]
    ran = {(r["model"], str(r["layers"]), r["dtype"]) for r in rows}
    append_rows(args.csv, rows, prov, replaces=lambda old: (old["model"], old["layers"], old["dtype"]) in ran)
    print(f"{len(rows)} rows in {args.csv}: `python benchmarks/report.py` renders BENCHMARKS.md from it")
    if args.plot:
        plot(rows, args.plot)
    return 0


if __name__ == "__main__":
    sys.exit(main())
