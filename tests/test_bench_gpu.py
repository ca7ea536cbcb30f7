"""benchmarks/gpu_table.py: the GPU table's command, run end to end on its tiny CPU path (and on
CUDA where there is one)."""
import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest
from ci import HANG_GUARD_S, long_only
import torch

from monet.profiling.profiler import cache_path
from monet.zoo.build import find_profile

SCRIPT = Path(__file__).resolve().parent.parent / "benchmarks" / "gpu_table.py"
MODEL = "mobilenet_v2"
# 100 %: keeping everything fits on every machine, so some budget is solved and measured; whether
# 75 % is feasible depends on the workspace the script profiles here
BUDGETS = ("100%", "75%")


def _module():
    spec = importlib.util.spec_from_file_location("gpu_table", SCRIPT)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod  # dataclasses look their module up there
    spec.loader.exec_module(mod)
    return mod


def _run(tmp_path, device, *extra):
    work, profiles, out = tmp_path / "work", tmp_path / "profiles", tmp_path / "table.md"
    cmd = [sys.executable, str(SCRIPT), "--step", "all", "--models", MODEL, "--device", device, "--small",
           "--work-dir", str(work), "--profiles-dir", str(profiles), "--out", str(out),
           "--budgets", ",".join(BUDGETS), "--time-limit", "3", "--repeats", "1", "--compile-budgets", "", "--no-progress",
           *extra]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=HANG_GUARD_S)
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert "[gpu_table" in proc.stderr  # it says what it is doing
    return work, profiles, out


def _check(work, profiles, out, device):
    assert out.is_file()
    text = out.read_text()
    res = json.loads((work / MODEL / "measure.json").read_text())
    assert res["finished"]
    methods = [r["method"] for r in res["rows"]]
    assert methods[0] == "PyTorch"
    assert [m for m in methods if m.startswith("MONeT")] == [f"MONeT {b}" for b in BUDGETS]
    # one table row per budget plus plain PyTorch (and the Chen peer)
    table_rows = [line for line in text.splitlines() if line.startswith("| ") and not line.startswith("| method")]
    assert sum(r.startswith("| MONeT") for r in table_rows) == len(BUDGETS)
    assert sum(r.startswith("| PyTorch") for r in table_rows) == 1
    solved = [r for r in res["rows"] if r.get("predicted_peak_bytes") is not None]
    # the budgets are fractions of the plain peak with the workspace profiled here: one this
    # machine cannot meet is a row that says so and names the smallest feasible budget
    asked = json.loads((work / MODEL / "solve.json").read_text())["rows"]
    for r in asked:
        assert "file" in r or (r["status"] == "infeasible" and r["min_budget_bytes"] > r["budget_bytes"]), r
    assert len(solved) == sum("file" in r for r in asked) and asked[0]["budget"] == "100%" and "file" in asked[0]
    for r in solved:
        assert "error" not in r, r
        assert r["allocated_bytes"] <= r["budget_bytes"], r
        assert r["grad_rel_error"] <= 1e-5, r
    for r in res["rows"]:
        assert "error" not in r, r
    if device == "cuda":
        assert all(r["reserved_bytes"] >= r["allocated_bytes"] for r in res["rows"])
    # the profile lies where `monet zoo build` looks for it, named as the profile cache names it
    manifest = json.loads((work / MODEL / "profile.json").read_text())
    # the solve step counts bytes as on the GPU the profile recorded (cuBLAS workspaces by capability)
    assert manifest["cuda_capability"] == (list(torch.cuda.get_device_capability()) if device == "cuda" else None)
    gt = _module()
    graph = gt.capture_config(gt.small_configs()[MODEL], device)
    found = find_profile(graph, profiles)
    assert found is not None and found == Path(manifest["profile"])
    assert found.name == cache_path(graph, device, profiles).name
    return res


@long_only("the GPU table's CPU path end to end", 130,
           "in the short suite only its parts run (the missing-step error, the published rows)")
def test_cpu_path_end_to_end(tmp_path):
    work, profiles, out = _run(tmp_path, "cpu")
    res = _check(work, profiles, out, "cpu")
    assert res["rows"][0]["reserved_bytes"] is None  # no reserved memory on the CPU


def test_missing_step_is_an_error_that_says_what_to_run(tmp_path):
    cmd = [sys.executable, str(SCRIPT), "--step", "measure", "--models", MODEL, "--device", "cpu",
           "--work-dir", str(tmp_path)]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=HANG_GUARD_S)
    assert proc.returncode == 1
    assert "--step solve --models mobilenet_v2" in proc.stderr


def test_published_row_is_parsed():
    pub = _module().published()
    assert pub["resnet50"]["plain_gb"] == 15.06
    assert pub["resnet50"]["points"][2] == (6.00, pytest.approx(0.0931))
    assert len(pub) == 5 and all(len(p["points"]) == 4 for p in pub.values())


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_cuda_path_end_to_end(tmp_path):
    work, profiles, out = _run(tmp_path, "cuda")
    res = _check(work, profiles, out, "cuda")
    assert res["alloc_conf"].startswith("expandable_segments:True")
