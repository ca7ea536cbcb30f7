"""benchmarks/depth.py's bookkeeping (no model is run): the plot drawn from CSV files, and a
measuring run refused without the raw results file it appends to."""
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


def test_the_plot_is_drawn_from_csv_files_alone(tmp_path):
    a, b = tmp_path / "a.csv", tmp_path / "b.csv"
    pd.DataFrame(_rows("gpt2", 12, "a")).to_csv(a, index=False)
    pd.DataFrame(_rows("gpt2", 24, "b") + _rows("bert", 12, "b")).to_csv(b, index=False)
    png = tmp_path / "depth.png"
    assert depth.main(["--from-csv", f"{a},{b}", "--plot", str(png)]) == 0
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    with pytest.raises(SystemExit, match="--from-csv needs --plot"):
        depth.main(["--from-csv", str(a)])


def test_a_measuring_run_needs_its_raw_results_file(capsys):
    with pytest.raises(SystemExit):
        depth.main(["--models", "gpt2", "--layers", "2"])
    assert "--csv is required" in capsys.readouterr().err
