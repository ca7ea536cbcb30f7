"""Markdown for the generated parts of BENCHMARKS.md: GitHub tables and the sections they sit in
(the zoo's section, `monet.zoo.report.write_markdown`, and the benchmarks' under ``benchmarks/``)."""
from __future__ import annotations

import os
from pathlib import Path


def md_table(header: list[str], rows: list[list[str]], align: str | None = None) -> str:
    """A GitHub markdown table (no dependency on tabulate).

    Args:
        header: column titles.
        rows: cells as strings, one list per row (a ``|`` in a cell is escaped).
        align: one letter per column, ``r`` right-aligned, anything else left; default all left.
    """
    align = align or "l" * len(header)
    sep = ["---:" if a == "r" else "---" for a in align]
    lines = ["| " + " | ".join(header) + " |", "| " + " | ".join(sep) + " |"]
    lines += ["| " + " | ".join(c.replace("|", "\\|") for c in r) + " |" for r in rows]
    return "\n".join(lines)


def _section_end(lines: list[str], start: int) -> int:
    """The index of the first line after ``lines[start]`` (a heading of level k) that is a heading
    of level k or higher (fewer ``#``), outside fenced code blocks; ``len(lines)`` if none."""
    level = len(lines[start]) - len(lines[start].lstrip("#"))
    fenced = False
    for i in range(start + 1, len(lines)):
        line = lines[i]
        if line.startswith("```"):
            fenced = not fenced
            continue
        depth = len(line) - len(line.lstrip("#"))
        if not fenced and 1 <= depth <= level and line[depth:depth + 1] == " ":
            return i
    return len(lines)


def write_section(path: Path, text: str, section: str) -> None:
    """Replace the section of the markdown file ``path`` headed by the line ``section`` (e.g.
    ``"## Schedule zoo"``, up to the next heading of its level or a higher one: its subsections
    go with it, its sibling sections stay) with ``text`` where it stands, or append ``text`` when
    there is no such section; a missing file is created.  The file is replaced atomically (written
    beside it, then renamed), so an interrupted run leaves the old one."""
    path = Path(path)
    lines = path.read_text().splitlines() if path.exists() else []
    if section in lines:
        start = lines.index(section)
        end = _section_end(lines, start)
        lines[start:end] = text.splitlines() + [""]
    else:
        lines += ([""] if lines else []) + text.splitlines()
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text("\n".join(lines).rstrip("\n") + "\n")
    os.replace(tmp, path)
