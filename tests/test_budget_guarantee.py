"""The analytic cost source keeps its budget where the schedule runs.

`monet.profiling.workspace.workspace_bound` charges every operator an upper bound on its
workspace; this checks (a) that the bound covers the workspace the profiler measures on this
machine and the one recorded in tests/data, node by node, on a small network with the families whose kernels allocate most on CPU (a
dense convolution, ConvNeXt's channels-last 7x7 depthwise convolution, whose backward reorders
hundreds of times its weight, BatchNorm, LayerNorm, pooling, a matmul), and (b) that schedules
solved with the analytic source at their smallest budget, in normal and in full mode, measure at
most that budget at the allocator.  Both can fail: (a) if a bound is too low for a node, (b) if the
bounds leave a schedule's peak uncovered (with no bound, ResNet-50's full-mode schedule measured
207.4 MB against 206.6 MB).
"""
from __future__ import annotations

import copy

import pytest
import torch
from torch import nn

from monet.capture import capture
from monet.profiling.measure import measure_iteration_peak, output_grad
from monet.profiling.costs import analytic_costs, costs_for
from monet.profiling.profiler import profile_costs
from monet.profiling.sources import cost_table, variant_cost_fn
from monet.profiling.workspace import with_workspace_bound, workspace_bound, workspace_family
from monet.solver.solve import min_budget, solve
from monet.wrapper import MONeTWrapper
from recorded import recorded_costs

SHAPE = (2, 3, 16, 16)
FULL = "inplace_conv_multiway_newnode"


class ChannelsLastLayerNorm(nn.Module):
    """ConvNeXt's LayerNorm over channels: permute to channels last, normalise, permute back."""

    def __init__(self, c):
        super().__init__()
        self.norm = nn.LayerNorm(c)

    def forward(self, x):
        return self.norm(x.permute(0, 2, 3, 1)).permute(0, 3, 1, 2)


def small_net() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(
        nn.Conv2d(3, 32, 3, padding=1), nn.BatchNorm2d(32), nn.ReLU(),
        nn.MaxPool2d(2),
        nn.Conv2d(32, 32, 7, padding=3, groups=32),  # depthwise, channels last after the permutes
        ChannelsLastLayerNorm(32),
        nn.Conv2d(32, 64, 1), nn.BatchNorm2d(64), nn.ReLU(),
        nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(64, 10),
    )


@pytest.fixture(scope="module")
def setup():
    model = small_net()
    x = torch.randn(SHAPE, generator=torch.Generator().manual_seed(0))
    graph = capture(model, x)
    return dict(model=model, x=x, graph=graph, g=output_grad(model, x))


def test_bound_covers_measured_workspace(setup):
    """Every node's bound >= the workspace the profiler measures here (this thread count), and >=
    the workspace recorded in tests/data (`recorded`), whose depthwise backward allocates: a bound
    of zero would miss it (a machine whose kernels allocate nothing here checks less)."""
    model, x, graph = setup["model"], setup["x"], setup["graph"]
    by_name = {n.name: n for n in graph.joint.graph.nodes}
    node = {(n.kind, n.id): by_name[n.name] for n in graph.fwd + graph.bwd}
    assert {workspace_family(fx_node) for fx_node in node.values()} >= {
        "convolution", "convolution_backward", "normalisation", "other"}
    recorded = recorded_costs("budget_guarantee", model, x, graph)
    measured = profile_costs(model, x, graph, "cpu", repeats=1, warmup=0, progress=False)
    for table in (measured, recorded):
        for kind, i, ws in zip(table["kind"], table["node"], table["workspace_bytes"]):
            fx_node = node[(kind, i)]
            assert workspace_bound(fx_node, "cpu") >= ws, (kind, i, fx_node.target, ws, workspace_bound(fx_node, "cpu"))
    # the depthwise backward allocates a temporary (on the recording machine, one thread: 54 KiB)
    depthwise = [(k, i) for (k, i), n in node.items()
                 if n.target == torch.ops.aten.convolution_backward.default and n.args[9] > 1]
    ws = recorded.set_index(["kind", "node"])["workspace_bytes"]
    assert depthwise and (ws[depthwise] > 0).all()


def test_bound_grows_with_threads_where_the_kernel_does(setup):
    """The grouped convolution backward's per-thread weight-gradient copies (6 per thread past
    43 threads), and nothing else past the per-thread scratchpad, depend on the thread count."""
    graph = setup["graph"]
    fx_node = next(n for n in graph.joint.graph.nodes if n.target == torch.ops.aten.convolution_backward.default
                   and n.args[9] > 1)
    w = fx_node.args[2].meta["val"].numel() * 4
    assert workspace_bound(fx_node, "cpu", 64) - workspace_bound(fx_node, "cpu", 1) >= (6 * 64 - 260) * w
    with pytest.raises(ValueError, match="threads"):
        workspace_bound(fx_node, "cpu", 0)
    with pytest.raises(ValueError, match="cpu"):
        workspace_bound(fx_node, "mps")


def test_analytic_source_charges_the_bound(setup):
    model, x, graph = setup["model"], setup["x"], setup["graph"]
    table = cost_table("analytic", model, x, graph, "cpu")
    plain = analytic_costs(graph)
    assert (table["workspace_bytes"] > 0).all()
    assert (table["time_s"] == plain["time_s"]).all()  # only the workspace changes
    assert table["source"].str.endswith("+workspace-bound").all()
    graph_from_file = copy.copy(graph)
    graph_from_file.joint = None
    with pytest.raises(ValueError, match="joint graph"):
        with_workspace_bound(plain, graph_from_file)


@pytest.mark.parametrize("mode", ["normal", FULL])
def test_smallest_budget_holds_at_the_allocator(setup, mode):
    """Solved with the analytic source at the smallest budget found, the schedule's measured peak
    (allocator level, after warm-up) is within the budget."""
    model, x, graph, g = setup["model"], setup["x"], setup["graph"], setup["g"]
    table = cost_table("analytic", model, x, graph, "cpu")
    costs = costs_for(graph, table)
    cost_fn = variant_cost_fn("analytic", model, x, graph, table, "cpu")
    budget, _ = min_budget(graph, costs, mode, solver="HIGHS", time_limit=5, cost_fn=cost_fn)
    sol = solve(graph, costs, budget, mode, solver="HIGHS", time_limit=5, cost_fn=cost_fn)
    measured = measure_iteration_peak(MONeTWrapper(copy.deepcopy(model), sol, SHAPE[1:]), x, g)
    assert measured <= budget, f"{mode}: measured peak {measured} > budget {budget}"
    # with bounds for workspace, the prediction is an upper bound of the measurement
    assert sol.meta.predicted_peak_bytes >= measured


def test_a_float64_network_keeps_its_budget():
    """In float64 the CPU convolves by im2col, not oneDNN: its column buffer (9x a 3x3
    convolution's input) is counted by the bound, every node's measured workspace is under its
    bound, and the schedule at the smallest budget measures at most that budget."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU(),
                          *[m for _ in range(3) for m in (nn.Conv2d(8, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU())],
                          nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(8, 10)).double()
    x = torch.randn(SHAPE, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    graph = capture(model, x)
    by_name = {n.name: n for n in graph.joint.graph.nodes}
    node = {(n.kind, n.id): by_name[n.name] for n in graph.fwd + graph.bwd}
    measured = profile_costs(model, x, graph, "cpu", repeats=1, warmup=0, progress=False)
    for kind, i, ws in zip(measured["kind"], measured["node"], measured["workspace_bytes"]):
        assert workspace_bound(node[(kind, i)], "cpu") >= ws, (kind, i, node[(kind, i)].target, ws)
    table = cost_table("analytic", model, x, graph, "cpu")
    costs = costs_for(graph, table)
    budget, _ = min_budget(graph, costs, "normal", solver="HIGHS", time_limit=5)
    sol = solve(graph, costs, budget, "normal", solver="HIGHS", time_limit=5)
    peak = measure_iteration_peak(MONeTWrapper(copy.deepcopy(model), sol, SHAPE[1:]), x, output_grad(model, x))
    assert peak <= budget, f"measured peak {peak} > budget {budget}"
