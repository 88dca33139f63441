"""Every page of docs/ and every script of examples/ is reached by a link from the README or
another page, and every relative link of those pages resolves (file, and heading anchor for a
Markdown target).

The examples were once named in the text only (README's "`examples/` has short scripts",
models.md's "(`examples/finetune_gpt2_with_grades.py`)"): a reader could not follow them.
Links inside fenced code blocks are not links and are left out.
"""

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
FENCE = re.compile(r"^```.*?^```", re.S | re.M)
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")


def links(page: Path) -> list[str]:
    return LINK.findall(FENCE.sub("", page.read_text(encoding="utf-8")))


def slug(heading: str) -> str:
    """GitHub's anchor of a heading: lower case, punctuation but '-' and '_' dropped, spaces
    to '-'."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def anchors(page: Path) -> set[str]:
    text = FENCE.sub("", page.read_text(encoding="utf-8"))
    return {slug(h) for h in re.findall(r"^#+\s+(.*)$", text, re.M)}


def targets() -> dict[Path, list[str]]:
    """Each page's relative links: the resolved file -> the pages that link to it."""
    found: dict[Path, list[str]] = {}
    for page in PAGES:
        for url in links(page):
            if re.match(r"[a-z]+:", url):  # http:, https:, mailto:
                continue
            path = url.partition("#")[0]
            target = (page.parent / path).resolve() if path else page.resolve()
            found.setdefault(target, []).append(f"{page.relative_to(ROOT)} -> {url}")
    return found


def test_every_relative_link_of_the_readme_and_docs_resolves():
    broken = []
    for page in PAGES:
        for url in links(page):
            if re.match(r"[a-z]+:", url):
                continue
            path, _, anchor = url.partition("#")
            target = (page.parent / path).resolve() if path else page.resolve()
            if not target.exists():
                broken.append(f"{page.relative_to(ROOT)}: {url} (no such file)")
            elif anchor and target.suffix == ".md" and anchor not in anchors(target):
                broken.append(f"{page.relative_to(ROOT)}: {url} (no such heading)")
    assert broken == []


def test_every_docs_page_is_linked_from_the_readme_or_another_page():
    linked = targets()
    pages = sorted((ROOT / "docs").glob("*.md"))
    assert pages
    missing = [str(p.relative_to(ROOT)) for p in pages
               if not any(ref.split(" -> ")[0] != str(p.relative_to(ROOT))
                          for ref in linked.get(p.resolve(), []))]
    assert missing == []


def test_every_example_script_is_linked_from_the_readme_or_a_docs_page():
    linked = targets()
    scripts = sorted((ROOT / "examples").glob("*.py"))
    assert scripts
    missing = [str(s.relative_to(ROOT)) for s in scripts if s.resolve() not in linked]
    assert missing == []


def test_the_link_reader_skips_code_blocks_and_reads_anchors():
    assert slug("One pattern per layer: `attn_backend_cycle`") == (
        "one-pattern-per-layer-attn_backend_cycle")
    assert LINK.findall(FENCE.sub("", "a [x](y.md)\n```\n[z](w.md)\n```\n")) == ["y.md"]
