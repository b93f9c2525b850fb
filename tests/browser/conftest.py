"""Fixtures for the browser test: the built book, a local HTTP server, headless Chromium.

Run with ``make test-browser`` (which builds the book when it is missing or stale and
installs Debian's chromium when /usr/bin/chromium is missing). ``make test`` never
collects this directory (see the repository's conftest.py, option ``--run-browser``).
"""

from __future__ import annotations

import functools
import http.server
import shutil
import threading
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SITE = ROOT / "_build" / "html"
SCREENSHOTS = ROOT / "_build" / "screenshots"
CHROMIUM = Path("/usr/bin/chromium")
HOST = "127.0.0.1"
# The probe's flags for Debian Chromium on this machine: no GPU, no QUIC, and none of
# Chromium's own background traffic (the network is closed; every such try would fail).
CHROMIUM_ARGS = [
    "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
    "--disable-background-networking", "--disable-component-update", "--disable-sync",
]


def site_pages() -> list[str]:
    """Every HTML page of the built book, as paths relative to _build/html (posix)."""
    if not SITE.is_dir():
        return []
    skip = {"_static", "_sources", "_images", "jupyter_execute"}
    return sorted(p.relative_to(SITE).as_posix() for p in SITE.rglob("*.html")
                  if not skip.intersection(p.relative_to(SITE).parts))


class _QuietHandler(http.server.SimpleHTTPRequestHandler):
    def log_message(self, format, *args):  # noqa: A002 - the stdlib's signature
        pass


@pytest.fixture(scope="session")
def site() -> Path:
    if not (SITE / "index.html").is_file():
        pytest.fail(f"no built book at {SITE}: run `make book` (make test-browser does)")
    return SITE


@pytest.fixture(scope="session")
def base_url(site):
    """http://127.0.0.1:<free port>/ serving _build/html, for the whole session."""
    handler = functools.partial(_QuietHandler, directory=str(site))
    server = http.server.ThreadingHTTPServer((HOST, 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://{HOST}:{server.server_address[1]}/"
    server.shutdown()
    server.server_close()
    thread.join(timeout=10)


@pytest.fixture(scope="session")
def browser():
    if not CHROMIUM.exists():
        pytest.fail(f"{CHROMIUM} is missing: `make test-browser` installs Debian's chromium")
    from playwright.sync_api import sync_playwright

    with sync_playwright() as pw:
        chromium = pw.chromium.launch(executable_path=str(CHROMIUM), headless=True,
                                      args=CHROMIUM_ARGS)
        yield chromium
        chromium.close()


@pytest.fixture(scope="session")
def screenshots() -> Path:
    shutil.rmtree(SCREENSHOTS, ignore_errors=True)
    SCREENSHOTS.mkdir(parents=True)
    return SCREENSHOTS
