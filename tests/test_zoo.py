"""The zoo of prebuilt schedules: every shipped entry loads, fits its graph and its budget; the
commands (`monet zoo list / get / verify / plot`), ``"zoo:NAME"`` references and the build pipeline.

The shipped-entry tests are parametrized over ``index.json``, so they cover whatever the last
``monet zoo build`` produced; each configuration is captured once (meta device, seconds).  The other
tests build a tiny zoo of their own in a temporary folder (MobileNetV2 at batch 8 and 3x64x64 on the
CPU) and point the zoo at it.
"""
from __future__ import annotations

import copy
import functools
import json


import pytest
from ci import skip_unless_long
import torch

import monet.zoo.index as zoo_index
from monet.cli import main
from monet.solution import SolutionFileError, load_solution
from monet.zoo import build as zb
from monet.zoo import report as zr
from monet.zoo import verify as zv
from monet.zoo.index import FIELDS, LATER_FIELDS, ZooEntryError, load_index

SHIPPED = load_index()


@functools.lru_cache(maxsize=None)
def _graph(model: str, batch: int, shape: tuple[int, ...]):
    """One capture per configuration, shared by all its entries."""
    return zb.capture_config(model, batch, shape)


# ----------------------------------------------------------------------------------------------
# the shipped zoo
# ----------------------------------------------------------------------------------------------


def test_shipped_index_is_well_formed():
    names = [r["name"] for r in SHIPPED]
    assert len(names) == len(set(names)), "duplicate entry names"
    for r in SHIPPED:
        missing = set(FIELDS) - set(r) - set(LATER_FIELDS)  # an index of an older build lacks those
        assert not missing, f"{r.get('name')}: missing fields {missing}"
        assert r["cost_source"].startswith(("analytic", "profile")), r["name"]
        assert (zoo_index.ZOO_DIR / zoo_index.SCHEDULES / r["file"]).is_file(), r["name"]
        assert r["predicted_peak_bytes"] <= r["budget_bytes"], r["name"]


def test_shipped_frontier_is_monotone():
    """Per model, an entry at a larger budget is never slower than one at a smaller budget (the
    build hands a faster schedule to every budget it fits)."""
    for model in {r["model"] for r in SHIPPED}:
        rows = sorted((r for r in SHIPPED if r["model"] == model), key=lambda r: r["budget_bytes"])
        for small, large in zip(rows, rows[1:]):
            assert large["objective_s"] <= small["objective_s"] * (1 + 1e-9), (small["name"], large["name"])


@pytest.mark.parametrize("name", [r["name"] for r in SHIPPED])
def test_shipped_entry_loads_matches_and_fits(name):
    """Loads with the restricted unpickler, was made for its zoo model's graph at its batch and
    input shape, and the simulator's peak of its schedule is within its budget (and equals the
    recorded prediction)."""
    if name.startswith(("googlenet", "mobilenet_v2", "resnet50", "gpt2")):
        skip_unless_long("the entries of the four largest graphs (GoogLeNet, MobileNetV2, ResNet-50, GPT-2 small)", 85,
                   "the short suite verifies UNet's and VGG-16's entries, and the tiny zoo's build and verify")
    r = zoo_index.entry(name)
    res = zv.verify(name, _graph(r["model"], r["batch_size"], tuple(r["input_shape"])))
    assert res["fits"], f"{name}: simulated peak {res['peak_bytes']} > budget {res['budget_bytes']}"
    assert res["matches_prediction"], f"{name}: simulated {res['peak_bytes']} vs recorded {res['predicted_peak_bytes']}"


# ----------------------------------------------------------------------------------------------
# a tiny zoo built here
# ----------------------------------------------------------------------------------------------

TINY_SHAPE = (3, 64, 64)
TINY = zb.ZooConfig("mobilenet_v2", 8, ("70%", "5%"), input_shape=TINY_SHAPE, mode="normal", device="cpu")


@pytest.fixture(scope="module")
def tiny_zoo(tmp_path_factory):
    """A zoo folder with MobileNetV2 (batch 8, 3x64x64, normal mode) at 70 % of its plain peak and
    at 5 %, which no schedule reaches (parameters and their gradients alone exceed it)."""
    root = tmp_path_factory.mktemp("zoo")
    records, failures = zb.build([TINY], root=root, time_limit=5, solver_log=False)
    assert not failures
    return root, {r["name"]: r for r in records}


@pytest.fixture
def use_tiny_zoo(tiny_zoo, monkeypatch):
    root, records = tiny_zoo
    monkeypatch.setattr(zoo_index, "ZOO_DIR", root)
    return root, records


def test_build_writes_entries_and_a_min_entry(tiny_zoo):
    root, records = tiny_zoo
    name = TINY.entry_name("70%")
    assert name == "mobilenet_v2-8-3x64x64-70pct"
    assert set(records) == {name, TINY.entry_name("min")}
    rec, least = records[name], records[TINY.entry_name("min")]
    # another input shape, mode and device than the best-known table's: nothing to hold it against
    assert rec["best_known_s"] is None and rec["vs_best"] is None and "best_known_budget" in rec
    assert rec["budget"] == "70%" and rec["predicted_peak_bytes"] <= rec["budget_bytes"]
    assert rec["cost_source"] == "analytic p100" and rec["fingerprint"] == _graph("mobilenet_v2", 8, TINY_SHAPE).fingerprint
    # 5 % is infeasible: an entry at the smallest feasible budget stands in, named as such
    assert least["budget"] == "min" and least["substitute_for"] == ["5%"]
    assert least["budget_bytes"] < rec["budget_bytes"]
    assert [r["name"] for r in load_index(root)] == sorted(records, key=lambda n: -records[n]["budget_bytes"])
    sol = load_solution(root / "schedules" / rec["file"])
    assert sol.meta.cost_source == "analytic p100" and sol.meta.model == "mobilenet_v2"
    for n in records:
        res = zv.verify(n, _graph("mobilenet_v2", 8, TINY_SHAPE), root)
        assert res["fits"] and res["matches_prediction"], res


def test_zoo_list_columns(use_tiny_zoo, capsys):
    assert main(["zoo", "list"]) == 0
    out = capsys.readouterr().out
    header = out.splitlines()[0]
    for col in ("name", "model", "batch", "budget", "predicted peak", "predicted overhead", "source"):
        assert col in header, col
    assert "mobilenet_v2-8-3x64x64-70pct" in out and "analytic p100" in out
    assert main(["zoo", "list", "--json"]) == 0
    data = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert {e["name"] for e in data["entries"]} == set(use_tiny_zoo[1])
    frame = zoo_index.list_entries()
    assert list(frame.columns) == [title for _, title in zoo_index.TABLE] and len(frame) == 2


def test_zoo_get_writes_a_loadable_file(use_tiny_zoo, tmp_path, capsys):
    name = TINY.entry_name("70%")
    out = tmp_path / "got.pkl"
    assert main(["zoo", "get", name, "-o", str(out)]) == 0
    assert "monet solution for mobilenet_v2" in capsys.readouterr().out
    assert load_solution(out) == load_solution(zoo_index.path_of(name)) == load_solution(f"zoo:{name}")


def test_unknown_name_is_a_clear_error(use_tiny_zoo, capsys):
    assert main(["zoo", "get", "mobilenet_v2-8-3x64x64-7pct"]) == 2
    err = capsys.readouterr().err
    assert "no zoo entry named 'mobilenet_v2-8-3x64x64-7pct'" in err and "mobilenet_v2-8-3x64x64-70pct" in err
    with pytest.raises(KeyError, match="available: "):
        load_solution(zoo_index.path_of("nope"))
    with pytest.raises(SolutionFileError, match="no zoo entry named 'nope'"):
        load_solution("zoo:nope")
    assert main(["check", "zoo:nope"]) == 2


def test_empty_zoo_says_so(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(zoo_index, "ZOO_DIR", tmp_path)
    assert main(["zoo", "list"]) == 0
    assert "the zoo is empty" in capsys.readouterr().out
    with pytest.raises(ZooEntryError, match="the zoo is empty"):
        load_solution(zoo_index.path_of("resnet50-184-6GB"))


def test_wrapper_takes_a_zoo_reference(use_tiny_zoo):
    from monet.wrapper import MONeTWrapper
    from monet.zoo.models import example_input, get_model

    name = TINY.entry_name("70%")
    torch.manual_seed(0)
    model = get_model("mobilenet_v2")
    x = example_input("mobilenet_v2", 8, TINY_SHAPE)
    wrapped = MONeTWrapper(copy.deepcopy(model), f"zoo:{name}", TINY_SHAPE)
    assert wrapped.solution == load_solution(zoo_index.path_of(name))
    for m in (wrapped, model):
        torch.manual_seed(1)  # the same dropout mask
        m(x).square().mean().backward()
    for (n, p), q in zip(model.named_parameters(), wrapped.model.parameters()):
        torch.testing.assert_close(q.grad, p.grad, rtol=1e-5, atol=1e-7, msg=n)


def test_verify_command(use_tiny_zoo, capsys):
    assert main(["zoo", "verify", "--root", str(use_tiny_zoo[0])]) == 0
    assert "2 of 2 entries pass" in capsys.readouterr().out


def test_plot_and_raw_rows(use_tiny_zoo, tmp_path):
    import pandas as pd

    from monet.profiling.raw_results import PROVENANCE

    records = load_index()
    png = zr.plot_frontier(records, tmp_path / "docs" / "frontier.png")
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    path = tmp_path / "zoo.csv"
    for _ in range(2):  # the zoo is rebuilt whole: rewriting replaces every earlier row
        zr.write_csv(records, path, "monet zoo plot -o x.png --csv zoo.csv")
    rows = pd.read_csv(path, dtype=str, keep_default_na=False)
    assert sorted(rows.entry) == sorted(r["name"] for r in records) and TINY.entry_name("70%") in set(rows.entry)
    assert list(rows.columns) == zr.HEADER + list(PROVENANCE)
    assert set(rows.command) == {"monet zoo plot -o x.png --csv zoo.csv"}
    assert "| entry | model (batch) |" in zr.markdown_table(records)


def test_profile_hook(tmp_path):
    """A cost table in zoo/profiles named by the graph's fingerprint replaces the analytic costs."""
    from monet.impls import impls_for, variant
    from monet.profiling.costs import DeviceSpec, analytic_costs
    from monet.profiling.profiler import save_costs

    graph = _graph("mobilenet_v2", 8, TINY_SHAPE)
    assert zb.find_profile(graph, tmp_path) is None
    table = analytic_costs(graph, DeviceSpec.named("v100"))
    table["time_s"] *= 2
    table["recompute_s"] *= 2
    table["workspace_bytes"] = 1024
    table["source"] = "profile:Tesla V100-SXM2-16GB"
    save_costs(table, tmp_path / f"{graph.fingerprint[:16]}_Tesla-V100-SXM2-16GB_torch2.13.0.csv")
    zc = zb.zoo_costs(graph, profiles_dir=tmp_path)
    assert zc.source == "profile Tesla V100-SXM2-16GB" and zc.profile is not None
    assert zc.costs.total_time == pytest.approx(table["time_s"].sum())
    assert (zc.costs.fwd_workspace == 1024).all()
    impl = next(iter(impls_for("newnode", "cpu")))  # a variant graph, as the solver costs it
    vg, keys, governed = variant(graph, impl.name)
    vc = zc.cost_fn(vg, keys, governed)
    assert (vc.fwd_workspace == 1024).all() and vc.total_time > 0
    ws_f, ws_b = zv.workspace_for(graph, {"name": "x", "cost_source": zc.source}, tmp_path)
    assert (ws_f == 1024).all() and (ws_b == 1024).all()
    ws_f, _ = zv.workspace_for(graph, {"name": "x", "cost_source": "analytic p100"}, tmp_path)
    assert not ws_f.any()


def test_configs_are_monets():
    batches = {c.model: c.batch_size for c in zb.CONFIGS}
    assert batches == {"resnet50": 184, "googlenet": 320, "unet": 11, "mobilenet_v2": 272, "vgg16": 176,
                       "gpt2-small": 8}
    names = [c.entry_name(b) for c in zb.CONFIGS for b in c.budgets]
    assert len(names) == 32 and "resnet50-184-6GB" in names and "gpt2-small-8-33pct" in names
    assert all(c.mode == "inplace_conv_multiway_newnode" and c.device == "cuda" for c in zb.CONFIGS)
