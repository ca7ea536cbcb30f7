"""benchmarks/executor_tax.py: one row end to end on the CPU, and how a row's goal is read."""
import pytest

import executor_tax as et


def test_one_row_prints_its_table(capsys, tmp_path):
    import pandas as pd

    import reach_models as rm

    reason = rm.missing("transformers")
    if reason:
        pytest.skip(reason)
    raw = tmp_path / "tax.csv"
    assert et.main(["--rows", "gpt2-b2", "--pairs", "3", "--clock", "cpu", "--csv", str(raw)]) == 0
    rows = pd.read_csv(raw, dtype=str, keep_default_na=False)  # the printed row, with its provenance
    assert list(rows.row) == ["gpt2-b2"] and rows.command[0].startswith("python benchmarks/executor_tax.py --rows")
    out = capsys.readouterr().out
    row = next(line for line in out.splitlines() if line.startswith("| gpt2-b2 "))
    cells = [c.strip() for c in row.strip("|").split("|")]
    assert cells[1] == "transformers/gpt2" and cells[2] == "2" and cells[10] == "3"
    plain, monet, tax = float(cells[6]), float(cells[7]), float(cells[8])
    assert plain > 0 and monet > 0 and tax > -100
    assert "cpu clock" in out


def test_unknown_row_is_refused():
    assert et.main(["--rows", "nope"]) == 1


@pytest.mark.parametrize("q25, q75, expected", [(-0.01, 0.015, "met"), (0.025, 0.04, "not met"),
                                                (0.0, 0.03, "within spread")])
def test_goal_reads_the_quartiles(q25, q75, expected):
    r = et.Result(et.ROWS["demo"], tax=(q25 + q75) / 2, q25=q25, q75=q75)
    assert et.goal(r) == expected
