"""Why the captured graph's gradients differ from eager PyTorch's on CUDA: the decisive experiments.

On an H100 (torch 2.11.0+cu130) ResNet-50's gradients under monet came out 0.37 (relative L2) off
plain PyTorch's at every budget, 100 % included where nothing is recomputed, and its BatchNorm
buffers 9.2e-4 off; GPT-2's were exact (the first H100 run, 2026-11).  This script decides the cause
by experiment, in one run of about a minute on a GPU:

1. **Who differs**: each model's gradients and buffers against plain PyTorch for
   (a) plain PyTorch again (the noise floor: 0 where kernels are deterministic),
   (b) ``torch.compile(model, backend="aot_eager")``: the same captured graph run by AOTAutograd's
       own partitioner, no monet: if it differs as much, the cause is the captured graph's
       arithmetic, not monet's executor,
   (c) monet's executor keeping everything (the 100 % schedule: `monet.solver.solve`, mode "none"),
   (d) monet's executor with a normal-mode schedule at 50 % of the plain peak.
2. **Under which numerics**: each of those under the defaults, under full fp32
   (`monet.compat.strict_fp32`: TF32 off for cuDNN convolutions and cuBLAS matmuls) and under full
   fp32 with ``torch.backends.cudnn.deterministic``.  If the difference vanishes with TF32 off, it is
   arithmetic, and every check compares under the same numerics (docs/design.md, "What must stay true").
3. **Where**: one forward pass of the captured graph (aot_eager's forward module run node by node)
   against eager PyTorch's module outputs (forward hooks), from the same weights and batch, under
   the defaults and under full fp32: the relative difference of each module's output, and the
   first module where they part (> 1e-6).

Writes ``--out DIR/numerics.json`` and prints a summary.  ``--device cpu`` runs tiny configurations
(a check of the script; on the CPU everything is bitwise).  Run on the GPU machine as
``python3 benchmarks/gpu_numerics.py --out $OUT``.
"""
from __future__ import annotations

import argparse
import contextlib
import copy
import json
import sys
import time
from pathlib import Path

import torch
import torch.nn as nn

ROOT = Path(__file__).resolve().parents[1]


def log(msg: str) -> None:
    print(f"[gpu_numerics] {msg}", file=sys.stderr, flush=True)


def build(name: str, device: str, small: bool):
    """(model, example batch: a tensor or a dict of keyword arguments) on ``device``."""
    torch.manual_seed(0)
    if name == "resnet50":
        try:
            from torchvision.models import resnet50
            model = resnet50(num_classes=10 if small else 1000)
        except (ImportError, RuntimeError):  # torchvision's C ops do not load beside a CPU build of torch
            from monet.zoo.models import get_model
            model = get_model("resnet50", num_classes=10 if small else 1000)
        x = torch.randn(4 if small else 16, 3, 32 if small else 64, 32 if small else 64)
        return model.to(device).train(), x.to(device)
    if name == "gpt2":
        from transformers import GPT2Config, GPT2LMHeadModel
        cfg = GPT2Config(n_layer=2, n_embd=64, n_head=2, vocab_size=256, n_positions=64) if small else \
            GPT2Config(n_layer=4, vocab_size=8192, n_positions=256)
        cfg.attn_pdrop = cfg.resid_pdrop = cfg.embd_pdrop = 0.0  # no random masks: bitwise comparable
        model = GPT2LMHeadModel(cfg)
        ids = torch.randint(0, cfg.vocab_size, (2 if small else 4, 32 if small else 256))
        return model.to(device).train(), {"input_ids": ids.to(device), "labels": ids.to(device), "use_cache": False}
    raise ValueError(f"unknown model {name!r}")


def call(model, batch):
    return model(**batch) if isinstance(batch, dict) else model(batch)


def loss_of(out) -> torch.Tensor:
    from monet.profiling.measure import loss_of as lo
    return lo(out)


def grads_and_buffers(model: nn.Module, batch) -> tuple[dict, dict]:
    """Gradients and buffers (by position) after one forward+backward from seed 0."""
    torch.manual_seed(0)
    for p in model.parameters():
        p.grad = None
    loss_of(call(model, batch)).backward()
    grads = {i: p.grad.detach().double().clone() for i, p in enumerate(model.parameters()) if p.grad is not None}
    bufs = {i: b.detach().double().clone() for i, b in enumerate(model.buffers()) if b.is_floating_point()}
    return grads, bufs


def rel_l2(a: dict, b: dict) -> float:
    if a.keys() != b.keys():
        return float("inf")
    num = sum(float((a[k] - b[k]).pow(2).sum()) for k in a)
    den = sum(float(b[k].pow(2).sum()) for k in b)
    return (num / den) ** 0.5 if den else 0.0


def max_rel(a: dict, b: dict) -> float:
    if a.keys() != b.keys():
        return float("inf")
    worst = 0.0
    for k in a:
        scale = float(b[k].abs().max()) if b[k].numel() else 0.0
        if scale:
            worst = max(worst, float((a[k] - b[k]).abs().max()) / scale)
    return worst


def candidates(model: nn.Module, batch, half: bool = True):
    """name -> a function building the candidate from a fresh copy of ``model`` (``half``: with a
    normal-mode schedule at 50 % of the plain peak, solved here)."""
    from monet.capture import capture
    from monet.profiling.costs import analytic_costs, costs_for
    from monet.solver.solve import eager_peak, solve
    from monet.wrapper import MONeTWrapper

    graph = capture(copy.deepcopy(model), batch)
    costs = costs_for(graph, analytic_costs(graph))
    info = dict(model=type(model).__name__, device=str(next(model.parameters()).device.type))
    keep = solve(graph, costs, None, "none", info=info)
    makers = {
        "plain": lambda m: m,
        "aot_eager": lambda m: torch.compile(m, backend="aot_eager", fullgraph=True),
        "monet_keep_all": lambda m: MONeTWrapper(m, keep),
    }
    if not half:
        return makers
    try:
        half = solve(graph, costs, int(0.5 * eager_peak(graph, costs)), "normal", time_limit=20, info=info)
    except Exception as e:  # noqa: BLE001 - an infeasible budget: the smallest feasible one
        log(f"50 %: {type(e).__name__}: {str(e)[:200]}; solving at the smallest budget")
        half = solve(graph, costs, None, "normal", time_limit=20, info=info)

    makers[f"monet_{half.schedule.recompute_count()}_recomputations"] = lambda m: MONeTWrapper(m, half)
    return makers


@contextlib.contextmanager
def numerics(name: str):
    from monet.compat import strict_fp32

    if name == "default":
        yield
    elif name == "fp32":
        with strict_fp32():
            yield
    elif name in ("fp32_deterministic", "fp32_no_cudnn"):
        # cuDNN deterministic, or off (eager's BatchNorm then runs ATen's native kernel, the one the
        # captured graph runs; convolutions ATen's own kernels in both); cudnn.flags restores every
        # flag it sets, and strict_fp32 inside it switches TF32 off after flags' allow_tf32
        off = name == "fp32_no_cudnn"
        with torch.backends.cudnn.flags(enabled=not off, deterministic=not off,
                                        benchmark=torch.backends.cudnn.benchmark), strict_fp32():
            yield
    else:
        raise ValueError(name)


NUMERICS = ("default", "fp32", "fp32_deterministic", "fp32_no_cudnn")


def who_differs(model: nn.Module, batch, settings=NUMERICS, which=None) -> list[dict]:
    rows = []
    """Each candidate's gradients and buffers against plain PyTorch's under each numerics setting.
    ``which``: candidate names to keep (``monet_half`` stands for the 50 % schedule); None: all."""
    half = which is None or "monet_half" in which
    makers = candidates(model, batch, half=half)
    if which is not None:
        makers = {k: v for k, v in makers.items() if k in which or (half and k.endswith("_recomputations"))}
    for num in settings:
        with numerics(num):
            torch.compiler.reset()
            ref_g, ref_b = grads_and_buffers(copy.deepcopy(model), batch)
            for name, make in makers.items():
                t0 = time.perf_counter()
                try:
                    g, b = grads_and_buffers(make(copy.deepcopy(model)), batch)
                    row = dict(numerics=num, candidate=name, grad_rel_l2=rel_l2(g, ref_g),
                               grad_max_rel=max_rel(g, ref_g), buffer_max_rel=max_rel(b, ref_b))
                except Exception as e:  # noqa: BLE001 - recorded, the others go on
                    row = dict(numerics=num, candidate=name, error=f"{type(e).__name__}: {str(e)[:300]}")
                row["seconds"] = round(time.perf_counter() - t0, 2)
                rows.append(row)
                log(json.dumps(row))
    return rows


def module_outputs_eager(model: nn.Module, batch) -> dict[str, torch.Tensor]:
    outs: dict[str, torch.Tensor] = {}
    handles = []
    for name, m in model.named_modules():
        if name and not list(m.children()):
            def hook(_m, _i, o, name=name):
                if isinstance(o, torch.Tensor):
                    outs[name] = o.detach().double().clone()
            handles.append(m.register_forward_hook(hook))
    try:
        torch.manual_seed(0)
        call(model, batch)
    finally:
        for h in handles:
            h.remove()
    return outs


def module_outputs_graph(model: nn.Module, batch) -> dict[str, torch.Tensor]:
    """Each leaf module's output in aot_eager's forward graph: the last node of the forward module
    whose ``nn_module_stack`` ends in that module (run node by node with an fx.Interpreter)."""
    import torch.fx as fx
    from monet.compat import aot_backend, boxed_function

    outs: dict[str, torch.Tensor] = {}

    class Recorder(fx.Interpreter):
        def run_node(self, n):
            val = super().run_node(n)
            stack = n.meta.get("nn_module_stack")
            if stack and isinstance(val, torch.Tensor) and val.is_floating_point():
                path = list(stack.values())[-1][0]
                outs[_clean(path)] = val.detach().double().clone()
            return val

    def fw_compiler(gm, _inputs):
        return boxed_function(lambda *args: Recorder(gm).run(*args))

    def bw_compiler(gm, _inputs):
        return boxed_function(gm)

    torch.compiler.reset()
    compiled = torch.compile(model, backend=aot_backend(fw_compiler, bw_compiler), fullgraph=True)
    torch.manual_seed(0)
    call(compiled, batch)
    return outs


def _clean(path: str) -> str:
    """``L['self'].layer1[0].conv1`` / ``L__self___layer1_0_conv1`` -> ``layer1.0.conv1``."""
    import re
    p = path.replace("L['self'].", "").replace("L['self']", "")
    p = re.sub(r"\[(\d+)\]", r".\1", p)
    p = re.sub(r"\['([^']+)'\]", r".\1", p)
    return p.strip(".")


def where_they_part(model: nn.Module, batch, threshold: float = 1e-6,
                    settings=("default", "fp32", "fp32_no_cudnn")) -> dict:
    """Per numerics setting: each leaf module's forward output in the captured graph against eager
    PyTorch's (relative max difference) and the first module where they part by more than
    ``threshold``."""
    out = {}
    for num in settings:
        with numerics(num):
            eager = module_outputs_eager(copy.deepcopy(model), batch)
            graph = module_outputs_graph(copy.deepcopy(model), batch)
        rows = []
        for name, e in eager.items():
            g = graph.get(name)
            if g is None or g.shape != e.shape:
                continue
            scale = float(e.abs().max()) or 1.0
            rows.append((name, float((g - e).abs().max()) / scale))
        first = next(((n, d) for n, d in rows if d > threshold), None)
        out[num] = dict(compared=len(rows), eager_modules=len(eager), first_parting=first,
                        worst=sorted(rows, key=lambda r: -r[1])[:10], first_20=rows[:20])
        log(f"{num}: {len(rows)} module outputs compared; first > {threshold:g}: {first}")
    return out


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", type=Path, required=True, help="folder for numerics.json")
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--models", default="resnet50,gpt2")
    p.add_argument("--small", action="store_true", help="tiny configurations (default on the CPU)")
    p.add_argument("--numerics", default=",".join(NUMERICS),
                   help=f"settings to compare under, comma-separated (default all: {','.join(NUMERICS)})")
    p.add_argument("--candidates", default="plain,aot_eager,monet_keep_all,monet_half",
                   help="who to compare with plain PyTorch (monet_half: a schedule solved at 50 %% of the "
                        "plain peak, which takes a solve)")
    p.add_argument("--where-first", action="store_true",
                   help="locate the first module where the captured forward parts from eager before "
                        "comparing gradients (the quicker, more decisive experiment)")
    args = p.parse_args(argv)
    small = args.small or args.device == "cpu"
    from monet.compat import numerics as settings

    result = dict(torch=torch.__version__, device=args.device,
                  device_name=torch.cuda.get_device_name() if args.device.startswith("cuda") else "cpu",
                  cudnn=torch.backends.cudnn.version() if args.device.startswith("cuda") else None,
                  default_numerics=settings(), models={})
    args.out.mkdir(parents=True, exist_ok=True)
    for name in args.models.split(","):
        model, batch = build(name, args.device, small)
        log(f"{name}: {sum(p.numel() for p in model.parameters()) / 1e6:.1f} M parameters")
        entry = {}
        result["models"][name] = entry
        where_settings = [n for n in args.numerics.split(",") if n != "fp32_deterministic"]
        steps = [("where", lambda: where_they_part(model, batch, settings=where_settings)),
                 ("who_differs", lambda: who_differs(model, batch, args.numerics.split(","),
                                                     args.candidates.split(",")))]
        for key, run in (steps if args.where_first else steps[::-1]):
            try:
                entry[key] = run()
            except Exception as e:  # noqa: BLE001 - recorded
                entry[f"{key}_error"] = f"{type(e).__name__}: {e}"
                log(f"{name}: {entry[f'{key}_error']}")
            (args.out / "numerics.json").write_text(json.dumps(result, indent=1, default=str))
    log(f"wrote {args.out / 'numerics.json'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
