"""Test-wide setup.

Under pytest-xdist (pytest.ini runs two workers) each worker runs torch on one thread, without
OpenMP spin-waiting: two workers with two spinning threads each on two cores made iterations
several times slower. Every comparison (schedule against plain PyTorch) runs within one worker, so
the thread count does not change what a test checks.

The benchmarks (``benchmarks/``, not installed) import each other by module name, as when run as
``python benchmarks/NAME.py``: their folder goes on the import path for the tests that use them
(tests/test_bench_gpu.py)."""
import os
import sys
from pathlib import Path

if os.environ.get("PYTEST_XDIST_WORKER"):
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    import torch

    torch.set_num_threads(1)

BENCHMARKS = str(Path(__file__).resolve().parent.parent / "benchmarks")
if BENCHMARKS not in sys.path:
    sys.path.append(BENCHMARKS)
