"""README is a front page and docs/ holds one page per topic (issue 24): every link and every repository path they
write points at something that exists. Each checker is also run on a made-up text, so that it can be seen to fail."""

from __future__ import annotations

import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
README = REPO / "README.md"
DOCS = REPO / "docs"
MAX_README_LINES = 300
MIN_TOPIC_PAGES = 5

FENCE = re.compile(r"^(```|~~~)")
LINK = re.compile(r"(?<!!)\[[^\]]*\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)")
SPAN = re.compile(r"(`+)(.+?)\1")
# A word that names a file or folder of this repository: one of its top-level folders, then a path.
REPO_PATH = re.compile(r"^(?:sprite|parity|tests|benchmarks|conf|launch_templates|examples|docs|\.ci)/[A-Za-z0-9_.\-/]*$")


def pages() -> list[Path]:
    """README.md and the top-level pages of docs/ (docs/runs/ holds records of runs, not pages)."""
    return [README, *sorted(DOCS.glob("*.md"))]


def prose(text: str) -> list[tuple[int, str]]:
    """(line number, line) of every line outside fenced code blocks."""
    found, fenced = [], False
    for number, line in enumerate(text.splitlines(), 1):
        if FENCE.match(line.strip()):
            fenced = not fenced
            continue
        if not fenced:
            found.append((number, line))
    return found


def slug(heading: str) -> str:
    """GitHub's anchor of a heading: lower case, punctuation (backticks too) dropped, spaces to hyphens."""
    text = heading.strip().lower()
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def anchors(text: str) -> set[str]:
    """Every heading's anchor, with GitHub's -1, -2 suffixes for repeated headings."""
    seen: dict[str, int] = {}
    found = set()
    for _, line in prose(text):
        match = re.match(r"^#{1,6}\s+(.*?)\s*#*\s*$", line)
        if not match:
            continue
        base = slug(match.group(1))
        count = seen.get(base, 0)
        seen[base] = count + 1
        found.add(base if count == 0 else f"{base}-{count}")
    return found


def links(text: str) -> list[tuple[int, str]]:
    """(line, target) of every Markdown link outside code blocks and inline code."""
    found = []
    for number, line in prose(text):
        for match in LINK.finditer(SPAN.sub("", line)):
            found.append((number, match.group(1)))
    return found


def broken_links(page: Path, text: str) -> list[str]:
    """Relative links of ``page`` whose file is missing, or whose ``#anchor`` names no heading of that file."""
    wrong = []
    for number, target in links(text):
        if re.match(r"^[a-z][a-z0-9+.-]*:", target):  # https:, mailto: ...: not a file here
            continue
        path, _, anchor = target.partition("#")
        goal = (page.parent / path).resolve() if path else page
        if not goal.exists():
            wrong.append(f"{page.name}:{number}: {target} (no such file)")
        elif anchor and goal.suffix == ".md" and anchor not in anchors(goal.read_text()):
            wrong.append(f"{page.name}:{number}: {target} (no heading #{anchor} in {goal.name})")
    return wrong


def repo_paths(text: str) -> list[tuple[int, str]]:
    """(line, path) of every repository path written in inline code, e.g. `sprite/launch/plan.py`; a word with a
    placeholder (`conf/<name>.yaml`) or a glob is no path."""
    found = []
    for number, line in prose(text):
        for match in SPAN.finditer(line):
            for word in match.group(2).split():
                word = word.strip(",;:()'\"")
                if REPO_PATH.match(word) and not re.search(r"[<>*{}]", word):
                    found.append((number, word))
    return found


def missing_paths(page_name: str, text: str, root: Path = REPO) -> list[str]:
    return [f"{page_name}:{number}: {path}" for number, path in repo_paths(text) if not (root / path).exists()]


def topic_pages(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.glob("*.md") if p.name != "architecture.md")


# --- the real pages ---

def test_readme_is_a_front_page():
    lines = README.read_text().splitlines()
    assert len(lines) <= MAX_README_LINES, f"README.md has {len(lines)} lines; move topics to docs/"


def test_the_readme_keeps_its_test_command_where_ci_reads_it():
    lines = README.read_text().splitlines()
    marker = lines.index("<!-- test-command -->")
    assert lines[marker + 1] == "```bash"
    assert lines[marker + 2].startswith("python3 -m venv .venv") and "pytest" in lines[marker + 2]


def test_docs_has_a_page_per_topic():
    assert len(topic_pages(DOCS)) >= MIN_TOPIC_PAGES, topic_pages(DOCS)
    assert (DOCS / "architecture.md").exists()


def test_every_link_resolves():
    wrong = [problem for page in pages() for problem in broken_links(page, page.read_text())]
    assert wrong == []


def test_every_repository_path_exists():
    wrong = [problem for page in pages() for problem in missing_paths(page.name, page.read_text())]
    assert wrong == []


def test_the_readme_links_every_topic_page():
    text = README.read_text()
    assert [name for name in topic_pages(DOCS) if f"docs/{name}" not in text] == []


# --- the checkers on made-up text ---

MADE_UP = """# Top `heading`: here

See [that](other.md#gone), [this](#top-heading-here), [web](https://example.org/x.md) and
[missing](nowhere.md). `[not](a-link.md)` is code.

```bash
[not a link](in-a-block.md)
```

## Top `heading`: here
"""


def test_the_link_checker_finds_missing_files_and_anchors(tmp_path):
    (tmp_path / "other.md").write_text("# Present\n")
    page = tmp_path / "page.md"
    page.write_text(MADE_UP)
    assert [target for _, target in links(MADE_UP)] == ["other.md#gone", "#top-heading-here",
                                                        "https://example.org/x.md", "nowhere.md"]
    assert broken_links(page, MADE_UP) == ["page.md:3: other.md#gone (no heading #gone in other.md)",
                                           "page.md:4: nowhere.md (no such file)"]


def test_slugs_are_githubs():
    assert slug("Checkpoints: manifests, `sprite ckpt`, `--resume`") == "checkpoints-manifests-sprite-ckpt---resume"
    assert slug("What every rank runs: `python -m sprite.runtime`") == "what-every-rank-runs-python--m-spriteruntime"
    assert anchors(MADE_UP) == {"top-heading-here", "top-heading-here-1"}


def test_the_path_checker_finds_a_missing_path(tmp_path):
    (tmp_path / "sprite").mkdir()
    (tmp_path / "sprite" / "here.py").write_text("")
    text = ("`sprite/here.py`, `sprite/gone.py`, `benchmarks/x.py --model tiny`, `conf/<name>.yaml`,\n"
            "`sprite.runtime`, `tests/*.py`, `sprite run --devices 2`\n")
    assert [path for _, path in repo_paths(text)] == ["sprite/here.py", "sprite/gone.py", "benchmarks/x.py"]
    assert missing_paths("p.md", text, tmp_path) == ["p.md:1: sprite/gone.py", "p.md:1: benchmarks/x.py"]


def test_the_page_counter_leaves_out_the_architecture(tmp_path):
    for name in ("architecture.md", "a.md", "b.md"):
        (tmp_path / name).write_text("# x\n")
    (tmp_path / "runs").mkdir()
    (tmp_path / "runs" / "c.md").write_text("# x\n")
    assert topic_pages(tmp_path) == ["a.md", "b.md"]


def test_sites_md_names_every_site_profile_key():
    """docs/sites.md lists what a profile holds: every key sprite/spec/sites.py accepts."""
    from sprite.spec.sites import PROFILE_KEYS

    text = (Path(__file__).resolve().parents[1] / "docs" / "sites.md").read_text()
    assert [key for key in PROFILE_KEYS if f"`{key}" not in text] == []
