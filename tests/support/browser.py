"""Debian's headless Chromium driven by Playwright, for tests that use the Airflow UI as a person does.

No browser build is downloaded (none can be here): Playwright launches the system's
``/usr/bin/chromium`` (``make .venv`` installs Debian's ``chromium`` package when it is missing).
The flags keep Chromium off the network except for the pages it is sent to: without
``--disable-background-networking`` and its friends it opens connections of its own, which a closed
network refuses.
"""

from __future__ import annotations

import re
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from playwright.sync_api import Page, sync_playwright

CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
# a page on a 2-core machine shared with a scheduler, Spark and other tests
TIMEOUT_MS = 60_000


@contextmanager
def chromium_page(failure_dir: Path) -> Iterator[Page]:
    """A page of a fresh headless Chromium (its own user-data-dir). If the block fails, the page's
    screenshot and HTML are saved in ``failure_dir`` and the failure names them."""
    with sync_playwright() as playwright, tempfile.TemporaryDirectory(prefix="chromium-") as profile:
        context = playwright.chromium.launch_persistent_context(
            profile,
            executable_path=CHROMIUM,
            headless=True,
            args=CHROMIUM_ARGS,
            viewport={"width": 1400, "height": 1000},
        )
        context.set_default_timeout(TIMEOUT_MS)
        page = context.new_page()
        try:
            yield page
        except BaseException as exc:
            exc.add_note(save_page(page, failure_dir))
            raise
        finally:
            context.close()


def save_page(page: Page, directory: Path) -> str:
    """Save the page's screenshot and HTML in ``directory``; a line naming both."""
    directory.mkdir(parents=True, exist_ok=True)
    name = re.sub(r"[^A-Za-z0-9_.-]+", "_", page.url)[-80:] or "page"
    screenshot, html = directory / f"{name}.png", directory / f"{name}.html"
    try:
        page.screenshot(path=screenshot, full_page=True)
        html.write_text(page.content())
    except Exception as exc:  # a crashed browser: the failure itself says more
        return f"the page could not be saved ({exc})"
    return f"the browser's page at the failure: {screenshot} (HTML: {html})"
