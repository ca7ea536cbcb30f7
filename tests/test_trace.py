"""Per-node memory traces (`monet.profiling.trace`): recorded on the CPU against the simulator, the
committed traces (tests/data/traces: CPU ones recorded here, CUDA ones recorded on a GPU by
benchmarks/gpu_traces.py) replayed on any machine, and the report of the first node where the
memory model and the allocator part."""
from __future__ import annotations

import gzip
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch

from monet.capture import capture
from monet.profiling import trace as tr
from monet.profiling import trace_compare
from monet.profiling.graph_json import graph_from_json
from monet.profiling.costs import analytic_costs, costs_for
from monet.solver.solve import eager_peak, solve
from ci import HANG_GUARD_S
from usernet import UserNet

ROOT = Path(__file__).resolve().parent.parent
TRACES = sorted((ROOT / "tests" / "data" / "traces").glob("*.json.gz"))
SCRIPT = ROOT / "benchmarks" / "gpu_traces.py"
USERNET = f"{ROOT / 'tests' / 'usernet.py'}:UserNet"


@pytest.fixture(scope="module")
def recorded():
    """UserNet (residual, custom activation, in-place ops, BatchNorm, dropout) at batch 4, a normal
    schedule at 70 % of its simulated plain peak that recomputes, recorded on the CPU twice: with the
    workspace derived from the recording, and with none."""
    torch.manual_seed(0)
    model, x = UserNet(), torch.randn(4, 3, 16, 16)
    graph = capture(model, x)
    costs = costs_for(graph, analytic_costs(graph))
    sol = solve(graph, costs, int(0.7 * eager_peak(graph, costs)), "normal", time_limit=20,
                info=dict(model=USERNET, batch_size=4, input_shape=(3, 16, 16), dtype="float32"))
    assert sol.schedule.recompute_count() > 0
    derived = tr.record_trace(model, x, sol, model_name=USERNET, label="70% normal")
    zero = tr.record_trace(model, x, sol, model_name=USERNET,
                           workspace=(np.zeros(len(graph.fwd), int), np.zeros(len(graph.bwd), int)),
                           workspace_source="none")
    return derived, zero, graph, sol


def test_recording_covers_every_node_of_both_passes(recorded):
    trace, _, graph, _ = recorded
    n = trace.nodes
    assert list(n["row"]) == list(range(len(n)))
    assert set(n["pass"]) == {"forward", "backward"}
    assert (n["pass"] == "forward").idxmin() > 0  # the forward pass first, then the backward
    assert set(n.loc[n["role"] == "backward", "node_id"]) == set(range(len(graph.bwd)))
    assert set(n.loc[n["role"] == "forward", "node_id"]) == set(range(len(graph.fwd)))
    assert (n["role"] == "recompute").any()
    stages = n.loc[n["role"] == "recompute", "stage"]
    assert (stages >= 0).all()  # a recomputation belongs to the stage of the backward node after it
    assert trace.meta["measured"]["events_attributed"]
    assert not n[tr.MEASURED + tr.SIMULATED].isna().any().any()


def test_cpu_measurement_agrees_with_the_simulator(recorded):
    """On the CPU the allocator's bytes after every node equal the simulator's (outputs allocated,
    values freed after their last use, unread outputs of a multi-output op with its tuple), and the
    bytes while a node runs are the simulator's plus the node's measured workspace: with none
    counted the simulator is below or equal at every node, with the recorded workspace equal at the
    iteration's peak."""
    derived, zero, _, _ = recorded
    for t in (derived, zero):
        assert (t.nodes["after_bytes"] == t.nodes["sim_after_bytes"]).all()
    assert (zero.nodes["sim_peak_bytes"] <= zero.nodes["peak_bytes"]).all()
    assert (zero.nodes["peak_bytes"] > zero.nodes["sim_peak_bytes"]).any()  # kernels' temporaries
    assert derived.meta["simulated"]["peak_bytes"] == derived.meta["measured"]["peak_bytes"]
    assert zero.meta["simulated"]["peak_bytes"] < zero.meta["measured"]["peak_bytes"]


def test_events_are_attributed_to_their_nodes(recorded):
    """Each row's allocator events add up to what the row's counters say it changed."""
    trace, _, _, _ = recorded
    ev = trace.events
    signed = np.where(ev["action"] == "alloc", ev["size"], -ev["size"])
    per_row = pd.Series(signed).groupby(ev["row"].to_numpy()).sum()
    n = trace.nodes.set_index("row")
    for row, delta in per_row.items():
        if row >= 0:
            assert delta == n.loc[row, "after_bytes"] - n.loc[row, "before_bytes"], row
    assert n.loc[per_row.index[per_row.index >= 0], "op"].str.startswith("aten").any()


def test_file_round_trip(recorded, tmp_path):
    trace, _, _, _ = recorded
    path = trace.save(tmp_path / "t.json.gz")
    assert tr.is_trace_file(path)
    back = tr.Trace.load(path)
    assert back.meta == json.loads(json.dumps(trace.meta))
    pd.testing.assert_frame_equal(back.nodes, trace.nodes, check_dtype=False)
    pd.testing.assert_frame_equal(back.events, trace.events, check_dtype=False)
    sim, nodes = tr.replay_trace(back)  # no model code needed: the joint graph is in the file
    assert sim.peak_bytes == trace.meta["simulated"]["peak_bytes"]
    assert (nodes["sim_after_bytes"] == trace.nodes["sim_after_bytes"]).all()


def test_cuda_events_are_attributed_by_their_metadata():
    """The CUDA allocator's history (the snapshot format of 2.11-2.15): alloc and free events carry
    the row the probe stamped in ``user_metadata``; events between nodes have none (row -1); other
    actions are dropped."""
    snapshot = {"device_traces": [[
        {"action": "alloc", "addr": 100, "size": 512, "stream": 0, "user_metadata": f"{tr.SCOPE}3"},
        {"action": "free_requested", "addr": 100, "size": 512, "stream": 0, "user_metadata": f"{tr.SCOPE}4"},
        {"action": "free_completed", "addr": 100, "size": 512, "stream": 0, "user_metadata": f"{tr.SCOPE}4"},
        {"action": "alloc", "addr": 200, "size": 1024, "stream": 0},
        {"action": "snapshot", "addr": 0, "size": 0, "stream": 0},
        {"action": "segment_alloc", "addr": 0, "size": 2097152, "stream": 0, "user_metadata": ""}]]}
    events, labelled = tr._cuda_events(snapshot, 0)
    assert labelled
    assert events.values.tolist() == [[3, "alloc", 512, 100], [4, "free_requested", 512, 100],
                                      [4, "free_completed", 512, 100], [-1, "alloc", 1024, 200],
                                      [-1, "segment_alloc", 2097152, 0]]
    assert not tr._cuda_events({"device_traces": [[{"action": "alloc", "addr": 1, "size": 512}]]}, 0)[1]


def test_not_a_trace(tmp_path):
    plain = tmp_path / "x.json.gz"
    with gzip.open(plain, "wt") as f:
        json.dump({"format": "something else"}, f)
    (tmp_path / "y.txt").write_text("hello")
    newer = tmp_path / "z.json.gz"
    with gzip.open(newer, "wt") as f:
        json.dump({"format": tr.FORMAT, "version": tr.VERSION + 1}, f)
    for p in (plain, tmp_path / "y.txt", newer):
        assert not tr.is_trace_file(p) or p == newer
        with pytest.raises(tr.TraceFormatError):
            tr.Trace.load(p)


def test_a_changed_graph_is_refused(recorded):
    trace, _, _, _ = recorded
    joint = json.loads(json.dumps(trace.meta["graph"]["joint"]))
    node = next(n for n in joint["nodes"] if n[0] == "placeholder")
    node[5]["T"][0][0] += 1  # another batch size
    with pytest.raises(tr.TraceMismatchError):
        graph_from_json(joint, trace.meta["graph"]["fingerprint"])


def _without_workspace(trace: tr.Trace) -> tr.Trace:
    """``trace`` with no workspace for the replay to count: what it simulates then comes from the
    graph and the schedule alone, none of it from the recording it is compared with."""
    ws = trace.meta["workspace"]
    ws["fwd"], ws["bwd"], ws["source"] = [0] * len(ws["fwd"]), [0] * len(ws["bwd"]), "none"
    return trace


@pytest.mark.parametrize("path", TRACES, ids=[p.name for p in TRACES])
def test_committed_trace_replays_to_its_measured_bytes(path):
    """Every committed trace (CPU ones recorded here; CUDA ones by benchmarks/gpu_traces.py on a GPU)
    simulated again on this machine with no workspace: the bytes held after every node are the
    allocator's (on the CPU exactly, on CUDA within the comparison's tolerance), and while a node
    runs the simulation is never above the allocator (what a node adds is its workspace).  Then
    with the workspace derived from the recording, whose peak it reproduces within 2 % (a check
    of the replay, not of the memory model: that workspace comes from this very recording; see
    the test of two recordings below).  A trace whose meta has ``known_gap`` (the memory model is
    known not to count something there yet, named in it) is an expected failure, strict: once the
    model is fixed, remove the mark."""
    trace = tr.Trace.load(path)
    bare = trace_compare.compare_trace(_without_workspace(tr.Trace.load(path)))
    assert bare.unmatched == 0
    exact = trace.meta["device"]["type"] == "cpu"
    after = bare.nodes["diff_after"].abs()
    assert (after == 0).all() if exact else (after <= bare.tolerance_bytes).all()
    assert (bare.nodes["diff_peak"] >= (0 if exact else -bare.tolerance_bytes)).all()
    c = trace_compare.compare_trace(trace)
    assert c.unmatched == 0
    gap = trace.meta.get("known_gap")
    if gap and not c.within:
        pytest.xfail(f"{gap}: {trace_compare.format_report(c, trace.meta, rows=0).splitlines()[-2:]}")
    assert c.within, trace_compare.format_report(c, trace.meta, rows=3)
    assert not gap, f"{path.name} is within 2 % now: remove its known_gap ({gap})"


def test_workspace_of_one_recording_predicts_another(recorded):
    """The workspace derived from one recording, simulated against a second recording of the same
    schedule: the simulated peak within 2 % of the second's measured one, and the bytes after every
    node equal (the simulation read nothing of the second recording)."""
    derived, _, graph, sol = recorded
    ws = derived.meta["workspace"]
    first = (np.asarray(ws["trace_fwd"], dtype=np.int64), np.asarray(ws["trace_bwd"], dtype=np.int64))
    torch.manual_seed(0)
    model, x = UserNet(), torch.randn(4, 3, 16, 16)
    second = tr.record_trace(model, x, sol, model_name=USERNET, workspace=first, workspace_source="first recording")
    assert second.meta["workspace"]["source"] == "first recording"
    c = trace_compare.compare_trace(second)
    assert c.unmatched == 0 and c.within, trace_compare.format_report(c, second.meta, rows=3)
    assert (c.nodes["diff_after"] == 0).all()


def test_committed_traces_exist():
    kinds = {tr.Trace.load(p).meta["device"]["type"] for p in TRACES}
    assert "cpu" in kinds
    assert all(p.stat().st_size < 2_000_000 for p in TRACES)


def _doctored(path, backward_index: int, extra: int, held: bool):
    """The trace at ``path`` with ``extra`` bytes more measured at its ``backward_index``-th backward
    node: held from there on (``held``: also after it and in every later row), or only while it runs."""
    trace = tr.Trace.load(path)
    n = trace.nodes
    k = int(n.loc[n["role"] == "backward", "row"].iloc[backward_index])
    n.loc[n["row"] == k, "peak_bytes"] += extra
    if held:
        n.loc[n["row"] == k, "after_bytes"] += extra
        n.loc[n["row"] > k, ["gap_peak_bytes", "before_bytes", "peak_bytes", "after_bytes"]] += extra
    trace.meta["measured"]["peak_bytes"] = int(max(trace.meta["measured"]["peak_bytes"], n["peak_bytes"].max()))
    return trace, k


def test_first_parting_node_on_a_doctored_trace():
    """A trace whose measurement gains 1 MiB from one backward node on (a library workspace
    allocated there and held) parts from the simulation exactly at that node, on the bytes after it;
    one whose node peaks 1 MiB higher (a workspace) parts there, on the peak."""
    path = next(p for p in TRACES if tr.Trace.load(p).meta["device"]["type"] == "cpu")
    trace, k = _doctored(path, 3, 2**20, held=True)
    c = trace_compare.compare_trace(trace)
    assert c.first_parting is not None
    assert int(c.first_parting["row"]) == k and c.first_parting["quantity"] == "after"
    assert c.first_parting["difference"] == 2**20
    assert f"first parting node: row {k} " in trace_compare.format_report(c, trace.meta, rows=2)
    trace, k = _doctored(path, 5, 2**20, held=False)
    c = trace_compare.compare_trace(trace)
    assert int(c.first_parting["row"]) == k and c.first_parting["quantity"] == "peak"
    assert trace_compare.compare_trace(tr.Trace.load(path)).first_parting is None  # the trace itself agrees


def test_cli_replays_a_trace():
    from monet.cli import main

    import contextlib
    import io

    path = next(p for p in TRACES if tr.Trace.load(p).meta["device"]["type"] == "cpu")
    out = io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(io.StringIO()):
        code = main(["check", str(path), "--json", "--rows", "2"])
    text = out.getvalue()
    assert code == 0
    result = json.loads(text.strip().splitlines()[-1])
    assert result["within"] and result["first_parting"] is None
    assert "simulated / measured" in text


def test_cli_records_a_trace(recorded, tmp_path):
    """``monet check FILE --trace --trace-out``: records, reports, writes a trace that replays."""
    from monet.cli import main

    import contextlib
    import io

    sol_path = tmp_path / "un.pkl"
    recorded[3].save(sol_path)
    out = io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(io.StringIO()):
        code = main(["check", str(sol_path), "--trace", "--trace-out", str(tmp_path / "t.json.gz"), "--json"])
    assert code == 0
    result = json.loads(out.getvalue().strip().splitlines()[-1])
    assert result["within"] and result["measured_peak_bytes"] == result["simulated_peak_bytes"]
    assert result["first_parting"] is None
    assert trace_compare.compare_trace(tr.Trace.load(tmp_path / "t.json.gz")).within


def test_gpu_script_cpu_path(tmp_path):
    """benchmarks/gpu_traces.py on its CPU path: a trace of the tiny ResNet-50 that replays here."""
    proc = subprocess.run([sys.executable, str(SCRIPT), "--device", "cpu", "--tiny", "--only",
                           "resnet50-tiny-8-keepall", "--out", str(tmp_path)], capture_output=True, text=True,
                          timeout=HANG_GUARD_S, env={**__import__("os").environ, "KINETO_LOG_LEVEL": "6"})
    assert proc.returncode == 0, proc.stderr[-3000:]
    path = tmp_path / "resnet50-tiny-8-keepall.json.gz"
    trace = tr.Trace.load(path)
    assert trace.meta["model"] == {"name": "resnet50", "kwargs": {"base_width": 8, "layers": [1, 1, 1, 1]},
                                   "batch_size": 8, "input_shape": [3, 64, 64], "dtype": "float32",
                                   "inputs_spec": None}
    assert trace.meta["device"]["type"] == "cpu" and trace.meta["device"]["torch"] == torch.__version__
    assert trace.meta["schedule"]["stages"] and not any(s[1] for s in trace.meta["schedule"]["stages"])
    assert trace_compare.compare_trace(trace).within
    versions = json.loads((tmp_path / "versions.json").read_text())
    assert versions["traces"][0]["name"] == "resnet50-tiny-8-keepall"
    assert "resnet50-tiny-8-keepall: measured" in proc.stdout
