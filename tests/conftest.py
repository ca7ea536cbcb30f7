"""The benchmarks (``benchmarks/``, not installed) import each other by module name, as when run as
``python benchmarks/NAME.py``: their folder goes on the import path for the tests that use them
(tests/test_bench_gpu.py)."""
import sys
from pathlib import Path

BENCHMARKS = str(Path(__file__).resolve().parent.parent / "benchmarks")
if BENCHMARKS not in sys.path:
    sys.path.append(BENCHMARKS)
