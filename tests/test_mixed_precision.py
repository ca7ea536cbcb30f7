"""Mixed precision: schedules for autocast training (bf16 on the CPU; fp16/bf16 on CUDA).

The graph captured under ``torch.autocast`` holds autocast's casts and 16-bit activations, its
sizes and costs follow those dtypes, its fingerprint records the setting; a schedule solved for it
trains with plain autocast PyTorch's gradients; a solution runs only under the autocast it was
solved for.

Tolerance: plain bf16 autocast PyTorch on the CPU is bitwise deterministic from run to run (checked
here), so its "run-to-run tolerance" is zero and a recomputation-only schedule must give bitwise
the same gradients, BatchNorm statistics and outputs.  An implementation with other arithmetic is
held to one unit of bf16 precision (see `test_other_arithmetic_within_bf16_precision`).
"""
from __future__ import annotations

import copy
import json
import pickle
from pathlib import Path

import pytest
from ci import skip_unless_long
import torch
import torch.nn.functional as F

from monet import mixed_precision
from monet.capture import capture
from monet.cli import main
from monet.profiling.costs import DeviceSpec, analytic_costs, costs_for
from monet.profiling.cuda_bytes import memory_terms
from monet.solution import (FORMAT_VERSION, MAGIC, AutocastMismatchError, SolutionFileError, SolutionMeta,
                            SolutionMismatchError, describe, load_solution, save_solution)
from monet.solver.solve import eager_peak, solve
from monet.wrapper import MONeTWrapper
from usernet import UserNet

SHAPE = (3, 16, 16)
BATCH = 8
BF16 = ("cpu", "bfloat16")
INFO = dict(model="UserNet", batch_size=BATCH, input_shape=SHAPE, dtype="float32")


@pytest.fixture(scope="module")
def setup():
    torch.manual_seed(0)
    model = UserNet()
    x = torch.randn(BATCH, *SHAPE)
    g32 = capture(model, x)
    g16 = capture(model, x, autocast_dtype=torch.bfloat16)
    c32 = costs_for(g32, analytic_costs(g32))
    c16 = costs_for(g16, analytic_costs(g16))
    # a budget that forces recomputation: 70 % of plain bf16 autocast's simulated peak
    sol16 = solve(g16, c16, int(0.7 * eager_peak(g16, c16)), "normal", time_limit=20, info=INFO)
    sol32 = solve(g32, c32, eager_peak(g32, c32), "none", info=INFO)  # fp32, keep everything
    return dict(model=model, x=x, g32=g32, g16=g16, c32=c32, c16=c16, sol16=sol16, sol32=sol32)


def _bf16_values(graph):
    by_name = {n.name: n for n in graph.joint.graph.nodes}
    return [v for v in graph.values.values()
            if v.producer and isinstance(by_name[v.name].meta.get("val"), torch.Tensor)
            and by_name[v.name].meta["val"].dtype == torch.bfloat16]


def test_bf16_graph_has_bf16_activations_and_smaller_peak(setup):
    g32, g16 = setup["g32"], setup["g16"]
    assert g32.autocast is None and g16.autocast == BF16
    assert "bfloat16 autocast on cpu" in g16.describe()
    ops16 = [n.op for n in g16.fwd]
    assert "aten._to_copy.default" in ops16 and "aten._to_copy.default" not in [n.op for n in g32.fwd]
    # every convolution's output is bf16, counted at 2 bytes per element (fp32: 4)
    convs = list(zip([n for n in g32.fwd if n.op == "aten.convolution.default"],
                     [n for n in g16.fwd if n.op == "aten.convolution.default"]))
    assert len(convs) == 3
    for n32, n16 in convs:
        val = {n.name: n for n in g16.joint.graph.nodes}[n16.name].meta["val"]
        assert val.dtype == torch.bfloat16
        assert n16.out_bytes == val.numel() * 2 and n32.out_bytes == 2 * n16.out_bytes
    assert len(_bf16_values(g16)) >= 10 and not _bf16_values(g32)
    # parameters stay fp32 (autocast casts copies); their gradients are cast back to fp32
    assert g16.param_bytes == g32.param_bytes
    out = next(n for n in g16.joint.graph.nodes if n.op == "output")
    grads = [a for a in out.args[0][g16.num_fwd_outputs:] if a is not None]
    assert grads and all(a.meta["val"].dtype == torch.float32 for a in grads)
    # the simulated plain-PyTorch peak follows the dtypes
    p32, p16 = eager_peak(g32, setup["c32"]), eager_peak(g16, setup["c16"])
    assert p16 < 0.75 * p32, (p16, p32)


def test_fingerprints_differ(setup):
    g32, g16 = setup["g32"], setup["g16"]
    assert g32.fingerprint != g16.fingerprint
    assert g16.summary[-1] == "autocast cpu bfloat16" and not g32.summary[-1].startswith("autocast")
    assert mixed_precision.from_summary(g16.summary) == BF16 and mixed_precision.from_summary(g32.summary) is None
    # the ambient autocast (as a training loop sets it) gives the same graph as autocast_dtype
    with torch.autocast("cpu", dtype=torch.bfloat16):
        ambient = capture(setup["model"], setup["x"])
    assert ambient.fingerprint == g16.fingerprint and ambient.autocast == BF16


def test_costs_follow_dtypes(setup):
    def conv_rows(graph, spec=DeviceSpec.cpu_default()):
        t = analytic_costs(graph, spec)
        return t[(t["op"] == "aten.convolution.default") & (t["kind"] == "fwd")].reset_index(drop=True)

    r32, r16 = conv_rows(setup["g32"]), conv_rows(setup["g16"])
    assert (r32["flops"] == r16["flops"]).all() and (r16["flops"] > 0).all()  # the same FLOP
    # bytes from the dtypes: bf16 input and output, bf16 weight copies
    assert (r16["bytes_moved"] * 2 == r32["bytes_moved"]).all()
    # a GPU's 16-bit (tensor core) rate for ops whose floating-point inputs are all 16-bit
    h100 = DeviceSpec.named("h100")
    fast = DeviceSpec("h100-tc", h100.flops_per_s, 1e30, 0.0, half_flops_per_s=h100.half_flops_per_s)
    slow = DeviceSpec("h100-no-tc", h100.flops_per_s, 1e30, 0.0)
    f, s = conv_rows(setup["g16"], fast), conv_rows(setup["g16"], slow)
    assert list(f["time_s"] * (h100.half_flops_per_s / h100.flops_per_s)) == pytest.approx(list(s["time_s"]))
    assert (conv_rows(setup["g32"], fast)["time_s"] == conv_rows(setup["g32"], slow)["time_s"]).all()


def _steps(model, x, y, steps=2, bwd_in_autocast=False):
    """Plain autocast training, PyTorch's AMP recipe: forward and loss inside autocast."""
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    torch.manual_seed(1)  # same dropout masks
    outs, grads = [], []
    for _ in range(steps):
        opt.zero_grad(set_to_none=True)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            out = model(x)
            loss = F.cross_entropy(out, y)
            if bwd_in_autocast:
                loss.backward()
        if not bwd_in_autocast:
            loss.backward()
        outs.append(out.detach())
        grads.append([p.grad.clone() for p in model.parameters()])
        opt.step()
    return outs, grads, {k: v.clone() for k, v in model.state_dict().items()}


def _bitwise(a, b):
    (oa, ga, sa), (ob, gb, sb) = a, b
    assert all(u.dtype == torch.bfloat16 and torch.equal(u, v) for u, v in zip(oa, ob))
    assert all(torch.equal(u, v) for step_a, step_b in zip(ga, gb) for u, v in zip(step_a, step_b))
    assert sa.keys() == sb.keys() and all(torch.equal(sa[k], sb[k]) for k in sa)  # weights, BN statistics


def test_schedule_under_autocast_matches_plain_autocast(setup):
    model, x, sol = setup["model"], setup["x"], setup["sol16"]
    assert sol.meta.autocast == BF16
    assert sol.schedule.recompute_count() > 0  # the budget forces recomputation
    recomputed = {setup["g16"].fwd[i].op for s in sol.schedule.stages for i in s.recompute}
    assert "aten.convolution.default" in recomputed or "aten._to_copy.default" in recomputed
    assert sol.meta.predicted_peak_bytes <= sol.meta.budget_bytes < sol.meta.eager_peak_bytes
    y = torch.randint(0, 5, (BATCH,))
    plain = _steps(copy.deepcopy(model), x, y)
    _bitwise(plain, _steps(copy.deepcopy(model), x, y))  # plain autocast: bitwise from run to run
    _bitwise(plain, _steps(MONeTWrapper(copy.deepcopy(model), sol, SHAPE), x, y))
    # backward inside the autocast context too, as some training loops do
    _bitwise(_steps(copy.deepcopy(model), x, y, bwd_in_autocast=True),
             _steps(MONeTWrapper(copy.deepcopy(model), sol, SHAPE), x, y, bwd_in_autocast=True))


class AttentionNet(torch.nn.Module):
    """A transformer layer's bf16 autocast hazards: dropout on a bf16 activation, attention with a
    mask and dropout (on the CPU computed in fp32 by the math kernel), an fp32 region autocast is
    switched off in (a router or an fp32 head, as MoE and LM code write them).  (B, T, 16) -> (B, 5)."""

    def __init__(self, d=16, classes=5):
        super().__init__()
        self.qkv, self.proj, self.router = (torch.nn.Linear(d, 3 * d), torch.nn.Linear(d, d),
                                            torch.nn.Linear(d, d))
        self.drop, self.head = torch.nn.Dropout(0.1), torch.nn.Linear(d, classes)

    def forward(self, x):
        b, t, d = x.shape
        q, k, v = (u.view(b, t, 2, d // 2).transpose(1, 2) for u in self.qkv(x).split(d, -1))
        mask = torch.ones(t, t, dtype=torch.bool, device=x.device).tril()
        a = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=0.1 if self.training else 0.0)
        h = self.drop(self.proj(a.transpose(1, 2).reshape(b, t, d)))  # a bf16 dropout
        with torch.autocast("cpu", enabled=False):
            h = self.router(h.float())  # fp32
        return self.head(h.mean(1))


def test_attention_and_dropout_under_autocast_match_plain_autocast():
    """Gradients bitwise those of plain bf16 autocast PyTorch (backward outside autocast) where the
    traced graph would otherwise differ from eager: the CPU dropout's backward scale in bf16
    (`monet.impls.dropout.match_eager_dropout`) and the backward of ops autocast left in fp32
    (`monet.compat.eager_backward_autocast`)."""
    from monet.impls.dropout import eager_scale

    torch.manual_seed(0)
    model, x, y = AttentionNet(), torch.randn(4, 12, 16), torch.randint(0, 5, (4,))
    g = capture(model, x, autocast_dtype=torch.bfloat16)
    scales = {(n.args[0].meta["val"].dtype, n.args[2]) for n in g.joint.graph.nodes
              if n.target is torch.ops.aten.native_dropout_backward.default}
    assert scales == {(torch.bfloat16, eager_scale(0.1, torch.bfloat16)), (torch.float32, 1 / 0.9)}
    torch.manual_seed(0)
    noise = F.dropout(torch.ones(64, dtype=torch.bfloat16), 0.1)  # eager: its kept elements' factor
    rounded = eager_scale(0.1, torch.bfloat16)
    assert set(noise.unique().tolist()) == {0.0, rounded} and rounded != 1 / 0.9
    by_name = {n.name: n for n in g.joint.graph.nodes}
    matmuls = {by_name[n.name].meta["val"].dtype for n in g.bwd if n.op in ("aten.mm.default", "aten.bmm.default")}
    assert matmuls == {torch.bfloat16, torch.float32}  # the fp32 ops' backward matmuls stay fp32, as in eager
    costs = costs_for(g, analytic_costs(g))
    sol = solve(g, costs, int(0.8 * eager_peak(g, costs)), "normal", time_limit=3,
                info=dict(INFO, model="AttentionNet", input_shape=(12, 16)))
    assert sol.schedule.recompute_count() > 0
    plain = _steps(copy.deepcopy(model), x, y)
    _bitwise(plain, _steps(copy.deepcopy(model), x, y))  # plain autocast: bitwise from run to run
    _bitwise(plain, _steps(MONeTWrapper(copy.deepcopy(model), sol, (12, 16)), x, y))


def test_measured_iterations_cast_the_weights_each_time():
    """`measure.step_peak` and `measure.step_overhead` under autocast run each forward pass in an
    autocast context of its own and the backward pass outside it (the AMP recipe): every
    iteration casts the fp32 weights to bf16 again, so the copies, which ``Linear`` saves for the
    backward pass, are allocated (and timed) in the measured iteration.  In one context held
    around all iterations autocast cached the warm-up's copies, and an eager peer's measured peak
    missed them (19 MiB of a 12-layer Llama's)."""
    from torch.utils._python_dispatch import TorchDispatchMode

    from monet.profiling.measure import step_overhead, step_peak

    class WeightCasts(TorchDispatchMode):
        def __init__(self, shapes):
            super().__init__()
            self.shapes, self.count = shapes, 0

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            kwargs = kwargs or {}
            if (func is torch.ops.aten._to_copy.default and kwargs.get("dtype") is torch.bfloat16
                    and tuple(args[0].shape) in self.shapes):
                self.count += 1
            return func(*args, **kwargs)

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(64, 48, bias=False), torch.nn.Linear(48, 32, bias=False))
    x = torch.randn(2, 64)
    shapes = {tuple(p.shape) for p in model.parameters()}
    in_backward = []
    for p in model.parameters():
        p.register_hook(lambda g: in_backward.append(torch.is_autocast_enabled("cpu")))
    with WeightCasts(shapes) as casts:
        step_peak(model, x, autocast=BF16)  # a warm-up iteration and the measured one
    assert casts.count == 2 * len(shapes) and in_backward and not any(in_backward)
    with WeightCasts(shapes) as casts:
        step_overhead(model, model, x, repeats=2, warmup=1, autocast=BF16)
    assert casts.count == 2 * (1 + 2) * len(shapes)  # both sides, one warm-up and two timed each


def test_other_arithmetic_within_bf16_precision(setup):
    """An implementation that rounds differently (output-activated BatchNorm rebuilds its input from
    its bf16 output) cannot be bitwise: its gradients must agree with plain autocast's within one
    unit of bf16 precision, ``torch.finfo(torch.bfloat16).eps`` = 2^-7, in the relative L2 norm of
    all gradients (the fp32 criterion, 1e-5, is ~84 fp32 epsilons; plain bf16 autocast itself is
    ~1e-2 away from fp32 here).  Measured: ~4e-4."""
    from monet.impls import apply_impls
    from monet.impls.batchnorm import batch_norm_backward_from_output
    from monet.profiling.measure import compare_gradients, output_grad

    model, x, g16 = setup["model"], setup["x"], setup["g16"]
    bn = {f"fwd:{n.id}": "batchnorm.output_activated" for n in g16.fwd if "batch_norm" in n.op}
    graph = apply_impls(g16, bn)
    costs = costs_for(graph, analytic_costs(graph))
    sol = solve(graph, costs, eager_peak(graph, costs), "none", info=INFO)
    assert sol.schedule.impl == bn and len(bn) == 2 and sol.meta.autocast == BF16
    g = output_grad(model, x, autocast=BF16)
    assert g.dtype == torch.bfloat16
    diff, _, buffers_equal = compare_gradients(lambda: copy.deepcopy(model),
                                               lambda: MONeTWrapper(copy.deepcopy(model), sol, SHAPE), x, g,
                                               autocast=BF16)
    assert diff <= torch.finfo(torch.bfloat16).eps and buffers_equal, diff
    # the kernel accumulates in fp32 and returns fp32 weight and bias gradients, as ATen's does
    torch.manual_seed(0)
    xb, w, b = torch.randn(4, 3, 5, 5).bfloat16(), torch.rand(3) + 0.5, torch.randn(3)
    y, mean, invstd, _, _ = torch.ops.aten._native_batch_norm_legit_functional(
        xb, w, b, torch.zeros(3), torch.ones(3), True, 0.1, 1e-5)
    gy = torch.randn_like(y)
    ref = torch.ops.aten.native_batch_norm_backward(gy, xb, w, None, None, mean, invstd, True, 1e-5, [True] * 3)
    got = batch_norm_backward_from_output(gy, y, w, b, invstd, 1e-5, [True] * 3)
    assert [t.dtype for t in got] == [t.dtype for t in ref] == [torch.bfloat16, torch.float32, torch.float32]
    for r, o in zip(ref, got):
        assert float((r.float() - o.float()).norm() / r.float().norm()) <= torch.finfo(torch.bfloat16).eps


def test_graphs_run_with_autocast_disabled(setup, monkeypatch):
    """The traced graphs already hold autocast's casts: they must run with autocast off, or every
    op would pass through autocast a second time."""
    import monet.wrapper as wrapper

    seen = []
    fwd, bwd = wrapper._boxed_forward, wrapper._boxed_backward

    def spy(compiler, kind):
        def compile_(gm, example_inputs):
            run = compiler(gm, example_inputs)

            def call(args):
                seen.append((kind, torch.is_autocast_enabled("cpu")))
                return run(args)
            call._boxed_call = True
            return call
        return compile_

    monkeypatch.setattr(wrapper, "_boxed_forward", spy(fwd, "fwd"))
    monkeypatch.setattr(wrapper, "_boxed_backward", spy(bwd, "bwd"))
    wrapped = MONeTWrapper(copy.deepcopy(setup["model"]), setup["sol16"], SHAPE)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        wrapped(setup["x"]).float().sum().backward()
    assert seen == [("fwd", False), ("bwd", False)]


def test_fp32_solution_under_autocast_refused(setup):
    model, x = setup["model"], setup["x"]
    wrapped = MONeTWrapper(copy.deepcopy(model), setup["sol32"], SHAPE)
    before = copy.deepcopy(wrapped.state_dict())
    with torch.autocast("cpu", dtype=torch.bfloat16):
        with pytest.raises(RuntimeError, match=r"made without autocast.*bfloat16 autocast on cpu.*"
                                               r"outside the autocast context.*autocast_dtype=torch.bfloat16") as e:
            wrapped(x)
    assert isinstance(e.value, AutocastMismatchError) and isinstance(e.value, SolutionMismatchError)
    assert all(torch.equal(before[k], v) for k, v in wrapped.state_dict().items())  # nothing ran
    wrapped(x).sum().backward()  # without autocast it trains
    with torch.autocast("cpu", dtype=torch.bfloat16), torch.no_grad():
        wrapped.eval()(x)  # evaluation runs the model as it is, under any autocast


def test_autocast_solution_without_autocast_refused(setup):
    wrapped = MONeTWrapper(copy.deepcopy(setup["model"]), setup["sol16"], SHAPE)
    with pytest.raises(AutocastMismatchError, match=r"bfloat16 autocast on cpu.*runs without autocast.*"
                                                   r"torch\.autocast\('cpu', dtype=torch\.bfloat16\)"):
        wrapped(setup["x"])
    with torch.autocast("cpu", dtype=torch.float16):
        with pytest.raises(AutocastMismatchError, match=r"made for bfloat16 autocast on cpu.*float16 autocast"):
            wrapped(setup["x"])


def test_solution_file_records_autocast(setup, tmp_path):
    sol = setup["sol16"]
    path = tmp_path / "bf16.pkl"
    save_solution(sol, path)
    back = load_solution(path)
    assert back == sol and back.meta.autocast == BF16
    assert "under bfloat16 autocast on cpu" in describe(back)
    assert setup["sol32"].meta.autocast is None
    fields = {k: getattr(sol.meta, k) for k in sol.meta.__dataclass_fields__}
    assert SolutionMeta(**{**fields, "autocast": None}).autocast == BF16  # read from the summary
    with pytest.raises(ValueError, match="disagrees with the graph"):
        SolutionMeta(**{**fields, "autocast": ("cpu", "float16")})
    with pytest.raises(ValueError, match="disagrees with the graph"):
        SolutionMeta(**{**fields, "autocast": BF16, "graph_summary": setup["g32"].summary})
    back.meta.autocast = None  # a tampered file: the record disagrees with the graph summary
    tampered = tmp_path / "tampered.pkl"
    tampered.write_bytes(MAGIC + bytes([FORMAT_VERSION]) + pickle.dumps(back, protocol=4))
    with pytest.raises(SolutionFileError, match="autocast"):
        load_solution(tampered)


def test_cli_refuses_fp16_on_cpu(capsys):
    code = main(["solve", "resnet50", "--batch-size", "2", "--budget", "1GB", "--autocast", "fp16",
                 "-o", "unused.pkl"])
    assert code == 2
    assert "--autocast fp16 is for CUDA only" in capsys.readouterr().err


def test_cli_solve_and_check_bf16(tmp_path, capsys):
    """``monet solve --autocast bf16`` then ``monet check``, which runs under the recorded autocast."""
    skip_unless_long("the bf16 command line", 28, "the short suite runs the bf16 schedule in Python here and the CLI's solve and "
               "check in fp32 (tests/test_cli.py)")
    model_file = tmp_path / "net.py"
    model_file.write_text(f"import sys\nsys.path.insert(0, {str(Path(__file__).parent)!r})\n"
                          "from usernet import UserNet\n\n\ndef build():\n    return UserNet()\n")
    common = ["solve", f"{model_file}:build", "--batch-size", str(BATCH), "--input-shape", "3,16,16",
              "--mode", "normal", "--cost", "hybrid", "--cache-dir", str(tmp_path / "cache"), "--autocast", "bf16",
              "--time-limit", "20", "--json"]
    # The workspace is measured on this machine (--cost hybrid), so whether 70 % of the plain peak is
    # feasible depends on the machine: take the smallest feasible budget this run finds, and solve at
    # 70 % or at that budget, whichever is larger.  The second solve reads the same cached workspace.
    code = main([*common, "--min-budget", "-o", str(tmp_path / "min.pkl")])
    captured = capsys.readouterr()
    assert code == 0, captured.err
    found = json.loads(captured.out.splitlines()[-1])
    least, eager = found["budget_bytes"], found["eager_peak_bytes"]
    assert found["predicted_peak_bytes"] <= least <= eager, found  # below where recomputation lowers the peak
    budget = max(int(0.7 * eager), least)
    out = tmp_path / "bf16.pkl"
    code = main([*common, "--budget", "70%" if budget == int(0.7 * eager) else str(budget), "-o", str(out)])
    captured = capsys.readouterr()
    assert code == 0, captured.err
    solved = json.loads(captured.out.splitlines()[-1])
    assert solved["autocast"] == "bfloat16"
    assert (solved["budget_bytes"], solved["eager_peak_bytes"]) == (budget, eager)
    sol = load_solution(out)
    assert sol.meta.autocast == BF16
    assert sol.schedule.recompute_count() > 0 or budget == eager  # nothing to recompute at the plain peak
    code = main(["check", str(out), "--check-diff", "--run-bs", "--json"])
    captured = capsys.readouterr()
    assert code == 0, captured.err
    result = json.loads(captured.out.splitlines()[-1])
    assert result["autocast"] == "bfloat16" and result["grads_bitwise_equal"] and result["buffers_bitwise_equal"]
    # measured at the allocator under bf16 autocast: within the budget, and as predicted (2 %)
    assert result["peak_bytes"] <= result["budget_bytes"]
    if budget < 0.95 * eager:  # the prediction's 2 % and more below the plain peak
        assert result["peak_bytes"] < result["eager_measured_peak_bytes"]
    assert abs(result["predicted_peak_bytes"] / result["peak_bytes"] - 1) <= 0.02


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_cuda_autocast_schedule(dtype):
    """fp16/bf16 autocast on CUDA: a recomputing schedule's gradients against plain autocast's.

    Not bitwise on CUDA: the traced graph runs ATen's decomposed kernels (native BatchNorm where
    eager PyTorch calls cuDNN's), which may round differently; the bound is plain autocast's own
    run-to-run difference or one unit of the 16-bit precision (``monet check``'s criterion),
    whichever is larger."""
    if dtype == torch.bfloat16 and not torch.cuda.is_bf16_supported():
        pytest.skip("this GPU has no bf16")
    torch.manual_seed(0)
    model = UserNet().cuda()
    model.drop.p = 0.0  # precision is under test here, not CUDA's dropout RNG
    x = torch.randn(BATCH, *SHAPE, device="cuda")
    graph = capture(model, x, autocast_dtype=dtype)
    name = str(dtype).removeprefix("torch.")
    assert graph.autocast == ("cuda", name) and graph.summary[-1] == f"autocast cuda {name}"
    costs = costs_for(graph, analytic_costs(graph, DeviceSpec.named("h100")))
    # 70 % of the activations: the cuBLAS workspaces (64 MiB on an H100 against this model's few
    # hundred KiB) are held through the step whatever the schedule, so 70 % of the whole peak is
    # infeasible (on an H100: smallest feasible 64.30 MiB, budget 45.15 MiB)
    held = memory_terms(graph).library_bytes
    budget = held + int(0.7 * (eager_peak(graph, costs) - held))
    sol = solve(graph, costs, budget, "normal", time_limit=20, info=dict(INFO, device="cuda"))
    assert sol.schedule.recompute_count() > 0 and sol.meta.autocast == ("cuda", name)
    g = torch.randn(BATCH, 5, device="cuda", dtype=dtype)

    def grads(m):
        with torch.autocast("cuda", dtype=dtype):
            out = m(x)
        assert out.dtype == dtype
        out.backward(g)
        return torch.cat([p.grad.flatten() for p in m.parameters()]).double()

    plain = [grads(copy.deepcopy(model)) for _ in range(3)]
    scale = float(plain[0].norm())
    run_to_run = max(float((p - plain[0]).norm()) for p in plain[1:]) / scale
    diff = float((grads(MONeTWrapper(copy.deepcopy(model), sol, SHAPE)) - plain[0]).norm()) / scale
    assert diff <= max(2 * run_to_run, torch.finfo(dtype).eps), (diff, run_to_run)
    wrapped = MONeTWrapper(copy.deepcopy(model), sol, SHAPE)
    with pytest.raises(AutocastMismatchError, match="runs without autocast"):
        wrapped(x)
