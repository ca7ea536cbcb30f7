"""Per-node cost tables: the analytic model, the profiler, the disk cache and the solver's arrays."""
import dataclasses
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch
from torch import nn

from monet.capture import capture
from monet.profiling import profiler as profiler_mod
from monet.profiling.costs import (COLUMNS, CostArrays, DeviceSpec, analytic_costs, costs_for,
                                   validate_costs)
from monet.profiling.profiler import (ProfilingInterpreter, cache_path, joint_inputs, load_costs,
                                      load_or_profile, profile_costs, save_costs)

N, CIN, H, W, COUT, K, CLASSES = 2, 3, 8, 8, 4, 3, 5


def tiny_model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(
        nn.Conv2d(CIN, COUT, K, padding=1),
        nn.BatchNorm2d(COUT),
        nn.ReLU(),
        nn.Flatten(),
        nn.Linear(COUT * H * W, CLASSES),
    )


@pytest.fixture(scope="module")
def tiny():
    model = tiny_model()
    x = torch.randn(N, CIN, H, W)
    return model, x, capture(model, x)


@pytest.fixture(scope="module")
def tiny_profile(tiny):
    model, x, graph = tiny
    return profile_costs(model, x, graph, "cpu", repeats=2, warmup=1, progress=False)


def keys(graph):
    return {("fwd", n.id) for n in graph.fwd} | {("bwd", n.id) for n in graph.bwd}


def check_table(table, graph):
    assert list(table.columns) == COLUMNS
    assert len(table) == len(graph.fwd) + len(graph.bwd)
    assert set(zip(table["kind"], table["node"])) == keys(graph)
    assert (table["impl"] == "default").all()
    ops = {(n.kind, n.id): n.op for n in graph.fwd + graph.bwd}
    assert all(ops[(k, i)] == op for k, i, op in zip(table["kind"], table["node"], table["op"]))


# ---------------------------------------------------------------------------------------- analytic


def test_analytic_row_per_node(tiny):
    _, _, graph = tiny
    table = analytic_costs(graph)
    check_table(table, graph)
    assert (table["time_s"] > 0).all()
    assert (table["recompute_s"] == table["time_s"]).all()
    assert (table["workspace_bytes"] == 0).all()
    assert (table["source"] == "analytic").all()
    assert table["node"].dtype == np.int64 and table["flops"].dtype == np.int64
    assert table["time_s"].dtype == np.float64


def test_conv_and_linear_flops_by_hand(tiny):
    _, _, graph = tiny
    table = analytic_costs(graph).set_index(["kind", "node"])
    conv = next(n for n in graph.fwd if n.op == "aten.convolution.default")
    # textbook: one multiply and one add per (output element, input channel, kernel tap)
    assert table.loc[("fwd", conv.id), "flops"] == 2 * N * COUT * H * W * CIN * K * K
    linear = next(n for n in graph.fwd if n.op == "aten.addmm.default")
    assert table.loc[("fwd", linear.id), "flops"] == 2 * N * (COUT * H * W) * CLASSES
    # the backward matmuls: grad input (N x C) @ (C x F) and grad weight (C x N) @ (N x F)
    mms = [n for n in graph.bwd if n.op == "aten.mm.default"]
    assert len(mms) == 2
    for n in mms:
        assert table.loc[("bwd", n.id), "flops"] == 2 * N * (COUT * H * W) * CLASSES
    # bytes moved = inputs (x, weight, bias) + output, fp32 from the shapes
    f32 = torch.finfo(torch.float32).bits // 8
    expected = (N * CIN * H * W + COUT * CIN * K * K + COUT + N * COUT * H * W) * f32
    assert table.loc[("fwd", conv.id), "bytes_moved"] == expected
    relu = next(n for n in graph.fwd if n.op == "aten.relu.default")
    assert table.loc[("fwd", relu.id), "flops"] == 0
    assert table.loc[("fwd", relu.id), "bytes_moved"] == 2 * N * COUT * H * W * f32


def test_analytic_deterministic(tiny):
    model, x, graph = tiny
    pd.testing.assert_frame_equal(analytic_costs(graph), analytic_costs(graph))
    again = capture(tiny_model(), x.clone())
    assert again.fingerprint == graph.fingerprint
    pd.testing.assert_frame_equal(analytic_costs(graph), analytic_costs(again))


def test_analytic_roofline_formula(tiny):
    _, _, graph = tiny
    spec = DeviceSpec("test", flops_per_s=1e9, bytes_per_s=1e8, launch_s=1e-3)
    table = analytic_costs(graph, spec)
    expected = np.maximum(table["flops"] / 1e9, table["bytes_moved"] / 1e8) + 1e-3
    np.testing.assert_allclose(table["time_s"].to_numpy(), expected.to_numpy(), rtol=0, atol=0)
    # a faster device is faster on every node
    fast = analytic_costs(graph, DeviceSpec.named("h100"))
    assert (fast["time_s"] < analytic_costs(graph, DeviceSpec.named("p100"))["time_s"]).all()


def test_device_spec_presets():
    assert DeviceSpec.named("cpu") == DeviceSpec.cpu_default()
    for name in ("p100", "v100", "a100", "h100", "h200"):
        spec = DeviceSpec.named(name.upper())
        assert spec.flops_per_s > 1e12 and spec.bytes_per_s > 1e11
    assert DeviceSpec.p100() == DeviceSpec.named("p100")
    with pytest.raises(dataclasses.FrozenInstanceError):
        DeviceSpec.cpu_default().flops_per_s = 1.0
    with pytest.raises(ValueError, match="unknown device preset"):
        DeviceSpec.named("tpu")
    with pytest.raises(ValueError, match="flops_per_s"):
        DeviceSpec("bad", flops_per_s=0, bytes_per_s=1)


# ------------------------------------------------------------------------------------ costs_for


def test_costs_for_arrays(tiny):
    _, _, graph = tiny
    table = analytic_costs(graph)
    arrays = costs_for(graph, table)
    assert isinstance(arrays, CostArrays)
    assert arrays.fwd_time.shape == arrays.fwd_recompute.shape == arrays.fwd_workspace.shape == (len(graph.fwd),)
    assert arrays.bwd_time.shape == arrays.bwd_workspace.shape == (len(graph.bwd),)
    fwd = table[table["kind"] == "fwd"].sort_values("node")
    np.testing.assert_array_equal(arrays.fwd_time, fwd["time_s"].to_numpy())
    # row order in the table does not matter
    shuffled = table.sample(frac=1.0, random_state=0)
    again = costs_for(graph, shuffled)
    np.testing.assert_array_equal(again.bwd_time, arrays.bwd_time)


def test_costs_for_missing_node(tiny):
    _, _, graph = tiny
    table = analytic_costs(graph)
    victim = graph.bwd[2]
    short = table[~((table["kind"] == "bwd") & (table["node"] == victim.id))]
    with pytest.raises(ValueError, match=rf"bwd node {victim.id} \({victim.op}"):
        costs_for(graph, short)
    wrong_op = table.copy()
    wrong_op.loc[0, "op"] = "aten.sin.default"
    with pytest.raises(ValueError, match="another graph"):
        costs_for(graph, wrong_op)
    with pytest.raises(ValueError, match="no row"):
        costs_for(graph, table, impl="winograd")


def test_validate_costs_rejects(tiny):
    _, _, graph = tiny
    table = analytic_costs(graph)
    with pytest.raises(ValueError, match="missing columns"):
        validate_costs(table.drop(columns=["flops"]))
    bad = table.copy()
    bad["time_s"] = bad["time_s"].astype(object)
    bad.loc[1, "time_s"] = -1.0
    with pytest.raises(ValueError, match="time_s"):
        validate_costs(bad)
    with pytest.raises(ValueError, match="duplicate"):
        validate_costs(pd.concat([table, table.iloc[:1]]))
    bad = table.copy()
    bad.loc[0, "kind"] = "fw"
    with pytest.raises(ValueError, match="'fwd' or 'bwd'"):
        validate_costs(bad)


# ------------------------------------------------------------------------------------- profiler


def test_profile_costs_cpu(tiny, tiny_profile):
    model, x, graph = tiny
    table = tiny_profile
    check_table(table, graph)
    assert (table["time_s"] > 0).all()
    assert (table["recompute_s"] == table["time_s"]).all()
    assert (table["workspace_bytes"] >= 0).all()
    assert table["source"].str.startswith("profile:").all()
    # flops and bytes come from the same model as the analytic table
    analytic = analytic_costs(graph)
    assert (table["flops"] == analytic["flops"]).all()
    assert (table["bytes_moved"] == analytic["bytes_moved"]).all()
    costs_for(graph, table)  # covers the graph


def test_profile_leaves_model_and_rng_alone(tiny):
    model, x, graph = tiny
    before = {k: v.clone() for k, v in model.state_dict().items()}
    state = torch.get_rng_state()
    profile_costs(model, x, graph, "cpu", repeats=1, warmup=0, progress=False)
    assert torch.equal(torch.get_rng_state(), state)
    for k, v in model.state_dict().items():
        assert torch.equal(v, before[k]), k


def test_random_op_runs_once_in_the_data_flow():
    """The dropout mask that flows downstream is the first (and only) draw: the profiling run's
    outputs equal a plain run of the joint graph from the same RNG state, although the timing
    and memory re-runs draw more random numbers."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(16, 32), nn.Dropout(0.5), nn.ReLU(), nn.Linear(32, 4))
    x = torch.randn(8, 16)
    graph = capture(model, x)
    assert any(n.random for n in graph.fwd)

    torch.manual_seed(1)
    args = joint_inputs(model, x, graph, "cpu")
    with torch.no_grad():
        ref = torch.fx.Interpreter(graph.joint).run(*args, enable_io_processing=False)

    class _Bar:
        def update(self, n):
            pass

    torch.manual_seed(1)
    args = joint_inputs(model, x, graph, "cpu")
    interp = ProfilingInterpreter(graph, torch.device("cpu"), repeats=3, warmup=2, pbar=_Bar(), source="t")
    with torch.no_grad():
        out = interp.run(*args, enable_io_processing=False)
    assert len(out) == len(ref)
    for a, b in zip(out, ref):
        if a is None:
            assert b is None
        else:
            torch.testing.assert_close(a, b, rtol=0, atol=0)


def test_joint_inputs_reject_other_model(tiny):
    _, x, graph = tiny
    other = nn.Sequential(nn.Conv2d(CIN, COUT + 1, K, padding=1), nn.BatchNorm2d(COUT + 1), nn.ReLU(),
                          nn.Flatten(), nn.Linear((COUT + 1) * H * W, CLASSES))
    with pytest.raises(ValueError, match="primals_1"):
        joint_inputs(other, x, graph, "cpu")
    with pytest.raises(ValueError, match="the graph reads param '0.weight', which the model does not have"):
        joint_inputs(nn.Linear(3, 3), x, graph, "cpu")


# ---------------------------------------------------------------------------------- files/cache


def test_save_load_round_trip(tmp_path, tiny, tiny_profile):
    _, _, graph = tiny
    for name, table in (("analytic.csv", analytic_costs(graph)), ("profile.csv", tiny_profile)):
        path = save_costs(table, tmp_path / "sub" / name)
        loaded = load_costs(path)
        pd.testing.assert_frame_equal(loaded, table, check_exact=True)
    assert not list((tmp_path / "sub").glob("*.tmp"))


@pytest.mark.parametrize("corruption", ["truncate", "garbage", "binary", "empty", "negative"])
def test_corrupt_file_raises(tmp_path, tiny, corruption):
    _, _, graph = tiny
    path = save_costs(analytic_costs(graph), tmp_path / "costs.csv")
    text = path.read_text()
    if corruption == "truncate":
        path.write_text(text[: len(text) * 2 // 3].rsplit(",", 3)[0])
    elif corruption == "garbage":
        path.write_text("hello,world\n1,2\n")
    elif corruption == "binary":
        path.write_bytes(b"\x89PNG\r\n\x1a\n\xff\xfe\x00\x01" * 10)
    elif corruption == "empty":
        path.write_text("")
    else:
        lines = text.splitlines()
        cells = lines[1].split(",")
        cells[COLUMNS.index("time_s")] = "-3.0"
        path.write_text("\n".join([lines[0], ",".join(cells)] + lines[2:]) + "\n")
    with pytest.raises(ValueError, match="costs.csv"):
        load_costs(path)


def test_load_or_profile_caches(tmp_path, tiny, monkeypatch):
    model, x, graph = tiny
    path = cache_path(graph, "cpu", tmp_path)
    assert path.parent == tmp_path
    assert graph.fingerprint[:16] in path.name and torch.__version__.split("+")[0] in path.name
    assert path.suffix == ".csv"
    first = load_or_profile(model, x, graph, "cpu", cache_dir=tmp_path, repeats=1, warmup=0, progress=False)
    assert path.is_file()

    def no_profiling(*a, **k):
        raise AssertionError("profiled although a cached profile exists")

    monkeypatch.setattr(profiler_mod, "profile_costs", no_profiling)
    second = load_or_profile(model, x, graph, "cpu", cache_dir=tmp_path)
    pd.testing.assert_frame_equal(first, second, check_exact=True)

    path.write_text("kind,node\nfwd,0\n")
    with pytest.raises(ValueError, match=path.name):
        load_or_profile(model, x, graph, "cpu", cache_dir=tmp_path)


def test_cached_table_for_another_graph_is_rejected(tmp_path, tiny):
    model, x, graph = tiny
    path = cache_path(graph, "cpu", tmp_path)
    save_costs(analytic_costs(graph).iloc[:-1], path)  # one backward node short
    with pytest.raises(ValueError, match="delete"):
        load_or_profile(model, x, graph, "cpu", cache_dir=tmp_path)


def test_default_cache_dir_is_in_home(tiny):
    _, _, graph = tiny
    path = cache_path(graph, "cpu")
    assert path.is_absolute()
    assert path.parent == profiler_mod.default_cache_dir()
    assert str(path).startswith(str(Path.home()))


def test_profile_costs_in_context(tiny, tiny_profile):
    """Timed in an iteration's sequence (the CPU quick profile's way): every node has a finite
    positive time, the same workspace as when timed in a loop, and ``only`` still measures a subset."""
    model, x, graph = tiny
    table = profile_costs(model, x, graph, "cpu", repeats=3, warmup=1, progress=False, in_context=True)
    check_table(table, graph)
    assert np.isfinite(table["time_s"]).all() and (table["time_s"] > 0).all()
    assert (table["recompute_s"] == table["time_s"]).all()
    loop = tiny_profile.set_index(["kind", "node"])["workspace_bytes"]
    assert (table.set_index(["kind", "node"])["workspace_bytes"] == loop).all()
    some = {("fwd", graph.fwd[0].id), ("bwd", graph.bwd[-1].id)}
    part = profile_costs(model, x, graph, "cpu", repeats=1, warmup=0, progress=False, only=some, in_context=True)
    assert set(zip(part["kind"], part["node"])) == some and (part["time_s"] > 0).all()


def test_in_context_timer_times_each_node_once_per_iteration(tiny):
    """`ContextTimer` runs the joint graph once and records one call per measured node."""
    from monet.profiling.profiler import ContextTimer

    model, x, graph = tiny
    main = {n.name: n for n in list(graph.fwd) + list(graph.bwd)}
    times: dict = {}
    args = joint_inputs(model, x, graph, "cpu")
    with torch.no_grad():
        for _ in range(2):
            ContextTimer(graph, torch.device("cpu"), main, times).run(*args, enable_io_processing=False)
    assert set(times) == keys(graph)
    assert all(len(v) == 2 and min(v) > 0 for v in times.values())


# ----------------------------------------------------------------------------------------- CUDA


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_profile_costs_cuda(tiny):
    model, x, graph = tiny
    table = profile_costs(model, x, graph, "cuda", repeats=3, warmup=2, progress=False)
    check_table(table, graph)
    assert (table["time_s"] > 0).all()
    assert (table["workspace_bytes"] >= 0).all()
    assert (table["source"] == f"profile:{torch.cuda.get_device_name()}").all()
    # the model stays where it was
    assert all(p.device.type == "cpu" for p in model.parameters())
    costs_for(graph, table)


def test_in_context_times_are_pooled_over_a_signatures_nodes():
    """Timed in an iteration's sequence, the nodes of one op signature (a layer's twins) share one
    time, the median of every call of all of them (`pooled_medians`); nodes of other signatures
    keep their own."""
    from monet.graph import op_signature
    from monet.profiling.profiler import pooled_medians

    assert pooled_medians({("fwd", 0): [1.0, 5.0, 2.0], ("fwd", 1): [3.0, 4.0, 9.0], ("bwd", 0): [7.0]},
                          {("fwd", 0): "a", ("fwd", 1): "a", ("bwd", 0): "b"}) == {"a": 3.5, "b": 7.0}
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(16, 16), nn.Tanh(), nn.Linear(16, 16), nn.Tanh(), nn.Linear(16, 2))
    x = torch.randn(32, 16)
    graph = capture(model, x)
    table = profile_costs(model, x, graph, "cpu", repeats=3, warmup=1, progress=False, in_context=True)
    by_name = {n.name: n for n in graph.joint.graph.nodes}
    times = table.set_index(["kind", "node"])["time_s"]
    groups: dict = {}
    for node in list(graph.fwd) + list(graph.bwd):
        groups.setdefault(op_signature(by_name[node.name]), []).append(times[(node.kind, node.id)])
    twins = [ts for ts in groups.values() if len(ts) > 1]
    assert twins and all(len(set(ts)) == 1 for ts in twins)  # the two tanh layers, their linears
    assert (table["time_s"] > 0).all()
