"""A deep stack costed on a shallow copy (monet.profiling.shallow): the copy, the carried
cost table and the carried iteration record.  Nothing here asserts a measured time: the tables
carried are analytic ones (the same on every machine), and the measured paths are checked for
their structure only."""
from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
import torch
import torch.nn as nn

import monet.profiling.shallow as shallow
from monet.capture import capture
from monet.graph import node_signatures
from monet.profiling.costs import analytic_costs
from monet.profiling.dispatch import FIELDS
from monet.profiling.shallow import (Shallow, carried_record, carried_table, describe_costing, repeated_layers,
                                     shallow_copy)
from monet.profiling.sources import iterations, quick_profile

HIDDEN, BATCH, LAYERS = 16, 32, 12


class Layer(nn.Module):
    def __init__(self):
        super().__init__()
        self.norm = nn.LayerNorm(HIDDEN)
        self.up = nn.Linear(HIDDEN, 2 * HIDDEN)
        self.down = nn.Linear(2 * HIDDEN, HIDDEN)

    def forward(self, x):
        return x + self.down(torch.relu(self.up(self.norm(x))))


class Deep(nn.Module):
    def __init__(self, layers: int = LAYERS):
        super().__init__()
        self.embed = nn.Linear(4, HIDDEN)
        self.body = nn.Module()
        self.body.layers = nn.ModuleList(Layer() for _ in range(layers))
        self.heads = nn.ModuleList([nn.Linear(HIDDEN, 2), nn.Linear(HIDDEN, 3)])  # short and mixed: no stack
        self.out = nn.Linear(5, 1)

    def forward(self, x):
        x = self.embed(x)
        for layer in self.body.layers:
            x = layer(x)
        return self.out(torch.cat([h(x) for h in self.heads], -1)).square().mean()


@pytest.fixture(scope="module")
def deep():
    torch.manual_seed(0)
    model = Deep()
    x = torch.randn(BATCH, 4)
    return model, x, capture(model, x)


def test_the_stack_is_the_longest_list_of_identical_layers():
    model = Deep()
    assert repeated_layers(model, min_layers=4) == ("body.layers", LAYERS)
    assert repeated_layers(model, min_layers=LAYERS + 1) is None
    model.body.layers[3].up = nn.Linear(HIDDEN, 3 * HIDDEN)  # one layer of another shape: not a stack
    model.body.layers[3].down = nn.Linear(3 * HIDDEN, HIDDEN)
    assert repeated_layers(model, min_layers=4) is None


def test_the_copy_keeps_the_first_layers_and_leaves_the_model_whole():
    torch.manual_seed(0)
    model = Deep()
    small = shallow_copy(model, "body.layers", 3)
    assert len(small.body.layers) == 3 and len(model.body.layers) == LAYERS
    for a, b in zip(small.body.layers, model.body.layers[:3]):
        assert all(torch.equal(p, q) and p is not q for p, q in zip(a.parameters(), b.parameters()))
    assert sum(p.numel() for p in small.parameters()) < sum(p.numel() for p in model.parameters())


def test_every_node_takes_its_twins_cost(deep):
    model, x, graph = deep
    small = shallow_copy(model, "body.layers", 3)
    small_graph = capture(small, x)
    stand = Shallow(small, small_graph, "body.layers", 3, LAYERS)
    # a table whose every row is distinct: each node's time is its id, its workspace 10x the id
    table = analytic_costs(small_graph)
    table["time_s"] = table["recompute_s"] = 1e-3 * (1 + np.arange(len(table)))
    table["workspace_bytes"] = 10 * np.arange(len(table))
    carried = carried_table(graph, stand, table)
    assert carried is not None and len(carried) == len(graph.fwd) + len(graph.bwd)
    theirs = node_signatures(small_graph)
    rows = table.set_index(["kind", "node"])
    by_sig: dict = {}
    for key, sig in theirs.items():
        by_sig.setdefault(sig, []).append(rows.loc[key])
    for row, ((kind, node), sig) in zip(carried.itertuples(), node_signatures(graph).items()):
        assert (row.kind, row.node) == (kind, node)
        twins = by_sig[sig]
        assert row.time_s == pytest.approx(float(np.median([t["time_s"] for t in twins])))
        assert row.workspace_bytes == max(int(t["workspace_bytes"]) for t in twins)
        assert "3-of-12-layers" in row.source
    # more layers than the copy's three take the copy's layers' costs: the sum grows with depth
    assert carried["time_s"].sum() > table["time_s"].sum()


def test_a_node_without_a_twin_is_measured_whole(deep):
    model, x, graph = deep
    other = Deep(layers=3)
    other.embed = nn.Linear(4, HIDDEN, bias=False)  # another op at the start: no twin for it
    other_graph = capture(other, x)
    stand = Shallow(other, other_graph, "body.layers", 3, LAYERS)
    assert carried_table(graph, stand, analytic_costs(other_graph)) is None


def test_the_time_beyond_the_operators_is_one_sum_and_the_tax_a_fraction(deep):
    model, x, graph = deep
    table = analytic_costs(graph)
    u, nodes = float(table["time_s"].sum()), len(table)  # u: the deep graph's operators, seconds
    stand = Shallow(model, graph, "body.layers", 3, LAYERS)
    # the copy: 0.4 u of operators, 0.1 u beyond them, its executor 0.05 u over plain PyTorch
    small = dict(executor_iteration_s=0.5 * u, operators_s=0.4 * u, operator_scale=1.0, recompute_factor=0.9,
                 between_operators_s=0.1 * u / 50, plain_iteration_s=0.45 * u)
    record = carried_record(model, x, graph, table, stand, small, plain_s=u)
    assert set(record) == set(FIELDS)
    # keeping everything: plain PyTorch's iteration plus the copy's tax, 0.05 / 0.45 of it; beyond: 0.1 u in
    # all, not per 50 nodes
    tax = 0.05 / 0.45
    assert record["executor_iteration_s"] == pytest.approx((1 + tax) * u)
    assert record["between_operators_s"] == pytest.approx(0.1 * u / nodes)
    assert record["recompute_factor"] == 0.9 and record["plain_iteration_s"] == u
    assert record["operator_scale"] == pytest.approx(1 + tax - 0.1)  # the operators make up the rest
    # plain PyTorch slower than the carried operators: their scale rises to meet it, the tax with it
    record = carried_record(model, x, graph, table, stand, small, plain_s=2 * u)
    assert record["executor_iteration_s"] == pytest.approx(2 * (1 + tax) * u)
    assert record["operator_scale"] == pytest.approx(2 * (1 + tax) - 0.1)
    # faster (the copy's operators overstate the deep model's): it falls to meet it
    record = carried_record(model, x, graph, table, stand, small, plain_s=0.5 * u)
    assert record["executor_iteration_s"] == pytest.approx(0.5 * (1 + tax) * u)
    assert record["operator_scale"] == pytest.approx(0.5 * (1 + tax) - 0.1)
    # a copy whose executor is faster than its operators' sum and than plain PyTorch: nothing added
    faster = dict(small, executor_iteration_s=0.3 * u, operator_scale=0.75)
    record = carried_record(model, x, graph, table, stand, faster, plain_s=0.5 * u)
    assert record["executor_iteration_s"] == pytest.approx(0.5 * u)
    assert record["between_operators_s"] == 0.0 and record["operator_scale"] == pytest.approx(0.5)
    # measured on the model itself when not given
    assert carried_record(model, x, graph, table, stand, small)["plain_iteration_s"] > 0


def test_hybrid_costs_of_a_deep_stack_come_from_its_copy(deep, monkeypatch, tmp_path):
    model, x, graph = deep
    monkeypatch.setattr(shallow, "MIN_LAYERS", 8)
    monkeypatch.setattr(shallow, "SHALLOW_LAYERS", 3)
    table = quick_profile(model, x, graph, "cpu", tmp_path)
    assert len(table) == len(graph.fwd) + len(graph.bwd)
    assert table["source"].str.contains("3-of-12-layers").all()
    assert "on a copy with 3 of the 12 layers of body.layers" in describe_costing(model, graph)
    record = iterations("hybrid", model, x, graph, "cpu", tmp_path)
    assert set(record) == set(FIELDS) and record["plain_iteration_s"] > 0
    # both are cached under the deep graph's fingerprint: a second costing measures nothing
    files = sorted(p.name for p in (tmp_path / "quick-context").iterdir())
    assert sum(graph.fingerprint[:16] in f for f in files) == 2, files
    again = quick_profile(model, x, graph, "cpu", tmp_path)
    pd.testing.assert_frame_equal(again.reset_index(drop=True), table.reset_index(drop=True), check_dtype=False)


def test_a_shallow_stack_is_measured_whole(deep, tmp_path):
    model, x, graph = deep  # 12 layers: under MIN_LAYERS
    assert LAYERS < shallow.MIN_LAYERS
    table = quick_profile(model, x, graph, "cpu", tmp_path)
    assert not table["source"].str.contains("layers").any()
