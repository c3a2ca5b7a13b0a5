"""A browser screen: Playwright driving Debian's Chromium, one fresh browser per rollout.

Playwright's own browser downloads are never used: the browser is the system's
`chromium-headless-shell` (or `chromium`), found at the usual Debian paths, on `$PATH`, or
given as the `chromium` option / `$OPENFORGE_CHROMIUM`. Each `BrowserComputer` launches
its own browser (Playwright gives every launch a fresh temporary profile) and one
context, so nothing leaks between rollouts; the network is whatever the sandbox allows.

Playwright's sync API must be driven from the thread that started it, while the computer
API serves requests from its own threads: every browser call is therefore run on one
dedicated worker thread.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, TypeVar

from openforge.errors import OpenforgeError
from openforge_gui.actions import Action
from openforge_gui.computer import ActionFailed, Computer

T = TypeVar("T")

CHROMIUM_CANDIDATES = ("/usr/lib/chromium/chromium-headless-shell", "/usr/bin/chromium",
                       "/usr/bin/chromium-browser", "/usr/bin/chromium-headless-shell")
# Headless, offline-friendly, no sandbox of its own (the rollout's sandbox is the sandbox).
CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update",
                 "--disable-sync", "--disable-dev-shm-usage"]
URL_SCHEMES = ("http://", "https://")


class BrowserMissingError(OpenforgeError):
    """No Chromium binary was found; the message says how to install one."""


def find_chromium(explicit: str | None = None) -> str:
    """The Chromium executable to launch, or a one-line `BrowserMissingError`."""
    wanted = explicit or os.environ.get("OPENFORGE_CHROMIUM")
    if wanted:
        path = shutil.which(wanted) or (wanted if Path(wanted).is_file() else None)
        if path is None:
            raise BrowserMissingError(f"Chromium not found at {wanted!r} (option chromium / "
                                      "$OPENFORGE_CHROMIUM)")
        return path
    for candidate in CHROMIUM_CANDIDATES:
        if Path(candidate).is_file() and os.access(candidate, os.X_OK):
            return candidate
    for name in ("chromium-headless-shell", "chromium", "chromium-browser"):
        if found := shutil.which(name):
            return found
    raise BrowserMissingError("no Chromium found: install Debian's browser with `apt-get install "
                              "chromium-headless-shell` (or chromium), or set $OPENFORGE_CHROMIUM")


class BrowserComputer(Computer):
    """One headless Chromium page as a `Computer`.

    `width` x `height` is the viewport (and screenshot) size; `action_timeout_s` bounds
    each element lookup and navigation; `allow_goto` is False for task sets whose page must
    not be left (MiniWoB), and otherwise only http(s) URLs may be opened.
    """

    def __init__(self, width: int = 1280, height: int = 800, chromium: str | None = None,
                 action_timeout_s: float = 5.0, allow_goto: bool = True) -> None:
        self.width, self.height = width, height
        self.timeout_ms = action_timeout_s * 1000
        self.allow_goto = allow_goto
        executable = find_chromium(chromium)
        self._worker = ThreadPoolExecutor(max_workers=1, thread_name_prefix="browser")
        try:
            self._call(lambda: self._launch(executable))
        except Exception:
            self._worker.shutdown(wait=False)
            raise

    def _call(self, fn: Callable[[], T]) -> T:
        """Run `fn` on the browser's own thread and return its result (or raise its error)."""
        return self._worker.submit(fn).result()

    def _launch(self, executable: str) -> None:
        from playwright.sync_api import sync_playwright

        self._playwright = sync_playwright().start()
        try:
            self._browser = self._playwright.chromium.launch(
                executable_path=executable, headless=True, args=CHROMIUM_ARGS)
            self._context = self._browser.new_context(
                viewport={"width": self.width, "height": self.height}, device_scale_factor=1)
            self._context.set_default_timeout(self.timeout_ms)
            self.page = self._context.new_page()
        except Exception:
            self._playwright.stop()
            raise

    # --- used by environments (on any thread) --------------------------------------------

    def open(self, url: str) -> None:
        """Navigate to the task's start page (any scheme: the environment chose it)."""
        self._call(lambda: self.page.goto(url, wait_until="load"))

    def add_style(self, css: str) -> None:
        """Add a style sheet to the current page (hide what the agent must not see)."""
        self._call(lambda: self.page.add_style_tag(content=css))

    def evaluate(self, script: str, arg: Any = None) -> Any:
        """Evaluate a JavaScript function expression in the page, e.g. `() => document.title`."""
        return self._call(lambda: self.page.evaluate(script, arg))

    # --- the Computer interface ------------------------------------------------------------

    def screenshot(self) -> tuple[bytes, int, int]:
        png = self._call(lambda: self.page.screenshot(type="png"))
        return png, self.width, self.height

    def location(self) -> tuple[str | None, str | None]:
        return self._call(lambda: (self.page.url, self.page.title()))

    def perform(self, action: Action) -> None:
        from playwright.sync_api import Error as PlaywrightError

        try:
            self._call(lambda: self._perform(action))
        except PlaywrightError as exc:
            first = str(exc).strip().splitlines()[0] if str(exc).strip() else "browser error"
            raise ActionFailed(f"{action.type}: {first}") from None

    def _perform(self, action: Action) -> None:
        page = self.page
        if action.type == "click":
            page.mouse.click(action.x, action.y)
        elif action.type == "click_element":
            if action.selector:
                target = page.locator(action.selector)
            else:  # the element whose text is exactly this, else one that contains it
                target = page.get_by_text(action.text or "", exact=True)
                if target.count() == 0:
                    target = page.get_by_text(action.text or "", exact=False)
            target.first.click()
        elif action.type == "type":
            page.keyboard.type(action.text)
        elif action.type == "key":
            page.keyboard.press(action.keys)
        elif action.type == "scroll":
            page.mouse.move(action.x, action.y)
            page.mouse.wheel(action.dx, action.dy)
        elif action.type == "goto":
            if not self.allow_goto:
                raise ActionFailed("goto: this task does not allow leaving its page")
            if not action.url.startswith(URL_SCHEMES):
                raise ActionFailed(f"goto: only http(s) URLs may be opened, not {action.url!r}")
            page.goto(action.url, wait_until="load")
        elif action.type == "wait":
            page.wait_for_timeout(action.seconds * 1000)

    def close(self) -> None:
        def stop() -> None:
            try:
                self._browser.close()
            finally:
                self._playwright.stop()

        try:
            self._call(stop)
        finally:
            self._worker.shutdown(wait=True)
