"""Every Python block of README.md and docs/*.md runs as written (none of the README's
did).  The blocks of one file run in order, each in a fresh Python process, in one working
directory per file (a later block may load the file an earlier one saved), with ``HOME`` in a
temporary folder (monet's cost cache starts empty, as on a new machine).  A block whose first line
is ``# needs: cuda`` runs only where CUDA is available; it shows, in its comments, the CPU-sized
block that runs everywhere.

The test harness, not the blocks, declares torchvision's two detection ops first
(`reach_models.declare_torchvision_ops`): transformers imports torchvision where it is
installed, and this project's CPU build of torch does not load its C extension.
"""
from __future__ import annotations

import os
import subprocess
import sys

import pytest
from ci import HANG_GUARD_S, skip_unless_long
import torch

from doc_blocks import FILES, ROOT, fenced_blocks

PRELUDE = f"""
import sys
sys.path.insert(0, {str(ROOT / 'tests')!r})
from reach_models import declare_torchvision_ops
declare_torchvision_ops()
"""


def blocks():
    out = []
    for path in FILES:
        python = [b for b in fenced_blocks(path) if b.info == "python"]
        for k, b in enumerate(python):
            out.append(pytest.param(path, k, b.line, b.code, id=f"{path.relative_to(ROOT)}:{b.line}"))
    return out


_DIRS: dict = {}


def test_every_block_is_found():
    assert len(blocks()) >= 8  # README's and the guide's at least: a changed fence would hide them


@pytest.mark.parametrize("path, k, line, code", blocks())
def test_block_runs(path, k, line, code, tmp_path_factory):
    if code.startswith("# needs: cuda") and not torch.cuda.is_available():
        pytest.skip("the block needs CUDA")
    if "Trainer(" in code:
        skip_unless_long("the Trainer example", 50, "tests/test_trainer.py trains the wrapper in transformers' Trainer")
    if "autocast_dtype=" in code:
        skip_unless_long("the bf16 autocast example", 45, "tests/test_mixed_precision.py solves and trains under autocast")
    home = _DIRS.setdefault("home", tmp_path_factory.mktemp("home"))
    cwd = _DIRS.setdefault(path, tmp_path_factory.mktemp(path.stem))
    script = cwd / f"block_{k}.py"
    script.write_text(PRELUDE + "\n" + code)
    env = {**os.environ, "HOME": str(home), "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get(
        "PYTHONPATH", "")]))}
    proc = subprocess.run([sys.executable, str(script)], cwd=cwd, env=env, capture_output=True, text=True,
                          timeout=HANG_GUARD_S)
    assert proc.returncode == 0, (f"{path.name} line {line}: the block failed\n--- stdout\n{proc.stdout[-3000:]}\n"
                                  f"--- stderr\n{proc.stderr[-6000:]}")
