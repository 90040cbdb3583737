"""The repository's text describes the product as it is (CPU, fast).

Two checks over every git-tracked text file (binary files are skipped):

1. No process words outside ``benchmarks/results/`` (result files keep their own notes): how the code got
   here belongs in git log, not in code, comments, docs or the manifest. The patterns are ``PROCESS_WORDS``:
   numbered work sessions, this repository's issues and numbered parts of a run, and dated history ("since"
   followed by a date; a table "regenerated" after some event). Upstream references by link or ``#number`` are
   fine, and so is a measured fact naming its device and date. A line that quotes process words on purpose (a
   test's example of what a checker refuses) carries the marker ``EXAMPLE_MARK`` in a comment.
2. Every result file a text cites exists in ``benchmarks/results/``: a ``benchmarks/results/<file>`` path, or a
   bare result name (``<what>_<device>_<YYYY-MM-DD>...``, the names the benchmarks write). A citation may name
   a file without its extension (``..._2026-11-27`` for ``..._2026-11-27.json.gz``); names followed by ``<``,
   ``{``, ``*`` or ``[`` are patterns (``fwd_h100_2026-11-25*.json``), not citations.
"""

import importlib.util
import re
import shutil
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
RESULTS = REPO / "benchmarks" / "results"


def _gen_docs():
    spec = importlib.util.spec_from_file_location("_gen_docs_for_repo_text", REPO / "tools" / "gen_docs.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


#: The manifest generator's core (sessions, this repository's issues, parts of a run), plus dated history
#: ("since" a date, or "regenerated" followed by "after"). Dates alone are allowed here: measured facts carry them.
PROCESS_WORDS = re.compile(
    r"\b(?:" + _gen_docs().PROCESS_WORD_CORE + r")"
    r"|\bsince \d{4}-\d\d"
    r"|\bregenerated\s+after\b",
    re.IGNORECASE,
)

DEVICES = r"(?:h100|h200|b200|rtx\w*|sm\d+a?|a100|l40s?)"
RESULT_PATH = re.compile(r"benchmarks/results/([A-Za-z0-9_.\-]+)")
RESULT_NAME = re.compile(r"\b([A-Za-z0-9_]+_" + DEVICES + r"_\d{4}-\d\d-\d\d[A-Za-z0-9_]*(?:\.[a-z]+)*)", re.IGNORECASE)
PATTERN_NEXT = "<{*["
#: A line holding this (in a comment) quotes process words on purpose, e.g. as a checker's negative example.
EXAMPLE_MARK = "process-words: " + "example"


def _tracked_text_files():
    if shutil.which("git") is None or not (REPO / ".git").exists():
        pytest.skip("not a git checkout: the tracked files are unknown")
    out = subprocess.run(["git", "ls-files", "-z"], cwd=REPO, capture_output=True, check=True).stdout
    for rel in out.decode().split("\0"):
        path = REPO / rel
        if not rel or not path.is_file() or path.is_symlink():
            continue
        data = path.read_bytes()
        if b"\0" in data[:8192]:
            continue
        try:
            yield rel, data.decode("utf-8")
        except UnicodeDecodeError:
            continue


def _outside_results():
    return [(rel, text) for rel, text in _tracked_text_files() if not rel.startswith("benchmarks/results/")]


def test_no_process_words():
    hits = []
    for rel, text in _outside_results():
        for lineno, line in enumerate(text.splitlines(), 1):
            if EXAMPLE_MARK in line:
                continue
            for m in PROCESS_WORDS.finditer(line):
                hits.append(f"{rel}:{lineno}: {m.group(0)!r}")
    assert not hits, f"{len(hits)} process words (say what is true now; git log keeps the history):\n" + "\n".join(hits)


def _cited_result(text: str, m: re.Match) -> str | None:
    """The file name a match cites, or None for a pattern such as ``train_h100_<date>.json``."""
    end = m.end(1)
    if end < len(text) and text[end] in PATTERN_NEXT:
        return None
    return m.group(1).rstrip(".")


def _exists(name: str) -> bool:
    if (RESULTS / name).is_file():
        return True
    return any(p.name.startswith(name + ".") for p in RESULTS.iterdir())


def test_cited_result_files_exist():
    missing = []
    for rel, text in _outside_results():
        for lineno, line in enumerate(text.splitlines(), 1):
            names = set()
            for rx in (RESULT_PATH, RESULT_NAME):
                for m in rx.finditer(line):
                    name = _cited_result(line, m)
                    if name and "/" not in name:
                        names.add(name)
            for name in sorted(names):
                if not _exists(name):
                    missing.append(f"{rel}:{lineno}: {name}")
    assert not missing, f"{len(missing)} citations of result files not in benchmarks/results/:\n" + "\n".join(missing)


def test_patterns_match_what_they_mean():
    assert PROCESS_WORDS.search("measured in " + "session" + " 12")
    assert PROCESS_WORDS.search("see " + "session" + "38.sh")
    assert PROCESS_WORDS.search("Issue" + " 20's target")
    assert not PROCESS_WORDS.search("upstream flash-attention #2336")
    assert not PROCESS_WORDS.search("H100, 2026-11-25: 373 TFLOPS")
    line = "see fwd_h100_2026-11-25.json and sanitizer_h100_2026-11-25*.json"
    names = [_cited_result(line, m) for m in RESULT_NAME.finditer(line)]
    assert names == ["fwd_h100_2026-11-25.json", None]
    assert _exists("fwd_h100_2026-11-25") and _exists("fwd_h100_2026-11-25.json")
