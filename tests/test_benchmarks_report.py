"""BENCHMARKS.md is generated, byte for byte, by ``python benchmarks/report.py`` from the raw results
in benchmarks/results/ (every file read by a section, every row with its provenance), and the
benchmarks append raw rows with `monet.profiling.raw_results.append_rows`."""
import sys
from pathlib import Path

import pandas as pd
import pytest

from monet.profiling.raw_results import PROVENANCE, append_rows, command_line, provenance

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))

import report  # noqa: E402

BENCHMARKS_MAX_BYTES = 60_000


def test_benchmarks_md_is_what_the_results_give():
    text = report.render()
    assert (ROOT / "BENCHMARKS.md").read_text() == text, \
        "BENCHMARKS.md differs from the raw results: run `python benchmarks/report.py`"
    assert len(text.encode()) <= BENCHMARKS_MAX_BYTES


def test_the_check_mode_fails_on_a_hand_edit(tmp_path, capsys):
    out = tmp_path / "B.md"
    assert report.main(["--out", str(out)]) == 0
    assert report.main(["--check", "--out", str(out)]) == 0
    out.write_text(out.read_text().replace("## Solver at full scale", "## Solver at full scale, edited"))
    assert report.main(["--check", "--out", str(out)]) == 1
    assert "edited" in capsys.readouterr().out


def test_every_section_has_a_caption_per_table():
    """Each table is followed, before the next section, by its provenance: a line naming date,
    machine, torch and command."""
    lines = report.render().splitlines()
    tables = [k for k, line in enumerate(lines) if line.startswith("| ---") and not lines[k - 1].startswith("| section")]
    assert len(tables) >= len(report.SECTIONS)
    for k in tables:
        rest = lines[k:]
        section = rest[:next((i for i, line in enumerate(rest) if line.startswith("## ")), len(rest))]
        captions = [line for line in section if line.startswith("*") and " UTC; " in line and "torch " in line]
        assert captions and all(line.endswith("`*") or "`;" in line for line in captions), lines[k - 1]


def test_a_results_file_no_section_reads_is_refused(monkeypatch, tmp_path):
    results = tmp_path / "results"
    (results / "gpu").mkdir(parents=True)
    for name in {f for s in report.SECTIONS for f in s.files}:
        (results / name).write_bytes((report.RESULTS / name).read_bytes())
    (results / "stray.csv").write_text("a,date,machine,torch,command\n1,d,m,t,c\n")
    monkeypatch.setattr(report, "RESULTS", results)
    with pytest.raises(ValueError, match="stray.csv is read by no section"):
        report.render()
    (results / "stray.csv").unlink()
    (results / "solver.csv").unlink()
    with pytest.raises(ValueError, match="solver.csv is named by a section but missing"):
        report.render()


def test_a_row_without_provenance_is_refused(monkeypatch, tmp_path):
    (tmp_path / "x.csv").write_text("a,date\n1,2026\n")
    monkeypatch.setattr(report, "RESULTS", tmp_path)
    with pytest.raises(ValueError, match="no machine, torch, command column"):
        report.read("x.csv")


def test_append_rows_replaces_a_configuration_measured_again(tmp_path):
    path = tmp_path / "sub" / "r.csv"
    first = provenance("python benchmarks/x.py --a")
    append_rows(path, [dict(model="gpt2", peak=1), dict(model="bert", peak=2)], first)
    append_rows(path, [dict(model="gpt2", peak=3, extra="e")], dict(first, command="again"),
                replaces=lambda old: old["model"] == "gpt2")
    rows = pd.read_csv(path, dtype=str, keep_default_na=False)
    assert list(rows.columns) == ["model", "peak", *PROVENANCE, "extra"]
    assert rows[["model", "peak", "command", "extra"]].values.tolist() == [
        ["bert", "2", "python benchmarks/x.py --a", ""], ["gpt2", "3", "again", "e"]]
    assert not list(tmp_path.glob("sub/*.tmp"))


def test_command_line_quotes_what_a_shell_needs():
    assert command_line("python b.py", ["--peers", "transformers every 1"]) == "python b.py --peers 'transformers every 1'"
    assert command_line("monet demo", []) == "monet demo"


def test_citations_of_benchmarks_sections_name_a_section():
    """Code and docs that cite `BENCHMARKS.md, "Section"` name a section the report writes."""
    import re

    heads = [line[3:] for line in report.render().splitlines() if line.startswith("## ")]
    paths = [ROOT / "README.md", *(ROOT / "docs").glob("*.md")]
    paths += [p for d in ("monet", "solver", "profiling", "zoo", "benchmarks") for p in (ROOT / d).rglob("*.py")]
    cited = [(p.relative_to(ROOT), m.group(1)) for p in paths
             for m in re.finditer(r'BENCHMARKS\.md[,\'s]* "([^"]+)"', " ".join(p.read_text().split()))]
    assert cited, "the pattern finds the citations"
    assert [c for c in cited if not any(h.startswith(c[1]) for h in heads)] == []


def test_runs_of_one_command_share_a_table_and_constant_columns_fold(monkeypatch, tmp_path):
    """Two runs of one command: one table, a cell "first / second" where they differ, the one value
    where they agree, a method of one run only "-" in the other; a column equal in every row of
    four is said once under the table instead."""
    prov = dict(machine="m", torch="t", command="monet demo")
    rows = [dict(method="plain", overhead="reference", **prov, date="d1"),
            dict(method="monet 40%", overhead="+11.1 %", **prov, date="d1"),
            dict(method="plain", overhead="reference", **prov, date="d2"),
            dict(method="monet 40%", overhead="+12.0 %", **prov, date="d2"),
            dict(method="monet 50%", overhead="+9.0 %", **prov, date="d2")]
    (tmp_path / "runs.csv").write_text(pd.DataFrame(rows).to_csv(index=False))
    monkeypatch.setattr(report, "RESULTS", tmp_path)
    text = "\n".join(report.runs_merged("runs.csv")())
    assert text.count("| method |") == 1
    assert "| plain | reference |" in text and "| monet 40% | +11.1 % / +12.0 % |" in text
    assert "| monet 50% | - / +9.0 % |" in text
    assert "*d1, d2 UTC; m; torch t; `monet demo`*" in text
    assert report._dates(["2026-12-07 07:33", "2026-12-07 13:49", "2026-12-08 09:00"]) == \
        "2026-12-07 07:33, 13:49, 2026-12-08 09:00"
    frame = pd.DataFrame({"model": list("abcd"), "gradients": ["bitwise"] * 4, "faster": ["yes", "no", "yes", "yes"]})
    shown, note = report.folded(frame, ("gradients", "faster"))
    assert list(shown.columns) == ["model", "faster"] and note == "Gradients: bitwise in every row."
    assert report.folded(frame.head(3), ("gradients",))[1] == ""
    shown, note = report.folded(frame.assign(chen="-"), ("chen", "gradients"))
    assert "chen" not in shown.columns and note == "Gradients: bitwise in every row."
