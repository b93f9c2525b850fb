"""Every page of the built book, opened in headless Chromium as a reader would.

For each HTML page under _build/html (discovered from the built site, so new chapters
and appendices are covered without editing this file) the test checks that:

- the page loads nothing from any host but 127.0.0.1 (the book works offline: every
  request to another host is intercepted, aborted and reported);
- no request fails and the console shows no error (nor an uncaught exception);
- every image, figures included, has loaded (``naturalWidth > 0``);
- math is typeset: no raw TeX (``$$``, ``\\frac``, ``\\begin``, ``\\(``, ``\\[``) is left
  in the visible text, every math element holds MathJax output and none is a TeX error;
- every internal link points at a page, file and anchor that exist in the built site;
- every exercise solution dropdown starts closed and opens when clicked;
- a page built from a notebook offers the .ipynb download, and it holds outputs;

and saves a full-page screenshot to _build/screenshots/<page>.png.
"""

from __future__ import annotations

import html.parser
import json
from functools import cache
from pathlib import Path
from urllib.parse import unquote, urlsplit

import pytest

from .conftest import HOST, site_pages

RAW_TEX = ("$$", "\\frac", "\\begin", "\\(", "\\[")
LOAD_TIMEOUT_MS = 60_000
MATHJAX_TIMEOUT_MS = 30_000


class _Anchors(html.parser.HTMLParser):
    def __init__(self):
        super().__init__()
        self.ids: set[str] = set()

    def handle_starttag(self, tag, attrs):
        for name, value in attrs:
            if name == "id" or (tag == "a" and name == "name"):
                self.ids.add(value or "")


@cache
def anchors(page: Path) -> frozenset[str]:
    """The id (and <a name>) attributes of a built page: the anchors a link may target."""
    parser = _Anchors()
    parser.feed(page.read_text(encoding="utf-8"))
    return frozenset(parser.ids)


def broken_link(href: str, base_url: str, site: Path) -> str | None:
    """Why an internal link does not resolve in the built site, or None if it does."""
    parts = urlsplit(href)
    if parts.scheme not in ("http", "https") or not href.startswith(base_url):
        return None  # mailto:, javascript:, or an external reference (never loaded)
    path = unquote(parts.path[len(urlsplit(base_url).path):])
    target = site / path
    if path == "" or path.endswith("/"):
        target = target / "index.html"
    if not target.is_file():
        return f"{href}: no file {target.relative_to(site)}"
    fragment = unquote(parts.fragment)
    if fragment and target.suffix == ".html" and fragment not in anchors(target):
        return f"{href}: no anchor #{fragment} in {target.relative_to(site)}"
    return None


PAGES = site_pages()


def test_site_is_built(site):
    assert "index.html" in PAGES, "the built book has no index.html"
    chapters = [p for p in PAGES if p.startswith("chapters/")]
    assert chapters, "the built book has no chapter pages"


@pytest.mark.parametrize("page_path", PAGES)
def test_page(page_path, site, base_url, browser, screenshots):
    problems: list[str] = []
    context = browser.new_context(viewport={"width": 1280, "height": 900},
                                  service_workers="block")
    external: list[str] = []

    def route(route):
        url = route.request.url
        host = urlsplit(url).hostname
        if urlsplit(url).scheme in ("http", "https", "ws", "wss") and host != HOST:
            external.append(url)
            route.abort()
        else:
            route.continue_()

    context.route("**/*", route)
    page = context.new_page()
    console_errors: list[str] = []
    page.on("console", lambda m: m.type == "error" and console_errors.append(
        f"{m.text} ({m.location.get('url', '')}:{m.location.get('lineNumber', '')})"))
    page.on("pageerror", lambda e: console_errors.append(f"uncaught: {e}"))
    failed: list[str] = []
    page.on("requestfailed", lambda r: urlsplit(r.url).hostname == HOST and failed.append(
        f"{r.url}: {r.failure}"))
    page.on("response", lambda r: r.status >= 400 and failed.append(f"{r.url}: HTTP {r.status}"))

    try:
        page.goto(base_url + page_path, wait_until="load", timeout=LOAD_TIMEOUT_MS)
        page.wait_for_load_state("networkidle", timeout=LOAD_TIMEOUT_MS)

        # -- math: MathJax loaded from the book, every math element typeset ------------
        n_math = page.locator(".math.notranslate").count()
        if n_math:
            try:
                page.wait_for_function(
                    "() => window.MathJax && MathJax.startup && MathJax.startup.promise",
                    timeout=MATHJAX_TIMEOUT_MS)
                page.evaluate("() => MathJax.startup.promise")
            except Exception as exc:  # noqa: BLE001 - reported as a page problem
                problems.append(f"MathJax did not start on a page with {n_math} math "
                                f"elements: {exc.__class__.__name__}")
            math = page.evaluate("""() => {
                const all = Array.from(document.querySelectorAll('.math.notranslate'));
                return {
                  untypeset: all.filter(m => !m.querySelector('mjx-container'))
                                .map(m => m.textContent.trim().slice(0, 80)),
                  containers: document.querySelectorAll('mjx-container').length,
                  errors: Array.from(document.querySelectorAll('mjx-merror'))
                                .map(e => (e.getAttribute('data-mjx-error') || e.textContent)
                                .slice(0, 80)),
                };
            }""")
            if math["containers"] == 0:
                problems.append(f"{n_math} math elements but no MathJax output (mjx-container)")
            if math["untypeset"]:
                problems.append(f"{len(math['untypeset'])} math elements not typeset, "
                                f"e.g. {math['untypeset'][:3]}")
            if math["errors"]:
                problems.append(f"TeX errors rendered: {math['errors'][:5]}")
        text = page.evaluate("""() => {
            const body = document.body.cloneNode(true);
            body.querySelectorAll('pre, code, script, style, mjx-container, .highlight, '
                                  + 'textarea, .cell_input').forEach(e => e.remove());
            return body.innerText;
        }""")
        for marker in RAW_TEX:
            at = text.find(marker)
            if at >= 0:
                problems.append(f"raw TeX {marker!r} in the visible text: "
                                f"...{text[max(0, at - 40):at + 60]!r}...")

        # -- images: every one (figures included) loaded ---------------------------------
        images = page.evaluate("""async () => {
            const imgs = Array.from(document.images);
            imgs.forEach(i => { i.loading = 'eager'; });
            await Promise.all(imgs.map(i => i.decode().catch(() => null)));
            return imgs.map(i => ({src: i.currentSrc || i.src, ok: i.complete && i.naturalWidth > 0,
                                   figure: !!i.closest('figure')}));
        }""")
        bad = [i["src"] for i in images if not i["ok"]]
        if bad:
            problems.append(f"{len(bad)} of {len(images)} images not loaded: {bad[:5]}")
        if page_path.startswith("chapters/") and not any(i["figure"] for i in images):
            problems.append("a chapter page with no figure image")

        # -- internal links ----------------------------------------------------------------
        hrefs = page.evaluate("() => Array.from(document.querySelectorAll('a[href]'), a => a.href)")
        broken = sorted({why for h in hrefs if (why := broken_link(h, base_url, site))})
        if broken:
            problems.append(f"{len(broken)} broken internal links: {broken[:10]}")

        # -- the executed notebook download on pages built from a notebook ------------------
        source_ipynb = site / "_sources" / Path(page_path).with_suffix(".ipynb")
        if source_ipynb.is_file() or page_path.startswith("chapters/"):
            links = page.evaluate("""() => Array.from(
                document.querySelectorAll('.dropdown-download-buttons a[href$=".ipynb"]'),
                a => a.href)""")
            if not links:
                problems.append("no .ipynb download button")
            for link in links:
                response = context.request.get(link)
                if not response.ok:
                    problems.append(f"download {link}: HTTP {response.status}")
                    continue
                nb = json.loads(response.body())
                code = [c for c in nb.get("cells", []) if c.get("cell_type") == "code"]
                if not any(c.get("outputs") for c in code):
                    problems.append(f"download {link} is not an executed notebook (no outputs)")

        # -- screenshot: what a reader sees before opening anything --------------------------
        page.screenshot(path=str(screenshots / (page_path.replace("/", "__")[:-5] + ".png")),
                        full_page=True)

        # -- exercise solutions: closed dropdowns that open on click -------------------------
        solutions = page.locator("div.solution.dropdown")
        for k in range(solutions.count()):
            solution = solutions.nth(k)
            name = solution.get_attribute("id")
            content = solution.locator(":scope > :not(.admonition-title)").first
            button = solution.locator(":scope > .admonition-title button.toggle-button")
            if button.count() != 1:
                problems.append(f"solution {name}: no toggle button")
                continue
            if content.is_visible():
                problems.append(f"solution {name}: open before it was clicked")
            button.click()
            try:
                content.wait_for(state="visible", timeout=5_000)
            except Exception:  # noqa: BLE001
                problems.append(f"solution {name}: content not visible after a click")
    finally:
        context.close()

    if external:
        problems.append(f"{len(external)} requests to other hosts (the book must work "
                        f"offline): {sorted(set(external))[:5]}")
    if failed:
        problems.append(f"{len(failed)} failed requests: {sorted(set(failed))[:5]}")
    if console_errors:
        problems.append(f"{len(console_errors)} console errors: {console_errors[:5]}")
    assert not problems, f"{page_path}:\n  " + "\n  ".join(problems)
