"""Raw benchmark results: the provenance every row carries, and rows appended to a CSV file.

The benchmarks and ``monet zoo plot --csv`` write raw rows only; ``benchmarks/report.py``
generates BENCHMARKS.md from them, each table captioned with its rows' `PROVENANCE`.
"""
from __future__ import annotations

import os
import platform
import shlex
import sys
import time
from pathlib import Path
from typing import Callable, Iterable

#: the columns every raw row carries: UTC date and time, machine, torch release, the command
PROVENANCE = ("date", "machine", "torch", "command")


def command_line(program: str, argv: Iterable[str] | None = None) -> str:
    """The shell command that ran: ``program`` (e.g. ``"python benchmarks/depth.py"``) and ``argv``
    (default: this process's arguments), quoted as a shell would need them."""
    return f"{program} {shlex.join(sys.argv[1:] if argv is None else list(argv))}".rstrip()


def provenance(command: str) -> dict[str, str]:
    """The `PROVENANCE` of rows measured now by ``command`` on this machine."""
    import torch

    machine = f"{platform.processor() or platform.machine()}, {os.cpu_count()} cores"
    return dict(date=time.strftime("%Y-%m-%d %H:%M", time.gmtime()), machine=machine, torch=torch.__version__,
                command=command)


def append_rows(path: Path, rows: list[dict], prov: dict[str, str],
                replaces: Callable[[dict], bool] | None = None) -> None:
    """Append ``rows``, each with the columns of ``prov``, to the CSV file ``path`` (created with its
    folder if missing).  The file's columns become the union of the old and new ones, in first-seen
    order (a missing cell is empty).  ``replaces(old_row)``: the old rows it is true for are dropped
    first (a configuration measured again replaces its earlier rows).  Written beside the file and
    renamed, so an interrupted run leaves the old file."""
    import pandas as pd

    path = Path(path)
    new = pd.DataFrame([{**r, **prov} for r in rows])
    if path.exists():
        old = pd.read_csv(path, dtype=str, keep_default_na=False)
        if replaces is not None:
            old = old[[not replaces(r) for r in old.to_dict("records")]]
        new = pd.concat([old, new], ignore_index=True)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    new.to_csv(tmp, index=False)
    os.replace(tmp, path)
