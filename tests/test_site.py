"""The site builds strictly, and in a real browser every page is whole and self-contained.

The build (``mkdocs build --strict``, notebooks executed) goes to a temporary folder; a local HTTP
server serves it to Debian's chromium, driven by Playwright (no browser download). Every request to
another host is blocked and recorded: the site must load nothing from elsewhere.
"""

from __future__ import annotations

import functools
import http.server
import os
import shutil
import subprocess
import sys
import threading
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"


@pytest.fixture(scope="session")
def site(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("site")
    env = dict(os.environ, NO_MKDOCS_2_WARNING="1")
    proc = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "-q", "-d", str(out)],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=1200,
    )
    assert proc.returncode == 0, f"mkdocs build --strict failed:\n{proc.stdout}\n{proc.stderr}"
    return out


def _pages(site: Path) -> list[str]:
    return sorted(
        str(p.parent.relative_to(site))
        for p in site.rglob("index.html")
        if "vendor" not in p.parts and "figures" not in p.parts
    )


def test_site_builds_with_every_post_and_notebook(site):
    pages = _pages(site)
    posts = sorted(p.stem for p in (ROOT / "docs" / "posts").glob("*.md"))
    notebooks = sorted(p.stem for p in (ROOT / "docs" / "notebooks").glob("*.py"))
    assert "." in pages
    assert all(f"posts/{p}" in pages for p in posts), (posts, pages)
    assert all(f"notebooks/{n}" in pages for n in notebooks), (notebooks, pages)
    assert (site / "vendor" / "katex" / "katex.min.js").is_file()
    assert list((site / "figures").rglob("*.svg")), "no build-time figures"


@pytest.fixture(scope="session")
def base_url(site):
    handler = functools.partial(_QuietHandler, directory=str(site))
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{httpd.server_port}"
    httpd.shutdown()


class _QuietHandler(http.server.SimpleHTTPRequestHandler):
    def log_message(self, *args):  # keep pytest's output clean
        pass


@pytest.fixture(scope="session")
def browser():
    from playwright.sync_api import sync_playwright

    assert Path(CHROMIUM).exists(), (
        "Debian chromium is missing: apt-get install chromium (scripts/dev does)"
    )
    with sync_playwright() as p:
        b = p.chromium.launch(
            executable_path=CHROMIUM,
            args=[
                "--no-sandbox",
                "--disable-gpu",
                "--disable-background-networking",
                "--disable-component-update",
                "--disable-sync",
                "--no-first-run",
                "--disable-quic",
                "--disable-dev-shm-usage",
            ],
        )
        yield b
        b.close()


@pytest.fixture
def page(browser, base_url):
    ctx = browser.new_context(viewport={"width": 1400, "height": 900})
    page = ctx.new_page()
    page.errors, page.external = [], []
    page.on("pageerror", lambda e: page.errors.append(f"pageerror: {e}"))
    page.on("console", lambda m: m.type == "error" and page.errors.append(f"console: {m.text}"))
    page.on("response", lambda r: r.status >= 400 and page.errors.append(f"{r.status} {r.url}"))

    def route(r):
        if r.request.url.startswith(base_url) or r.request.url.startswith("data:"):
            return r.continue_()
        page.external.append(r.request.url)  # a CDN or remote font: the site must not need it
        return r.abort()

    page.route("**/*", route)
    yield page
    ctx.close()


def _open(page, base_url, rel):
    page.goto(f"{base_url}/{'' if rel == '.' else rel + '/'}")
    page.wait_for_load_state("networkidle")


# JS: text outside code that still looks like TeX after rendering
_RAW_TEX = """() => {
  const out = [];
  const walker = document.createTreeWalker(document.querySelector('article') || document.body,
                                           NodeFilter.SHOW_TEXT);
  for (let n = walker.nextNode(); n; n = walker.nextNode()) {
    if (n.parentElement.closest('pre, code, script, style, .katex, .highlight, .jp-OutputArea'))
      continue;
    const t = n.textContent;
    if (/\\$\\$|\\$[^$\\s][^$]*\\$|\\\\\\(|\\\\\\[|\\\\frac|\\\\sqrt/.test(t))
      out.push(t.trim().slice(0, 80));
  }
  return out;
}"""


def pytest_generate_tests(metafunc):
    if "rel" in metafunc.fixturenames:
        # pages are listed from the source tree, so ids exist before the build runs
        posts = [f"posts/{p.stem}" for p in sorted((ROOT / "docs" / "posts").glob("*.md"))]
        nbs = [f"notebooks/{p.stem}" for p in sorted((ROOT / "docs" / "notebooks").glob("*.py"))]
        api = [f"api/{p.stem}" if p.stem != "index" else "api"
               for p in sorted((ROOT / "docs" / "api").glob("*.md"))]
        metafunc.parametrize("rel", [".", "errata", "about"] + posts + nbs + api)


@pytest.mark.browser
def test_page_is_whole_and_self_contained(page, base_url, rel):
    _open(page, base_url, rel)
    unrendered = page.evaluate("""() => [...document.querySelectorAll('.arithmatex')]
        .filter(e => !e.querySelector('.katex')).map(e => e.textContent.slice(0, 80))""")
    assert unrendered == [], f"formulas KaTeX did not render: {unrendered}"
    assert page.locator(".katex-error").count() == 0, page.locator(".katex-error").all_inner_texts()
    assert page.evaluate(_RAW_TEX) == []
    broken = page.evaluate("""() => [...document.images]
        .filter(i => !(i.complete && i.naturalWidth > 0)).map(i => i.src)""")
    assert broken == [], f"images that did not load: {broken}"
    blocks = page.locator(".md-typeset .highlight pre").count()
    copy = page.locator(
        ".md-typeset .highlight pre [data-md-type='copy'], .md-typeset .highlight .md-clipboard"
    )
    assert copy.count() >= blocks, f"{blocks - copy.count()} code blocks lack a copy button"
    assert page.errors == [], page.errors
    assert page.external == [], f"requests to other hosts: {page.external}"


@pytest.mark.browser
def test_math_uses_the_local_katex_fonts(page, base_url):
    _open(page, base_url, "posts/01-newton")
    assert page.locator(".katex").count() > 20
    assert page.evaluate("() => document.fonts.check('16px KaTeX_Main')")


@pytest.mark.browser
def test_reference_and_triton_tabs_switch_together(page, base_url):
    _open(page, base_url, "posts/01-newton")
    sets = page.locator(".tabbed-set")
    assert sets.count() >= 1

    def selected() -> list[str]:
        return page.evaluate("""() => [...document.querySelectorAll('.tabbed-set')].map(s => {
            const i = [...s.querySelectorAll(':scope > input')].findIndex(x => x.checked);
            return s.querySelectorAll(':scope > .tabbed-labels > label')[i].textContent.trim();
        })""")

    assert set(selected()) == {"Reference (NumPy)"}
    page.locator(".tabbed-labels label", has_text="Triton").first.click()
    assert set(selected()) == {"Triton"}
    visible = page.locator(".tabbed-block:visible pre").first.inner_text()
    assert "@triton.jit" in visible
    page.locator(".tabbed-labels label", has_text="Reference (NumPy)").first.click()
    assert set(selected()) == {"Reference (NumPy)"}


@pytest.mark.browser
def test_home_page_lists_every_post(page, base_url):
    _open(page, base_url, ".")
    links = page.locator("article a[href*='posts/']").evaluate_all(
        "els => els.map(e => e.getAttribute('href'))"
    )
    posts = sorted(p.stem for p in (ROOT / "docs" / "posts").glob("*.md"))
    assert all(any(p in href for href in links) for p in posts), (posts, links)


def _posts_with_errata() -> list[str]:
    return [p.stem for p in sorted((ROOT / "docs" / "posts").glob("*.md"))
            if '??? errata "' in p.read_text(encoding="utf-8")]


def test_the_blog_has_dates_a_feed_an_archive_and_the_errata_page(site):
    posts = sorted(p.stem for p in (ROOT / "docs" / "posts").glob("*.md"))
    for post in posts:
        html = (site / "posts" / post / "index.html").read_text(encoding="utf-8")
        assert "<time datetime=" in html and "min read" in html, post
    feed = (site / "feed_rss_created.xml").read_text(encoding="utf-8")
    assert all(f"/posts/{p}/</link>" in feed for p in posts), "every post is in the RSS feed"
    assert list((site / "archive").rglob("index.html")), "no archive page"
    assert list((site / "category").rglob("index.html")), "no category pages"
    errata = (site / "errata" / "index.html").read_text(encoding="utf-8")
    for post in _posts_with_errata():
        assert f'href="../posts/{post}/"' in errata, f"{post}'s errata are not on the Errata page"
    api = sorted(p.stem for p in (ROOT / "docs" / "api").glob("*.md") if p.stem != "index")
    for topic in api:  # mkdocstrings rendered the topic's public functions
        html = (site / "api" / topic / "index.html").read_text(encoding="utf-8")
        assert html.count('class="doc doc-heading"') >= 1, topic


@pytest.mark.browser
def test_posts_fit_the_column_at_1280px_with_checks_folded(browser, base_url):
    ctx = browser.new_context(viewport={"width": 1280, "height": 900})
    page = ctx.new_page()
    try:
        for path in sorted((ROOT / "docs" / "posts").glob("*.md")):
            page.goto(f"{base_url}/posts/{path.stem}/")
            page.wait_for_load_state("load")
            wide = page.evaluate("""() => [...document.querySelectorAll('.md-content pre > code')]
                .filter(c => c.scrollWidth > c.clientWidth + 1)
                .map(c => c.textContent.split('\\n').sort((a, b) => b.length - a.length)[0])""")
            assert wide == [], f"{path.stem}: code that scrolls sideways at 1280 px: {wide[:3]}"
            opened = page.locator("details.check[open]").count()
            assert opened == 0, f"{path.stem}: {opened} check blocks are open by default"
    finally:
        ctx.close()
