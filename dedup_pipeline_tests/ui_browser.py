"""Headless Chromium on the Dagster UI, for the browser tests (test_ui_server.py,
test_ui_buttons.py): Debian's chromium driven by playwright through `executable_path`, never a
browser download. One persistent profile per test, a fixed viewport, the UI's first-visit dialog
already dismissed."""

from __future__ import annotations

import contextlib
import re
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from dedup_pipeline_tests.apt import apt_install

CHROMIUM_FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                  "--disable-background-networking", "--disable-component-update", "--disable-sync"]
VIEWPORT = {"width": 1600, "height": 1000}


def chromium() -> str:
    """Debian's chromium binary, installed with apt-get when running as root and missing. Skips
    (with the reason) only when it is missing and cannot be installed (not root / no apt-get)."""
    found = shutil.which("chromium") or shutil.which("chromium-browser")
    if found:
        return found
    why = apt_install("chromium")
    if why == "not root or no apt-get":
        pytest.skip("the browser test needs Debian's chromium: not installed, and not root (or no "
                    "apt-get) to install it; run `apt-get install -y chromium` as root")
    assert not why, f"apt-get install chromium failed: {why}"
    found = shutil.which("chromium")
    assert found, "apt-get installed chromium but there is no chromium on PATH"
    return found


@contextlib.contextmanager
def browser_page(profile: Path) -> Iterator[Any]:
    """A page of a fresh headless Chromium (its profile in `profile`); closed on exit. When the
    block fails, the page as it was is saved next to the profile (`failure.png`)."""
    binary = chromium()
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        ctx = p.chromium.launch_persistent_context(
            str(profile), executable_path=binary, headless=True, args=CHROMIUM_FLAGS,
            viewport=VIEWPORT)
        # Dagster's "Join the Dagster community" dialog opens on a first visit once its query
        # answers, which on a loaded machine can be many seconds after the page settles, and then
        # takes the clicks meant for the page. The profile starts with what the UI itself stores
        # when a user presses Skip (localStorage `communityNux`, see dagster-webserver's
        # NUX/CommunityNux.tsx), so the dialog never opens.
        ctx.add_init_script("if (!localStorage.getItem('communityNux')) "
                            "localStorage.setItem('communityNux', JSON.stringify('1'));")
        page = ctx.new_page()
        try:
            yield page
        except BaseException:
            shot = profile.parent / "failure.png"
            with contextlib.suppress(Exception):
                page.screenshot(path=str(shot), full_page=True)
                print(f"the page when the test failed: {shot}")
            raise
        finally:
            ctx.close()


def open_page(page: Any, url: str) -> None:
    """Go to `url` and wait for the UI's queries."""
    page.goto(url, wait_until="networkidle", timeout=120_000)


def menu_of(page: Any, text: str) -> Any:
    """The drop-down button right of the button whose text is exactly `text` (a split button
    such as Materialize / Execute)."""
    buttons = page.locator("button")
    texts = buttons.all_inner_texts()
    assert text in texts, (text, texts)
    return buttons.nth(texts.index(text) + 1)


def button(page_or_dialog: Any, text: str) -> Any:
    """The button whose visible text is exactly `text` (the UI's buttons carry an icon whose
    label is part of their accessible name, so `get_by_role(name=...)` does not match them)."""
    return page_or_dialog.locator("button").filter(has_text=re.compile(rf"^{re.escape(text)}$"))
