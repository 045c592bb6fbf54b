"""Each post reads as a blog post: a lead for the home page, at most 4,500 words of prose, checks
folded away, corrections in one Errata block at the end, and no lab diary on the page (no dates,
commit hashes, hand-typed probe numbers, or words for notes readers never saw).

These read the markdown sources, so they run in seconds; tests/test_site.py checks the built site.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
POSTS = sorted((ROOT / "docs" / "posts").glob("*.md"))
PAGES = sorted(p for p in (ROOT / "docs").rglob("*.md") if "notebooks" not in p.parts)
MAX_WORDS = 4500

_FENCE = re.compile(r"^( *)(`{3,}|~{3,}).*?^\1\2[ \t]*$", re.S | re.M)
_MONTH = ("January|February|March|April|May|June|July|August|September|October|November|"
          "December")


def _front_matter(text: str) -> tuple[str, str]:
    m = re.match(r"---\n(.*?)\n---\n", text, re.S)
    assert m, "no front matter"
    return m.group(1), text[m.end():]


def prose(text: str) -> str:
    """The words a reader reads: no front matter, code, maths, tables, headings or includes."""
    t = _front_matter(text)[1] if text.startswith("---\n") else text
    t = _FENCE.sub("", t)
    t = re.sub(r"\$\$.*?\$\$", "", t, flags=re.S)
    t = re.sub(r"\$[^$\n]+\$", "", t)
    lines = [ln for ln in t.splitlines()
             if not ln.lstrip().startswith(("|", "{{", "<", "#")) and "--8<--" not in ln]
    return re.sub(r"`[^`]*`", "x", "\n".join(lines))


def word_count(text: str) -> int:
    return len(re.findall(r"[A-Za-z][A-Za-z'\-]*", prose(text)))


def test_word_count_counts_prose_only():
    text = ("---\ndate: 2026-01-01\n---\n# Title\n\nOne two three `code here`.\n\n"
            "```python\nx = 1  # not prose\n```\n\n$$a + b$$\n\n| a | b |\n")
    assert word_count(text) == 4  # One two three x


@pytest.mark.parametrize("path", POSTS, ids=lambda p: p.stem)
def test_post_is_a_blog_post(path):
    text = path.read_text(encoding="utf-8")
    meta, body = _front_matter(text)
    assert re.search(r"^date:\n  created: \d{4}-\d\d-\d\d$", meta, re.M), "date.created"
    assert re.search(r"^categories:\n  - ", meta, re.M), "categories"
    assert re.search(r"^description: .{20,}", meta, re.M), "description"
    assert body.lstrip().startswith("# "), "the title comes first"
    assert body.count("<!-- more -->") == 1, "one excerpt mark: the lead the home page shows"
    n = word_count(text)
    assert n <= MAX_WORDS, f"{n} words of prose (at most {MAX_WORDS}: split or cut)"


@pytest.mark.parametrize("path", POSTS, ids=lambda p: p.stem)
def test_checks_are_folded_and_errata_close_the_post(path):
    text = path.read_text(encoding="utf-8")
    assert 'title="check' not in text, 'check fences go in ??? check "..." blocks'
    assert ".doc-check" not in text, 'hidden checks become folded ??? check "..." blocks'
    assert not re.search(r'^\s*(!!!|\?\?\?\+?) \w+ "Correction', text, re.M), \
        "corrections go in the Errata block"
    errata = [m.start() for m in re.finditer(r'^\?\?\?\+? errata "', text, re.M)]
    assert len(errata) <= 1, "one Errata block per post"
    if errata:  # nothing but the block's own indented lines after it
        tail = text[errata[0]:].splitlines()[1:]
        assert all(ln == "" or ln.startswith("    ") for ln in tail), "Errata ends the post"


@pytest.mark.parametrize("path", PAGES, ids=lambda p: str(p.relative_to(ROOT / "docs")))
def test_no_lab_diary_on_the_site(path):
    text = path.read_text(encoding="utf-8")
    words = prose(text)
    # (a random seed is fine: "seed 0", "seed=1")
    assert not re.search(r"\bseed( posts?| notes?| text)?'s\b|\bthe seed\b(?! *[=\d])|"
                         r"\bseed (posts?|notes?|text)\b", words, re.I), \
        "readers never saw the source notes: say 'the earlier version of these notes'"
    assert not re.search(r"\bthe original (post|notes?) (said|says|gave|claimed)\b", words), \
        "corrections speak in the Errata block only"
    assert not re.search(rf"\b\d{{1,2}} ({_MONTH}) 20\d\d\b", words), "dated entries belong in lab/"
    hashes = [h for h in re.findall(r"\b[0-9a-f]{7,40}\b", words)
              if re.search(r"\d", h) and re.search(r"[a-f]", h)]
    assert not hashes, f"commit hashes in the text: {hashes}"
    assert not re.search(r"^\s*probe\w*\s*=\s*[{\[(]", text, re.M), \
        "hand-typed probe numbers: a number the text needs comes from a committed results file"
    assert not re.search(r"\b(machine starts?|this session|development probes?)\b", words, re.I)


@pytest.mark.parametrize("path", POSTS, ids=lambda p: p.stem)
def test_every_python_fence_is_collected_and_run(path):
    """A fence pytest does not see is a check that never runs: count the python fences in the
    source and those the collector (conftest.py) finds, nested in tabs and admonitions too."""
    from conftest import pytest_markdown_docs_markdown_it

    text = path.read_text(encoding="utf-8")
    written = len(re.findall(r"^ *(`{3,}|~{3,}) *(\{ *\.)?python\b", text, re.M))
    tokens = pytest_markdown_docs_markdown_it().parse(text)
    collected = [t for t in tokens if t.type == "fence"
                 and re.match(r"(\{ *\.)?python\b", t.info.strip())]
    assert len(collected) == written


def test_pages_that_run_an_operator_section_register_their_own_copy():
    """A page that executes a kernel's custom-operator section must register it under its own
    namespace: registering kernelnotes::<op> again replaces the package's library while the
    package still calls it (an intermittent segfault). The page sets NS before the include, so
    NS must be assigned outside the section."""
    for path in POSTS:
        text = path.read_text(encoding="utf-8")
        for src, section in re.findall(r'--8<-- "(src/[^":]+):([a-z_]+)"', text):
            body = (ROOT / src).read_text(encoding="utf-8")
            start = body.index(f"[start:{section}]")
            code = body[start:body.index(f"[end:{section}]")]
            if "torch.library.custom_op" not in code:
                continue
            assert '@torch.library.custom_op(f"{NS}::' in code and "\nNS =" not in code, \
                (path.name, section)
            before = text[:text.index(f'{src}:{section}"')].rsplit("```", 1)[-1]
            assert re.search(r'^ *NS = "kernelnotes_page"', before, re.M), (path.name, section)
