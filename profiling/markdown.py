"""GitHub markdown tables: the tables benchmarks/report.py writes into BENCHMARKS.md, and those the
benchmarks and ``monet zoo plot`` print."""
from __future__ import annotations


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
