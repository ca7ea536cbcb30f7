"""The fenced code blocks of the documentation, shared by the tests that run or check them
(tests/test_doc_examples.py runs the Python ones, tests/test_cli.py checks the shell ones)."""
from __future__ import annotations

from pathlib import Path
from typing import NamedTuple

ROOT = Path(__file__).resolve().parent.parent
#: README.md and docs/*.md: the files a reader pastes from.
FILES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]


class Block(NamedTuple):
    """One fenced block: its info string ("python", "bash", ""), the line number of its first line
    of code (1-based) and its code (each line ending in a newline)."""

    info: str
    line: int
    code: str


def fenced_blocks(path: Path) -> list[Block]:
    """The fenced blocks (```) of a markdown file, in order."""
    out, info, start, lines = [], None, 0, []
    for number, line in enumerate(path.read_text().splitlines(), 1):
        if line.startswith("```"):
            if info is None:
                info, start, lines = line[3:].strip(), number + 1, []
            else:
                out.append(Block(info, start, "".join(lines)))
                info = None
            continue
        if info is not None:
            lines.append(line + "\n")
    return out
