"""Installing monet next to a torch that is already there, without a network (the GPU image's way)."""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.slow
def test_editable_install_without_network_or_build_isolation(tmp_path):
    """``pip install --no-build-isolation --no-deps -e .`` of a copy of the checkout, with no index to
    fetch from, into a prefix of its own: the build backend declared in pyproject.toml is the
    installed setuptools (with wheel, as on the GPU image), and the editable install maps
    monet.solver, monet.profiling and monet.zoo to their folders (pip's fallback to ``setup.py
    develop``, taken without pyproject.toml, mapped none of them)."""
    tracked = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True)
    if tracked.returncode != 0:
        pytest.skip("not a git checkout")
    src = tmp_path / "src"
    for name in tracked.stdout.splitlines():
        if (ROOT / name).is_file():
            (src / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(ROOT / name, src / name)
    for name in ("pyproject.toml",):  # not committed yet in a working tree under change
        if (ROOT / name).is_file() and not (src / name).exists():
            shutil.copy2(ROOT / name, src / name)
    prefix = tmp_path / "prefix"
    proc = subprocess.run([sys.executable, "-m", "pip", "install", "--no-index", "--no-build-isolation", "--no-deps",
                           "--ignore-installed", "--prefix", str(prefix), "-e", str(src)], capture_output=True, text=True, cwd=tmp_path,
                          env={**os.environ, "PIP_NO_INDEX": "1", "PIP_DISABLE_PIP_VERSION_CHECK": "1"})
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    site = next(prefix.glob("lib/python*/site-packages"))
    # only that install on the path (-S: no other site-packages, where this checkout is installed)
    probe = ("import importlib.util as u, site, sys; site.addsitedir(sys.argv[1]); "
             "print(*[u.find_spec(m).origin for m in ('monet.solver', 'monet.profiling', 'monet.zoo')])")
    where = subprocess.run([sys.executable, "-S", "-c", probe, str(site)], capture_output=True, text=True, cwd=tmp_path)
    assert where.returncode == 0, where.stderr[-2000:]
    assert where.stdout.split() == [str(src / "solver" / "__init__.py"), str(src / "profiling" / "__init__.py"),
                                    str(src / "zoo" / "__init__.py")]
