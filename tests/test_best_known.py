"""The table of the best schedules known (`monet.solver.best_known`) and the zoo's gap to it:
which rows fit a budget, what ``record_best_known`` keeps, the zoo's fields and its
"vs best known" column.  Nothing is captured or solved."""
from __future__ import annotations

import pandas as pd
import pytest

from monet.solver import best_known as bk
from monet.zoo import build as zb
from monet.zoo import report as zr
from monet.zoo.index import list_entries, save_index, vs_best_text

GiB = 2**30
EAGER = 20 * GiB  # plain PyTorch's simulated peak of the made-up configuration
BEST = {
    ("resnet50", 184, "70"): 0.63,  # budget int(EAGER * 0.7) = 14 GiB
    ("resnet50", 184, "50"): 0.65,  # 10 GiB
    ("resnet50", 184, "33"): 0.69,  # 6.6 GiB
    ("resnet50", 184, "min"): 0.001,  # bytes, not seconds: must never be taken for an objective
    ("resnet50", 184, "8GB"): 0.66,
    ("resnet50", 32, "70"): 0.1,  # another batch
    ("vgg16", 184, "70"): 0.2,  # another model
}


def test_best_fitting_takes_the_lowest_row_whose_budget_fits():
    assert bk.best_fitting(BEST, "resnet50", 184, int(EAGER * 0.7), EAGER) == (0.63, "70")
    assert bk.best_fitting(BEST, "resnet50", 184, int(EAGER * 0.7) - 1, EAGER) == (0.65, "50")
    # a 50 % row does not fit a budget below int(eager * 0.5); the 8GB row does
    assert bk.best_fitting(BEST, "resnet50", 184, int(EAGER * 0.5) - 1, EAGER) == (0.66, "8GB")
    assert bk.best_fitting(BEST, "resnet50", 184, 8 * GiB, EAGER) == (0.66, "8GB")
    assert bk.best_fitting(BEST, "resnet50", 184, 8 * GiB - 1, EAGER) == (0.69, "33")


def test_best_fitting_skips_min_rows_and_returns_none_when_nothing_fits():
    # below every objective row only the "min" row (a budget in bytes) is left: it is no objective
    assert bk.best_fitting(BEST, "resnet50", 184, int(EAGER * 0.33) - 1, EAGER) is None
    assert bk.best_fitting(BEST, "resnet50", 184, 10**15, EAGER)[0] == 0.63  # not 0.001
    assert bk.best_fitting(BEST, "googlenet", 320, 10**15, EAGER) is None
    assert bk.best_fitting({}, "resnet50", 184, 10**15, EAGER) is None


def test_keys():
    assert bk.key_budget_bytes("10GB", EAGER) == 10 * GiB
    assert bk.key_budget_bytes("33", EAGER) == int(EAGER * 33 / 100)
    assert bk.key_budget_bytes("min", EAGER) is None and bk.key_budget_bytes("6GiB", EAGER) is None
    assert [bk.budget_key(b) for b in ("10GB", "50%", "33 %", "min", "6GiB", "123456")] == \
        ["10GB", "50", "33", None, None, None]


def _row(key, value, model="resnet50", batch=184):
    return dict(model=model, batch=batch, _key=key, _value=value)


def test_record_best_known_writes_better_rows_only(tmp_path):
    path = tmp_path / "best.csv"
    assert len(bk.record_best_known([_row("70", 1.0), _row("10GB", 2.0), _row("min", 300.0)], "cmd A", path)) == 3
    written = bk.record_best_known([_row("70", 0.9), _row("10GB", 2.5), _row("min", 400.0), _row("50", None)],
                                   "cmd B", path)
    assert [(e["budget"], e["best"], e["found_by"]) for e in written] == [("70", 0.9, "cmd B")]
    assert bk.load_best_known(path) == {("resnet50", 184, "70"): 0.9, ("resnet50", 184, "10GB"): 2.0,
                                        ("resnet50", 184, "min"): 300.0}
    df = pd.read_csv(path, dtype={"budget": str})
    assert list(df.columns) == bk.BEST_COLUMNS
    assert list(df["budget"]) == ["70", "10GB", "min"]  # percents, then GB keys, then min
    assert dict(zip(df["budget"], df["unit"])) == {"70": "s", "10GB": "s", "min": "bytes"}
    assert dict(zip(df["budget"], df["found_by"]))["10GB"] == "cmd A"


def test_record_best_known_sorts_gb_and_percent_keys(tmp_path):
    path = tmp_path / "best.csv"
    bk.record_best_known([_row("5GB", 1.0), _row("min", 1.0), _row("33", 1.0), _row("10GB", 1.0), _row("70", 1.0),
                          _row("70", 1.0, model="vgg16")], "cmd", path)
    df = pd.read_csv(path, dtype={"budget": str})
    assert list(zip(df["model"], df["budget"])) == [("resnet50", "70"), ("resnet50", "33"), ("resnet50", "10GB"),
                                                    ("resnet50", "5GB"), ("resnet50", "min"), ("vgg16", "70")]


def test_the_shipped_table_loads():
    table = bk.load_best_known()
    assert bk.BEST_KNOWN.name == "best_known.csv" and bk.BEST_KNOWN.parent.name == "benchmarks"
    assert table and all(v > 0 for v in table.values())


# ----------------------------------------------------------------------------------------------
# the zoo against the table
# ----------------------------------------------------------------------------------------------


def _record(budget="10GB", budget_bytes=10 * GiB, objective_s=0.66, **extra):
    rec = dict(name=f"resnet50-184-{budget.replace('%', 'pct')}", model="resnet50", batch_size=184,
               input_shape=[3, 224, 224], dtype="torch.float32", budget=budget, budget_bytes=budget_bytes,
               substitute_for=[], mode=zb.MODE, device="cuda", cost_source="analytic P100",
               predicted_peak_bytes=budget_bytes - 1, eager_peak_bytes=EAGER, predicted_overhead=0.05,
               objective_s=objective_s, eager_time_s=0.6, bound_s=0.6, gap=0.01, status="gap", solver="CBC",
               solve_time_s=60.0, time_limit_s=60.0, recomputations=3, file="x.pkl", file_bytes=1, fingerprint="f",
               monet_version="0", torch_version="0", created="now")
    rec.update(extra)
    return rec


def test_zoo_fields_hold_an_entry_against_the_best_fitting_row():
    rec = _record(objective_s=0.6666)  # 10 GiB: the 50 % row (10 GiB) and the 8GB row fit; 50 % is lower
    fields = zb.best_known_fields(rec, BEST, EAGER)
    assert fields["best_known_s"] == 0.65 and fields["best_known_budget"] == "50"
    assert fields["vs_best"] == pytest.approx(0.6666 / 0.65 - 1)
    # a new best is negative
    assert zb.best_known_fields(_record(objective_s=0.64), BEST, EAGER)["vs_best"] < 0
    # nothing fits (or no table): all None
    assert set(zb.best_known_fields(_record(budget_bytes=GiB), BEST, EAGER).values()) == {None}
    assert set(zb.best_known_fields(rec, {}, EAGER).values()) == {None}
    # a "33%" entry's own row fits it: both budgets are parse_budget's, byte for byte
    from monet.solver.solve import parse_budget

    pct = _record("33%", parse_budget("33%", EAGER), objective_s=0.69)
    assert bk.key_budget_bytes("33", EAGER) == parse_budget("33%", EAGER)
    assert zb.best_known_fields(pct, BEST, EAGER)["best_known_budget"] == "33"
    assert zb.best_known_fields({**pct, "budget_bytes": pct["budget_bytes"] - 1}, BEST, EAGER)[
        "best_known_budget"] != "33"  # a byte less does not fit the 33 % row


def test_record_best_writes_only_entries_that_beat_the_table(tmp_path):
    path = tmp_path / "best.csv"
    bk.record_best_known([_row("50", 0.65), _row("8GB", 0.66)], "before", path)
    best = bk.load_best_known(path)
    better = _record(objective_s=0.64)
    worse = _record("9GB", 9 * GiB, objective_s=0.67)
    half = _record("50%", int(EAGER * 0.5), objective_s=0.645)
    none_fits = _record("5GB", 5 * GiB, objective_s=0.9)
    same = _record("8GB", 8 * GiB, objective_s=0.66 * (1 - 1e-15))  # float noise: no new best
    records = [{**r, **zb.best_known_fields(r, best, EAGER)} for r in (better, worse, half, none_fits, same)]
    written = zb.record_best(records, "monet zoo build --record-best", path)
    assert sorted((e["budget"], e["best"]) for e in written) == [("10GB", 0.64), ("50", 0.645)]
    table = bk.load_best_known(path)
    assert table[("resnet50", 184, "10GB")] == 0.64 and table[("resnet50", 184, "50")] == 0.645
    assert ("resnet50", 184, "9GB") not in table and ("resnet50", 184, "5GB") not in table
    assert set(pd.read_csv(path)["found_by"]) == {"before", "monet zoo build --record-best"}


def test_vs_best_text():
    assert vs_best_text(_record(vs_best=0.0042, best_known_budget="50")) == "+0.42 %"
    assert vs_best_text(_record(vs_best=-0.01, best_known_budget="50")) == "new best"
    assert vs_best_text(_record(vs_best=0.0, best_known_budget="10GB")) == "new best"  # its own recorded row
    assert vs_best_text(_record(vs_best=0.0, best_known_budget="50")) == "+0.00 %"  # another budget's schedule
    assert vs_best_text(_record(vs_best=-1e-16, best_known_budget="50")) == "+0.00 %"  # float noise: the same
    assert vs_best_text(_record(vs_best=-1e-16, best_known_budget="10GB")) == "new best"
    assert vs_best_text(_record(vs_best=None, best_known_s=None)) == "-"
    assert vs_best_text(_record()) == "-"  # an index of an older build


def test_markdown_and_list_show_vs_best_known_and_dash_for_old_records(tmp_path, monkeypatch):
    new = _record(best_known_s=0.65, best_known_budget="50", vs_best=0.0042)
    old = _record("9GB", 9 * GiB)  # written before the fields existed
    assert "vs_best" not in old
    table = zr.markdown_table([new, old])
    lines = table.splitlines()
    header = [c.strip() for c in lines[0].strip("|").split("|")]
    assert "vs best known" in header and "gap" in header
    col = header.index("vs best known")
    cells = {row.split("|")[1].strip(): [c.strip() for c in row.strip("|").split("|")] for row in lines[2:]}
    assert cells[new["name"]][col] == "+0.42 %" and cells[old["name"]][col] == "-"
    assert cells[new["name"]][header.index("gap")] == "1.00 %"  # the solver's own gap is kept
    # `monet zoo list`'s table, from an index with both records
    save_index([new, old], tmp_path)
    monkeypatch.setattr("monet.zoo.index.ZOO_DIR", tmp_path)
    frame = list_entries().set_index("name")
    assert frame.loc[new["name"], "vs best known"] == "+0.42 %" and frame.loc[old["name"], "vs best known"] == "-"


def test_zoo_build_command_passes_record_best(monkeypatch, tmp_path):
    """``monet zoo build --record-best`` hands its command line to the build (which writes new bests
    with it); without the flag the table is only read."""
    from monet.cli import main

    seen = []
    monkeypatch.setattr(zb, "build", lambda configs, **kw: seen.append(kw) or ([], []))
    argv = ["zoo", "build", "--models", "vgg16", "--budgets", "10GB", "--out-dir", str(tmp_path), "--record-best"]
    assert main(argv) == 0 and main(argv[:-1]) == 0
    assert seen[0]["record_best_by"] == "monet " + " ".join(argv) and seen[1]["record_best_by"] is None
    assert seen[0]["time_limit"] == zb.DEFAULT_TIME_LIMIT == 60.0
