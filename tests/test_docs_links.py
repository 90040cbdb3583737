"""The documentation holds together: every relative link in README.md and docs/*.md resolves to a tracked file
(and a ``#anchor`` to a heading of its target), the README stays short, and the generated performance tables
match the kept result files. CPU only, no imports of the package."""

from __future__ import annotations

import re
import subprocess
import sys
import unicodedata
from functools import lru_cache
from pathlib import Path
from urllib.parse import unquote

import pytest

ROOT = Path(__file__).resolve().parents[1]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]

#: Inline links and images, ``[text](target)`` / ``![alt](target "title")``; reference definitions ``[id]: target``.
INLINE_LINK = re.compile(r"!?\[(?:[^\[\]]|\[[^\[\]]*\])*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
REFERENCE_LINK = re.compile(r"^\s{0,3}\[[^\]]+\]:\s*<?(\S+?)>?(?:\s+\"[^\"]*\")?\s*$")
FENCE = re.compile(r"^\s{0,3}(`{3,}|~{3,})")
HEADING = re.compile(r"^\s{0,3}(#{1,6})\s+(.*?)\s*#*\s*$")
EXTERNAL = re.compile(r"^[a-zA-Z][a-zA-Z0-9+.-]*:")  # http:, https:, mailto:, ...


def _outside_fences(text: str):
    """(line number, line) of the lines outside fenced code blocks."""
    fence = None
    for number, line in enumerate(text.splitlines(), 1):
        m = FENCE.match(line)
        if m:
            if fence is None:
                fence = m.group(1)[0] * 3
            elif m.group(1).startswith(fence):
                fence = None
            continue
        if fence is None:
            yield number, line


def _prose_lines(text: str):
    """``_outside_fences`` with inline code spans blanked (a link inside code is not a link)."""
    for number, line in _outside_fences(text):
        yield number, re.sub(r"(`+)(.+?)\1", lambda s: " " * len(s.group(0)), line)


def _slug(heading: str) -> str:
    """GitHub's anchor of a heading: markup dropped, lower case, punctuation removed, spaces to hyphens."""
    text = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", heading)  # links keep their text
    text = re.sub(r"<[^>]+>", "", text).replace("`", "").replace("*", "")
    text = text.strip().lower()
    kept = "".join(ch for ch in text if ch in " -_" or unicodedata.category(ch)[0] in "LN")
    return kept.replace(" ", "-")


@lru_cache(maxsize=None)
def anchors(path: Path) -> frozenset:
    """Every heading anchor of a Markdown file, duplicates numbered as GitHub numbers them (-1, -2, ...)."""
    seen: dict = {}
    out = set()
    for _, line in _outside_fences(path.read_text(encoding="utf-8")):
        m = HEADING.match(line)
        if not m:
            continue
        slug = _slug(m.group(2))
        count = seen.get(slug, 0)
        seen[slug] = count + 1
        out.add(slug if count == 0 else f"{slug}-{count}")
    return frozenset(out)


@lru_cache(maxsize=None)
def tracked_files() -> frozenset:
    """Paths (relative to the root) git tracks; without git (an unpacked archive) every file on disk."""
    try:
        out = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, check=True).stdout
        return frozenset(p for p in out.decode().split("\0") if p)
    except (OSError, subprocess.CalledProcessError):
        return frozenset(p.relative_to(ROOT).as_posix() for p in ROOT.rglob("*") if p.is_file())


def _is_tracked(rel: str) -> bool:
    files = tracked_files()
    rel = rel.rstrip("/")
    return rel in files or any(f.startswith(rel + "/") for f in files)  # a file, or a directory holding one


def links(path: Path):
    """(line number, target) of every link in ``path`` outside code."""
    for number, line in _prose_lines(path.read_text(encoding="utf-8")):
        for m in INLINE_LINK.finditer(line):
            yield number, m.group(1)
        m = REFERENCE_LINK.match(line)
        if m:
            yield number, m.group(1)


def broken_links(path: Path) -> list:
    """Every relative link of ``path`` that does not resolve, as 'file:line: target (why)'."""
    problems = []
    for number, target in links(path):
        if EXTERNAL.match(target):
            continue
        where = f"{path.relative_to(ROOT)}:{number}: {target}"
        file_part, _, anchor = target.partition("#")
        file_part = unquote(file_part)
        if file_part:
            resolved = (path.parent / file_part).resolve()
            try:
                rel = resolved.relative_to(ROOT).as_posix()
            except ValueError:
                problems.append(f"{where} (points outside the repository)")
                continue
            if not _is_tracked(rel):
                problems.append(f"{where} (not a tracked file)")
                continue
        else:
            resolved = path
        if anchor:
            if resolved.suffix.lower() != ".md" or not resolved.is_file():
                problems.append(f"{where} (an anchor into a file that is not Markdown)")
            elif unquote(anchor).lower() not in anchors(resolved):
                problems.append(f"{where} (no heading with that anchor)")
    return problems


# ------------------------------------------------------------------------------------------------- helpers tested

def test_slug_follows_github():
    assert _slug("Low-level entries: flash_attn_fwd and flash_attn_bwd") == \
        "low-level-entries-flash_attn_fwd-and-flash_attn_bwd"
    assert _slug("torch.compile and CUDA graphs") == "torchcompile-and-cuda-graphs"
    assert _slug("8. Features in the backward") == "8-features-in-the-backward"
    assert _slug("Paged K/V") == "paged-kv"
    assert _slug("The `sm_120a` gate") == "the-sm_120a-gate"
    assert _slug("With [transformers](https://huggingface.co) 5.20") == "with-transformers-520"


def test_link_parser_skips_code_and_finds_anchors(tmp_path):
    doc = tmp_path / "x.md"
    doc.write_text("# Top\n\nSee [a](#top) and ![img](pic.png \"t\"), not `[b](nope.md)`.\n\n"
                   "```bash\n# not a heading\n[c](nope.md)\n```\n\n## Top\n\n[ref]: other.md#part\n")
    assert [t for _, t in links(doc)] == ["#top", "pic.png", "other.md#part"]
    assert anchors(doc) == {"top", "top-1"}


# --------------------------------------------------------------------------------------------- the repository's docs

@pytest.mark.parametrize("path", DOCS, ids=[p.relative_to(ROOT).as_posix() for p in DOCS])
def test_relative_links_resolve(path):
    assert not broken_links(path), "\n".join(broken_links(path))


def test_docs_exist():
    names = {p.name for p in DOCS}
    for name in ("README.md", "api.md", "serving.md", "training.md", "performance.md", "verification.md",
                 "design-backward.md", "design-flex.md"):
        assert name in names, f"{name} is missing"


def test_readme_is_short():
    lines = (ROOT / "README.md").read_text(encoding="utf-8").splitlines()
    assert len(lines) <= 350, f"README.md has {len(lines)} lines (at most 350)"
    long = [(n, len(line)) for n, line in enumerate(lines, 1) if len(line) > 400]
    assert not long, f"README.md lines over 400 characters (line, length): {long}"


def test_performance_tables_are_generated():
    """The tables between the perf markers are what ``tools/gen_perf.py`` makes of the kept result files."""
    proc = subprocess.run([sys.executable, str(ROOT / "tools" / "gen_perf.py"), "--check"], cwd=ROOT,
                          capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
