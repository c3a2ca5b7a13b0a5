"""A browser screen: Playwright driving Debian's Chromium, one fresh browser per rollout.

Playwright's own browser downloads are never used: the browser is the system's
`chromium-headless-shell` (or `chromium`), found at the usual Debian paths, on `$PATH`, or
given as the `chromium` option / `$OPENFORGE_CHROMIUM`. Each `BrowserComputer` launches
its own browser (Playwright gives every launch a fresh temporary profile) and one
context, so nothing leaks between rollouts. The browser runs on the trusted side, on the
host's network: all of its traffic goes through its own `EgressProxy` (`egress.py`), which
lets it reach the public web and the task's own sites, never the host's other services.

Playwright's sync API must be driven from the thread that started it, while the computer
API serves requests from its own threads: every browser call is therefore run on one
dedicated worker thread.
"""

from __future__ import annotations

import os
import shutil
import time
import uuid
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout
from pathlib import Path
from typing import Any, TypeVar

from openforge.errors import OpenforgeError
from openforge_gui.actions import Action
from openforge_gui.computer import ActionFailed, Computer, ScreenGone
from openforge_gui.egress import EgressProxy

T = TypeVar("T")

CHROMIUM_CANDIDATES = ("/usr/lib/chromium/chromium-headless-shell", "/usr/bin/chromium",
                       "/usr/bin/chromium-browser", "/usr/bin/chromium-headless-shell")
# Headless, offline-friendly, no sandbox of its own (the rollout's sandbox is the sandbox).
CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update",
                 "--disable-sync", "--disable-dev-shm-usage"]
URL_SCHEMES = ("http://", "https://")
# Seconds one browser call may take before the browser counts as hung. Each action bounds its
# own waits (`action_timeout_s`, `wait` at most 30 s); only a page that never yields its
# thread (a script in an endless loop) outlasts this, and it would hold every later call,
# the final state's included, for ever.
CALL_TIMEOUT_S = 60.0
# Chromium now and then refuses one capture ("Unable to capture screenshot", seen right after
# a navigation ends on an error page) and takes the same picture when asked again; a few
# tries, a moment apart, tell that hiccup from a screen that cannot be captured.
SCREENSHOT_TRIES = 4
SCREENSHOT_RETRY_PAUSE_S = 0.1


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
                 action_timeout_s: float = 5.0, allow_goto: bool = True,
                 call_timeout_s: float | None = None,
                 allowed_hosts: Iterable[str] = ()) -> None:
        self.width, self.height = width, height
        self.timeout_ms = action_timeout_s * 1000
        self.allow_goto = allow_goto
        self.call_timeout_s = call_timeout_s or CALL_TIMEOUT_S
        # Why the browser can no longer be used (it crashed, or hung and was stopped).
        self.gone: str | None = None
        # A switch Chromium ignores, on this browser's command line only: it finds the
        # process to stop when the page hangs.
        self._marker = f"--openforge-screen={uuid.uuid4().hex}"
        executable = find_chromium(chromium)
        # The task's start page is allowed when opened (`open`); `allowed_hosts` adds the
        # other private origins its site needs (an intranet deployment's assets).
        self.egress = EgressProxy(allowed_hosts)
        self._worker = ThreadPoolExecutor(max_workers=1, thread_name_prefix="browser")
        try:
            self._call(lambda: self._launch(executable))
        except Exception:
            self._worker.shutdown(wait=False)
            self.egress.close()
            raise

    def _call(self, fn: Callable[[], T]) -> T:
        """Run `fn` on the browser's own thread and return its result (or raise its error).

        A browser that died, or did not answer within `call_timeout_s` (then it is stopped,
        which frees the thread), raises `ScreenGone`, now and on every later call: the
        computer API answers it as an error, and the final state records it instead of
        waiting on a page that never answers.
        """
        from playwright.sync_api import Error as PlaywrightError

        if self.gone is not None:
            raise ScreenGone(self.gone)
        future = self._worker.submit(fn)
        try:
            return future.result(timeout=self.call_timeout_s)
        except FutureTimeout:
            self.gone = (f"the browser did not answer within {self.call_timeout_s:g} s (a page "
                         "that hangs): it was stopped")
            self._stop_chromium()
            raise ScreenGone(self.gone) from None
        except PlaywrightError:
            if not self._chromium_alive():
                self.gone = "the browser is gone (it crashed or was killed)"
                raise ScreenGone(self.gone) from None
            raise

    def _chromium_processes(self) -> list[Any]:
        import psutil

        found = []
        for proc in psutil.Process().children(recursive=True):
            try:
                if self._marker in proc.cmdline():
                    found.append(proc)
            except psutil.Error:  # it ended meanwhile
                pass
        return found

    def _chromium_alive(self) -> bool:
        return bool(self._chromium_processes())

    def _stop_chromium(self) -> None:
        """Kill this browser's Chromium: its pipe closes, and the call stuck on it returns."""
        import psutil

        for proc in self._chromium_processes():
            try:
                proc.kill()
            except psutil.Error:
                pass

    def _launch(self, executable: str) -> None:
        from playwright.sync_api import sync_playwright

        self._playwright = sync_playwright().start()
        try:
            self._browser = self._playwright.chromium.launch(
                executable_path=executable, headless=True,
                args=[*CHROMIUM_ARGS, *self.egress.chromium_args(), self._marker])
            self._context = self._browser.new_context(
                viewport={"width": self.width, "height": self.height}, device_scale_factor=1)
            self._context.set_default_timeout(self.timeout_ms)
            self.page = self._context.new_page()
        except Exception:
            self._playwright.stop()
            raise

    # --- used by environments (on any thread) --------------------------------------------

    def open(self, url: str) -> None:
        """Navigate to the task's start page (any scheme: the environment chose it, so its
        origin is reachable whatever its address)."""
        self.egress.allow(url)
        self._call(lambda: self.page.goto(url, wait_until="load"))

    def add_style(self, css: str) -> None:
        """Add a style sheet to the current page (hide what the agent must not see)."""
        self._call(lambda: self.page.add_style_tag(content=css))

    def evaluate(self, script: str, arg: Any = None) -> Any:
        """Evaluate a JavaScript function expression in the page, e.g. `() => document.title`."""
        return self._call(lambda: self.page.evaluate(script, arg))

    # --- the Computer interface ------------------------------------------------------------

    def screenshot(self) -> tuple[bytes, int, int]:
        from playwright.sync_api import Error as PlaywrightError

        failure = ""
        for attempt in range(1, SCREENSHOT_TRIES + 1):
            try:
                png = self._call(lambda: self.page.screenshot(type="png"))
                return png, self.width, self.height
            except PlaywrightError as exc:  # the browser lives (else `_call` raised ScreenGone)
                failure = str(exc).strip().splitlines()[0] if str(exc).strip() else "error"
                if attempt < SCREENSHOT_TRIES:
                    time.sleep(SCREENSHOT_RETRY_PAUSE_S * attempt)
        raise ActionFailed(f"screenshot: {SCREENSHOT_TRIES} tries failed: {failure}")

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
            # A stopped browser's thread is free again, so `stop` can still run on it.
            self._worker.submit(stop).result(timeout=self.call_timeout_s)
        except Exception:  # noqa: BLE001 - a browser that is gone has nothing left to close
            self._stop_chromium()
        finally:
            self._worker.shutdown(wait=False)
            self.egress.close()
