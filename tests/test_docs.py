"""The documentation's front door holds: README.md is short and opens with the two commands CI runs,
every relative link in README.md, docs/*.md and BENCHMARKS.md's summary reaches a file of the
repository (and, with ``#anchor``, a heading of it), and BENCHMARKS.md opens with a one-screen
summary.

Definitions used here:

- a *link* is markdown's ``[text](target)``, ``![alt](target)`` or ``[label]: target`` outside
  fenced code blocks and inline code; targets with a scheme (``https:``, ``mailto:``) are external and not checked;
- a target ``path#anchor`` resolves when ``path`` (relative to the linking file's folder; empty:
  the linking file itself) exists inside the repository and, when there is an anchor, ``path`` is
  a markdown file with a heading whose GitHub anchor (`anchor`) is ``anchor``;
- BENCHMARKS.md's *summary* is every line before its first line that starts with ``## `` outside
  fenced code blocks, the ``# Benchmarks`` title included.

Needs nothing but the standard library (no torch): ``pytest -q -n 0 tests/test_docs.py``.
"""
from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
BENCHMARKS = ROOT / "BENCHMARKS.md"
DOCS = sorted((ROOT / "docs").glob("*.md"))

README_MAX_CHARS = 9000  # about one screen of prose, the examples and one results table
README_MAX_LINE = 110
SUMMARY_MAX_LINES = 40
#: README's first code block, verbatim: CI (`.ci/run`) runs the second line
COMMANDS = ("pip install torch==2.13.0 -e . && monet demo\n"
            "pip install torch==2.13.0 -e '.[test]' && pytest -q\n")
#: the releases setup.py admits, one line each under README's "Tested PyTorch releases"
TESTED_RELEASES = ("2.11.0", "2.13.0", "2.14.1", "2.15.0")

_FENCE = re.compile(r"^(```|~~~)[^\n]*\n.*?^\1[^\n]*$", re.MULTILINE | re.DOTALL)
_INLINE_CODE = re.compile(r"(`+)(?!`).*?(?<!`)\1", re.DOTALL)
_LINK = re.compile(r"!?\[[^\]]*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
_REFERENCE = re.compile(r"^ {0,3}\[[^\]]+\]:\s*<?([^\s>]+)>?", re.MULTILINE)  # [label]: target
_SCHEME = re.compile(r"^[a-zA-Z][a-zA-Z0-9+.-]*:")


def without_code(text: str) -> str:
    """``text`` without fenced code blocks and inline code (their brackets are not links)."""
    return _INLINE_CODE.sub("", _FENCE.sub("", text))


def outside_fences(text: str) -> list[str]:
    """The lines of ``text`` with those inside fenced code blocks blanked (so line numbers hold)."""
    lines, fence = [], None
    for line in text.splitlines():
        marker = line[:3]
        if fence is None and marker in ("```", "~~~"):
            fence = marker
            lines.append("")
        elif fence is not None:
            if line.startswith(fence):
                fence = None
            lines.append("")
        else:
            lines.append(line)
    return lines


def anchor(heading: str) -> str:
    """GitHub's anchor of a heading's text: markup dropped, lower case, every character but
    letters, digits, ``_``, ``-`` and spaces removed, spaces turned into ``-``."""
    text = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", heading)  # a link shows its text
    text = text.replace("`", "").replace("*", "").strip().lower()
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def anchors(path: Path) -> set[str]:
    """Every heading anchor of the markdown file ``path``; repeated headings get ``-1``, ``-2`` ..."""
    seen: dict[str, int] = {}
    out = set()
    for line in outside_fences(path.read_text()):
        m = re.match(r"^#{1,6}\s+(.*?)\s*#*\s*$", line)
        if not m:
            continue
        a = anchor(m.group(1))
        n = seen.get(a, 0)
        seen[a] = n + 1
        out.add(a if n == 0 else f"{a}-{n}")
    return out


def links(text: str) -> list[str]:
    """The link targets of markdown ``text`` (code excluded): inline links, then reference
    definitions (``[label]: target``)."""
    plain = without_code(text)
    return _LINK.findall(plain) + _REFERENCE.findall(plain)


def broken_links(path: Path, text: str | None = None) -> list[str]:
    """The relative links of ``path`` (or of ``text``, a part of it) that do not resolve, each
    with the reason."""
    text = path.read_text() if text is None else text
    bad = []
    for target in links(text):
        if _SCHEME.match(target):
            continue
        file_part, _, frag = target.partition("#")
        dest = (path.parent / file_part).resolve() if file_part else path
        if file_part and ROOT not in dest.parents:
            bad.append(f"{target}: outside the repository")
        elif not dest.exists():
            bad.append(f"{target}: no such file")
        elif frag:
            if dest.suffix != ".md" or not dest.is_file():
                bad.append(f"{target}: an anchor into a file that is not markdown")
            elif frag not in anchors(dest):
                bad.append(f"{target}: no heading with that anchor in {dest.name}")
    return bad


def benchmarks_summary() -> list[str]:
    """BENCHMARKS.md's lines before its first ``## `` heading (outside code fences)."""
    text = BENCHMARKS.read_text()
    lines = outside_fences(text)
    first = next(i for i, line in enumerate(lines) if line.startswith("## "))
    return text.splitlines()[:first]


def test_readme_is_short():
    text = README.read_text()
    assert len(text) <= README_MAX_CHARS, \
        f"README.md has {len(text)} characters, at most {README_MAX_CHARS}: move the detail to docs/"
    long = [k for k, line in enumerate(text.splitlines(), 1) if len(line) > README_MAX_LINE]
    assert not long, f"README.md's lines {long} are over {README_MAX_LINE} characters"


def test_readme_opens_with_the_two_commands():
    m = _FENCE.search(README.read_text())
    assert m, "README.md has no code block"
    body = m.group(0).split("\n", 1)[1].rsplit("\n", 1)[0] + "\n"
    assert body == COMMANDS, f"README.md's first code block must be exactly:\n{COMMANDS}got:\n{body}"


def test_readme_lists_the_tested_releases():
    lines = README.read_text().splitlines()
    assert "## Tested PyTorch releases" in lines  # setup.py cites this section
    section = lines[lines.index("## Tested PyTorch releases") + 1:]
    section = section[:next((i for i, line in enumerate(section) if line.startswith("## ")), len(section))]
    for version in TESTED_RELEASES:
        line = next((line for line in section if line.startswith(f"- torch {version}:")), None)
        assert line is not None, f"no line for torch {version}"
        assert " passed" in line and "<" not in line, f"torch {version}'s line holds no pytest summary: {line}"


@pytest.mark.parametrize("path", [README, *DOCS], ids=lambda p: str(p.relative_to(ROOT)))
def test_relative_links_resolve(path):
    assert broken_links(path) == []


def test_readme_links_to_the_docs_and_benchmarks():
    targets = {t.partition("#")[0] for t in links(README.read_text())}
    for doc in ("docs/guide.md", "docs/cli.md", "docs/design.md", "docs/capture.md", "BENCHMARKS.md"):
        assert doc in targets, f"README.md does not link {doc}"


def test_benchmarks_opens_with_a_short_summary():
    summary = benchmarks_summary()
    assert summary and summary[0] == "# Benchmarks"
    assert len(summary) <= SUMMARY_MAX_LINES, (
        f"BENCHMARKS.md's summary (the lines before its first '## ' section) has {len(summary)} lines, "
        f"at most {SUMMARY_MAX_LINES}")
    text = "\n".join(summary)
    assert len([t for t in links(text) if t.startswith("#")]) >= 5, "the summary should link its sections"
    assert broken_links(BENCHMARKS, text) == []


def test_the_checks_see_what_they_check(tmp_path):
    """The helpers find links, anchors and breakage (so the tests above cannot pass vacuously)."""
    assert anchor("FSDP2 (`fully_shard`)") == "fsdp2-fully_shard"
    assert anchor("One call: `monet.optimize`") == "one-call-monetoptimize"
    assert anchor("Recompute factor on the CPU: Chen's schedule against the solved ones") == \
        "recompute-factor-on-the-cpu-chens-schedule-against-the-solved-ones"
    md = tmp_path / "x.md"
    md.write_text("# A\n## A\n```\n## not a heading [x](nowhere.md)\n```\n"
                  "[ok](#a-1) [bad](#b) `[code](nowhere.md)` [gone](nowhere.md) [web](https://example.org)\n"
                  "[r][1]\n\n[1]: missing.md#x\n")
    assert anchors(md) == {"a", "a-1"}
    assert links(md.read_text()) == ["#a-1", "#b", "nowhere.md", "https://example.org", "missing.md#x"]
    # tmp_path is outside the repository: only the in-file anchors can be checked there
    assert [b.split(":")[0] for b in broken_links(md)] == ["#b", "nowhere.md", "missing.md#x"]
    assert len(links(README.read_text())) >= 10


def test_the_repository_cites_only_what_it_holds():
    """Code and docs cite nothing outside the repository: no design document of the
    workplace, no "brief"; what they meant is in docs/design.md."""
    banned = ("DESIGN" + ".md", "the " + "brief")
    found = []
    for path in sorted(ROOT.rglob("*")):
        rel = path.relative_to(ROOT)
        if path.suffix not in (".py", ".md") or rel.parts[0] in (".git", "tests") and "data" in rel.parts:
            continue
        if any(part.startswith(".") or part in ("build", "dist") or part.endswith(".egg-info") for part in rel.parts):
            continue
        text = path.read_text(errors="replace")
        found += [f"{rel}: {b}" for b in banned if b in text]
    assert not found, found


#: a date (2026-11-27) or a tracker's issue number ("issue 18"): history, which git keeps
HISTORY = re.compile(r"20[0-9]{2}-[01][0-9]-[0-3][0-9]|issue [0-9]+", re.IGNORECASE)
LIBRARY = ("monet", "solver", "profiling", "zoo")


def test_library_code_carries_no_dates_or_issue_numbers():
    """The library's code and docstrings are contracts, not history: no dates and no issue
    numbers of a tracker a reader of the repository does not have (a reason that must survive is
    a named note in docs/design.md)."""
    found = [f"{path.relative_to(ROOT)}:{k}: {line.strip()[:80]}"
             for package in LIBRARY for path in sorted((ROOT / package).rglob("*.py"))
             for k, line in enumerate(path.read_text().splitlines(), 1) if HISTORY.search(line)]
    assert not found, found


def test_the_history_pattern_finds_what_it_bans():
    assert HISTORY.search("measured on 2026-11-27") and HISTORY.search("see Issue 18")
    assert not HISTORY.search("PR #175344") and not HISTORY.search("torch 2.11-2.15")


def test_reference_docs_carry_no_dates_or_issue_numbers():
    """README.md and docs/*.md are reference: no dates and no issue numbers (a table's date goes
    in its caption in BENCHMARKS.md, generated from the raw results)."""
    found = [f"{path.relative_to(ROOT)}:{k}: {line.strip()[:80]}" for path in (README, *DOCS)
             for k, line in enumerate(path.read_text().splitlines(), 1) if HISTORY.search(line)]
    assert not found, found
