"""benchmarks/depth.py's bookkeeping (no model is run): rows merged from an earlier run's CSV, and
the plot drawn from CSV files."""
from __future__ import annotations

import pandas as pd
import pytest

import depth  # benchmarks/ (on the path: tests/conftest.py)


def _rows(model: str, layers: int, measured: str) -> list[dict]:
    cfg = dict(model=model, layers=layers, dtype="fp32", hidden=64, seq=16, batch=2, vocab=128, measured=measured)
    return [dict(cfg, method="plain PyTorch", peak=100 * 2**20, overhead=0.0, grads="reference"),
            dict(cfg, method="transformers every 1", peak=40 * 2**20, overhead=0.3, grads="bitwise"),
            dict(cfg, method="monet at transformers every 1", peak=39 * 2**20, overhead=0.2, grads="bitwise",
                 budget=40 * 2**20, predicted_overhead=0.21, capture_s=1.0, costs_s=2.0, solve_s=3.0),
            dict(cfg, method="transformers offload", error="RuntimeError: no pinned memory")]


def test_merge_keeps_the_other_configurations_and_replaces_the_one_run(tmp_path):
    csv = tmp_path / "depth.csv"
    pd.DataFrame(_rows("gpt2", 12, "old") + _rows("llama", 12, "old")).to_csv(csv, index=False)
    new = _rows("llama", 12, "new")
    rows = depth.merged(new, csv)
    assert [(r["model"], r["measured"]) for r in rows] == [("gpt2", "old")] * 4 + [("llama", "new")] * 4
    assert "error" not in rows[0] and rows[3]["error"].startswith("RuntimeError")  # empty cells dropped
    text = depth.table(rows)
    assert text.count("| gpt2 |") == 4 and "0.39x" in text and "1 + 2 + 3" in text
    with pytest.raises(SystemExit, match="--merge needs --csv"):
        depth.merged(new, None)


def test_the_plot_is_drawn_from_csv_files_alone(tmp_path):
    a, b = tmp_path / "a.csv", tmp_path / "b.csv"
    pd.DataFrame(_rows("gpt2", 12, "a")).to_csv(a, index=False)
    pd.DataFrame(_rows("gpt2", 24, "b") + _rows("bert", 12, "b")).to_csv(b, index=False)
    png = tmp_path / "depth.png"
    assert depth.main(["--from-csv", f"{a},{b}", "--plot", str(png)]) == 0
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    with pytest.raises(SystemExit, match="--from-csv needs --plot"):
        depth.main(["--from-csv", str(a)])
